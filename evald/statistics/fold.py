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
* per comparison segment, ``SampleRatio`` on the arm counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from evald.config import ComparisonConfig, StatisticsConfig
from evald.statistics.cusum import Cusum, difference_z
from evald.statistics.intervals import Moments
from evald.statistics.sequential import Comparison, SequenceBound
from evald.statistics.srm import SampleRatio

__all__ = ["ComparisonState", "Rest", "arm_moments", "fold_window"]

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
    baseline: dict[Key, tuple[Moments, ...]] = field(default_factory=dict)  # oldest first
    ratio: dict[Rest, SampleRatio] = field(default_factory=dict)

    def alpha(self, settings: StatisticsConfig) -> float:
        """The level each sequence runs at: the family rate split over the family."""
        return settings.alpha / self.family

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
            table("baseline", lambda ms: tuple(Moments.from_json(m) for m in ms)),
            {_rest_of(r): SampleRatio.from_json(v) for r, v in data["ratio"]},
        )


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
    }


def _bound_of(data: dict[str, Any]) -> SequenceBound:
    return SequenceBound(
        float(data["difference"]),
        float(data["low"]),
        float(data["high"]),
        float(data["evalue"]),
        int(data["n_control"]),
        int(data["n_treatment"]),
    )


def alerting_measures(comparison: ComparisonConfig, measures: Sequence[str]) -> list[str]:
    """The measures that alert: those with a minimum effect, or every measure if none has one."""
    return [m for m in measures if m in comparison.min_effect] or list(measures)


def arm_moments(
    comparison: ComparisonConfig,
    measures: Sequence[str],
    segments: Iterable[tuple[dict[str, str], np.ndarray]],
) -> dict[tuple[str, Rest], list[Moments]]:
    """(arm, comparison segment) -> one ``Moments`` per measure, from (labels, (M, 3) sums)
    pairs; segments of other arms (or none) are left out."""
    arms = {comparison.control, *comparison.treatments}
    dropped = {comparison.label, *comparison.arm_scoped_labels}
    acc: dict[tuple[str, Rest], np.ndarray] = {}
    for labels, sums in segments:
        arm = labels.get(comparison.label)
        if arm not in arms:
            continue
        rest = tuple((k, v) for k, v in labels.items() if k not in dropped)
        key = (arm, rest)
        if key in acc:
            acc[key] = acc[key] + sums
        else:
            acc[key] = np.array(sums, dtype=np.float64)
    return {
        key: [Moments(round(n), s, q) for n, s, q in arr.tolist()]
        for key, arr in sorted(acc.items())
        if len(arr) == len(measures)
    }


def fold_window(
    state: ComparisonState,
    comparison: ComparisonConfig,
    settings: StatisticsConfig,
    measures: Sequence[str],
    segments: Iterable[tuple[dict[str, str], np.ndarray]],
) -> ComparisonState:
    """Fold one complete window (at or after the comparison's start) into ``state``.

    The steps, in order: (1) sum the window per (arm, comparison segment); (2) grow the family
    by comparison segments seen for the first time; (3) per comparison segment, the sample-ratio
    guard on the arm counts (lists: the largest finite count over the measures); (4) per
    treatment and measure, one look of the sequence at α/m and one CUSUM step on treatment −
    control; (5) per arm and measure, one CUSUM step against the trailing baseline, then the
    window joins that baseline.
    """
    by_arm = arm_moments(comparison, measures, segments)
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
    empty = [Moments()] * len(measures)
    split = [1.0] * len(arms) if comparison.split is None else [comparison.split[a] for a in arms]
    alpha = new.alpha(settings)
    for rest in present:
        window = {arm: by_arm.get((arm, rest), empty) for arm in arms}
        counts = [max(m.n for m in window[arm]) for arm in arms]
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
                cusum = new.vs_control.get(key, Cusum())
                new.vs_control[key] = cusum.step(
                    difference_z(c, t),
                    min(c.n, t.n),
                    settings.cusum_k,
                    settings.cusum_h,
                    settings.cusum_min_n,
                )
        for arm in arms:
            for j, measure in enumerate(measures):
                _baseline_step(new, settings, (arm, rest, measure), window[arm][j])
    return new


def _baseline_step(
    state: ComparisonState, settings: StatisticsConfig, key: Key, window: Moments
) -> None:
    """One window of an arm against the sum of its trailing baseline windows (in place on the
    fresh dicts of ``fold_window``'s new state)."""
    trailing = state.baseline.get(key, ())
    if trailing:
        reference = sum(trailing, Moments())
        cusum = state.vs_baseline.get(key, Cusum())
        state.vs_baseline[key] = cusum.step(
            difference_z(reference, window),
            window.n,
            settings.cusum_k,
            settings.cusum_h,
            settings.cusum_min_n,
        )
    if window.n:
        state.baseline[key] = (*trailing, window)[-settings.baseline_windows :]
