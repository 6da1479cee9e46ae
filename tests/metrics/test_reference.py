"""Property tests: evald's kernels equal trec_eval (pytrec_eval), ir_measures and ranx.

Random batches cover empty lists, unserved relevant items, unjudged served items, lists where
everything or nothing is relevant, and cutoffs beyond the list length. trec_eval orders by
score; each list is fed with strictly decreasing scores so its order is the served order.
"""

from __future__ import annotations

from dataclasses import dataclass

import ir_measures
import numpy as np
import pytest
import pytrec_eval
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from numba.typed import List as TypedList
from ranx import metrics as ranx_metrics

from evald.metrics import Batch, evaluate, parse_measures

CUTOFFS = (1, 2, 3, 5, 10, 20)  # 20 is beyond every generated list
TOL = 1e-9
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Case:
    """One generated batch: served item ids and int judgments per list."""

    rankings: list[list[str]]
    qrels: list[dict[str, int]]

    def batch(self) -> Batch:
        return Batch.from_lists(self.rankings, self.qrels)

    def trec_run(self) -> dict[str, dict[str, float]]:
        return {
            f"q{i}": {doc: float(len(r) - rank) for rank, doc in enumerate(r)}
            for i, r in enumerate(self.rankings)
        }

    def trec_qrels(self) -> dict[str, dict[str, int]]:
        return {f"q{i}": dict(q) for i, q in enumerate(self.qrels) if q}


@st.composite
def one_list(draw: st.DrawFn) -> tuple[list[str], dict[str, int]]:
    mode = draw(st.sampled_from(["mixed", "all_relevant", "none_relevant", "empty"]))
    size = draw(st.integers(0, 12))
    grade = {
        "mixed": st.one_of(st.none(), st.integers(0, 4)),
        "all_relevant": st.integers(1, 4),
        "none_relevant": st.one_of(st.none(), st.just(0)),
        "empty": st.one_of(st.none(), st.integers(0, 4)),
    }[mode]
    grades = draw(st.lists(grade, min_size=size, max_size=size))
    pool = [f"d{i}" for i in range(size)]
    order = draw(st.permutations(pool)) if pool else []
    served = [] if mode == "empty" else order[: draw(st.integers(0, size))]
    qrels = {doc: g for doc, g in zip(pool, grades, strict=True) if g is not None}
    return served, qrels


cases = st.lists(one_list(), min_size=1, max_size=8).map(
    lambda lists: Case([r for r, _ in lists], [q for _, q in lists])
)

EDGE = Case(
    rankings=[[], ["a", "b"], ["a", "b", "c"], ["x"], ["a", "b", "c"]],
    qrels=[{"a": 2}, {"a": 1, "b": 3}, {"a": 0, "b": 0}, {}, {"z": 4, "b": 1}],
)


def trec_eval(case: Case, measures: set[str], rel: int) -> dict[str, dict[str, float]]:
    evaluator = pytrec_eval.RelevanceEvaluator(case.trec_qrels(), measures, relevance_level=rel)
    return evaluator.evaluate(case.trec_run())


def expected_row(results: dict[str, dict[str, float]], i: int, name: str) -> float:
    """trec_eval leaves out queries without judgments; evald scores those 0."""
    return results.get(f"q{i}", {}).get(name, 0.0)


def check(ours: np.ndarray, theirs: list[float], label: str) -> None:
    assert ours.dtype == np.float64
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=TOL, err_msg=label)


@pytest.mark.parametrize("rel", [1, 2])
@SETTINGS
@given(case=cases)
@example(case=EDGE)
def test_binary_measures_equal_trec_eval(case: Case, rel: int) -> None:
    trec_names = {"map", "recip_rank"} | {
        f"{m}_{k}" for m in ("P", "recall", "map_cut", "success") for k in CUTOFFS
    }
    results = trec_eval(case, trec_names, rel)
    r = "" if rel == 1 else f"(rel={rel})"
    pairs = {f"AP{r}": "map", f"RR{r}": "recip_rank"}
    for k in CUTOFFS:
        pairs |= {
            f"P{r}@{k}": f"P_{k}",
            f"R{r}@{k}": f"recall_{k}",
            f"AP{r}@{k}": f"map_cut_{k}",
            f"Success{r}@{k}": f"success_{k}",
        }
    ours = {str(m): v for m, v in evaluate(parse_measures(list(pairs)), case.batch()).items()}
    for name, trec in pairs.items():
        check(ours[name], [expected_row(results, i, trec) for i in range(len(case.rankings))], name)


