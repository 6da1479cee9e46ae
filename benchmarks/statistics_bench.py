"""The statistics core's guarantees at sizes too large for the test suite, each beside its
negative control measured in the same run.

- A/A peeking: comparisons of a zero-heavy measure looked at after every window; share ever
  flagged by the confidence sequence (target ≤ α + 3 SE) against a fixed 95% z interval.
- Family: Holm on always-valid p-values over 3 measures × 4 segments against each alone at α.
- Clustered coverage at intra-class correlation 0.2: bootstrap against the plain t interval.
- CUSUM (k 0.5, h 5): false-alarm run length against Siegmund's value, and the detection delay
  of a 2% absolute drop of a measure with sd 0.3 at 500 lists per arm per window.
- The engine's per-window statistics: CPU time per result of the aggregate step with and
  without the bootstrap sums, alternating in one process.

    python -m benchmarks.statistics_bench [--quick] [--seed N]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

import numpy as np

from benchmarks import _common as c

Z95 = 1.959963984540054


def zero_heavy(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """0 for 60% of lists (nothing relevant found), else Beta(2, 3)."""
    return np.where(rng.random(shape) < 0.6, 0.0, rng.beta(2.0, 3.0, shape))


def aa_peeking(comparisons: int, windows: int, per_window: int, seed: int) -> tuple[float, float]:
    from evald.statistics.sequential import half_width

    rng = np.random.default_rng(seed)
    sums = np.zeros((2, comparisons))
    squares = np.zeros((2, comparisons))
    low = np.full(comparisons, -np.inf)
    high = np.full(comparisons, np.inf)
    fixed = np.zeros(comparisons, dtype=bool)
    for w in range(1, windows + 1):
        y = zero_heavy(rng, (2, comparisons, per_window))
        sums += y.sum(axis=2)
        squares += np.square(y).sum(axis=2)
        n = w * per_window
        if n < 100:
            continue
        var = (squares - sums * sums / n) / (n - 1)
        se2 = (var[0] + var[1]) / n
        diff = (sums[1] - sums[0]) / n
        half = half_width(2 * n, se2, 0.05, float(2 * windows * per_window))
        low, high = np.maximum(low, diff - half), np.minimum(high, diff + half)
        fixed |= np.abs(diff) > Z95 * np.sqrt(se2)
    return float(((low > 0) | (high < 0)).mean()), float(fixed.mean())


def family(families: int, members: int, windows: int, seed: int) -> tuple[float, float]:
    from evald.statistics.multiplicity import holm_reject
    from evald.statistics.sequential import log_evalue

    rng = np.random.default_rng(seed)
    shape = (2, families, members)
    sums, squares = np.zeros(shape), np.zeros(shape)
    min_p = np.ones((families, members))
    holm = np.zeros(families, dtype=bool)
    for w in range(1, windows + 1):
        y = zero_heavy(rng, (*shape, 20))
        sums += y.sum(axis=-1)
        squares += np.square(y).sum(axis=-1)
        n = 20 * w
        if n < 100:
            continue
        var = (squares - sums * sums / n) / (n - 1)
        log_e = log_evalue(2 * n, (var[0] + var[1]) / n, (sums[1] - sums[0]) / n, 0.05, 5000.0)
        min_p = np.minimum(min_p, np.minimum(1.0, np.exp(-log_e)))
        holm |= [any(holm_reject(row, 0.05)) for row in min_p]
    return float(holm.mean()), float((min_p <= 0.05).any(axis=1).mean())


def coverage(windows: int, users: int, icc: float, seed: int) -> tuple[float, float]:
    from evald.statistics.bootstrap import BootstrapState
    from evald.statistics.intervals import t_interval

    rng = np.random.default_rng(seed)
    hits = np.zeros(2)
    for w in range(windows):
        lists = 1 + rng.poisson(4.0, users)
        user = np.repeat(np.arange(users), lists)
        y = rng.normal(0, math.sqrt(icc), users)[user] + rng.normal(
            0, math.sqrt(1 - icc), user.size
        )
        state = BootstrapState.of((np.uint64(w) << np.uint64(32)) + user.astype(np.uint64), y)
        for i, iv in enumerate((state.interval(), t_interval(state.moments))):
            hits[i] += iv.low <= 0.0 <= iv.high
    return float(hits[0] / windows), float(hits[1] / windows)


def cusum_runs(runs: int, drop_se: float, seed: int) -> np.ndarray:
    from evald.statistics.cusum import cusum_update

    rng = np.random.default_rng(seed)
    stat, length = np.zeros(runs), np.zeros(runs, dtype=np.int64)
    alive, t = np.ones(runs, dtype=bool), 0
    while alive.any():
        t += 1
        stat = np.where(alive, cusum_update(stat, rng.normal(-drop_se, 1.0, runs), 0.5), 0.0)
        fired = alive & (stat > 5.0)
        length[fired], alive = t, alive & ~fired
    return length


def state_cost(batches: int, seed: int) -> tuple[float, float, float]:
    """CPU µs per finalized result of the engine's aggregate step (``Aggregates.observe`` on
    batches of 4096 results: 7 measures, windows 5m and 1h, 12 segments), without the
    bootstrap state, with it (100 replicates), and of the cluster keys (one BLAKE2b per
    result); the cases alternate batch by batch so load on the machine hits them alike."""
    from evald.aggregate import Aggregates
    from evald.segments import SegmentIndex
    from evald.statistics.bootstrap import request_clusters

    rng = np.random.default_rng(seed)
    n, measures = 4096, [f"m{i}" for i in range(7)]
    segments = SegmentIndex(["arm", "surface"], 50, 200)
    ids = [segments.segment_of({"arm": f"a{i % 3}", "surface": f"s{i % 4}"}) for i in range(12)]
    plain = Aggregates(measures, segments, [0.5], 60_000, [300_000, 3_600_000], 3 * 3_600_000, 0)
    boot = Aggregates(measures, segments, [0.5], 60_000, [300_000, 3_600_000], 3 * 3_600_000)
    totals = [0.0, 0.0, 0.0]
    for b in range(batches):
        seg = rng.choice(ids, n)
        ts = 1_767_225_600_000 + b * 20_000 + rng.integers(0, 20_000, n)
        values = rng.random((n, len(measures)))
        rids = [f"r{b}-{i}" for i in range(n)]
        t0 = time.process_time()
        plain.observe(0, seg, ts, values)
        t1 = time.process_time()
        keys = request_clusters(rids)
        t2 = time.process_time()
        boot.observe(0, seg, ts, values, clusters=keys)
        t3 = time.process_time()
        totals[0] += t1 - t0
        totals[1] += t3 - t2
        totals[2] += t2 - t1
    per = 1e6 / (batches * n)
    return totals[0] * per, totals[1] * per, totals[2] * per


def body(args: argparse.Namespace) -> None:
    c.require("evald.statistics", "Comparison", "BootstrapState", "Cusum")
    from evald.statistics.cusum import siegmund_arl

    q = args.quick
    started = time.perf_counter()
    comps, windows = (1000, 200) if q else (4000, 500)
    seq, fixed = aa_peeking(comps, windows, 20, args.seed)
    limit = 0.05 + 3 * math.sqrt(0.05 * 0.95 / comps)
    c.target(
        f"A/A {comps} x {windows} looks: sequence ever flagged",
        f"{seq:.2%}",
        seq <= limit,
        f"<= {limit:.2%}",
    )
    c.line("  fixed 95% z interval peeked alike (control)", f"{fixed:.2%}")

    fams = 300 if q else 1500
    holm, alone = family(fams, 12, 150, args.seed + 1)
    limit = 0.05 + 3 * math.sqrt(0.05 * 0.95 / fams)
    c.target(
        f"{fams} families of 12: Holm ever flagged", f"{holm:.2%}", holm <= limit, f"<= {limit:.2%}"
    )
    c.line("  each comparison alone at alpha (control)", f"{alone:.2%}")

    wins = 1000 if q else 5000
    boot, plain = coverage(wins, 200, 0.2, args.seed + 2)
    c.target(
        f"coverage, ICC 0.2, {wins} windows: bootstrap",
        f"{boot:.2%}",
        0.935 <= boot <= 0.965,
        "93.5%-96.5%",
    )
    c.line("  plain t interval (control)", f"{plain:.2%}")

    runs = 1000 if q else 5000
    null = cusum_runs(runs, 0.0, args.seed + 3).mean()
    arl0 = siegmund_arl(0.5, 5.0)
    c.target(
        f"CUSUM (0.5, 5) false-alarm run length, {runs} runs",
        f"{null:.0f} windows",
        abs(null / arl0 - 1) <= 0.1,
        f"{arl0:.0f} ± 10%",
    )
    drop_se = 0.02 / math.sqrt(2 * 0.3**2 / 500)
    delay = cusum_runs(runs, drop_se, args.seed + 4)
    c.line(
        f"  delay, 2% drop (= {drop_se:.2f} SE): mean / p90",
        f"{delay.mean():.1f} / {np.percentile(delay, 90):.0f} windows"
        f" (analytic mean {siegmund_arl(0.5, 5.0, drop_se):.1f})",
    )
    batches = 20 if q else 100
    plain_us, boot_us, keys_us = state_cost(batches, args.seed + 5)
    c.line(
        f"aggregate step, {batches} batches of 4096 results (CPU us per result)",
        f"{plain_us:.2f} without the bootstrap, {boot_us:.2f} with it "
        f"({boot_us / plain_us:.1f}x) + {keys_us:.2f} for the cluster keys",
    )
    c.line("wall time", c.fmt_s(time.perf_counter() - started))


def main(argv: Sequence[str] | None = None) -> int:
    args = c.parse_args(__doc__.splitlines()[0], argv)
    return c.run_main("statistics: guarantees at scale", lambda: body(args))


if __name__ == "__main__":
    raise SystemExit(main())
