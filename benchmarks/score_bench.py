"""`evald score` on 1M lists against ranx and pytrec_eval on the same data, in the same run.

All three read the same JSONL file and score the same five measures. evald is timed end to end
through its command line entry point (read, validate, score, write one JSON line per query).
ranx and pytrec_eval are timed end to end too (read the file, build their dicts, evaluate), and
ranx's numba evaluation alone is shown as well, since that is its best case. ranx is warmed up on
a small input first so its JIT compile time is not charged to it.

Targets (issue 6 §7): evald at least as fast as ranx, and at least 10x pytrec_eval.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence

import numpy as np

from benchmarks import _common as c

EVALD_MEASURES = "nDCG@10,RR,P@10,R@10,AP@10"
RANX_MEASURES = ["ndcg@10", "mrr", "precision@10", "recall@10", "map@10"]
TREC_MEASURES = {"ndcg_cut.10", "recip_rank", "P.10", "recall.10", "map_cut.10"}


def write_lists(path: str, n: int, seed: int, depth: int = 20, judged: int = 6) -> None:
    """n lists of `depth` served docs; `judged` qrels per query, some of them unserved."""
    rng = np.random.default_rng(seed)
    # distinct docids within a list: a random base plus distinct offsets, modulo the corpus
    steps = rng.permutation(1_000_000)[: depth + 2]
    docs = (rng.integers(0, 1_000_000, size=(n, 1)) + steps[None, :]) % 1_000_000
    # judged docs: mostly served ones (position-biased), plus unserved ones (columns depth..)
    grades = rng.choice(4, size=(n, judged), p=(0.4, 0.3, 0.2, 0.1))
    picks = rng.integers(0, depth + 2, size=(n, judged))
    with open(path, "w") as fh:
        for i in range(n):
            row = docs[i]
            ranking = [f"d{x}" for x in row[:depth]]
            qrels: dict[str, int] = {}
            for g, p in zip(grades[i], picks[i], strict=True):
                qrels[f"d{row[p]}"] = int(g)
            fh.write(
                json.dumps(
                    {"qid": f"q{i}", "ranking": ranking, "qrels": qrels}, separators=(",", ":")
                )
            )
            fh.write("\n")


def load_dicts(path: str) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """The qrels and run dicts ranx / pytrec_eval take; served order as descending scores."""
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    with open(path, "rb") as fh:
        for raw in fh:
            obj = json.loads(raw)
            qid = obj["qid"]
            ranking = obj["ranking"]
            k = len(ranking)
            run[qid] = {doc: float(k - r) for r, doc in enumerate(ranking)}
            qrels[qid] = {doc: int(g) for doc, g in obj["qrels"].items()}
    return qrels, run


def time_evald(path: str, out: str) -> float:
    """`evald score FILE --measures ... --output OUT`, in process.

    Goes through the command module's own ``configure``/``run`` (what ``evald.cli`` dispatches
    to), so one unfinished sibling command cannot stop this benchmark.
    """
    cmd = c.require("evald.score.command", "configure", "run")
    parser = argparse.ArgumentParser(prog="evald score")
    cmd.configure(parser)  # type: ignore[attr-defined]
    args = parser.parse_args([path, "--measures", EVALD_MEASURES, "--output", out])
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        rc = cmd.run(args)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - t0
    if rc != 0:
        raise c.NotAvailable(f"evald score exited {rc}: {err.getvalue()[-500:]}")
    return elapsed


def evald_means(out: str) -> dict[str, float]:
    """Mean of each measure over evald's per-query output (outside any timed region)."""
    sums: dict[str, float] = {}
    n = 0
    with open(out, "rb") as fh:
        for raw in fh:
            obj = json.loads(raw)
            n += 1
            for key, value in obj.items():
                if key != "qid":
                    sums[key] = sums.get(key, 0.0) + float(value)
    return {k: v / max(n, 1) for k, v in sums.items()}


def time_ranx(path: str) -> tuple[float, float, dict[str, float]]:
    """(end-to-end seconds, evaluate-only seconds, means) for ranx."""
    from ranx import Qrels, Run, evaluate

    t0 = time.perf_counter()
    qrels_d, run_d = load_dicts(path)
    qrels, run = Qrels(qrels_d), Run(run_d)
    t1 = time.perf_counter()
    scores = evaluate(qrels, run, RANX_MEASURES, make_comparable=True)
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1, {k: float(v) for k, v in scores.items()}


def warm_ranx(tmp: str, seed: int) -> None:
    """Compile ranx's numba kernels on a tiny input so the timed run measures execution only."""
    from ranx import Qrels, Run, evaluate

    small = os.path.join(tmp, "warm.jsonl")
    write_lists(small, 200, seed + 1)
    qrels_d, run_d = load_dicts(small)
    evaluate(Qrels(qrels_d), Run(run_d), RANX_MEASURES, make_comparable=True)


def time_pytrec(path: str) -> tuple[float, float, dict[str, float]]:
    """(end-to-end seconds, evaluator-only seconds, means) for pytrec_eval."""
    import pytrec_eval

    t0 = time.perf_counter()
    qrels_d, run_d = load_dicts(path)
    t1 = time.perf_counter()
    per_query = pytrec_eval.RelevanceEvaluator(qrels_d, TREC_MEASURES).evaluate(run_d)
    t2 = time.perf_counter()
    means: dict[str, float] = {}
    for values in per_query.values():
        for key, value in values.items():
            means[key] = means.get(key, 0.0) + value
    return t2 - t0, t2 - t1, {k: v / max(len(per_query), 1) for k, v in means.items()}


