"""EngineConfig: every knob of the streaming engine, validated once at start.

Durations accept ``"30m"``-style strings or integer milliseconds and are stored as ms. A bad
value raises :class:`ConfigError` whose message starts with the field path
(``window: invalid duration ...``) so the daemon can print it and exit 2.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from evald.durations import parse_duration
from evald.events import MAX_GRADE, MAX_TS_MS, Limits, parse_timestamp
from evald.settings_section import Section

#: label names the exposition itself uses; a segment key with one of these names would clash
RESERVED_LABELS = frozenset(
    {
        "measure",
        "window",
        "le",
        "partition",
        "reason",
        "kind",
        "outcome",
        "instance",
        "job",
        "comparison",
        "team",
        "team_a",
        "team_b",
        "rank",
        "dimension",
        "value",
    }
)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

DEFAULT_ACTION_GRADES: dict[str, float] = {"click": 1.0, "add_to_cart": 2.0, "purchase": 3.0}
DEFAULT_HISTOGRAM_BOUNDS: tuple[float, ...] = (
    0.0,
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    0.95,
    1.0,
)


def _duration(value: Any) -> int:
    return parse_duration(value)


Duration = Annotated[int, BeforeValidator(_duration)]


def _instant(value: Any) -> Any:
    """Epoch ms from an int, an RFC 3339 time or a plain ``YYYY-MM-DD`` date (UTC midnight);
    YAML reads an unquoted date or time as a date / datetime object, taken alike."""
    if isinstance(value, datetime.datetime):
        value = value.isoformat().replace("+00:00", "Z")
        if value[-1] != "Z" and value[-6] not in "+-":
            value += "Z"  # YAML's naive datetime is UTC
    elif isinstance(value, datetime.date):
        value = value.isoformat()
    if isinstance(value, str):
        text = value.strip()
        if len(text) == 10:
            text += "T00:00:00Z"
        return parse_timestamp(text)
    return value


Instant = Annotated[int, BeforeValidator(_instant), Field(ge=0, le=MAX_TS_MS, strict=True)]

#: 2000-01-01T00:00:00Z: no event of a live system is older; epoch-0 and small-int clock bugs are
DEFAULT_MIN_EVENT_TIME = 946_684_800_000
#: the smallest share of a comparison's split an arm may have: one list in a trillion, far
#: below any real split, far above where the sample-ratio guard's arithmetic breaks
MIN_SHARE = 1e-12


class ConfigError(ValueError):
    """Invalid engine configuration; ``str()`` names the offending field first."""


def _default_measures() -> list[str]:
    from evald.metrics import DEFAULT_MEASURES

    return [part.strip() for part in DEFAULT_MEASURES.split(",")]


class ComparisonConfig(Section):
    """One arm comparison (docs/statistics.md, "How it is wired")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="names the comparison in its series")
    label: str = Field(description="the segment label key whose values are the arms")
    control: str = Field(min_length=1)
    treatments: list[str] = Field(min_length=1, description="one or more treatment arms")
    start: Instant = Field(description="declared start (date, RFC 3339 or epoch ms)")
    split: dict[str, float] | None = Field(
        None, description="expected traffic share per arm (default: equal); the sample-ratio guard"
    )
    arm_scoped_labels: list[str] = Field(
        default_factory=list,
        description="segment labels fixed by the arm (such as model), summed away",
    )
    min_effect: dict[str, float] = Field(
        default_factory=dict,
        description="measure -> smallest drop worth an alert (>= 0); the alerting family",
    )

    @model_validator(mode="after")
    def _check(self) -> ComparisonConfig:
        arms = [self.control, *self.treatments]
        if len(set(arms)) != len(arms):
            raise ValueError("control and treatments must be distinct arms")
        if self.split is not None:
            if sorted(self.split) != sorted(arms):
                raise ValueError("split: one weight per arm (control and every treatment)")
            if any(not (math.isfinite(w) and w > 0) for w in self.split.values()):
                raise ValueError("split: weights must be finite and > 0")
            # the guard reads each arm's share: 1e-300 of 1e300 (or of a total past the
            # largest float) is 0, whose logarithm is a numpy warning and an infinite e-value,
            # and a subnormal share (1e-311) makes its prior's log-gamma infinite
            total = sum(self.split.values())
            if not math.isfinite(total) or min(self.split.values()) / total < MIN_SHARE:
                raise ValueError(
                    f"split: every arm's share of the weights' total must be >= {MIN_SHARE:g}"
                )
        for measure, effect in self.min_effect.items():
            if not (math.isfinite(effect) and effect >= 0):
                raise ValueError(f"min_effect: {measure}: must be a finite number >= 0")
        return self


