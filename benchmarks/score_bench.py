"""`evald score` on 1M lists against ranx and pytrec_eval on the same data, in the same run.

All three read the same JSONL file and score the same five measures. evald is timed end to end
through its command line entry point (read, validate, score, write one JSON line per query), and
again with ``--mean`` (no rows written). ranx and pytrec_eval are timed end to end too (read the
file, build their dicts, evaluate), and their evaluation alone is shown as well. ranx is warmed
up on a small input first so its JIT compile time is not charged to it.

The same run measures the floors under any reader of this file, each also as a fraction of
pytrec_eval's end-to-end time: reading the file's lines, and decoding every line with
``json.loads``, ``pydantic_core.from_json`` and msgspec (evald's parser), results thrown away.
10x pytrec_eval end to end means a total of 0.10x its time; a floor above that is a bound
measured, not asserted. Then evald's time on a prefix of the file is split stage by stage
(``--profile`` adds a cProfile listing of the command).

Targets (issue 6 §7): evald at least as fast as ranx, and at least 10x pytrec_eval.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import itertools
import json
import os
import pstats
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence

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


def evald_args(path: str, *extra: str) -> argparse.Namespace:
    """The parsed command line of `evald score PATH --measures ... EXTRA`."""
    cmd = c.require("evald.score.command", "configure", "run")
    parser = argparse.ArgumentParser(prog="evald score")
    cmd.configure(parser)  # type: ignore[attr-defined]
    return parser.parse_args([path, "--measures", EVALD_MEASURES, *extra])


def time_evald(path: str, *extra: str) -> float:
    """`evald score FILE --measures ... EXTRA` (``--output OUT`` or ``--mean``), in process.

    Goes through the command module's own ``configure``/``run`` (what ``evald.cli`` dispatches
    to), so one unfinished sibling command cannot stop this benchmark. stdout (the means with
    ``--mean``) and stderr are captured.
    """
    cmd = c.require("evald.score.command", "configure", "run")
    args = evald_args(path, *extra)
    t0 = time.perf_counter()
    with (
        contextlib.redirect_stderr(io.StringIO()) as err,
        contextlib.redirect_stdout(io.StringIO()),
    ):
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


# ---------------------------------------------------------------------------------------------
# floors: what reading the file costs any reader, before any scoring


def floor_read(path: str) -> None:
    """Iterate the file's lines (binary), as every reader here does."""
    with open(path, "rb") as fh:
        for _ in fh:
            pass


def floor_json(path: str) -> None:
    """``json.loads`` of every line, the object thrown away (pytrec_eval's and ranx's reader)."""
    loads = json.loads
    with open(path, "rb") as fh:
        for raw in fh:
            loads(raw)


def floor_pydantic(path: str) -> None:
    """``pydantic_core.from_json`` of every line (Rust parser to Python objects)."""
    from pydantic_core import from_json

    with open(path, "rb") as fh:
        for raw in fh:
            from_json(raw, cache_strings=False)


def floor_msgspec(path: str) -> None:
    """evald's own decode of every line: msgspec into the typed record, no further checks."""
    mod = c.require("evald.score.jsonl_chunks", "_DECODE")
    decode = mod._DECODE  # type: ignore[attr-defined]
    with open(path, "rb") as fh:
        for raw in fh:
            decode(raw)


FLOORS = (
    ("read the file's lines only", floor_read),
    ("msgspec typed decode per line (evald's parser)", floor_msgspec),
    ("pydantic_core.from_json per line", floor_pydantic),
    ("json.loads per line", floor_json),
)


# ---------------------------------------------------------------------------------------------
# where evald's time goes


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off, as `evald score` has it while lines stream."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def write_prefix(path: str, out: str, n: int) -> None:
    with open(path, "rb") as src, open(out, "wb") as dst:
        dst.writelines(itertools.islice(src, n))