def time_evald_kernels(path: str, batch: int = 10_000) -> float:
    """evald's metric engine from parsed lists (Batch.from_lists + evaluate, 10k per batch).

    The counterpart of the baselines' "evaluate only" figures: input already in Python objects.
    """
    m = c.require("evald.metrics", "Batch", "evaluate", "parse_measures")
    measures = m.parse_measures(EVALD_MEASURES)  # type: ignore[attr-defined]
    rankings: list[list[str]] = []
    qrels: list[dict[str, float]] = []
    with open(path, "rb") as fh:
        for raw in fh:
            obj = json.loads(raw)
            rankings.append(obj["ranking"])
            qrels.append({d: float(g) for d, g in obj["qrels"].items()})
    t0 = time.perf_counter()
    for lo in range(0, len(rankings), batch):
        b = m.Batch.from_lists(rankings[lo : lo + batch], qrels[lo : lo + batch])  # type: ignore[attr-defined]
        m.evaluate(measures, b)  # type: ignore[attr-defined]
    return time.perf_counter() - t0


def body(argv: Sequence[str] | None) -> None:
    args = c.parse_args(__doc__ or "", argv)
    n = 50_000 if args.quick else 1_000_000
    warnings.simplefilter("ignore")  # ranx's numba casts warn on every call; noise in a report
    with tempfile.TemporaryDirectory(prefix="evald-score-bench-") as tmp:
        path = os.path.join(tmp, "lists.jsonl")
        out = os.path.join(tmp, "out.jsonl")
        t0 = time.perf_counter()
        write_lists(path, n, args.seed)
        size_mb = os.path.getsize(path) / 1e6
        c.line("data", f"{n:,} lists x 20 served, 6 judged each; {size_mb:.0f} MB JSONL")
        c.line("  generated in (not timed)", c.fmt_s(time.perf_counter() - t0))
        c.line("measures", EVALD_MEASURES)

        warm_ranx(tmp, args.seed)
        ranx_total, ranx_eval, ranx_means = time_ranx(path)
        trec_total, trec_eval, trec_means = time_pytrec(path)
        print("  -- end to end from the JSONL file", flush=True)
        c.line(
            "ranx (read, Qrels/Run, evaluate)",
            f"{c.fmt_s(ranx_total)}  {c.fmt_rate(n / ranx_total)}",
        )
        c.line(
            "pytrec_eval (read, dicts, evaluate)",
            f"{c.fmt_s(trec_total)}  {c.fmt_rate(n / trec_total)}",
        )
        try:
            evald_total = time_evald(path, out)
        except c.NotAvailable as exc:
            c.line("evald score", f"NOT AVAILABLE: {exc}")
            evald_total = None
        if evald_total is not None:
            c.line(
                "evald score FILE --output (CLI, in process)",
                f"{c.fmt_s(evald_total)}  {c.fmt_rate(n / evald_total)}",
            )
        print("  -- scoring only, input already parsed into Python objects", flush=True)
        c.line(
            "ranx evaluate (numba; Qrels/Run prebuilt)",
            f"{c.fmt_s(ranx_eval)}  {c.fmt_rate(n / ranx_eval)}",
        )
        c.line(
            "pytrec_eval RelevanceEvaluator + evaluate",
            f"{c.fmt_s(trec_eval)}  {c.fmt_rate(n / trec_eval)}",
        )
        try:
            evald_kern = time_evald_kernels(path)
        except c.NotAvailable as exc:
            c.line("evald Batch.from_lists + evaluate", f"NOT AVAILABLE: {exc}")
            evald_kern = None
        if evald_kern is not None:
            c.line(
                "evald Batch.from_lists + evaluate",
                f"{c.fmt_s(evald_kern)}  {c.fmt_rate(n / evald_kern)}",
            )
        if evald_total is None:
            return

        means = evald_means(out)
        agree = {
            "nDCG@10": ("ndcg_cut_10", "ndcg@10"),
            "RR": ("recip_rank", "mrr"),
            "P@10": ("P_10", "precision@10"),
        }
        print("  -- same answers?", flush=True)
        for name, (trec_key, ranx_key) in agree.items():
            ours, theirs = means.get(name), trec_means.get(trec_key)
            ok = ours is not None and theirs is not None and abs(ours - theirs) < 1e-9
            c.line(
                f"mean {name}: evald / pytrec_eval / ranx",
                f"{ours:.6f} / {theirs:.6f} / {ranx_means.get(ranx_key, float('nan')):.6f}"
                f"  ({'evald = pytrec_eval' if ok else 'evald DIFFERS from pytrec_eval'})"
                if ours is not None and theirs is not None
                else f"{ours} / {theirs}",
            )
        print("  -- ratios (baseline time / evald time; > 1 means evald is faster)", flush=True)
        c.target(
            "end to end: ranx / evald",
            f"{ranx_total / evald_total:.2f}x",
            ranx_total >= evald_total,
            ">= 1x",
        )
        c.target(
            "end to end: pytrec_eval / evald",
            f"{trec_total / evald_total:.2f}x",
            trec_total >= 10 * evald_total,
            ">= 10x",
        )
        if evald_kern is not None:
            c.line("scoring only: ranx evaluate / evald", f"{ranx_eval / evald_kern:.2f}x")
            c.line("scoring only: pytrec_eval / evald", f"{trec_eval / evald_kern:.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    return c.run_main("evald score on many lists vs ranx and pytrec_eval", lambda: body(argv))


if __name__ == "__main__":
    sys.exit(main())
