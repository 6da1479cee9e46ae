"""Interleaving against an A/B split of the same traffic, with the same always-valid test
(docs/statistics.md, "Interleaving: the figures"): impressions to the right verdict, their
ratio, and the A/A false-alarm share with its negative control (credit by position).

    python -m benchmarks.interleaving_bench [--streams N] [--impressions N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from evald.interleaving.simulation import (
    Looks,
    World,
    ab_verdict,
    interleaving_verdict,
    simulate,
)


def gap(streams: int, impressions: int) -> None:
    world, looks = World(), Looks(step=100)
    ratios: list[float] = []
    rows = []
    for seed in range(streams):
        stream = simulate(world, impressions, seed)
        at, sign = interleaving_verdict(stream, world, looks)
        verdicts = {m: ab_verdict(stream, world, looks, m) for m in ("clicks", "ndcg")}
        rows.append((seed, at, sign, verdicts))
        ab_at, ab_sign = verdicts["clicks"]
        if at is not None and sign == 1:
            # an A/B that never decides (or decides wrongly) counts as the whole stream: a bound
            right = ab_at if ab_at is not None and ab_sign == 1 else impressions
            ratios.append(right / at)
    for seed, at, sign, verdicts in rows:
        print(
            f"seed {seed:3d}: interleaving {at} ({sign:+d}); A/B clicks {verdicts['clicks']}, "
            f"nDCG {verdicts['ndcg']}"
        )
    right = sum(1 for _, at, sign, _ in rows if at is not None and sign == 1)
    print(
        f"interleaving right in {right}/{streams}; impressions to its verdict: median "
        f"{statistics.median(r[1] for r in rows if r[1] is not None):,.0f}"
    )
    for measure in ("clicks", "ndcg"):
        got = [v[measure] for *_, v in rows]
        ok = [a for a, s in got if a is not None and s == 1]
        print(
            f"A/B on {measure}: right in {len(ok)}/{streams} within {impressions:,}; "
            f"median of those {statistics.median(ok) if ok else float('nan'):,.0f}"
        )
    print(
        f"ratio A/B (clicks; {impressions:,} when undecided: a lower bound) / interleaving: "
        f"median {statistics.median(ratios):.1f}, min {min(ratios):.1f}, max {max(ratios):.1f}"
    )


def aa(streams: int) -> None:
    world, looks = World(users=2_000), Looks(step=100)
    for position in (False, True):
        flagged = sum(
            interleaving_verdict(
                simulate(
                    world,
                    3_000,
                    1_000 + s,
                    designs=("interleaving",),
                    same_rankers=True,
                    position_credit=position,
                ),
                world,
                looks,
            )[0]
            is not None
            for s in range(streams)
        )
        what = "credit by position (negative control)" if position else "credit by team"
        print(
            f"A/A, {what}: flagged {flagged}/{streams} = {flagged / streams:.1%} "
            f"(alpha 5%, looks every 100 of 3,000 impressions)"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--impressions", type=int, default=200_000)
    parser.add_argument("--aa-streams", type=int, default=1_000)
    args = parser.parse_args()
    start = time.process_time()
    gap(args.streams, args.impressions)
    aa(args.aa_streams)
    print(f"CPU {time.process_time() - start:.0f} s")


if __name__ == "__main__":
    main()