@SETTINGS
@given(case=cases)
@example(case=EDGE)
def test_ndcg_equals_trec_eval(case: Case) -> None:
    trec_names = {"ndcg"} | {f"ndcg_cut_{k}" for k in CUTOFFS}
    results = trec_eval(case, trec_names, 1)
    pairs = {"nDCG": "ndcg"} | {f"nDCG@{k}": f"ndcg_cut_{k}" for k in CUTOFFS}
    ours = {str(m): v for m, v in evaluate(parse_measures(list(pairs)), case.batch()).items()}
    for name, trec in pairs.items():
        check(ours[name], [expected_row(results, i, trec) for i in range(len(case.rankings))], name)


def ir_measures_values(case: Case, names: list[str]) -> dict[str, list[float]]:
    """ir_measures parses evald's canonical names itself: proves the syntax is the same."""
    parsed = [ir_measures.parse_measure(name) for name in names]
    qrels = [
        ir_measures.Qrel(f"q{i}", doc, g) for i, q in enumerate(case.qrels) for doc, g in q.items()
    ]
    run = [
        ir_measures.ScoredDoc(qid, doc, score)
        for qid, docs in case.trec_run().items()
        for doc, score in docs.items()
    ]
    found = {
        (m.query_id, str(m.measure)): m.value for m in ir_measures.iter_calc(parsed, qrels, run)
    }
    return {
        str(m): [found.get((f"q{i}", str(m)), 0.0) for i in range(len(case.rankings))]
        for m in parsed
    }


@SETTINGS
@given(case=cases)
@example(case=EDGE)
def test_names_and_values_equal_ir_measures(case: Case) -> None:
    names = [
        "nDCG@5", "nDCG", "nDCG@20", "P(rel=2)@3", "P@20", "R@10", "R(rel=2)@5", "AP(rel=2)",
        "AP@5", "RR@3", "RR(rel=3)", "Success@2", "Success(rel=2)@3",
    ]  # fmt: skip
    theirs = ir_measures_values(case, names)
    ours = {str(m): v for m, v in evaluate(parse_measures(names), case.batch()).items()}
    for name in names:
        assert name in theirs, f"ir_measures spells {name} differently"
        check(ours[name], theirs[name], name)


def ranx_inputs(case: Case, binary: bool = False) -> tuple[TypedList, TypedList]:
    """ranx's kernel input: per list (doc id, value) float arrays, qrels sorted by grade."""
    ids: dict[str, float] = {}
    qrels, run = TypedList(), TypedList()
    for ranking, judgments in zip(case.rankings, case.qrels, strict=True):
        rows = sorted(
            (
                (ids.setdefault(d, float(len(ids))), float(min(g, 1) if binary else g))
                for d, g in judgments.items()
            ),
            key=lambda row: -row[1],
        )
        qrels.append(np.array(rows, dtype=np.float64).reshape(-1, 2))
        scored = [
            (ids.setdefault(d, float(len(ids))), float(len(ranking) - r))
            for r, d in enumerate(ranking)
        ]
        run.append(np.array(scored, dtype=np.float64).reshape(-1, 2))
    return qrels, run


@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaTypeSafetyWarning")  # inside ranx f1
@SETTINGS
@given(case=cases)
@example(case=EDGE)
def test_graded_and_set_measures_equal_ranx(case: Case) -> None:
    qrels, run = ranx_inputs(case)
    batch = case.batch()
    for k in CUTOFFS:
        names = parse_measures(
            f"nDCG(dcg='exp-log2')@{k},F1@{k},Hit@{k},RR@{k},DCG@{k},DCG(dcg='exp-log2')@{k}"
        )
        got = {str(m): v for m, v in evaluate(names, batch).items()}
        check(got[f"DCG@{k}"], ranx_metrics.dcg(qrels, run, k, 1), f"dcg@{k}")
        check(got[f"DCG(dcg='exp-log2')@{k}"], ranx_metrics.dcg_burges(qrels, run, k, 1), "burges")
        burges = ranx_metrics.ndcg_burges(qrels, run, k, 1)
        check(got[f"nDCG(dcg='exp-log2')@{k}"], burges, f"ndcg_burges@{k}")
        check(got[f"F1@{k}"], ranx_metrics.f1(qrels, run, k, 1), f"F1@{k}")
        check(got[f"Success@{k}"], ranx_metrics.hit_rate(qrels, run, k, 1), f"Hit@{k}")
        check(got[f"RR@{k}"], ranx_metrics.reciprocal_rank(qrels, run, k, 1), f"RR@{k}")


@SETTINGS
@given(case=cases, p=st.sampled_from([0.5, 0.8, 0.95]))
@example(case=EDGE, p=0.8)
def test_binary_rbp_equals_ranx(case: Case, p: float) -> None:
    # ranx multiplies by the raw grade, so it is binary RBP only on 0/1 judgments
    qrels, run = ranx_inputs(case, binary=True)
    (values,) = evaluate(parse_measures(f"RBP(p={p})"), case.batch()).values()
    check(values, ranx_metrics.rank_biased_precision(qrels, run, p, 1), f"RBP(p={p})")
