"""Batched ranking measures with trec_eval / ir_measures semantics.

``evaluate(parse_measures("nDCG@10,RR"), Batch.from_lists(...))`` returns one float64 array of
shape (n,) per measure. ``mean_of`` turns those into the single number per measure that reports
and dashboards show (a weighted mean for aggregates such as GAUC).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from evald.metrics import kernels
from evald.metrics.batch import Batch
from evald.metrics.families import FAMILIES, GEOMETRIC
from evald.metrics.names import (
    DEFAULT_MEASURES,
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


def mean_terms(measure: Measure, values: np.ndarray) -> np.ndarray:
    """What is averaged for the measure: the values, or (GMAP) log(max(AP, 0.00001))."""
    geometric = FAMILIES[measure.family].aggregation == GEOMETRIC
    return kernels.geometric_terms(values) if geometric else values


def value_range(measure: Measure) -> tuple[float, float] | None:
    """The range of :func:`mean_terms`' values: [0, 1] for most measures, [-1, 1] for
    KendallTau, [log 0.00001, 0] for GMAP's log terms; None when unbounded (sums of gains,
    counts, negative gains)."""
    gains = dict(measure.params).get("gains") or ()
    if any(gain < 0 for _, gain in gains):
        return None  # a negative gain (trec_eval ndcg.0=-1) can take nDCG out of [0, 1]
    return FAMILIES[measure.family].span


def from_mean(measure: Measure, mean: float) -> float:
    """The reported mean from the average of :func:`mean_terms` (GMAP: its exponential)."""
    geometric = FAMILIES[measure.family].aggregation == GEOMETRIC
    return float(np.exp(mean)) if geometric else mean


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
        values = FAMILIES[measure.family].kernel(measure, batch)
        out[measure] = np.ascontiguousarray(values, dtype=np.float64)
    return out


def weights_of(measure: Measure, batch: Batch) -> np.ndarray:
    """Weight of each list in the measure's mean: 1 each, except a ``WEIGHTED`` family's
    (GAUC: see kernels.auc).

    Sums of ``weights * values`` and of ``weights`` are mergeable across batches.
    """
    weights = FAMILIES[measure.family].weights
    if weights is not None:
        _check_depth([measure], batch)
        return weights(measure, batch)
    return np.ones(batch.n, dtype=np.float64)


def mean_of(measure: Measure, values: np.ndarray, batch: Batch) -> float:
    """The one number reported for a measure over a batch; 0.0 when no list has weight."""
    weights = weights_of(measure, batch)
    total = float(weights.sum())
    if total <= 0:
        return 0.0
    return from_mean(measure, float(np.dot(weights, mean_terms(measure, values)) / total))
