"""LiveStatistics: runs the fold over the engine's complete windows as the watermarks pass them.

The engine calls ``advance`` after scoring and before pruning, so every window is folded while
its sums are still held. Only windows that are complete over every partition the engine holds
are folded, each once, in window order; data that lands in a window after it was folded (late
impressions) is left out of the fold, as it is left out of the window already reported.

The fold is global only when the engine sees every input partition (replay, the demo): the
daemon, where an instance owns a subset, does not build one (docs/statistics.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from evald.config import ComparisonConfig, EngineConfig
from evald.statistics.fold import ComparisonState, Key, Rest, alerting_measures, fold_window

if TYPE_CHECKING:
    from evald.aggregate import Aggregates

__all__ = ["ComparisonView", "LiveStatistics"]


@dataclass(frozen=True)
class ComparisonView:
    """One comparison's settings and its folded state, as the exposition and replay read it.

    ``detected``: per (treatment, comparison segment, measure) and signal (``cusum``: the
    CUSUM against control first above h; ``below``: the sequence first wholly below minus the
    minimum effect), the end of the window where it first happened.
    """

    config: ComparisonConfig
    state: ComparisonState
    first_end_ms: int | None  # end of the first window folded
    last_end_ms: int | None  # end of the last window folded
    detected: dict[tuple[Key, str], int] = field(default_factory=dict)


class LiveStatistics:
    """The folded statistics of every configured comparison; one per engine."""

    def __init__(self, config: EngineConfig, measures: Sequence[str]) -> None:
        self.settings = config.statistics
        self.measures = list(measures)
        self.width = self.settings.window
        self._states = {c.name: ComparisonState() for c in self.settings.comparisons}
        self._first: dict[str, int | None] = dict.fromkeys(self._states)
        self._next: int | None = None  # start of the next window to fold
        self._last_end: int | None = None  # end of the last window folded
        self._detected: dict[str, dict[tuple[Key, str], int]] = {n: {} for n in self._states}

    def advance(self, aggregates: Aggregates, complete_before: int | None, final: bool) -> int:
        """Fold every window that ends at or before ``complete_before`` (``final``: every
        window holding data); returns how many were folded."""
        span = aggregates.bucket_range()
        if span is None:
            return 0
        width = self.width
        first = span[0] * aggregates.bucket_ms // width * width
        if self._next is None:
            self._next = first
        if final:
            limit = -(-(span[1] + 1) * aggregates.bucket_ms // width) * width
        elif complete_before is None:
            return 0
        else:
            limit = complete_before // width * width
        folded = 0
        while self._next + width <= limit:
            start = self._next
            self._fold(aggregates, start, start + width)
            self._next = start + width
            folded += 1
        return folded

    def _fold(self, aggregates: Aggregates, start: int, end: int) -> None:
        sums = aggregates.window_sums(start, end)
        segments = [
            (aggregates.segments.labels_of(i), per_measure)
            for i, per_measure in enumerate(sums)
            if per_measure[:, 0].any()
        ]
        if not segments:
            return
        for comp in self.settings.comparisons:
            if start < comp.start:
                continue
            before = self._states[comp.name]
            state = fold_window(before, comp, self.settings, self.measures, segments)
            if state is not before and self._first[comp.name] is None:
                self._first[comp.name] = end
            self._states[comp.name] = state
            self._note_detections(comp, state, end)
        self._last_end = end

    def _note_detections(self, comp: ComparisonConfig, state: ComparisonState, end: int) -> None:
        seen = self._detected[comp.name]
        for key, cusum in state.vs_control.items():
            if cusum.alarmed and (key, "cusum") not in seen:
                seen[(key, "cusum")] = end
        for key, bound in state.bounds.items():
            effect = comp.min_effect.get(key[2])
            if effect is not None and bound.high < -effect and (key, "below") not in seen:
                seen[(key, "below")] = end

    def views(self) -> list[ComparisonView]:
        """Every comparison with its state (those with nothing folded yet too)."""
        return [
            ComparisonView(
                c,
                self._states[c.name],
                self._first[c.name],
                self._last_end,
                dict(self._detected[c.name]),
            )
            for c in self.settings.comparisons
        ]

    def alerting_measures(self, comparison: ComparisonConfig) -> list[str]:
        return alerting_measures(comparison, self.measures)


def finite(x: float) -> float | None:
    """JSON-safe: None for NaN and infinities."""
    return x if math.isfinite(x) else None


def rest_text(rest: Rest) -> str:
    """``surface=home,locale=de`` (``-`` when the comparison has no other label)."""
    return ",".join(f"{k}={v}" for k, v in rest) or "-"


def summary(view: ComparisonView, settings_alpha: float) -> Iterator[dict[str, object]]:
    """One JSON-ready record per (treatment, comparison segment, measure) of a comparison."""
    config, state = view.config, view.state
    for (treatment, rest, measure), seq in sorted(state.sequences.items()):
        bound = state.bounds[(treatment, rest, measure)]
        effect = config.min_effect.get(measure)
        vs_control = state.vs_control[(treatment, rest, measure)]
        yield {
            "comparison": config.name,
            "control": config.control,
            "treatment": treatment,
            "segment": dict(rest),
            "measure": measure,
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
            "srm_p_value": state.ratio[rest].p_value,
        }
