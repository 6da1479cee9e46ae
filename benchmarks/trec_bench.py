"""`evald score` on TREC files beside the trec_eval C binary and pytrec_eval, in one run.

Two runs are generated from a seed: 1M lines (1 000 topics × 1 000 documents) and 200k lines
(200 topics × 1 000), each with a qrels file of 100 judgments per topic (a third relevant, at
grades 1-2), scores with ties. Every tool reads the same two files from disk and computes the
same four measures (trec_eval ``-m map -m P.10 -m ndcg_cut.10 -m recip_rank``; evald
``--mean --format trec`` of the same names), and prints only the summary; each is timed end to end
as a process, wall time, best of ``--repeat``. pytrec_eval is timed as the Python a user writes
for it: read both files into dicts, evaluate, average. The outputs are compared (4 decimals) so
the three are known to compute the same thing.

The C binary is not part of this repository: build trec_eval from its public source with -O2
and pass its path (``--trec-eval PATH``); without it, its column says "not given".

    python -m benchmarks.trec_bench --trec-eval /path/to/trec_eval [--repeat 3] [--quick]
        [--before DIR]

``--before DIR`` also times ``evald score`` from another source tree (a checkout of an earlier
commit, put first on PYTHONPATH) in the same run, for before/after figures. Beside each wall
time the CPU time (user + system, all threads) is printed: on a shared machine it moves less.

Also measured: the start-up of ``evald score`` (a one-line JSONL file, and one-line TREC files),
beside ``python -c pass`` and ``python -c "import numpy"`` in the same run (target: under
0.15 s), and the load average at the start and the end.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

import numpy as np

from benchmarks import _common as c

TREC_EVAL_ARGS = ["-m", "map", "-m", "P.10", "-m", "ndcg_cut.10", "-m", "recip_rank"]
EVALD_MEASURES = "map,P.10,ndcg_cut.10,recip_rank"


def write_trec(run_path: str, qrels_path: str, topics: int, docs: int, seed: int) -> None:
    """A run of topics × docs lines (scores with ties) and 100 judgments per topic, 70 of them
    on retrieved documents."""
    rng = np.random.default_rng(seed)
    with open(run_path, "w") as run, open(qrels_path, "w") as qrels:
        for t in range(topics):
            ids = rng.choice(50_000, size=docs + 30, replace=False)
            scores = np.round(rng.normal(10.0, 3.0, size=docs), 2)  # 2 decimals: ties
            order = np.argsort(-scores, kind="stable")
            run.write(
                "".join(
                    f"{t} Q0 doc{ids[i]} {r} {scores[i]:.2f} bench\n"
                    for r, i in enumerate(order, start=1)
                )
            )
            judged = np.concatenate([rng.choice(ids[:docs], size=70, replace=False), ids[docs:]])
            grades = rng.choice(3, size=100, p=(0.67, 0.22, 0.11))
            qrels.write("".join(f"{t} 0 doc{d} {g}\n" for d, g in zip(judged, grades, strict=True)))


def pytrec_eval_script(run_path: str, qrels_path: str) -> str:
    """What a pytrec_eval user runs: parse both files, evaluate, print the means."""
    return f"""
import pytrec_eval
qrels, run = {{}}, {{}}
with open({qrels_path!r}) as fh:
    for line in fh:
        q, _, d, g = line.split()
        qrels.setdefault(q, {{}})[d] = int(g)
with open({run_path!r}) as fh:
    for line in fh:
        q, _, d, _, s, _ = line.split()
        run.setdefault(q, {{}})[d] = float(s)
names = {{"map", "P.10", "ndcg_cut.10", "recip_rank"}}
res = pytrec_eval.RelevanceEvaluator(qrels, names).evaluate(run)
for key in ("map", "P_10", "ndcg_cut_10", "recip_rank"):
    print(key, "all", "%.4f" % (sum(v[key] for v in res.values()) / len(res)))
