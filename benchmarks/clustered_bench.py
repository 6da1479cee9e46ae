"""The comparison's statistics when users come back, at sizes too large for the test suite:
every figure of docs/statistics.md §3-§4 and "Sample-ratio guard", each beside the list-level
variance (what evald used before) on the same streams.

- A/A streams (evald.statistics.simulation: per-user effects none / mild / strong, heavy-tailed
  lists per user, sessions over 34 five-minute windows, two surfaces): the share of streams
  the sequence ever flags (α = 0.05; pooled over the surfaces, and per surface at α/2), and the
  share whose CUSUMs alarm (against control, and each arm against its baseline), against the
  chance independent N(0, 1) windows alarm within the stream (the stated run length).
- The same at four times the traffic per window, and at 100 windows (the run length that
  share implies, beside Siegmund's).
- The variance clustered by user over the list-level one at the end of the streams.
- Detection of a 10% drop of the treatment from window 12 (one list-level SE per window):
  share detected and mean delay in windows, sequence and CUSUM, clustered and list level.
- The sample-ratio guard: the loss of treatment traffic it finds with 80% power after N
  assignments, alone and on one of two surfaces (a family of three guards).
- CPU per result of the shares with the replicate sums and without.

    python -m benchmarks.clustered_bench [--quick] [--seed N]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

import numpy as np

from benchmarks import _common as c

ALPHA = 0.05
TUNING_N = 5000.0


def _share(first: np.ndarray) -> float:
    """Share of streams where any of the segments fired (first window > 0)."""
    return float((first > 0).reshape(first.shape[0], -1).any(axis=1).mean())


def false_alarms(sums: np.ndarray, list_level: bool) -> dict[str, float]:
    from evald.statistics.simulation import baseline_alarms, cusum_alarms, sequence_flags

    pooled, split = sums[:, :, -1:], sums[:, :, :-1]
    out = {
        "sequence, pooled": sequence_flags(pooled, ALPHA, TUNING_N, list_level=list_level),
        "sequence, per surface (α/2)": sequence_flags(
            split, ALPHA / 2, TUNING_N, list_level=list_level
        ),
        "CUSUM vs control, pooled": cusum_alarms(pooled, list_level=list_level),
        "CUSUM vs control, per surface": cusum_alarms(split, list_level=list_level),
    }
    for arm, name in ((0, "control"), (1, "treatment")):
        alarms = baseline_alarms(sums, arm, list_level=list_level)
        out[f"CUSUM {name} vs baseline, pooled"] = alarms[:, -1:]
        out[f"CUSUM {name} vs baseline, per surface"] = alarms[:, :-1]
    return {k: _share(v) for k, v in out.items()}


def limits(streams: int, windows: int) -> dict[str, tuple[float, float]]:
    """Per check: (the rate it may reach, that plus three standard errors)."""
    from evald.statistics.simulation import iid_alarm_share

    one = iid_alarm_share(windows)
    either = 1 - (1 - one) ** 2
    out = {}
    for name in (
        "sequence, pooled",
        "sequence, per surface (α/2)",
        "CUSUM vs control, pooled",
        "CUSUM vs control, per surface",
        "CUSUM control vs baseline, pooled",
        "CUSUM control vs baseline, per surface",
        "CUSUM treatment vs baseline, pooled",
        "CUSUM treatment vs baseline, per surface",
    ):
        rate = ALPHA if name.startswith("sequence") else either if "surface" in name else one
        out[name] = (rate, rate + 3 * math.sqrt(rate * (1 - rate) / streams))
    return out


def variance_ratio(sums: np.ndarray) -> tuple[float, float]:
    """Median and 90th percentile over streams of the pooled comparison's clustered variance
    over its list-level one, at the end of the stream."""
    from evald.statistics.simulation import _contrast

    total = sums[:, :, -1].sum(axis=2)  # arms, streams, columns
    _, clustered, _ = _contrast(total[0], total[1], list_level=False)
    _, listed, _ = _contrast(total[0], total[1], list_level=True)
    ratio = clustered / listed
    return float(np.median(ratio)), float(np.percentile(ratio, 90))


def aa(streams: int, users: int, windows: int, seed: int) -> None:
    from evald.statistics.simulation import (
        STRENGTHS,
        Traffic,
        intraclass_correlation,
        simulate,
        with_pooled,
    )

    bounds = limits(streams, windows)
    for name, strength in STRENGTHS.items():
        started = time.process_time()
        traffic = Traffic(users=users, strength=strength, windows=windows)
        sums = with_pooled(simulate(traffic, streams, seed + int(strength * 100)))
        lists = sums[0, :, -1, :, 0].sum() + sums[1, :, -1, :, 0].sum()
        median, p90 = variance_ratio(sums)
        c.header(
            f"A/A, {name} (ICC {intraclass_correlation(strength):.2f}): {streams} streams of "
            f"{lists / streams:,.0f} lists, {windows} windows; clustered/list variance "
            f"median {median:.2f}, p90 {p90:.2f}"
        )
        new, old = false_alarms(sums, False), false_alarms(sums, True)
        for check, share in new.items():
            rate, limit = bounds[check]
            c.target(
                f"  {check}",
                f"{share:.2%} (list level {old[check]:.2%})",
                share <= limit,
                f"<= {rate:.2%} + 3 SE = {limit:.2%}",
            )
        c.line("  CPU", c.fmt_s(time.process_time() - started))


def run_lengths(streams: int, users: int, windows: int, seed: int) -> None:
    """The CUSUM against control over long streams: the alarm share within ``windows`` and the
    average run length it implies (geometric), beside independent N(0, 1) windows'."""
    from evald.statistics.cusum import siegmund_arl
    from evald.statistics.simulation import (
        STRENGTHS,
        Traffic,
        cusum_alarms,
        iid_alarm_share,
        simulate,
        with_pooled,
    )

    iid = iid_alarm_share(windows)

    def implied(share: float) -> float:
        return -windows / math.log1p(-share) if share > 0 else math.inf

    c.header(
        f"CUSUM vs control over {windows} windows, {streams} streams: alarm share and the run "
        f"length it implies (independent windows: {iid:.2%}, {implied(iid):.0f}; Siegmund "
        f"{siegmund_arl():.0f})"
    )
    for name, strength in STRENGTHS.items():
        traffic = Traffic(users=users, strength=strength, windows=windows)
        sums = with_pooled(simulate(traffic, streams, seed + 7 + int(strength * 100)))[:, :, -1:]
        new = _share(cusum_alarms(sums))
        old = _share(cusum_alarms(sums, list_level=True))
        c.line(
            f"  {name}",
            f"clustered {new:.2%} ({implied(new):.0f} windows), "
            f"list level {old:.2%} ({implied(old):.0f})",
        )


