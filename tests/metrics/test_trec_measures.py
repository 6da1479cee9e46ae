"""trec_eval's whole-list measures against pytrec_eval (trec_eval 9.0.8's own code).

Runs are generated with scores drawn from a few values, so ties are common, and ordered by
evald's TREC reader (score descending, then docid descending) as trec_eval orders them; judged
and unjudged, served and unserved documents, queries with R = 0 and empty runs all occur.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import pytrec_eval
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evald.metrics import Batch, evaluate, mean_of, parse_measures
from evald.score.trec import read_run

TOL = 1e-9
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LEVELS = (0.0, 0.1, 0.25, 0.3, 0.4, 0.5, 0.7, 1.0)


@dataclass(frozen=True)
class Topics:
    """Scored runs and int judgments per query (a query with no run lines has an empty run)."""

    runs: list[dict[str, float]]
    qrels: list[dict[str, int]]

    def rankings(self, *, judged_only: bool = False) -> list[list[str]]:
        text = "".join(
            f"q{i} Q0 {doc} 0 {score!r} t\n"
            for i, run in enumerate(self.runs)
            for doc, score in run.items()
        )
        run, rejected = read_run([line.encode() for line in text.splitlines(keepends=True)], "run")
        assert rejected == []
        out = [
            run.ranking(f"q{i}") if f"q{i}" in run.queries else [] for i in range(len(self.runs))
        ]
        if judged_only:
            out = [[d for d in r if d in q] for r, q in zip(out, self.qrels, strict=True)]
        return out

    def batch(self, *, judged_only: bool = False) -> Batch:
        return Batch.from_lists(self.rankings(judged_only=judged_only), self.qrels)

    def trec_eval(self, measures: set[str], rel: int, *, judged_only: bool = False) -> dict:
        qrels = {f"q{i}": dict(q) for i, q in enumerate(self.qrels) if q}
        run = {f"q{i}": dict(r) for i, r in enumerate(self.runs) if r}
        evaluator = pytrec_eval.RelevanceEvaluator(
            qrels, measures, relevance_level=rel, judged_docs_only_flag=judged_only
        )
        return evaluator.evaluate(run)


@st.composite
def one_topic(draw: st.DrawFn) -> tuple[dict[str, float], dict[str, int]]:
    size = draw(st.integers(0, 12))
    pool = [f"d{i}" for i in range(size)]
    grade = draw(st.sampled_from([st.integers(0, 3), st.just(0), st.integers(1, 3)]))
    qrels = {d: draw(grade) for d in pool if draw(st.booleans())}
    served = draw(st.permutations(pool))[: draw(st.integers(0, size))] if pool else []
    scores = st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0, 7.25])  # exact in float32: ties only
    return {d: draw(scores) for d in served}, qrels


topics = st.lists(one_topic(), min_size=1, max_size=6).map(
    lambda ts: Topics([r for r, _ in ts], [q for _, q in ts])
)

EDGE = Topics(
    runs=[{}, {"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 1.0, "c": 1.0}, {"x": 1.0}, {"c": 1.0}],
    qrels=[{"a": 2}, {"a": 1, "b": 0}, {"a": 0, "b": 0}, {}, {"z": 4, "b": 1, "c": 0}],
)


def column(results: dict, n: int, name: str) -> list[float]:
    """trec_eval's value per query; NaN where it scores none (no judgments or no run lines)."""
    return [results.get(f"q{i}", {}).get(name, math.nan) for i in range(n)]


def assert_equal_where_scored(ours: np.ndarray, theirs: list[float], label: str) -> None:
    scored = ~np.isnan(np.asarray(theirs, dtype=np.float64))
    np.testing.assert_allclose(
        ours[scored], np.asarray(theirs)[scored], rtol=0, atol=TOL, err_msg=label
    )


PAIRS = {
    "Rprec": "Rprec",
    "Bpref": "bpref",
    "infAP": "infAP",
    "NumRet": "num_ret",
    "NumRel": "num_rel",
    "NumRelRet": "num_rel_ret",
    "SetP": "set_P",
    "SetR": "set_recall",
    "SetF": "set_F",
    "IPrec11pt": "11pt_avg",
    "AP": "map",
    "nDCG": "ndcg",
    "P@5": "P_5",
} | {f"IPrec@{level!r}": f"iprec_at_recall_{level:.2f}" for level in LEVELS}

TREC_NAMES = {
    "Rprec", "bpref", "infAP", "num_ret", "num_rel", "num_rel_ret", "set_P", "set_recall",
    "set_F", "11pt_avg", "map", "ndcg", "P_5",
    "iprec_at_recall." + ",".join(repr(level) for level in LEVELS),
}  # fmt: skip


def with_rel(name: str, rel: int) -> str:
    if rel == 1 or name in ("NumRet", "nDCG"):
        return name
    family, _, cutoff = name.partition("@")
    return f"{family}(rel={rel})" + (f"@{cutoff}" if cutoff else "")


