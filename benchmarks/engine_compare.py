"""The engine benchmark on two source trees, interleaved: this checkout against a baseline one.

``python -m benchmarks.engine_compare --baseline-path DIR [--quick] [--rounds N]`` where DIR is
another checkout of evald (``git worktree add DIR <commit>``). One worker process per tree
imports ``evald`` from its tree and generates the same traffic (``engine_bench``'s, same seed)
before any timer starts; the parent then asks the two workers for one timed run at a time,
alternating (baseline, current, baseline, ...), so load drifting on a shared machine hits both
alike. Each run is timed in CPU seconds of its worker (wall seconds are printed too). Printed:
median and spread (min..max) per tree and case, and the ratio of medians current / baseline.

Cases: ``feed_batch`` per 500 lines with the kind inferred (replay) and given (Kafka), and
``feed`` per line; each ends with ``tick`` per batch and a ``drain`` (engine_bench's run).
Not a ``*_bench.py``: ``make bench`` does not run it, it needs a second tree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CASES = {
    "feed_batch, kind inferred (replay)": ("batched", False),
    "feed_batch, kind given (Kafka)": ("batched", True),
    "feed per line, kind inferred": ("per_line", False),
    "decode only (feed_batch's decoder, kind inferred)": ("decode", False),
}


def worker(tree: str, impressions: int, seed: int, replicates: int | None) -> None:
    """Serve timed runs on stdin/stdout: a case name in, one JSON line out; 'quit' ends.

    ``replicates``: the config's ``statistics.bootstrap_replicates`` in a tree that has the
    setting (a tree before it has no bootstrap at all); None: the default."""
    sys.path.insert(0, tree)  # this tree's evald, not the installed one
    from benchmarks import _common as c
    from benchmarks.engine_bench import decode_only, engine_run, load_engine

    engine_cls, config_cls, _imp, _fb = load_engine()
    import evald

    if not str(Path(evald.__file__).resolve()).startswith(str(Path(tree).resolve())):
        raise SystemExit(f"evald imported from {evald.__file__}, not from {tree}")
    config = config_cls()
    if replicates is not None and "statistics" in config_cls.model_fields:
        config = config_cls.model_validate({"statistics": {"bootstrap_replicates": replicates}})
    traffic = c.generate_traffic(impressions, seed=seed, gap_ms=50)
    runs: dict[str, Callable[[], Any]] = {}
    for name, (mode, known) in CASES.items():
        if mode == "decode":
            decode = decode_only(traffic.lines, engine_cls, config)
            runs[name] = lambda decode=decode: (decode(), None)  # type: ignore[misc]
            continue
        kinds = traffic.kinds if known else None
        runs[name] = engine_run(traffic.lines, kinds, engine_cls, config, batched=mode == "batched")
    print(json.dumps({"ready": traffic.events}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if name == "quit":
            break
        c0, w0 = time.process_time(), time.perf_counter()
        results, _ = runs[name]()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        print(json.dumps({"cpu": cpu, "wall": wall, "results": results}), flush=True)


class Worker:
    """One worker process and its pipe."""

    def __init__(self, tree: Path, impressions: int, seed: int, replicates: int | None) -> None:
        here = Path(__file__).resolve().parent.parent
        command = [sys.executable, "-m", "benchmarks.engine_compare", "--worker", str(tree)]
        command += ["--impressions", str(impressions), "--seed", str(seed)]
        if replicates is not None:
            command += ["--bootstrap-replicates", str(replicates)]
        self.proc = subprocess.Popen(
            command,
            cwd=here,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events = self._read()["ready"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker exited with {self.proc.wait()}")
        return dict(json.loads(line))

    def run(self, case: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(case + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(60)


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} s  ({min(values):.3f}..{max(values):.3f})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline-path", type=Path, help="the other checkout's root")
    parser.add_argument("--quick", action="store_true", help="20k impressions instead of 200k")
    parser.add_argument("--rounds", type=int, default=7, help="timed runs per tree and case")
    parser.add_argument("--seed", type=int, default=20261121)
    parser.add_argument(
        "--bootstrap-replicates",
        type=int,
        help="statistics.bootstrap_replicates in a tree that has it (0: no clustered interval,"
        " the work a tree from before the bootstrap does not do); default: the config default",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--impressions", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.impressions, args.seed, args.bootstrap_replicates)
        return 0
    if args.baseline_path is None or not (args.baseline_path / "evald").is_dir():
        parser.error("--baseline-path must name a checkout of evald (a folder holding evald/)")
    current = Path(__file__).resolve().parent.parent
    impressions = 20_000 if args.quick else 200_000
    print(f"engine benchmark, interleaved: current {current} vs baseline {args.baseline_path}")
    trees = {"baseline": args.baseline_path.resolve(), "current": current}
    replicates = args.bootstrap_replicates
    workers = {
        name: Worker(tree, impressions, args.seed, replicates) for name, tree in trees.items()
    }
    try:
        events = workers["current"].events
        print(f"  {impressions:,} impressions, {events:,} events; {args.rounds} rounds")
        if replicates is not None:
            print(f"  bootstrap_replicates: {replicates} (in a tree that has the setting)")
        cpu: dict[tuple[str, str], list[float]] = {}
        wall: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for case in CASES:
                for name, w in workers.items():
                    out = w.run(case)
                    if out["results"] not in (None, impressions):
                        raise SystemExit(f"{name}: {out['results']} results, not {impressions}")
                    cpu.setdefault((case, name), []).append(out["cpu"])
                    wall.setdefault((case, name), []).append(out["wall"])
        for case in CASES:
            print(f"  {case}")
            for name in trees:
                print(f"    {name:<9} CPU {spread(cpu[case, name])}")
                print(f"    {'':<9} wall {spread(wall[case, name])}")
            ratio = statistics.median(cpu[case, "current"]) / statistics.median(
                cpu[case, "baseline"]
            )
            wall_ratio = statistics.median(wall[case, "current"]) / statistics.median(
                wall[case, "baseline"]
            )
            print(f"    current / baseline: {ratio:.3f}x CPU, {wall_ratio:.3f}x wall")
    finally:
        for w in workers.values():
            w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
