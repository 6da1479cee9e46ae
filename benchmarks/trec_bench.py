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

What is timed is ``evald`` as a user runs an installed copy: the tree's ``evald`` package is
put into a throwaway venv's site-packages as its wheel installs it, byte-compiled (as pip does),
and that venv's ``evald`` script is run. The venv takes evald's dependencies from the current
environment through a ``.pth`` line naming its site-packages (a plain path entry: the current
environment's own ``.pth`` files, such as a development checkout's editable-install finder, are
not run).
Timing the development checkout instead would time two things a user never pays for: the
editable finder (about 14 ms at interpreter start) and, where ``PYTHONDONTWRITEBYTECODE`` is
set, the compilation of every evald module from source on every run (about 30 ms). Start-up is
also printed "from the source tree" (``python -m evald`` in the current environment) beside it.

``--before DIR`` also times ``evald score`` from another source tree (a checkout of an earlier
commit), installed the same way, in the same run, for before/after figures. Beside each wall
time the CPU time (user + system, all threads) is printed: on a shared machine it moves less.

Each size also gets one more run of each tool for its peak resident set size (its own
``ru_maxrss``) and the bytes per run line; ``--big`` adds a 5M-line run (5 000 topics) for it.

Also measured: the start-up of ``evald score`` (a one-line JSONL file, and one-line TREC files),
beside ``python -c pass`` and ``python -c "import numpy"`` (with one BLAS thread, as evald
score starts it) in the same run (target: under
0.15 s), and the load average at the start and the end.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence

import numpy as np

from benchmarks import _common as c

TREC_EVAL_ARGS = ["-m", "map", "-m", "P.10", "-m", "ndcg_cut.10", "-m", "recip_rank"]
EVALD_MEASURES = "map,P.10,ndcg_cut.10,recip_rank"
NUMPY_ONE_THREAD = "import os; os.environ['OPENBLAS_NUM_THREADS'] = '1'; import numpy"


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


#: The console script pip writes for ``[project.scripts] evald = "evald.cli:main"``.
SCRIPT = """#!{python}
import sys
from evald.cli import main
if __name__ == '__main__':
    sys.exit(main())
"""


def install(tree: str, where: str) -> str:
    """The ``evald`` script of a fresh venv in ``where`` holding ``tree``'s evald, compiled.

    Laid out as installing the project's wheel does (the ``evald`` package with its data in
    site-packages, a console script in bin) without building one: a wheel build needs a newer
    setuptools than a test environment may hold. The venv has no packages of its own but
    evald: a ``.pth`` line puts the current environment's site-packages after its own, so the
    same numpy and pyarrow are timed.
    """
    venv = os.path.join(where, "venv")
    quiet = {"capture_output": True, "text": True, "check": True}
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], **quiet)
    python = os.path.join(venv, "bin", "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], **quiet
    ).stdout.strip()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(os.path.join(tree, "evald"), os.path.join(site, "evald"), ignore=ignore)
    here = sysconfig.get_paths()
    with open(os.path.join(site, "deps.pth"), "w") as fh:
        fh.write("".join(f"{p}\n" for p in dict.fromkeys([here["purelib"], here["platlib"]])))
    # as pip does at install time, whatever PYTHONDONTWRITEBYTECODE says
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(site, "evald")], **quiet)
    script = os.path.join(venv, "bin", "evald")
    with open(script, "w") as fh:
        fh.write(SCRIPT.format(python=python))
    os.chmod(script, 0o755)
    found = subprocess.run(  # from where: `python -c` puts the working directory first
        [python, "-c", "import evald, numpy; print(evald.__file__)"], cwd=where, **quiet
    ).stdout.strip()
    assert found.startswith(site), found
    return script


