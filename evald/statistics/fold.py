"""The fold: complete windows' sums, in window order, into each comparison's statistics.

Pure: the state after a window depends only on the state before it, the window's sums per
segment and the settings. The sums add across partitions and instances, so the state does not
depend on who computed which share (tested: any partitioning gives the same state), and replay,
the demo and the engine run this same fold.

Per configured comparison, per *comparison segment* (the segment labels without the arm label
and the arm-scoped labels such as ``model``) and per measure:

* ``Comparison`` — the always-valid confidence sequence on treatment − control since the
  declared start, at α/m (Bonferroni over the family: treatments × alerting measures ×
  comparison segments), so the bands of the whole family hold together with rate α;
* ``Cusum`` on treatment − control standardized window means (``vs_control``) and on each
  arm's window mean against its own trailing baseline (``vs_baseline``);
* per comparison segment and pooled over them, ``SampleRatio`` on the arm counts.

Every variance is clustered by user when the window sums carry the bootstrap's replicate sums
and some list had a user id (clustered.py); sums of 3 columns (n, Σy, Σy²) give the list-level
statistics, the request-level fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from evald.config import ComparisonConfig, StatisticsConfig
from evald.statistics.clustered import ClusterSums, Contrast, contrast, sums_of_rows
from evald.statistics.cusum import Cusum
from evald.statistics.sequential import Comparison, SequenceBound
from evald.statistics.srm import SampleRatio, family_p_values

__all__ = ["ComparisonState", "Rest", "arm_sums", "fold_window", "standardized"]

#: A comparison segment: the (key, value) label pairs left once the arm labels are taken away.
Rest = tuple[tuple[str, str], ...]
#: (arm, comparison segment, measure)
Key = tuple[str, Rest, str]


@dataclass(frozen=True)
class ComparisonState:
    """Everything one comparison has folded; a new state per window (nothing is mutated)."""

    windows: int = 0  # windows folded since the start
    rests: tuple[Rest, ...] = ()  # comparison segments seen, in first-seen order
    family: int = 1  # m of the Bonferroni split
    sequences: dict[Key, Comparison] = field(default_factory=dict)  # keyed by treatment
    bounds: dict[Key, SequenceBound] = field(default_factory=dict)  # the last look's own
    vs_control: dict[Key, Cusum] = field(default_factory=dict)  # keyed by treatment
    vs_baseline: dict[Key, Cusum] = field(default_factory=dict)  # keyed by arm
    baseline: dict[Key, tuple[ClusterSums, ...]] = field(default_factory=dict)  # oldest first
    ratio: dict[Rest, SampleRatio] = field(default_factory=dict)
    pooled_ratio: SampleRatio | None = None  # the guard over every comparison segment

    def alpha(self, settings: StatisticsConfig) -> float:
        """The level each sequence runs at: the family rate split over the family."""
        return settings.alpha / self.family

    def srm_p_values(self) -> dict[Rest, float]:
        """Per comparison segment, the family-wise p-value of its sample-ratio guards (its own
        and the pooled one, ``family_p_values``): not trusted while below ``srm_alpha``."""
        raw = {rest: ratio.p_value for rest, ratio in self.ratio.items()}
        pooled = 1.0 if self.pooled_ratio is None else self.pooled_ratio.p_value
        return family_p_values(pooled, raw)

    def to_json(self) -> dict[str, object]:
        """A JSON-safe form for a checkpoint (non-finite numbers as strings)."""

        def pairs(table: dict[Key, Any], value: Callable[[Any], object]) -> list[object]:
            return [[_key_json(k), value(v)] for k, v in table.items()]

        return {
            "windows": self.windows,
            "rests": [_rest_json(r) for r in self.rests],
            "family": self.family,
            "sequences": pairs(self.sequences, Comparison.to_json),
            "bounds": pairs(self.bounds, _bound_json),
            "vs_control": pairs(self.vs_control, Cusum.to_json),
            "vs_baseline": pairs(self.vs_baseline, Cusum.to_json),
            "baseline": pairs(self.baseline, lambda ms: [m.to_json() for m in ms]),
            "ratio": [[_rest_json(r), v.to_json()] for r, v in self.ratio.items()],
            "pooled_ratio": None if self.pooled_ratio is None else self.pooled_ratio.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComparisonState:
        def table(name: str, value: Callable[[Any], Any]) -> dict[Key, Any]:
            return {_key_of(k): value(v) for k, v in data[name]}

        return cls(
            int(data["windows"]),
            tuple(_rest_of(r) for r in data["rests"]),
            int(data["family"]),
            table("sequences", Comparison.from_json),
            table("bounds", _bound_of),
            table("vs_control", Cusum.from_json),
            table("vs_baseline", Cusum.from_json),
            table("baseline", lambda ms: tuple(ClusterSums.from_json(m) for m in ms)),
            {_rest_of(r): SampleRatio.from_json(v) for r, v in data["ratio"]},
            _ratio_of(data.get("pooled_ratio")),
        )


def _ratio_of(data: dict[str, Any] | None) -> SampleRatio | None:
    return None if data is None else SampleRatio.from_json(data)


def _rest_json(rest: Rest) -> list[list[str]]:
    return [[k, v] for k, v in rest]


def _rest_of(data: list[list[str]]) -> Rest:
    return tuple((str(k), str(v)) for k, v in data)


def _key_json(key: Key) -> list[object]:
    return [key[0], _rest_json(key[1]), key[2]]


def _key_of(data: list[Any]) -> Key:
    return (str(data[0]), _rest_of(data[1]), str(data[2]))


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def _bound_json(b: SequenceBound) -> dict[str, object]:
    return {
        "difference": _num(b.difference),
        "low": _num(b.low),
        "high": _num(b.high),
        "evalue": _num(b.evalue),
        "n_control": b.n_control,
        "n_treatment": b.n_treatment,
        "clustered": b.clustered,
    }


def _bound_of(data: dict[str, Any]) -> SequenceBound:
    return SequenceBound(
        float(data["difference"]),
        float(data["low"]),
        float(data["high"]),
        float(data["evalue"]),
        int(data["n_control"]),
        int(data["n_treatment"]),
        bool(data.get("clustered", False)),
    )


def alerting_measures(comparison: ComparisonConfig, measures: Sequence[str]) -> list[str]:
    """The measures that alert: those with a minimum effect, or every measure if none has one."""
    return [m for m in measures if m in comparison.min_effect] or list(measures)


def arm_sums(
    comparison: ComparisonConfig,
    measures: Sequence[str],
    segments: Iterable[tuple[dict[str, str], np.ndarray]],
) -> dict[tuple[str, Rest], list[ClusterSums]]:
    """(arm, comparison segment) -> one ``ClusterSums`` per measure, from (labels, (M, columns)
    sums) pairs (clustered.row_width: 3 columns are list level); segments of other arms (or
    none) are left out. Rows of 3 columns summed with wider ones keep their 3: the replicates
    of such a sum are unknown."""
    arms = {comparison.control, *comparison.treatments}
    dropped = {comparison.label, *comparison.arm_scoped_labels}
    acc: dict[tuple[str, Rest], list[np.ndarray]] = {}
    for labels, sums in segments:
        arm = labels.get(comparison.label)
        if arm not in arms:
            continue
        rest = tuple((k, v) for k, v in labels.items() if k not in dropped)
        acc.setdefault((arm, rest), []).append(np.asarray(sums, dtype=np.float64))
    out: dict[tuple[str, Rest], list[ClusterSums]] = {}
    for key, parts in sorted(acc.items()):
        width = min(p.shape[1] for p in parts)
        total = parts[0][:, :width].copy()
        for part in parts[1:]:
            total += part[:, :width]
        if len(total) == len(measures):
            out[key] = sums_of_rows(total)
    return out


def standardized(c: Contrast) -> tuple[float, np.ndarray | None]:
    """z = Δ/√V of a contrast, and its replicate deviations D_b/√V when clustered (NaN z when
    the variance is not positive)."""
    if not c.variance > 0:
        return math.nan, None
    scale = math.sqrt(c.variance)
    replicates = None if c.replicates is None else c.replicates / scale
    return c.difference / scale, replicates


def fold_window(
    state: ComparisonState,
    comparison: ComparisonConfig,
    settings: StatisticsConfig,
    measures: Sequence[str],
    segments: Iterable[tuple[dict[str, str], np.ndarray]],
) -> ComparisonState:
    """Fold one complete window (at or after the comparison's start) into ``state``.

    The steps, in order: (1) sum the window per (arm, comparison segment); (2) grow the family
    by comparison segments seen for the first time; (3) the sample-ratio guards on the arm
    counts (lists: the largest finite count over the measures), per comparison segment and
    pooled; (4) per treatment and measure, one look of the sequence at α/m and one CUSUM step
    on treatment − control; (5) per arm and measure, one CUSUM step against the trailing
    baseline, then the window joins that baseline.
    """
    by_arm = arm_sums(comparison, measures, segments)
    if not by_arm:
        return state
    arms = [comparison.control, *comparison.treatments]
    present = sorted({rest for _arm, rest in by_arm})
    rests = state.rests + tuple(r for r in present if r not in state.rests)
    family = len(comparison.treatments) * len(alerting_measures(comparison, measures)) * len(rests)
    new = replace(
        state,
        windows=state.windows + 1,
        rests=rests,
        family=family,
        sequences=dict(state.sequences),
        bounds=dict(state.bounds),
        vs_control=dict(state.vs_control),
        vs_baseline=dict(state.vs_baseline),
        baseline=dict(state.baseline),
        ratio=dict(state.ratio),
    )
    empty = [ClusterSums()] * len(measures)
    split = [1.0] * len(arms) if comparison.split is None else [comparison.split[a] for a in arms]
    alpha = new.alpha(settings)
    pooled = [0] * len(arms)
    for rest in present:
        window = {arm: by_arm.get((arm, rest), empty) for arm in arms}
        counts = [max(m.n for m in window[arm]) for arm in arms]
        pooled = [a + b for a, b in zip(pooled, counts, strict=True)]
        ratio = new.ratio.get(rest, SampleRatio((0,) * len(arms)))
        new.ratio[rest] = ratio.look(counts, split)
        control = window[comparison.control]
        for treatment in comparison.treatments:
            for j, measure in enumerate(measures):
                key = (treatment, rest, measure)
                seq = new.sequences.get(key, Comparison())
                c, t = control[j], window[treatment][j]
                new.sequences[key], new.bounds[key] = seq.look(
                    c, t, alpha, settings.tuning_n, settings.min_n
                )
                window_contrast = contrast(c, t)
                new.vs_control[key] = new.vs_control.get(key, Cusum()).step_contrast(
                    window_contrast.difference,
                    window_contrast.variance,
                    c.n,
                    t.n,
                    settings.cusum_k,
                    settings.cusum_h,
                    settings.cusum_min_n,
                    window_contrast.replicates,
                )
        for arm in arms:
            for j, measure in enumerate(measures):
                _baseline_step(new, settings, (arm, rest, measure), window[arm][j])
    before = new.pooled_ratio or SampleRatio((0,) * len(arms))
    return replace(new, pooled_ratio=before.look(pooled, split))


def _baseline_step(
    state: ComparisonState, settings: StatisticsConfig, key: Key, window: ClusterSums
) -> None:
    """One window of an arm against the sum of its trailing baseline windows (in place on the
    fresh dicts of ``fold_window``'s new state)."""
    trailing = state.baseline.get(key, ())
    if trailing:
        reference = sum(trailing[1:], trailing[0])
        z, replicates = standardized(contrast(reference, window))
        cusum = state.vs_baseline.get(key, Cusum())
        state.vs_baseline[key] = cusum.step(
            z,
            window.n,
            settings.cusum_k,
            settings.cusum_h,
            settings.cusum_min_n,
            replicates,
        )
    if window.n:
        state.baseline[key] = (*trailing, window)[-settings.baseline_windows :]
