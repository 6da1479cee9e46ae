"""LiveStatistics: the fold of every comparison over the partitions' final shares.

A comparison window is folded once *every* partition's share of it is final
(evald/statistics/shares.py: a partition's watermark passed the window's end by the attribution
window), in window order, from the sum of the shares. A share counts once per (window,
partition): a copy that arrives again is ignored, and so is a share of a window already folded.
The shares depend only on each partition's events, so the fold does not depend on which
instance computed which share: the engine feeds its own shares (replay, the demo: it sees every
partition), the daemon feeds the shares every instance wrote to the statistics topic
(evald/daemon/main/comparisons.py), and both run this same code (docs/design.md, "Statistics over
all partitions").
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from evald.config import ComparisonConfig, EngineConfig
from evald.input_rule import time_in_words
from evald.statistics.clustered import replicates_of
from evald.statistics.fold import ComparisonState, Key, Rest, alerting_measures, fold_window
from evald.statistics.gate import ShareGate
from evald.statistics.shares import Frozen, Labels, Share, add_sums

__all__ = ["SIGNALS", "ComparisonView", "Detection", "LiveStatistics"]

log = logging.getLogger(__name__)

#: the signals whose first look is kept: the band first excluding 0 (``excluded``) and first
#: wholly below minus the minimum effect (``below``), keyed by (treatment, segment, measure);
#: the CUSUM against control (``cusum``) keyed alike; an arm's CUSUM against its trailing
#: baseline (``baseline``), keyed by (arm, segment, measure)
SIGNALS = ("excluded", "below", "cusum", "baseline")


@dataclass(frozen=True)
class Detection:
    """The first look at which a signal fired: the end of that window (event time, ms), its
    number since the start (1 = the first window folded) and the values at that look."""

    end_ms: int
    window: int
    values: dict[str, float | int | None]


@dataclass(frozen=True)
class ComparisonView:
    """One comparison's settings and its folded state, as the exposition and replay read it.

    ``detected``: per key and signal (``SIGNALS``), the first look where it fired.
    """

    config: ComparisonConfig
    state: ComparisonState
    first_end_ms: int | None  # end of the first window folded
    last_end_ms: int | None  # end of the last window folded
    detected: dict[tuple[Key, str], Detection] = field(default_factory=dict)


class LiveStatistics:
    """The folded statistics of every configured comparison, from the partitions' shares.

    Thread-safe: the daemon's statistics reader adds and folds while scrapes read ``views``.
    """

    def __init__(self, config: EngineConfig, measures: Sequence[str]) -> None:
        self.settings = config.statistics
        self.measures = list(measures)
        self.width = self.settings.window
        self._lock = threading.Lock()
        self._states = {c.name: ComparisonState() for c in self.settings.comparisons}
        self._first: dict[str, int | None] = dict.fromkeys(self._states)
        self._last_end: int | None = None  # end of the last window folded
        self._detected: dict[str, dict[tuple[Key, str], Detection]] = {n: {} for n in self._states}
        #: called after each window a comparison folds, with its view at that look (replay's
        #: ``--looks``); under the lock, so it must not call back into this object
        self.on_look: Callable[[ComparisonView], None] | None = None
        #: the shares until their window is complete in every partition
        self._gate: ShareGate[Share] = ShareGate(self.width)
        self._other_replicates: set[int] = set()  # B of shares summed with another B, warned

    @property
    def ignored(self) -> int:
        """Shares ignored: a second copy of a (window, partition), or one of a folded window."""
        with self._lock:
            return self._gate.ignored

    def add(self, frozen: Frozen | Share) -> None:
        """A final share, or a partition's final mark (a ``Frozen`` carries both)."""
        with self._lock:
            if isinstance(frozen, Share):
                self._gate.add(frozen)
                return
            for share in frozen.shares:
                self._gate.add(share)
            self._gate.mark(frozen.partition, frozen.final_until)

    def final_until(self, partitions: Iterable[int] | None = None) -> int | None:
        """The least final mark over ``partitions`` (None: those that sent one); None while
        one of them has none."""
        with self._lock:
            return self._gate.final_until(partitions)

    def unmarked(self, partitions: Iterable[int]) -> list[int]:
        """The partitions with no final mark yet: each holds every window's fold back."""
        with self._lock:
            return self._gate.unmarked(partitions)

    def fold(self, partitions: Iterable[int] | None = None) -> int:
        """Fold, in window order, every window final in all ``partitions`` (None: every
        partition that sent a mark); returns how many windows held data."""
        with self._lock:
            complete = self._gate.complete(partitions)
            for start, shares in complete:
                self._fold(start, start + self.width, shares)
        return len(complete)

    def _fold(self, start: int, end: int, shares: list[Share]) -> None:
        total: dict[Labels, np.ndarray] = {}
        for share in shares:  # in (partition, chunk) order: the same sums wherever folded
            for labels, sums in share.segments:
                self._note_replicates(start, sums)
                before = total.get(labels)
                total[labels] = sums if before is None else add_sums(before, sums)
        segments = [(dict(labels), total[labels]) for labels in sorted(total)]
        if not segments:
            return
        for comp in self.settings.comparisons:
            if start < comp.start:
                continue
            prior = self._states[comp.name]
            state = fold_window(prior, comp, self.settings, self.measures, segments)
            if state is prior:
                continue
            if self._first[comp.name] is None:
                self._first[comp.name] = end
            self._states[comp.name] = state
            self._note_detections(comp, state, end)
            if self.on_look is not None:
                self._last_end = end
                self.on_look(self._views([comp.name])[0])
        self._last_end = end

    def _note_replicates(self, start: int, sums: np.ndarray) -> None:
        """Warn once per B when a share was summed with replicates of another B than the
        settings' (``bootstrap_replicates`` changed between two runs): sums of two B add up at
        list level only, so a comparison's sequence stays list level from that window on."""
        replicates = replicates_of(sums.shape[1] if sums.ndim == 2 else 0)
        wanted = self.settings.bootstrap_replicates
        if replicates in (0, wanted) or replicates in self._other_replicates:
            return
        self._other_replicates.add(replicates)
        log.warning(
            "statistics: the window from %s was summed with bootstrap_replicates %d, not %d: "
            "comparisons reading it fold at list level (not clustered by user) from then on; "
            "give them a later start to have clustered bands again",
            time_in_words(start),
            replicates,
            wanted,
        )

    def _note_detections(self, comp: ComparisonConfig, state: ComparisonState, end: int) -> None:
        seen = self._detected[comp.name]

        def note(key: Key, signal: str, values: dict[str, float | int | None]) -> None:
            if (key, signal) not in seen:
                seen[(key, signal)] = Detection(end, state.windows, values)

        for key, bound in state.bounds.items():
            band: dict[str, float | int | None] = {
                "difference": bound.difference,
                "lower": bound.low,
                "upper": bound.high,
                "p_value": bound.p_value,
                "n_control": bound.n_control,
                "n_treatment": bound.n_treatment,
            }
            if not bound.low <= 0.0 <= bound.high and math.isfinite(bound.low):
                note(key, "excluded", band)
            effect = comp.min_effect.get(key[2])
            if effect is not None and bound.high < -effect:
                note(key, "below", band)
        for signal, table in (("cusum", state.vs_control), ("baseline", state.vs_baseline)):
            for key, cusum in table.items():
                if cusum.alarmed:  # the run: the windows since the statistic was last 0
                    values = {"statistic": cusum.statistic, "windows": cusum.windows}
                    note(key, signal, {**values, "run_windows": cusum.run_windows})

    def views(self) -> list[ComparisonView]:
        """Every comparison with its state (those with nothing folded yet too)."""
        with self._lock:
            return self._views()

    def _views(self, names: Sequence[str] | None = None) -> list[ComparisonView]:
        return [
            ComparisonView(
                c,
                self._states[c.name],
                self._first[c.name],
                self._last_end,
                dict(self._detected[c.name]),
            )
            for c in self.settings.comparisons
            if names is None or c.name in names
        ]

    def alerting_measures(self, comparison: ComparisonConfig) -> list[str]:
        return alerting_measures(comparison, self.measures)