def delays(streams: int, users: int, seed: int, drop: float = 0.10, at: int = 11) -> None:
    from evald.statistics.simulation import (
        STRENGTHS,
        Traffic,
        cusum_alarms,
        sequence_flags,
        simulate,
        with_pooled,
    )

    c.header(
        f"a {drop:.0%} drop of the treatment from window {at + 1} of 34 ({streams} streams): "
        "share detected, mean delay (windows after the drop)"
    )
    for name, strength in STRENGTHS.items():
        traffic = Traffic(users=users, strength=strength, shift=drop, shift_at=at)
        sums = with_pooled(simulate(traffic, streams, seed + 11 + int(strength * 100)))[:, :, -1:]
        parts = []
        for label in ("sequence", "CUSUM"):
            for level in (False, True):
                if label == "sequence":
                    first = sequence_flags(sums, ALPHA, TUNING_N, list_level=level)[:, 0]
                else:
                    first = cusum_alarms(sums, list_level=level)[:, 0]
                late = first > at  # a flag before the drop is a false alarm, not a detection
                delay = (first[late] - at).mean() if late.any() else math.nan
                tag = "list level" if level else "clustered"
                parts.append(f"{label} {tag} {late.mean():.0%} {delay:.1f}")
        c.line(f"  {name}", " · ".join(parts))