def time_splits(path: str, rows_path: str, batch: int = 10_000) -> dict[str, float]:
    """The command's pipeline stage by stage, each stage timed on its own, on ``path``.

    Same functions, chunk size and batch size as `evald score`: read the lines; parse and check
    them (the chunked reader); look the served docids up in their qrels, per chunk
    (``lists_from``); pad a batch into matrices (``build_batch``); the measures' kernels
    (``evaluate``); format and write the rows. The command's extra bookkeeping (queues, means)
    is what its own total has beyond their sum.
    """
    cmd = c.require("evald.score.command", "READ_CHUNK")
    reader = c.require("evald.score.jsonl_chunks", "read_chunks")
    bt = c.require("evald.score.batching", "lists_from", "concat", "build_batch")
    m = c.require("evald.metrics", "evaluate", "parse_measures", "required_depth")
    out = c.require("evald.score.output", "JsonlWriter")
    measures = m.parse_measures(EVALD_MEASURES)  # type: ignore[attr-defined]
    depth = m.required_depth(measures)  # type: ignore[attr-defined]
    clock = time.perf_counter
    splits = dict.fromkeys(["read", "parse+check", "lookups", "pad", "kernels", "rows"], 0.0)
    t0 = clock()
    with open(path, "rb") as fh:
        raws = list(fh)
    splits["read"] = clock() - t0
    with gc_paused(), open(rows_path, "w", encoding="utf-8") as rows:
        writer = out.JsonlWriter(rows, [str(x) for x in measures])  # type: ignore[attr-defined]
        pending: list[object] = []
        n = 0

        def score(lists: object) -> None:
            t0 = clock()
            b = bt.build_batch(lists, depth)  # type: ignore[attr-defined]
            t1 = clock()
            values = m.evaluate(measures, b)  # type: ignore[attr-defined]
            t2 = clock()
            writer.write(lists.qids, [values[x] for x in measures])  # type: ignore[attr-defined]
            splits["pad"] += t1 - t0
            splits["kernels"] += t2 - t1
            splits["rows"] += clock() - t2

        chunks = reader.read_chunks(raws, path, cmd.READ_CHUNK)  # type: ignore[attr-defined]
        while True:
            t0 = clock()
            chunk = next(chunks, None)
            t1 = clock()
            splits["parse+check"] += t1 - t0
            if chunk is None:
                break
            lists = bt.lists_from(chunk.qids, chunk.rankings, chunk.qrels)  # type: ignore[attr-defined]
            splits["lookups"] += clock() - t1
            del chunk
            room = batch - n
            if len(lists) < room:
                pending.append(lists)
                n += len(lists)
                continue
            pending.append(lists.slice(0, room))
            t0 = clock()
            whole = bt.concat(pending)  # type: ignore[attr-defined]
            splits["pad"] += clock() - t0
            score(whole)
            pending, n = [lists.slice(room, len(lists))], len(lists) - room
        if n:
            score(bt.concat(pending))  # type: ignore[attr-defined]
    del raws
    return splits


def profile_evald(path: str, out: str, top: int = 14) -> None:
    """cProfile of the command on ``path``: the functions with the most own time."""
    cmd = c.require("evald.score.command", "run")
    args = evald_args(path, "--output", out)
    prof = cProfile.Profile()
    with contextlib.redirect_stderr(io.StringIO()):
        prof.runcall(cmd.run, args)  # type: ignore[attr-defined]
    stats = pstats.Stats(prof)
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    print(f"  -- cProfile of evald score on that prefix (own time, total {total:.2f} s)")
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    for (file, lineno, name), (_, calls, own, _cum, _) in rows[:top]:
        where = f"{os.path.basename(file)}:{lineno}({name})" if lineno else name
        c.line(f"{own / total:5.1%}  {where}"[:52], f"{own:.3f} s  {calls:,} calls")


# ---------------------------------------------------------------------------------------------