"""


def timed(
    argv: Sequence[str], repeat: int, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> tuple[float, float, str]:
    """Best wall time and best CPU time (user + system) of ``repeat`` runs of a process, and
    its stdout."""
    best, best_cpu, out = float("inf"), float("inf"), ""
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=True, env=env, cwd=cwd)
        best = min(best, time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        best_cpu = min(best_cpu, cpu)
        out = done.stdout
    return best, best_cpu, out


def summary(text: str) -> dict[str, str]:
    """{measure: value} from trec_eval-style 'measure all value' lines."""
    rows = [line.split() for line in text.splitlines() if line.strip()]
    return {r[0]: r[2] for r in rows if len(r) == 3 and r[1] == "all"}


def main(argv: Sequence[str] | None = None) -> int:
    def extra(parser) -> None:  # type: ignore[no-untyped-def]
        parser.add_argument("--trec-eval", metavar="PATH", help="the trec_eval binary")
        parser.add_argument("--repeat", type=int, default=3, help="best of N (default 3)")
        parser.add_argument(
            "--before", metavar="DIR", help="also time evald from this source tree (PYTHONPATH)"
        )

    args = c.parse_args(__doc__.splitlines()[0], argv, extra)
    python = sys.executable
    evald = [python, "-m", "evald", "score"]
    sizes = [(100, 1000), (20, 1000)] if args.quick else [(1000, 1000), (200, 1000)]
    print(f"# {__doc__.splitlines()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        one = os.path.join(tmp, "one.jsonl")
        with open(one, "w") as fh:
            fh.write('{"qid": "q", "ranking": ["a"], "qrels": {"a": 1}}\n')
        one_run, one_qrels = os.path.join(tmp, "one.run"), os.path.join(tmp, "one.qrels")
        with open(one_run, "w") as fh:
            fh.write("q Q0 a 1 1.5 t\n")
        with open(one_qrels, "w") as fh:
            fh.write("q 0 a 1\n")
        print(f"load average {_load()} at the start")
        bare = timed([python, "-c", "pass"], 10)
        numpy_only = timed([python, "-c", "import numpy"], 10)
        start_up = timed([*evald, one, "-m", "RR"], 10)
        trec_argv = ["--run", one_run, "--qrels", one_qrels, "-m", "map", "--format", "trec"]
        trec_start = timed([*evald, *trec_argv, "--mean"], 10)
        print("start-up, best of 10 (wall, CPU; target: evald score under 0.15 s wall):")
        print(f"  evald score, a one-line JSONL file  {start_up[0]:.3f} s, {start_up[1]:.3f} s")
        print(f"  evald score, one-line TREC files    {trec_start[0]:.3f} s, {trec_start[1]:.3f} s")
        print(f"  python -c pass                      {bare[0]:.3f} s, {bare[1]:.3f} s")
        print(f"  python -c 'import numpy'            {numpy_only[0]:.3f} s, {numpy_only[1]:.3f} s")
        before_env = None
        if args.before:
            path = os.pathsep.join([args.before, os.environ.get("PYTHONPATH", "")])
            before_env = {**os.environ, "PYTHONPATH": path}
            # run from that tree: `python -m` puts the working directory first on sys.path
            where = subprocess.run(
                [python, "-c", "import evald; print(evald.__file__)"],
                capture_output=True, text=True, check=True, env=before_env, cwd=args.before,
            ).stdout.strip()  # fmt: skip
            assert where.startswith(os.path.abspath(args.before)), where
            before_start = timed([*evald, one, "-m", "RR"], 10, before_env, args.before)
            print(
                f"  --before: evald score, JSONL        {before_start[0]:.3f} s, "
                f"{before_start[1]:.3f} s"
            )
        for topics, docs in sizes:
            run_path = os.path.join(tmp, f"run{topics}")
            qrels_path = os.path.join(tmp, f"qrels{topics}")
            write_trec(run_path, qrels_path, topics, docs, args.seed)
            argv = [*evald, "--run", run_path, "--qrels", qrels_path, "-m", EVALD_MEASURES,
                    "--mean", "--format", "trec"]  # fmt: skip
            ours, ours_cpu, ours_out = timed(argv, args.repeat)
            print(
                f"{topics * docs:>9,} lines, {topics} topics, best of {args.repeat}, "
                f"load average {_load()}:"
            )
            print(f"  evald        {ours:.3f} s wall, {ours_cpu:.3f} s CPU")
            if before_env is not None:
                was, was_cpu, was_out = timed(argv, args.repeat, before_env, args.before)
                assert summary(was_out) == summary(ours_out), (was_out, ours_out)
                print(
                    f"  evald before {was:.3f} s wall, {was_cpu:.3f} s CPU "
                    f"(evald/before {ours / was:.2f}x wall, {ours_cpu / was_cpu:.2f}x CPU)"
                )
            if args.trec_eval:
                theirs, theirs_cpu, theirs_out = timed(
                    [args.trec_eval, *TREC_EVAL_ARGS, qrels_path, run_path], args.repeat
                )
                assert summary(ours_out) == summary(theirs_out), (ours_out, theirs_out)
                print(
                    f"  trec_eval    {theirs:.3f} s wall, {theirs_cpu:.3f} s CPU "
                    f"(evald/trec_eval {ours / theirs:.2f}x wall, {ours_cpu / theirs_cpu:.2f}x CPU)"
                )
            else:
                print("  trec_eval not given")
            script = pytrec_eval_script(run_path, qrels_path)
            pytrec, pytrec_cpu, pytrec_out = timed([python, "-c", script], args.repeat)
            assert summary(ours_out) == summary(pytrec_out), (ours_out, pytrec_out)
            print(
                f"  pytrec_eval  {pytrec:.3f} s wall, {pytrec_cpu:.3f} s CPU "
                f"(evald/pytrec_eval {ours / pytrec:.2f}x wall, {ours_cpu / pytrec_cpu:.2f}x CPU)"
            )
    print(f"load average {_load()} at the end")
    return 0


def _load() -> str:
    """The 1, 5 and 15 minute load averages: on a shared machine, the context of every time."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
