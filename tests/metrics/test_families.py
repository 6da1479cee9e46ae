"""The measure-family table: every trait the other modules read comes from it, and what they
read is what they held as their own lists before the table existed."""

from __future__ import annotations

import math

import numpy as np

from evald.metrics import FAMILIES, Batch, evaluate, make_measure, parse_measure, weights_of
from evald.metrics.families import GEOMETRIC, MEAN, WEIGHTED
from evald.score.output import COUNTS
from evald.score.scoring import NO_PER_QUERY_VALUE


def test_the_traits_others_read_are_the_lists_they_held() -> None:
    assert {"GAUC", "GMAP"} == NO_PER_QUERY_VALUE
    assert {"num_ret", "num_rel", "num_rel_ret", "NumRet", "NumRel", "NumRelRet"} == COUNTS
    unbounded = {name for name, family in FAMILIES.items() if family.span is None}
    assert unbounded == {"DCG", "CG", "NumRet", "NumRel", "NumRelRet"}
    assert {n for n, f in FAMILIES.items() if f.aggregation == GEOMETRIC} == {"GMAP"}
    assert {n for n, f in FAMILIES.items() if f.aggregation == WEIGHTED} == {"GAUC"}
    assert FAMILIES["KendallTau"].span == (-1.0, 1.0)
    assert FAMILIES["GMAP"].span == (math.log(0.00001), 0.0)


def test_each_entry_is_consistent() -> None:
    for name, family in FAMILIES.items():
        assert family.name == name
        # a weights kernel exactly for the weighted mean, and only there
        assert (family.weights is not None) == (family.aggregation == WEIGHTED), name
        assert family.aggregation in {MEAN, WEIGHTED, GEOMETRIC}, name
        # an aggregate names the family of its per-list values, which has a row of its own
        if family.aggregate_of is not None:
            assert FAMILIES[family.aggregate_of].aggregate_of is None, name
        assert not family.is_count or family.span is None, f"{name}: a count has no bound"


def test_every_family_is_scored_by_its_kernel_and_weighted_by_its_weights() -> None:
    batch = Batch.from_lists([["a", "b", "c"], ["d", "e"]], [{"a": 1, "c": 2}, {"d": 0, "e": 1}])
    for name, family in FAMILIES.items():
        measure = parse_measure(family.forms[0].replace("@k", "@2").replace("@r", "@0.5"))
        values = evaluate([measure], batch)[measure]
        assert values.shape == (2,) and np.isfinite(values).all(), name
    gauc = make_measure("GAUC")
    # GAUC weighs a list with both classes by its judged served items: the first has no
    # judged non-relevant item, the second has d and e
    assert weights_of(gauc, batch).tolist() == [0.0, 2.0]
    assert weights_of(make_measure("AUC"), batch).tolist() == [1.0, 1.0]