def body(argv: Sequence[str] | None) -> None:
    args = c.parse_args(__doc__ or "", argv, extra=_extra_args)
    n = 50_000 if args.quick else 1_000_000
    split_n = 50_000 if args.quick else 200_000
    repeat = args.repeat
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
        if repeat > 1:
            c.line("repeats", f"best of {repeat} for pytrec_eval, evald and the floors; ranx once")

        warm_ranx(tmp, args.seed)
        ranx_total, ranx_eval, ranx_means = time_ranx(path)
        trec_runs = [time_pytrec(path) for _ in range(repeat)]
        trec_total = min(r[0] for r in trec_runs)
        trec_eval = min(r[1] for r in trec_runs)
        trec_means = trec_runs[0][2]
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
            evald_total = min(time_evald(path, "--output", out) for _ in range(repeat))
            evald_mean = min(time_evald(path, "--mean") for _ in range(repeat))
        except c.NotAvailable as exc:
            c.line("evald score", f"NOT AVAILABLE: {exc}")
            evald_total = evald_mean = None
        if evald_total is not None and evald_mean is not None:
            c.line(
                "evald score FILE --output (CLI, in process)",
                f"{c.fmt_s(evald_total)}  {c.fmt_rate(n / evald_total)}",
            )
            c.line(
                "evald score FILE --mean (no rows written)",
                f"{c.fmt_s(evald_mean)}  {c.fmt_rate(n / evald_mean)}",
            )
        print(
            "  -- floors: the file read and decoded, nothing checked or scored"
            " (fraction of pytrec_eval end to end)",
            flush=True,
        )
        floors: dict[str, float] = {}
        for label, fn in FLOORS:
            try:
                floors[label] = c.best_of(lambda fn=fn: fn(path), repeat)
            except c.NotAvailable as exc:
                c.line(label, f"NOT AVAILABLE: {exc}")
                continue
            c.line(
                label,
                f"{c.fmt_s(floors[label])}  {c.fmt_rate(n / floors[label])}"
                f"  ({floors[label] / trec_total:.3f}x)",
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
        if evald_total is None or evald_mean is None:
            return
        report_splits(path, tmp, split_n, profile=args.profile)

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
        c.line("end to end: pytrec_eval / evald --mean", f"{trec_total / evald_mean:.2f}x")
        if evald_kern is not None:
            c.line("scoring only: ranx evaluate / evald", f"{ranx_eval / evald_kern:.2f}x")
            c.line("scoring only: pytrec_eval / evald", f"{trec_eval / evald_kern:.2f}x")
        print("  -- the bound", flush=True)
        budget = trec_total / 10
        c.line("10x pytrec_eval end to end allows", f"{c.fmt_s(budget)} for {n:,} lists")
        for label, seconds in floors.items():
            c.line(f"  {label.split(' (')[0]}", f"{seconds / budget:.2f}x that budget")


def report_splits(path: str, tmp: str, n: int, *, profile: bool) -> None:
    """Stage-by-stage wall time of evald on the first ``n`` lists, against the command's."""
    prefix = os.path.join(tmp, "prefix.jsonl")
    write_prefix(path, prefix, n)
    rows = os.path.join(tmp, "prefix-rows.jsonl")
    total = time_evald(prefix, "--output", rows)
    splits = time_splits(prefix, rows)
    print(f"  -- where evald's time goes ({n:,} lists; each stage timed on its own)", flush=True)
    labels = {
        "read": "read the lines",
        "parse+check": "parse and check (msgspec, chunk checks)",
        "lookups": "qrels look-ups per chunk (lists_from)",
        "pad": "pad a batch into matrices (build_batch)",
        "kernels": "evaluate (numpy kernels)",
        "rows": "format and write the rows",
    }
    for key, label in labels.items():
        seconds = splits[key]
        c.line(label, f"{seconds / n * 1e6:5.2f} µs/list  {seconds / total:5.1%}")
    rest = total - sum(splits.values())
    c.line(
        "rest (queues, means, chunk bookkeeping)",
        f"{rest / n * 1e6:5.2f} µs/list  {rest / total:5.1%}",
    )
    c.line("evald score --output on the same lists", f"{total / n * 1e6:5.2f} µs/list  100%")
    if profile:
        profile_evald(prefix, rows)


def _extra_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="best of N for pytrec_eval, evald and the floors (ranx runs once: minutes each)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile listing of evald score"
    )


def main(argv: Sequence[str] | None = None) -> int:
    return c.run_main("evald score on many lists vs ranx and pytrec_eval", lambda: body(argv))


if __name__ == "__main__":
    sys.exit(main())