def finite(x: float) -> float | None:
    """JSON-safe: None for NaN and infinities."""
    return x if math.isfinite(x) else None


def rest_text(rest: Rest) -> str:
    """``surface=home,locale=de`` (``-`` when the comparison has no other label)."""
    return ",".join(f"{k}={v}" for k, v in rest) or "-"


def _detection(view: ComparisonView, key: Key, signal: str) -> dict[str, object] | None:
    """A first look as JSON: the window's end (RFC 3339 and ms), its number and the values."""
    found = view.detected.get((key, signal))
    if found is None:
        return None
    values = {k: finite(v) if isinstance(v, float) else v for k, v in found.values.items()}
    return {"end": _rfc3339(found.end_ms), "end_ms": found.end_ms, "window": found.window, **values}


def summary(view: ComparisonView, settings_alpha: float) -> Iterator[dict[str, object]]:
    """One JSON-ready record per (treatment, comparison segment, measure) of a comparison: the
    state after the last look, and the first look of each signal (null: never fired)."""
    config, state = view.config, view.state
    srm = state.srm_p_values()
    for (treatment, rest, measure), seq in sorted(state.sequences.items()):
        key = (treatment, rest, measure)
        bound = state.bounds[key]
        effect = config.min_effect.get(measure)
        vs_control = state.vs_control[key]
        baseline = {
            arm: state.vs_baseline.get((arm, rest, measure)) for arm in (config.control, treatment)
        }
        yield {
            "comparison": config.name,
            "control": config.control,
            "treatment": treatment,
            "segment": dict(rest),
            "measure": measure,
            "window": state.windows,
            "end": None if view.last_end_ms is None else _rfc3339(view.last_end_ms),
            # the same instant as an int: a window ending past 9999 has a five-digit year
            "end_ms": view.last_end_ms,
            "variance": "user" if bound.clustered else "request",
            "lists_with_user": seq.control.users + seq.treatment.users,
            "difference": finite(bound.difference),
            "lower": finite(bound.low),
            "upper": finite(bound.high),
            "intersection_lower": None if seq.empty else finite(seq.low),
            "intersection_upper": None if seq.empty else finite(seq.high),
            "intersection_empty": seq.empty,
            "p_value": seq.p_value,
            "alpha": settings_alpha / state.family,
            "n_control": seq.control.n,
            "n_treatment": seq.treatment.n,
            "min_effect": effect,
            "below_min_effect": effect is not None and bound.high < -effect,
            "cusum_vs_control": vs_control.statistic,
            "cusum_alarm_window": vs_control.alarm_window,
            # the windows of the CUSUM's current run (since it was last 0): the drop it sees
            "cusum_run_windows": vs_control.run_windows if vs_control.statistic > 0 else 0,
            "cusum_vs_baseline": {
                arm: None if c is None else c.statistic for arm, c in baseline.items()
            },
            "srm_p_value": srm[rest],
            "first": {
                "excluded": _detection(view, key, "excluded"),
                "below": _detection(view, key, "below"),
                "cusum_vs_control": _detection(view, key, "cusum"),
                "cusum_vs_baseline": {
                    arm: _detection(view, (arm, rest, measure), "baseline") for arm in baseline
                },
            },
        }


def _rfc3339(ms: int) -> str:
    from evald.events import format_timestamp

    return format_timestamp(ms)
