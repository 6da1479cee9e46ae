"""`evald score --compare` on two runs of many queries: peak RSS and time, against an older evald.

The command runs in a child process (``python -m evald score --compare A B``) and its peak RSS is
the kernel's (``ru_maxrss`` from ``wait4``). The baseline is the same command of another version
of evald, measured in the same run: ``--baseline-ref REF`` extracts ``evald/`` of that git commit
into a temporary directory and puts it first on the child's path. That child runs under an
address-space limit (``--baseline-limit-gb``, default 8), so a version that allocates without
bound fails with a MemoryError instead of pushing a shared machine into swap or the OOM killer.

The runs: JSON Lines, 10 served documents per query and 4 graded judgments, the second run a
perturbation of the first, so nDCG@10 takes many distinct values per query (the randomization
test draws a random bit per query and sign pattern) and RR few (one binomial draw per distinct
difference). Target (issue 22): 10 million queries without a MemoryError, in memory that grows
with the queries, not with the sign patterns.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _common as c

MEASURES = "RR,nDCG@10"


def write_runs(directory: Path, n: int, seed: int) -> tuple[Path, Path]:
    """Two runs of n queries (generated in blocks, so the generator's memory stays small),
    written under temporary names and renamed once complete."""
    rng = np.random.default_rng(seed)
    paths = directory / "base.jsonl", directory / "new.jsonl"
    partial = [path.with_suffix(".partial") for path in paths]
    offsets = rng.permutation(40)[:14]
    with partial[0].open("w") as base, partial[1].open("w") as new:
        for low in range(0, n, 100_000):
            size = min(100_000, n - low)
            # 14 distinct documents per query: the first 10 served, 4 of the 14 judged
            docs = rng.integers(0, 1000, size=(size, 1)) + offsets[None, :]
            judged = np.take_along_axis(
                docs, np.argsort(rng.random((size, 14)), axis=1)[:, :4], axis=1
            )
            grades = rng.integers(0, 4, size=(size, 4))
            swaps = rng.integers(0, 10, size=(size, 2))
            for i in range(size):
                qrels = ",".join(f'"d{d}":{g}' for d, g in zip(judged[i], grades[i], strict=True))
                ranking = [f'"d{d}"' for d in docs[i, :10]]
                line = '{"qid":"q%d","ranking":[%s],"qrels":{%s}}\n'
                base.write(line % (low + i, ",".join(ranking), qrels))
                a, b = swaps[i]
                ranking[a], ranking[b] = ranking[b], ranking[a]
                new.write(line % (low + i, ",".join(ranking), qrels))
    for written, path in zip(partial, paths, strict=True):
        written.rename(path)
    return paths


def run_compare(
    runs: tuple[Path, Path], permutations: int, path: str | None, limit: int | None
) -> dict[str, Any]:
    """One `evald score --compare` child: its exit status, peak RSS, wall time, report."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = path
    command = [
        sys.executable, "-m", "evald", "score", "--compare", *map(str, runs), "-m", MEASURES,
        "--permutations", str(permutations), "--format", "json",
    ]  # fmt: skip

    def bounded() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            command, stdout=out, stderr=err, env=env, cwd=path or c.REPO, preexec_fn=bounded
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode(errors="replace")
    return {
        "status": proc.returncode,
        "peak_rss": usage.ru_maxrss * 1024,
        "seconds": elapsed,
        "report": json.loads(stdout) if proc.returncode == 0 else None,
        "error": stderr.strip().splitlines()[-1] if stderr.strip() else "",
    }


def report(label: str, result: dict[str, Any], queries: int) -> None:
    if result["status"] != 0:
        c.line(f"{label}: exit status", f"{result['status']}: {result['error'][:80]}")
        c.line(f"{label}: peak RSS before it failed", f"{result['peak_rss'] / 2**20:,.0f} MiB")
        return
    c.line(f"{label}: peak RSS", f"{result['peak_rss'] / 2**20:,.0f} MiB")
    c.line(f"{label}: peak RSS per query and run", f"{result['peak_rss'] / queries / 2:,.0f} B")
    c.line(f"{label}: wall time", c.fmt_s(result["seconds"]))
    for row in result["report"]["results"]:
        c.line(
            f"{label}: {row['measure']} p(t), p(rand)", f"{row['p_t']}, {row['p_randomization']}"
        )


def body(argv: Sequence[str] | None) -> None:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--queries", type=int, default=1_000_000)
        parser.add_argument("--permutations", type=int, default=10_000)
        parser.add_argument("--baseline-ref", help="git commit to measure as the baseline")
        parser.add_argument("--baseline-limit-gb", type=float, default=8.0)
        parser.add_argument(
            "--runs-dir", type=Path, help="keep the generated runs here and reuse them next time"
        )

    args = c.parse_args(__doc__ or "", argv, extra)
    queries = 100_000 if args.quick else args.queries
    c.line("queries per run, permutations", f"{queries:,}, {args.permutations:,}")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        where = Path(tmp)
        if args.runs_dir is not None:
            where = args.runs_dir / f"{queries}-{args.seed}"
            where.mkdir(parents=True, exist_ok=True)
        runs = where / "base.jsonl", where / "new.jsonl"
        if not all(p.exists() for p in runs):
            runs = write_runs(where, queries, args.seed)
        size = sum(p.stat().st_size for p in runs)
        c.line("input ready", f"{size / 2**20:,.0f} MiB in {c.fmt_s(time.perf_counter() - t0)}")
        current = run_compare(runs, args.permutations, None, None)
        report("this tree", current, queries)
        if args.baseline_ref:
            limit = int(args.baseline_limit_gb * 2**30)
            old = run_compare(
                runs, args.permutations, c.evald_at(args.baseline_ref, Path(tmp)), limit
            )
            report(
                f"{args.baseline_ref} (address space {args.baseline_limit_gb:g} GiB)", old, queries
            )
            if old["status"] == 0 and current["status"] == 0:
                c.line(
                    "peak RSS, baseline / this tree",
                    f"{old['peak_rss'] / current['peak_rss']:.1f}x",
                )


def main(argv: Sequence[str] | None = None) -> int:
    return c.run_main("evald score --compare: peak memory and time", lambda: body(argv))


if __name__ == "__main__":
    sys.exit(main())
