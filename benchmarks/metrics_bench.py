"""Metric kernels: evald against ranx (numba) and pytrec_eval on the same data, same run.

Two data sets: 1M lists of depth 20 and 100k of depth 100 (``--quick``: a tenth of each).
Each list is a served ranking of integer grades (most 0) plus a few relevant items that were
never served, so R and the ideal differ from the served grades as in real qrels.

What is timed: evald's ``evaluate`` on a ready ``Batch``; ranx's numba kernels on ready typed
lists (its dict building excluded); pytrec_eval's ``evaluate(run)`` with the evaluator (qrels
parsing) built beforehand. Building the inputs is timed separately for evald (its batch
constructors are on the streaming hot path). Before timing, the three tools' values are
compared on the whole data set, so the speed figures are for identical results.

Run: ``python -m benchmarks.metrics_bench [--quick]``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks._common import best_of, fmt_rate, fmt_s, line, parse_args, run_main, target

#: (evald name, ranx kernel name, ranx args (k, rel) or (p, rel), trec_eval name)
MEASURES: tuple[tuple[str, str, tuple[float, int], str], ...] = (
    ("nDCG@10", "ndcg", (10, 1), "ndcg_cut_10"),
    ("nDCG", "ndcg", (0, 1), "ndcg"),
    ("P@10", "precision", (10, 1), "P_10"),
    ("R@10", "recall", (10, 1), "recall_10"),
    ("AP@10", "average_precision", (10, 1), "map_cut_10"),
    ("AP", "average_precision", (0, 1), "map"),
    ("RR", "reciprocal_rank", (0, 1), "recip_rank"),
    ("RBP(p=0.8)", "rank_biased_precision", (0.8, 1), ""),
)


@dataclass
class Data:
    """One data set in every tool's input form."""

    grades: np.ndarray  # (n, depth) served grades
    extra: np.ndarray  # (n, e) grades of judged relevant items never served (0 = none)

    @property
    def n(self) -> int:
        return int(self.grades.shape[0])

    @property
    def depth(self) -> int:
        return int(self.grades.shape[1])


def make_data(n: int, depth: int, seed: int) -> Data:
    rng = np.random.default_rng(seed)
    # 70% non-relevant; a decaying share of higher grades, as click/purchase feedback looks
    grades = rng.choice(5, size=(n, depth), p=[0.7, 0.15, 0.08, 0.05, 0.02]).astype(np.float64)
    extra = rng.choice(5, size=(n, 3), p=[0.6, 0.2, 0.1, 0.07, 0.03]).astype(np.float64)
    return Data(grades, extra)


def evald_batch(data: Data):  # -> evald.metrics.Batch
    from evald.metrics import Batch

    ideal = -np.sort(-np.concatenate([data.grades, data.extra], axis=1), axis=1)
    lengths = np.full(data.n, data.depth, dtype=np.int64)
    judged = np.ones(data.grades.shape, dtype=bool)
    return Batch(data.grades, lengths, ideal, judged)


def ranx_inputs(data: Data) -> tuple[object, object, object]:
    """ranx kernel input: per list an (m, 2) [doc id, score or grade] array, qrels by grade.

    Also binary (0/1) qrels: ranx's RBP multiplies by the raw grade, so it equals binary RBP
    only on binary judgments.
    """
    from numba.typed import List as TypedList

    ids = np.arange(data.depth + data.extra.shape[1], dtype=np.float64)
    run_scores = np.column_stack((ids[: data.depth], data.depth - ids[: data.depth]))
    everything = np.concatenate([data.grades, data.extra], axis=1)
    order = np.argsort(-everything, axis=1, kind="stable")
    qrels, binary, run = TypedList(), TypedList(), TypedList()
    for i in range(data.n):
        row = everything[i, order[i]]
        keep = order[i][row > 0]
        qrels.append(np.column_stack((ids[keep], everything[i, keep])))
        binary.append(np.column_stack((ids[keep], np.ones(keep.size))))
        run.append(run_scores)
    return qrels, binary, run


def trec_inputs(data: Data) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    docs = [f"d{j}" for j in range(data.depth + data.extra.shape[1])]
    scores = {docs[j]: float(data.depth - j) for j in range(data.depth)}
    everything = np.concatenate([data.grades, data.extra], axis=1).astype(int).tolist()
    qrels = {
        f"q{i}": {docs[j]: g for j, g in enumerate(row) if g > 0} or {docs[0]: 0}
        for i, row in enumerate(everything)
    }
    run = {f"q{i}": dict(scores) for i in range(data.n)}
    return qrels, run


def trec_values(results: dict[str, dict[str, float]], name: str, n: int) -> np.ndarray:
    return np.array([results[f"q{i}"][name] for i in range(n)], dtype=np.float64)


