"""Batched ranking measures with trec_eval / ir_measures semantics.

``evaluate(parse_measures("nDCG@10,RR"), Batch.from_lists(...))`` returns one float64 array of
shape (n,) per measure. ``mean_of`` turns those into the single number per measure that reports
and dashboards show (a weighted mean for aggregates such as GAUC).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from evald.metrics import kernels
from evald.metrics.batch import Batch
from evald.metrics.names import (
    DEFAULT_MEASURES,
    FAMILIES,
    Measure,
    MeasureError,
    labelled_measures,
    make_measure,
    parse_measure,
    parse_measures,
    required_depth,
    valid_forms,
)

__all__ = [
    "DEFAULT_MEASURES",
    "FAMILIES",
    "Batch",
    "Measure",
    "MeasureError",
    "evaluate",
    "from_mean",
    "labelled_measures",
    "make_measure",
    "mean_of",
    "mean_terms",
    "parse_measure",
    "parse_measures",
    "required_depth",
    "valid_forms",
    "value_range",
    "weights_of",
]

_Kernel = Callable[[Measure, Batch], np.ndarray]


def _k(m: Measure) -> int:
    """The cutoff of a family that requires one (make_measure refuses such a measure without)."""
    assert m.cutoff is not None
    return m.cutoff


def _exp(m: Measure) -> bool:
    return m["dcg"] == "exp-log2"


_KERNELS: dict[str, _Kernel] = {
    "P": lambda m, b: kernels.precision(b.grades, m["rel"], _k(m)),
    "R": lambda m, b: kernels.recall(b.grades, b.ideal, m["rel"], m.cutoff),
    "F1": lambda m, b: kernels.f1(b.grades, b.ideal, m["rel"], _k(m)),
    "CG": lambda m, b: kernels.cg(b.grades, m.cutoff),
    "DCG": lambda m, b: _dcg(m, b),
    "nDCG": lambda m, b: _ndcg(m, b),
    "AP": lambda m, b: kernels.average_precision(
        b.grades, b.ideal, m["rel"], m.cutoff, m["denom"] == "min"
    ),
    "RR": lambda m, b: kernels.reciprocal_rank(b.grades, m["rel"], m.cutoff),
    "Success": lambda m, b: kernels.success(b.grades, m["rel"], _k(m)),
    "RBP": lambda m, b: kernels.rbp(
        b.grades, b.ideal, m["p"], None if m["graded"] else m["rel"], m.cutoff
    ),
    "RBPResidual": lambda m, b: kernels.rbp_residual(
        b.judged, b.lengths, b.ideal, m["p"], m.cutoff
    ),
    "ERR": lambda m, b: kernels.err(b.grades, m["gmax"], m.cutoff),
    "AUC": lambda m, b: kernels.auc(b.grades, b.judged, m["rel"])[0],
    "GAUC": lambda m, b: kernels.auc(b.grades, b.judged, m["rel"])[0],
    "KendallTau": lambda m, b: kernels.kendall_tau_b(b.grades, b.judged),
    "Rprec": lambda m, b: kernels.r_precision(b.grades, b.ideal, m["rel"]),
    "Bpref": lambda m, b: kernels.bpref(b.grades, b.judged, b.ideal, b.judged_total, m["rel"]),
    "infAP": lambda m, b: kernels.inferred_ap(b.grades, b.judged, b.ideal, m["rel"]),
    "GMAP": lambda m, b: kernels.average_precision(b.grades, b.ideal, m["rel"], None, False),
    "NumRet": lambda m, b: b.lengths.astype(np.float64),
    "NumRel": lambda m, b: kernels.relevant_count(b.ideal, m["rel"]).astype(np.float64),
    "NumRelRet": lambda m, b: kernels.relevant_retrieved(b.grades, m["rel"]),
    "SetP": lambda m, b: kernels.set_precision(b.grades, b.lengths, m["rel"]),
    "SetR": lambda m, b: kernels.set_recall(b.grades, b.ideal, m["rel"]),
    "SetF": lambda m, b: kernels.set_f(b.grades, b.lengths, b.ideal, m["rel"], m["beta"]),
    "Judged": lambda m, b: kernels.judged_at(b.judged, _k(m)),
    "IPrec": lambda m, b: kernels.interpolated_precision(
        b.grades, b.lengths, b.ideal, m["rel"], (m["recall"],)
    )[0],
    "IPrec11pt": lambda m, b: kernels.eleven_point_average(b.grades, b.lengths, b.ideal, m["rel"]),
}


def _gains(m: Measure, b: Batch) -> tuple[np.ndarray, np.ndarray]:
    return kernels.gain_dcg(b.grades, b.judged, b.ideal, b.judged_total, dict(m["gains"]), m.cutoff)


def _dcg(m: Measure, b: Batch) -> np.ndarray:
    if m["gains"] is not None:
        return _gains(m, b)[0]
    return kernels.dcg(b.grades, m.cutoff, _exp(m))


def _ndcg(m: Measure, b: Batch) -> np.ndarray:
    if m["gains"] is not None:
        found, ideal = _gains(m, b)
        return kernels._ratio(found, ideal)
    return kernels.ndcg(b.grades, b.ideal, m.cutoff, _exp(m))


#: Measures whose mean over lists is not the plain mean of their per-list values: the values
#: are mapped (``mean_terms``), averaged, and the average mapped back (``from_mean``).
GEOMETRIC = frozenset({"GMAP"})


def mean_terms(measure: Measure, values: np.ndarray) -> np.ndarray:
    """What is averaged for the measure: the values, or (GMAP) log(max(AP, 0.00001))."""
    return kernels.geometric_terms(values) if measure.family in GEOMETRIC else values


#: families whose values have no upper bound: gains summed (DCG, CG) and counts
UNBOUNDED = frozenset({"DCG", "CG", "NumRet", "NumRel", "NumRelRet"})


def value_range(measure: Measure) -> tuple[float, float] | None:
    """The range of :func:`mean_terms`' values: [0, 1] for most measures, [-1, 1] for
    KendallTau, [log 0.00001, 0] for GMAP's log terms; None when unbounded (sums of gains,
    counts, negative gains)."""
    gains = dict(measure.params).get("gains") or ()
    if measure.family in UNBOUNDED or any(gain < 0 for _, gain in gains):
        return None  # a negative gain (trec_eval ndcg.0=-1) can take nDCG out of [0, 1]
    if measure.family == "KendallTau":
        return -1.0, 1.0
    if measure.family in GEOMETRIC:
        return math.log(kernels.MIN_GEO_MEAN), 0.0
    return 0.0, 1.0


def from_mean(measure: Measure, mean: float) -> float:
    """The reported mean from the average of :func:`mean_terms` (GMAP: its exponential)."""
    return float(np.exp(mean)) if measure.family in GEOMETRIC else mean


def _check_depth(measures: Sequence[Measure], batch: Batch) -> None:
    """Refuse to score a measure on a batch cut shorter than the ranks it reads."""
    if not batch.truncated:
        return
    for measure in measures:
        needed = required_depth([measure])
        if needed is None or needed > batch.depth:
            raise ValueError(
                f"{measure} reads {'the whole list' if needed is None else f'{needed} ranks'} "
                f"but the batch was built with depth={batch.depth}; build it with "
                "depth=required_depth(measures)"
            )


def evaluate(measures: Sequence[Measure], batch: Batch) -> dict[Measure, np.ndarray]:
    """Score every list of the batch: {measure: float64 array (n,)} in the given order."""
    _check_depth(measures, batch)
    out: dict[Measure, np.ndarray] = {}
    for measure in measures:
        values = _KERNELS[measure.family](measure, batch)
        out[measure] = np.ascontiguousarray(values, dtype=np.float64)
    return out


def weights_of(measure: Measure, batch: Batch) -> np.ndarray:
    """Weight of each list in the measure's mean: 1 each, except GAUC (see kernels.auc).

    Sums of ``weights * values`` and of ``weights`` are mergeable across batches.
    """
    if measure.family == "GAUC":
        _check_depth([measure], batch)
        return kernels.auc(batch.grades, batch.judged, measure["rel"])[1]
    return np.ones(batch.n, dtype=np.float64)


def mean_of(measure: Measure, values: np.ndarray, batch: Batch) -> float:
    """The one number reported for a measure over a batch; 0.0 when no list has weight."""
    weights = weights_of(measure, batch)
    total = float(weights.sum())
    if total <= 0:
        return 0.0
    return from_mean(measure, float(np.dot(weights, mean_terms(measure, values)) / total))