@pytest.mark.parametrize("judged_only", [False, True])
@pytest.mark.parametrize("rel", [1, 2])
@SETTINGS
@given(case=topics)
@example(case=EDGE)
def test_whole_list_measures_equal_trec_eval(case: Topics, rel: int, judged_only: bool) -> None:
    results = case.trec_eval(TREC_NAMES, rel, judged_only=judged_only)
    names = {with_rel(ours, rel): trec for ours, trec in PAIRS.items()}
    got = evaluate(parse_measures(list(names)), case.batch(judged_only=judged_only))
    values = {str(m): v for m, v in got.items()}
    for ours, trec in names.items():
        assert_equal_where_scored(values[ours], column(results, len(case.runs), trec), ours)


@pytest.mark.parametrize("beta", [0.5, 2, 3.5])
@SETTINGS
@given(case=topics)
def test_set_f_takes_trec_evals_parameter_as_beta(case: Topics, beta: float) -> None:
    results = case.trec_eval({f"set_F.{beta}"}, 1)
    (values,) = evaluate(parse_measures(f"SetF(beta={beta})"), case.batch()).values()
    assert_equal_where_scored(values, column(results, len(case.runs), "set_F"), "SetF")


@SETTINGS
@given(case=topics)
@example(case=EDGE)
def test_gmap_is_trec_evals_geometric_mean_over_the_scored_queries(case: Topics) -> None:
    results = case.trec_eval({"gm_map"}, 1)
    scored = [i for i in range(len(case.runs)) if f"q{i}" in results]
    if not scored:
        return
    logs = [results[f"q{i}"]["gm_map"] for i in scored]  # per query: log(max(AP, 1e-5))
    batch = Batch.from_lists([case.rankings()[i] for i in scored], [case.qrels[i] for i in scored])
    (measure,) = parse_measures("GMAP")
    values = evaluate([measure], batch)[measure]
    assert math.isclose(
        mean_of(measure, values, batch), math.exp(sum(logs) / len(logs)), abs_tol=TOL
    )


@SETTINGS
@given(case=topics)
def test_judged_at_k_counts_judged_served_items_over_k(case: Topics) -> None:
    rankings = case.rankings()
    for k in (1, 3, 20):
        (values,) = evaluate(parse_measures(f"Judged@{k}"), case.batch()).values()
        expected = [
            sum(d in q for d in r[:k]) / k for r, q in zip(rankings, case.qrels, strict=True)
        ]
        np.testing.assert_allclose(values, expected, atol=0)


def trec_ndcg_with_gains(
    ranking: list[str], qrels: dict[str, int], gains: dict[int, float]
) -> float:
    """m_ndcg.c with a gain map, step for step (pytrec_eval cannot pass ``ndcg.1=3``)."""
    gain = {level: float(gains.get(level, level)) for level in set(qrels.values()) | set(gains)}
    found = sum(gain[qrels[d]] / math.log2(r + 2) for r, d in enumerate(ranking) if d in qrels)
    ideal_gains = sorted((gain[g] for g in qrels.values() if gain[g] > 0), reverse=True)
    ideal = sum(g / math.log2(r + 2) for r, g in enumerate(ideal_gains))
    return found / ideal if ideal > 0 else 0.0


@pytest.mark.parametrize("gains", [{1: 3, 2: 9}, {0: 1, 1: 3.5}, {1: 0, 2: -1, 3: 5}])
@SETTINGS
@given(case=topics)
@example(case=EDGE)
def test_ndcg_gain_maps_follow_trec_eval(case: Topics, gains: dict[int, float]) -> None:
    name = "nDCG(gains={" + ",".join(f"{k}:{v}" for k, v in gains.items()) + "})"
    (values,) = evaluate(parse_measures(name), case.batch()).values()
    expected = [
        trec_ndcg_with_gains(r, q, gains) for r, q in zip(case.rankings(), case.qrels, strict=True)
    ]
    np.testing.assert_allclose(values, expected, atol=TOL)


def test_default_gains_equal_plain_ndcg() -> None:
    batch = EDGE.batch()
    plain, mapped = evaluate(parse_measures("nDCG@3,nDCG(gains={1:1,2:2})@3"), batch).values()
    np.testing.assert_array_equal(plain, mapped)


def test_streaming_batches_score_the_new_measures_from_served_grades_alone() -> None:
    """Every served item is judged there: bpref's non-relevant pool is the served one."""
    batch = Batch.from_served_grades([[0, 1, 0, 2], [0, 0]])
    got = {str(m): v for m, v in evaluate(parse_measures("Bpref,SetP,Rprec,NumRel"), batch).items()}
    np.testing.assert_allclose(got["Bpref"], [(1.0 - 1 / 2 + 1.0 - 2 / 2) / 2, 0.0])
    np.testing.assert_allclose(got["SetP"], [0.5, 0.0])
    np.testing.assert_allclose(got["Rprec"], [0.5, 0.0])
    np.testing.assert_allclose(got["NumRel"], [2.0, 0.0])