def compare(label: str, ours: np.ndarray, theirs: np.ndarray) -> bool:
    worst = float(np.max(np.abs(ours - theirs))) if ours.size else 0.0
    if worst > 1e-9:
        line(f"  VALUES DIFFER {label}", f"max |diff| = {worst:.3g}")
        return False
    return True


def bench_set(n: int, depth: int, seed: int, with_trec: bool) -> None:
    import pytrec_eval
    from ranx import metrics as ranx_metrics

    from evald.metrics import Batch, evaluate, parse_measures

    print(f"\n  -- {n:,} lists of depth {depth} --", flush=True)
    data = make_data(n, depth, seed)
    batch = evald_batch(data)
    t0 = time.perf_counter()
    qrels_nb, binary_nb, run_nb = ranx_inputs(data)
    line("ranx typed-list building (not timed below)", fmt_s(time.perf_counter() - t0))
    trec_eval_inputs = None
    if with_trec:
        t0 = time.perf_counter()
        trec_eval_inputs = trec_inputs(data)
        line("pytrec_eval dict building (not timed below)", fmt_s(time.perf_counter() - t0))

    totals = {"evald": 0.0, "ranx": 0.0, "trec": 0.0, "evald_trec": 0.0}
    agree = True
    for name, kernel, args, trec_name in MEASURES:
        measures = parse_measures(name)
        ours = evaluate(measures, batch)[measures[0]]
        fn: Callable[..., np.ndarray] = getattr(ranx_metrics, kernel)
        judged = binary_nb if kernel == "rank_biased_precision" else qrels_nb
        theirs = fn(judged, run_nb, *args)  # also compiles on first use
        agree &= compare(f"{name} vs ranx", ours, theirs)
        t_evald = best_of(lambda m=measures: evaluate(m, batch), 3)
        t_ranx = best_of(lambda f=fn, q=judged, a=args: f(q, run_nb, *a), 3)
        totals["evald"] += t_evald
        totals["ranx"] += t_ranx
        figures = (
            f"evald {fmt_s(t_evald):>9}  ranx {fmt_s(t_ranx):>9}  "
            f"evald/ranx {t_evald / t_ranx:5.2f}"
        )
        if with_trec and trec_name and trec_eval_inputs is not None:
            qrels, run = trec_eval_inputs
            evaluator = pytrec_eval.RelevanceEvaluator(qrels, {trec_name})
            gc.collect()
            t0 = time.perf_counter()
            results = evaluator.evaluate(run)
            t_trec = time.perf_counter() - t0
            agree &= compare(f"{name} vs trec_eval", ours, trec_values(results, trec_name, n))
            del results
            totals["trec"] += t_trec
            totals["evald_trec"] += t_evald
            figures += f"  pytrec_eval {fmt_s(t_trec):>8}  pytrec/evald {t_trec / t_evald:6.1f}"
        line(name, figures)

    line("values identical across tools (1e-9)", "yes" if agree else "NO")
    ratio = totals["evald"] / totals["ranx"]
    target("all measures: evald time / ranx time", f"{ratio:.2f}", ratio <= 1.0, "<= 1")
    if totals["evald_trec"]:
        speedup = totals["trec"] / totals["evald_trec"]
        target(
            "trec_eval measures: pytrec_eval time / evald",
            f"{speedup:.1f}x",
            speedup >= 10,
            ">= 10x",
        )
    line(
        "evald lists scored per second (all measures)",
        fmt_rate(n * len(MEASURES) / totals["evald"]) + " list-measures",
    )

    # building batches from Python lists, as the streaming engine and `evald score` do
    rows = data.grades[: min(n, 200_000)].tolist()
    t_served = best_of(lambda: Batch.from_served_grades(rows), 2)
    line(
        f"Batch.from_served_grades, {len(rows):,} Python lists",
        f"{fmt_s(t_served)}  ({fmt_rate(len(rows) / t_served)} lists)",
    )
    small = rows[:1000]
    t_small = best_of(lambda: Batch.from_served_grades(small), 20)
    line("Batch.from_served_grades, batch of 1,000 lists", f"{fmt_s(t_small)}")
    rankings = [[f"d{j}" for j in range(depth)]] * min(n, 100_000)
    judgments = [{f"d{j}": g for j, g in enumerate(r) if g > 0} for r in rows[: len(rankings)]]
    t_lists = best_of(lambda: Batch.from_lists(rankings, judgments), 2)
    line(
        f"Batch.from_lists, {len(rankings):,} lists",
        f"{fmt_s(t_lists)}  ({fmt_rate(len(rankings) / t_lists)} lists)",
    )


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    scale = 10 if args.quick else 1

    def body() -> None:
        import numba

        line("numba threads available to ranx", str(numba.get_num_threads()))
        line("evald", "numpy, single thread")
        bench_set(1_000_000 // scale, 20, args.seed, with_trec=True)
        bench_set(100_000 // scale, 100, args.seed + 1, with_trec=True)

    run_main("metrics: evald kernels vs ranx and pytrec_eval", body)


if __name__ == "__main__":
    main()