def srm_power(runs: int, seed: int) -> None:
    """The loss of treatment traffic (share of it lost, 50/50 split) found with 80% power after
    N assignments, checked after every 1/50 of them: one guard at α = 0.001, and one surface's
    guard in a family of two surfaces and the pooled guard (α/4) when only that surface loses
    (N counts both surfaces)."""
    from evald.statistics.srm import srm_log_evalues

    rng = np.random.default_rng(seed)
    threshold = -math.log(0.001)

    def power(loss: float, n: int, level: float) -> float:
        share = (1 - loss) / (2 - loss)
        step = n // 50
        treated = rng.binomial(step, share, (runs, 50)).cumsum(axis=1)
        total = step * np.arange(1, 51)
        log_e = srm_log_evalues(np.stack([total - treated, treated], axis=-1), (1, 1))
        return float((log_e.max(axis=1) >= level).mean())

    def loss_at_80(n: int, level: float) -> float:
        low, high = 0.0, 0.5
        for _ in range(14):
            mid = (low + high) / 2
            low, high = (mid, high) if power(mid, n, level) < 0.8 else (low, mid)
        return high

    c.header(f"sample-ratio guard: traffic loss found with 80% power ({runs} runs per point)")
    for n in (10_000, 100_000, 1_000_000, 10_000_000):
        alone = loss_at_80(n, threshold)
        segment = loss_at_80(n // 2, threshold + math.log(4))
        c.line(
            f"  N = {n:,}",
            f"{alone:.2%} of the treatment's traffic; on one of two equal surfaces: {segment:.2%}",
        )


def share_cost(batches: int, seed: int) -> tuple[float, float]:
    """CPU µs per result of ``PartitionShares.observe`` (4096 results a batch, 7 measures, 12
    segments) without and with the 100 replicate pairs (the weights are the engine's, computed
    once per batch for the window sums too, so not counted); the cases alternate."""
    from evald.segments import SegmentIndex
    from evald.statistics.bootstrap import poisson_weights
    from evald.statistics.shares import PartitionShares

    rng = np.random.default_rng(seed)
    n = 4096
    segments = SegmentIndex(["arm", "surface"], 50, 200)
    ids = [segments.segment_of({"arm": f"a{i % 3}", "surface": f"s{i % 4}"}) for i in range(12)]
    plain = PartitionShares(3_600_000, 1_800_000, 7, segments)
    clustered = PartitionShares(3_600_000, 1_800_000, 7, segments, replicates=100)
    totals = [0.0, 0.0]
    for b in range(batches):
        seg = rng.choice(ids, n)
        ts = 1_767_225_600_000 + b * 20_000 + rng.integers(0, 20_000, n)
        values = rng.random((n, 7))
        weights = poisson_weights(rng.integers(1, 2**63, n).astype(np.uint64), 100, 1)
        users = np.ones(n, dtype=bool)
        reasons = ["window"] * n
        t0 = time.process_time()
        plain.observe(0, seg, ts, values, reasons)
        t1 = time.process_time()
        clustered.observe(0, seg, ts, values, reasons, weights, users)
        totals[0] += t1 - t0
        totals[1] += time.process_time() - t1
    per = 1e6 / (batches * n)
    return totals[0] * per, totals[1] * per


def body(args: argparse.Namespace) -> None:
    c.require("evald.statistics.clustered", "ClusterSums", "contrast")
    q = args.quick
    started = time.perf_counter()
    aa(200 if q else 1000, 5000, 34, args.seed)
    aa(60 if q else 300, 20000, 34, args.seed + 1)
    run_lengths(60 if q else 300, 15000, 100, args.seed)
    delays(100 if q else 500, 5000, args.seed)
    srm_power(400 if q else 2000, args.seed)
    batches = 20 if q else 100
    plain_us, clustered_us = share_cost(batches, args.seed)
    c.line(
        f"shares, {batches} batches of 4096 results (CPU us per result)",
        f"{plain_us:.2f} list level, {clustered_us:.2f} with the replicate sums",
    )
    c.line("wall time", c.fmt_s(time.perf_counter() - started))


def main(argv: Sequence[str] | None = None) -> int:
    args = c.parse_args(__doc__.splitlines()[0], argv)
    return c.run_main("clustered statistics: guarantees and delays at scale", lambda: body(args))


if __name__ == "__main__":
    raise SystemExit(main())