class StatisticsConfig(Section):
    """The always-valid comparison, sample-ratio guard and CUSUM (docs/statistics.md)."""

    # an infinite tuning_n made every bound NaN; an infinite cusum_k or cusum_h, a CUSUM that
    # never alarms: each was taken without a word
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    window: Duration = Field(
        60 * 60_000, gt=0, description="window folded (one of windows, when comparing)"
    )
    alpha: float = Field(0.05, gt=0, lt=1, description="family-wise error rate of the alerts")
    tuning_n: float = Field(5000.0, gt=0, description="lists where the sequence is tightest")
    min_n: int = Field(100, ge=2, description="lists per arm before a bound is published")
    srm_alpha: float = Field(0.001, gt=0, lt=1, description="level of the sample-ratio guard")
    cusum_k: float = Field(0.5, ge=0, description="CUSUM reference value (standard errors)")
    cusum_h: float = Field(5.0, gt=0, description="CUSUM decision threshold")
    cusum_min_n: int = Field(30, ge=2, description="lists per window before a CUSUM step")
    baseline_windows: int = Field(24, ge=1, description="trailing windows of an arm's baseline")
    bootstrap_replicates: int = Field(
        100,
        ge=0,
        # each one is a row of a (clusters x replicates) draw and a pair in the checkpoint:
        # 10**8 asked numpy for 821 GiB at the first window
        le=10_000,
        description="replicates of the clustered interval per window (0: none)",
    )
    comparisons: list[ComparisonConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _distinct(self) -> StatisticsConfig:
        names = [c.name for c in self.comparisons]
        if len(set(names)) != len(names):
            raise ValueError("comparisons: names must be distinct")
        return self


class InterleavingConfig(Section):
    """Interleaved impressions: how they are credited and the preference test (docs/statistics.md,
    "Interleaving")."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    window: Duration = Field(
        60 * 60_000, gt=0, description="event-time window of the sums; each complete one is a look"
    )
    credit: Literal["clicks", "grades"] = Field(
        "clicks", description="a team earns 1 per clicked item, or the item's grade"
    )
    alpha: float = Field(0.05, gt=0, lt=1, description="family-wise error rate of the verdicts")
    tuning_n: float = Field(
        5000.0, gt=0, description="compared lists where the sequence is tightest"
    )
    min_n: int = Field(100, ge=2, description="compared lists before a band is published")
    srm_alpha: float = Field(0.001, gt=0, lt=1, description="level of the draft's coin guard")
    start: Instant = Field(
        0,
        description="windows starting before it are not folded (date, RFC 3339 or epoch ms): "
        "the test started over",
    )
    teams: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="the rankers credited, by team name; empty: no interleaved list is credited",
    )

    @field_validator("teams")
    @classmethod
    def _check_teams(cls, value: list[str]) -> list[str]:
        if any(not name for name in value) or len(set(value)) != len(value):
            raise ValueError("team names are distinct and not empty")
        return value


class DrilldownConfig(Section):
    """The queries of the served lists, per segment and window (docs/drilldown.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_query_length: int = Field(
        100, ge=1, description="characters of a normalised query kept (the rest is cut)"
    )
    capacity: int = Field(
        32,
        ge=0,
        le=10_000,
        description="queries each summary (one segment and window) is sure to hold: it holds "
        "at most twice as many, and misses none with more than 1/(capacity+1) of its lists; "
        "memory per segment grows with it; 0: no summaries",
    )
    top: int = Field(10, ge=1, le=1000, description="queries a report lists per segment and window")
    label_capacity: int = Field(
        32,
        ge=0,
        le=10_000,
        description="label pairs (key and value) of the labels that are not segment keys each "
        "summary (one segment and window) is sure to hold, for the drop attribution: it holds "
        "at most twice as many; 0 (or capacity 0): none kept",
    )
    label_keys: int = Field(
        8,
        ge=0,
        le=64,
        description="keys of a list's labels that are not segment keys summarised (the first "
        "in code-point order); 0: none",
    )


class ZeroFeedbackConfig(Section):
    """The signals of the served lists alone: RBO between arms, unjudged and empty lists
    (docs/drilldown.md, "Zero-feedback signals")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    depth: int = Field(
        0,
        ge=0,
        le=100,
        description="the first items of each list compared and checked for judgements "
        "(10 is a usual depth); 0 (the default): no zero-feedback signals",
    )
    p: float = Field(0.9, gt=0, lt=1, description="RBO's persistence (Webber et al. 2010)")
    arm_label: str = Field(
        "arm",
        min_length=1,
        description="the label key whose values are the arms (any label: a segment key shows "
        "RBO per arm)",
    )
    reference: str = Field(
        "control", min_length=1, description="the arm (or model version) the others are compared to"
    )
    judged_capacity: int = Field(
        4096,
        ge=1,
        le=8192,
        description="(query, item) pairs with feedback each partition remembers (16 bytes "
        "each in its checkpoint)",
    )
    reference_capacity: int = Field(
        512,
        ge=1,
        le=1024,
        description="queries whose newest reference list each partition remembers (with "
        "depth, at most 8,192 item keys)",
    )


class ClickModelConfig(Section):
    """A click model fitted online per partition and segment in the engine (docs/click-models.md,
    "In evald run"); ``model`` null: none (the default: it costs CPU and checkpoint bytes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Literal["pbm"] | None = Field(
        None, description="the model fitted on the stream (pbm); null: none"
    )
    depth: int = Field(10, ge=1, le=255, description="ranks the model reads, from the top")
    max_pairs: int = Field(
        20_000,
        ge=16,
        le=1_000_000,
        description="(query, item) pairs kept per partition; a cold pair answers the prior",
    )
    half_life: Duration = Field(
        24 * 3_600_000, gt=0, description="event-time half-life of the statistics (the horizon)"
    )
    refit_every: int = Field(
        10_000, ge=1, description="lists of a partition between two refits, once warmed up"
    )


class EngineConfig(Section):
    """Join, scoring and aggregation settings (docs/semantics.md explains each rule)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # 5 minutes: the demo's, compose's and the walk-through's window, so a first window of
    # results is complete 12 event minutes after the traffic starts (window + lateness + 5m
    # of data); feedback later than this counts as unattributed "late", visible per reason
    window: Duration = Field(5 * 60_000, gt=0, description="attribution window after an impression")
    lateness: Duration = Field(2 * 60_000, ge=0, description="watermark = max event ts - lateness")
    min_event_time: Instant = Field(
        DEFAULT_MIN_EVENT_TIME,
        description="earliest plausible event time (date, RFC 3339 or epoch ms); "
        "older events are rejected as implausible_timestamp",
    )
    max_event_lead: Duration | None = Field(
        60 * 60_000,
        ge=0,
        description="how far an event time may lead its reference time (Kafka record timestamp, "
        "else the wall clock); further ahead is implausible_timestamp; null: no bound",
    )
    watermark_quorum: int = Field(
        32,
        ge=1,
        le=1024,
        description="events per confirmation block: an event time moves the watermark only "
        "once a whole block of this many consecutive events of the partition has reached it "
        "(1: every event confirms itself)",
    )
    idle_timeout: Duration = Field(
        5 * 60_000,
        gt=0,
        description="wall time without events before a partition's watermark "
        "advances with the wall clock",
    )
    measures: list[str] = Field(default_factory=_default_measures, min_length=1)
    label_keys: list[str] = Field(default_factory=lambda: ["model", "arm", "surface"])
    label_value_cap: int = Field(50, ge=1, description="distinct values per label key")
    max_segments: int = Field(
        200,
        ge=1,
        description="label combinations kept; later new ones go to the all-__other__ segment",
    )
    max_series: int = Field(
        100_000,
        ge=1,
        description="series the engine may expose at worst; max_segments must fit in it",
    )
    action_grades: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_ACTION_GRADES))
    # model_validate({}): the defaults, typed (a type checker without pydantic's plugin reads
    # the bare class as needing every field)
    limits: Limits = Field(default_factory=lambda: Limits.model_validate({}))
    max_pending: int = Field(1_000_000, ge=1, description="pending impressions per engine")
    max_held_feedback: int = Field(
        1_000_000, ge=1, description="feedback held for impressions not seen yet"
    )
    bucket: Duration = Field(60_000, gt=0, description="event-time bucket of the window sums")
    windows: list[Duration] = Field(
        default_factory=lambda: [5 * 60_000, 60 * 60_000],
        min_length=1,
        description="roll-up windows exported (multiples of bucket)",
    )
    retention: Duration = Field(3 * 3_600_000, gt=0, description="how long buckets are kept")
    histogram_bounds: list[float] = Field(
        default_factory=lambda: list(DEFAULT_HISTOGRAM_BOUNDS), min_length=1
    )
    batch_size: int = Field(4096, ge=1, description="finalized impressions scored per batch")
    statistics: StatisticsConfig = Field(
        default_factory=lambda: StatisticsConfig.model_validate({})
    )
    interleaving: InterleavingConfig = Field(
        default_factory=lambda: InterleavingConfig.model_validate({})
    )
    drilldown: DrilldownConfig = Field(default_factory=lambda: DrilldownConfig.model_validate({}))
    zero_feedback: ZeroFeedbackConfig = Field(
        default_factory=lambda: ZeroFeedbackConfig.model_validate({})
    )
    click_model: ClickModelConfig = Field(
        default_factory=lambda: ClickModelConfig.model_validate({})
    )

    @field_validator("click_model", mode="before")
    @classmethod
    def _click_model_name(cls, value: Any) -> Any:
        # ``click_model: pbm`` is short for ``click_model: {model: pbm}``
        return {"model": value} if isinstance(value, str) or value is None else value

    @field_validator("measures", mode="before")
    @classmethod
    def _split_measures(cls, value: Any) -> Any:
        # parse_measures splits at top-level commas only: nDCG(gains={1:3,2:9}) stays whole
        return [value] if isinstance(value, str) else value

    @field_validator("measures")
    @classmethod
    def _canonical_measures(cls, value: list[str]) -> list[str]:
        from evald.metrics import FAMILIES, parse_measures
        from evald.metrics.families import GEOMETRIC

        measures = parse_measures(value)
        for measure in measures:
            # the window sums hold (weighted) means of per-list values, not a geometric mean
            # (GAUC, weighted, they hold, though its per-list value alone is AUC's)
            family = FAMILIES[measure.family]
            if family.aggregation == GEOMETRIC:
                of = family.aggregate_of
                raise ValueError(
                    f"{measure} is an aggregate over queries (the geometric mean of {of}: "
                    f"export {of}), which the engine's sums cannot give; export its per-list "
                    "measure instead"
                )
        return [str(m) for m in measures]

    @field_validator("label_keys")
    @classmethod
    def _check_label_keys(cls, value: list[str]) -> list[str]:
        for key in value:
            if not _LABEL_NAME.fullmatch(key) or key.startswith("__"):
                raise ValueError(f"{key!r} is not a valid Prometheus label name")
            if key in RESERVED_LABELS:
                raise ValueError(
                    f"{key!r} is reserved (used by evald's own series: "
                    f"{', '.join(sorted(RESERVED_LABELS))})"
                )
        if len(set(value)) != len(value):
            raise ValueError("label keys must be distinct")
        return value

    @field_validator("action_grades")
    @classmethod
    def _check_action_grades(cls, value: dict[str, float]) -> dict[str, float]:
        for action, grade in value.items():
            if action == "judgment":
                raise ValueError("'judgment' is built in (its grade comes from the event)")
            if not action:
                raise ValueError("action names must not be empty")
            if isinstance(grade, bool) or not 0 <= grade <= MAX_GRADE:
                raise ValueError(f"grade of {action!r} must be a number from 0 to {MAX_GRADE:g}")
        return value

    @field_validator("histogram_bounds")
    @classmethod
    def _check_bounds(cls, value: list[float]) -> list[float]:
        if any(not math.isfinite(b) for b in value):
            raise ValueError("histogram bounds must be finite (+Inf is implied)")
        if any(b >= c for b, c in itertools.pairwise(value)):
            raise ValueError("histogram bounds must be strictly increasing")
        return value

    @model_validator(mode="after")
    def _check_windows(self) -> EngineConfig:
        for width in self.windows:
            if width <= 0 or width % self.bucket:
                raise ValueError(
                    f"windows: {width} ms is not a positive multiple of bucket ({self.bucket} ms)"
                )
        if self.retention < max(self.windows):
            raise ValueError("retention: must be at least the longest window")
        return self

    @model_validator(mode="after")
    def _check_statistics(self) -> EngineConfig:
        stats = self.statistics
        if stats.comparisons and stats.window not in self.windows:
            raise ValueError(
                f"statistics.window: {stats.window} ms is not one of windows {self.windows}"
            )
        for i, comp in enumerate(stats.comparisons):
            where = f"statistics.comparisons.{i}"
            for key in (comp.label, *comp.arm_scoped_labels):
                if key not in self.label_keys:
                    raise ValueError(f"{where}: {key!r} is not one of label_keys {self.label_keys}")
            self._check_arms(where, comp)
            for measure in comp.min_effect:
                if measure not in self.measures:
                    raise ValueError(
                        f"{where}.min_effect: {measure!r} is not one of measures {self.measures}"
                    )
        return self

    @model_validator(mode="after")
    def _check_share_rows(self) -> EngineConfig:
        """One segment's row of a comparison share (and one interleaving credit cell) is never
        cut across records: past a record's number budget it made a record no statistics topic
        at Kafka's default limit takes, refused in every session (the commit stalled)."""
        from evald.interleaving.shares import COUNTS, NUMBERS_PER_RECORD
        from evald.statistics.clustered import row_width
        from evald.statistics.shares import CELLS_PER_RECORD

        b = self.statistics.bootstrap_replicates
        m = len(self.measures)
        if self.statistics.comparisons and m * row_width(0) > CELLS_PER_RECORD:
            raise ValueError(
                f"measures: {m} measures make one segment's row of a comparison share more than "
                f"the {CELLS_PER_RECORD} numbers a share record holds; compare at most "
                f"{CELLS_PER_RECORD // row_width(0)}"
            )
        if self.statistics.comparisons and m * row_width(b) > CELLS_PER_RECORD:
            most = (CELLS_PER_RECORD // m - row_width(0) - 1) // 2
            raise ValueError(
                f"statistics.bootstrap_replicates: {b} replicates make one segment's row of a "
                f"comparison share {m} x {row_width(b)} = {m * row_width(b)} numbers, more than "
                f"the {CELLS_PER_RECORD} a share record holds (one segment is never cut): at "
                f"most {max(most, 0)} with {m} measures"
            )
        cell = len(COUNTS) + 2 * b
        if self.interleaving.teams and cell > NUMBERS_PER_RECORD:
            raise ValueError(
                f"statistics.bootstrap_replicates: {b} replicates make one interleaving credit "
                f"cell {cell} numbers, more than the {NUMBERS_PER_RECORD} a credit share record "
                f"holds (one cell is never cut): at most "
                f"{(NUMBERS_PER_RECORD - len(COUNTS)) // 2} with interleaving.teams"
            )
        return self

    def _check_arms(self, where: str, comp: ComparisonConfig) -> None:
        """Arms every event could show: each was taken, and the comparison then waited
        forever for an arm no segment would ever hold."""
        from evald.segments import NONE, OTHER

        arms = [comp.control, *comp.treatments]
        longest = self.limits.max_string_length
        for arm in arms:
            if not arm or arm in (NONE, OTHER):
                raise ValueError(f"{where}: arm {arm!r}: arms are named, and not {NONE} or {OTHER}")
            if len(arm) > longest:
                raise ValueError(
                    f"{where}: arm {arm!r} is longer than limits.max_string_length ({longest}): "
                    "no event can carry it"
                )
        if comp.label in comp.arm_scoped_labels:
            raise ValueError(
                f"{where}.arm_scoped_labels: {comp.label!r} is the comparison's label, whose "
                "values are the arms: it cannot be summed away"
            )
        room = min(self.label_value_cap, self.max_segments)
        if len(arms) > room:
            raise ValueError(
                f"{where}: {len(arms)} arms, but label_value_cap and max_segments keep "
                f"{room} value(s): the arms past it would all be {OTHER}"
            )

    @model_validator(mode="after")
    def _check_drilldown(self) -> EngineConfig:
        drill = self.drilldown
        if drill.max_query_length > self.limits.max_string_length:
            raise ValueError(
                f"drilldown.max_query_length: {drill.max_query_length} is more than "
                f"limits.max_string_length ({self.limits.max_string_length})"
            )
        zero = self.zero_feedback
        if zero.reference_capacity * zero.depth > 8192:
            raise ValueError(
                f"zero_feedback.reference_capacity: {zero.reference_capacity} queries x depth "
                f"{zero.depth} is more than 8,192 item keys (the checkpoint record's share)"
            )
        return self


def load_config(data: Mapping[str, Any] | None = None, **overrides: Any) -> EngineConfig:
    """Validate settings into an :class:`EngineConfig`; errors name the field (``ConfigError``)."""
    merged = {**(data or {}), **overrides}
    try:
        return EngineConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None


def describe_validation_error(exc: ValidationError) -> str:
    """``field.path: message`` per error, one per line; an unknown key gets a "did you mean"
    (a misspelling, or a field that belongs elsewhere, e.g. ``statistics.comparisons``)."""
    lines = []
    for error in exc.errors(include_url=False):
        parts = [str(part) for part in error["loc"]]
        loc = ".".join(parts)
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown setting" + unknown_hint(parts)
        lines.append(f"{loc}: {message}" if loc else message)
    return "\n".join(lines)


def unknown_hint(path: list[str]) -> str:
    """The "did you mean" of an unknown engine setting at ``path`` (``""`` if none is near);
    an ``engine`` section here is `evald run`'s settings file given where engine fields go."""
    from evald.suggest import did_you_mean

    if path == ["engine"]:
        return (
            " (this takes the engine fields themselves: the contents of an `evald run` "
            "settings file's engine section)"
        )
    return did_you_mean(EngineConfig, path)


def read_mapping_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML (or JSON) settings file as a mapping; an empty file is an empty mapping.

    Shared by `evald replay --config` and `evald run --config`, which wrap the ``ConfigError``
    (its message starts with the path) in their own error type.
    """
    from evald.settings_file import SettingsFileError, read_settings_file

    try:
        data = read_settings_file(path)
    except SettingsFileError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data