def timed(argv: Sequence[str], repeat: int, cwd: str | None = None) -> tuple[float, float, str]:
    """Best wall time and best CPU time (user + system) of ``repeat`` runs of a process, and
    its stdout."""
    best, best_cpu, out = float("inf"), float("inf"), ""
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=cwd)
        best = min(best, time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        best_cpu = min(best_cpu, cpu)
        out = done.stdout
    return best, best_cpu, out


def peak_rss(argv: Sequence[str]) -> int:
    """The peak resident set size (bytes) of one run of a process, from its own rusage."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return int(usage.ru_maxrss) * 1024  # kilobytes on Linux


def summary(text: str) -> dict[str, str]:
    """{measure: value} from trec_eval-style 'measure all value' lines."""
    rows = [line.split() for line in text.splitlines() if line.strip()]
    return {r[0]: r[2] for r in rows if len(r) == 3 and r[1] == "all"}


def main(argv: Sequence[str] | None = None) -> int:
    def extra(parser) -> None:  # type: ignore[no-untyped-def]
        parser.add_argument("--trec-eval", metavar="PATH", help="the trec_eval binary")
        parser.add_argument("--repeat", type=int, default=3, help="best of N (default 3)")
        parser.add_argument(
            "--before", metavar="DIR", help="also time evald built from this source tree"
        )
        parser.add_argument(
            "--big",
            action="store_true",
            help="also a 5M-line run (5 000 topics), for the peak memory as the run grows",
        )

    args = c.parse_args(__doc__.splitlines()[0], argv, extra)
    python = sys.executable
    sizes = [(100, 1000), (20, 1000)] if args.quick else [(1000, 1000), (200, 1000)]
    if args.big:
        sizes.append((5000, 1000))
    print(f"# {__doc__.splitlines()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        evald = [install(tree, os.path.join(tmp, "now")), "score"]
        before = None
        if args.before:
            before = [install(os.path.abspath(args.before), os.path.join(tmp, "before")), "score"]
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
        # with one BLAS thread, as evald score sets it before importing numpy
        numpy_only = timed([python, "-c", NUMPY_ONE_THREAD], 10)
        jsonl_argv = [one, "-m", "RR"]
        trec_argv = ["--run", one_run, "--qrels", one_qrels, "-m", "map", "--format", "trec",
                     "--mean"]  # fmt: skip
        from_tree = [python, "-m", "evald", "score"]
        print("start-up, best of 10 (wall, CPU; target: evald score under 0.15 s wall):")
        rows = [
            ("evald score, a one-line JSONL file", [*evald, *jsonl_argv], tmp),
            ("evald score, one-line TREC files", [*evald, *trec_argv], tmp),
            ("  from the source tree, JSONL", [*from_tree, *jsonl_argv], tree),
            ("  from the source tree, TREC", [*from_tree, *trec_argv], tree),
        ]
        if before is not None:
            rows += [
                ("--before: evald score, JSONL", [*before, *jsonl_argv], tmp),
                ("--before: evald score, TREC", [*before, *trec_argv], tmp),
            ]
        for label, command, cwd in rows:
            wall, cpu, _ = timed(command, 10, cwd=cwd)
            print(f"  {label:<36}{wall:.3f} s, {cpu:.3f} s")
        for label, (wall, cpu, _) in [
            ("python -c pass", bare),
            ("import numpy (1 thread)", numpy_only),
        ]:
            print(f"  {label:<36}{wall:.3f} s, {cpu:.3f} s")
        for topics, docs in sizes:
            run_path = os.path.join(tmp, f"run{topics}")
            qrels_path = os.path.join(tmp, f"qrels{topics}")
            write_trec(run_path, qrels_path, topics, docs, args.seed)
            flags = ["--run", run_path, "--qrels", qrels_path, "-m", EVALD_MEASURES, "--mean",
                     "--format", "trec"]  # fmt: skip
            ours, ours_cpu, ours_out = timed([*evald, *flags], args.repeat)
            print(
                f"{topics * docs:>9,} lines, {topics} topics, best of {args.repeat}, "
                f"load average {_load()}:"
            )
            print(f"  evald        {ours:.3f} s wall, {ours_cpu:.3f} s CPU")
            if before is not None:
                was, was_cpu, was_out = timed([*before, *flags], args.repeat)
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
            lines = topics * docs
            rss = [("evald", peak_rss([*evald, *flags]))]
            if before is not None:
                rss.append(("evald before", peak_rss([*before, *flags])))
            if args.trec_eval:
                rss.append(("trec_eval", peak_rss([args.trec_eval, *TREC_EVAL_ARGS, qrels_path,
                                                   run_path])))  # fmt: skip
            shown = [f"{name} {b / 1e6:,.0f} MB ({b / lines:,.0f} B/line)" for name, b in rss]
            print("  peak RSS: " + ", ".join(shown))
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
