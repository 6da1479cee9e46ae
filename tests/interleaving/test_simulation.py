"""The simulation of docs/statistics.md, "Interleaving: the figures", at sizes for the test
suite (fixed seeds); ``python -m benchmarks.interleaving_bench`` runs it at scale."""

from __future__ import annotations

import math

import pytest

from evald.interleaving.simulation import (
    Looks,
    World,
    ab_verdict,
    interleaving_verdict,
    simulate,
)

LOOKS = Looks(step=100)


def test_interleaving_finds_the_better_ranker_with_a_fraction_of_the_ab_traffic() -> None:
    """Five fixed streams of 30,000 impressions: interleaving names the better ranker (A) in
    each; the A/B split of the same users, on clicks per list with the same always-valid test,
    needs at least five times the impressions in all (a stream it never decides counts whole:
    a lower bound). Per stream the ratio varies widely (docs/statistics.md)."""
    world, n = World(), 30_000
    interleaved = ab = 0
    for seed in range(5):
        stream = simulate(world, n, seed)
        at, sign = interleaving_verdict(stream, world, LOOKS)
        assert at is not None and sign == 1, (seed, at, sign)
        ab_at, ab_sign = ab_verdict(stream, world, LOOKS)
        interleaved += at
        ab += ab_at if ab_at is not None and ab_sign == 1 else n
    assert ab >= 5 * interleaved, (ab, interleaved)


ALPHA_LIMIT = 0.05 + 3 * math.sqrt(0.05 * 0.95 / 100)


@pytest.mark.parametrize("position_credit", [False, True])
def test_aa_interleaving_stays_within_the_false_alarm_rate_and_broken_credit_is_caught(
    position_credit: bool,
) -> None:
    """Identical rankers looked at every 100 impressions: the test flags at most alpha of the
    streams (+3 SE); crediting by position instead of by team (the negative control) makes
    the top of the list "win", and the test flags it in nearly every stream."""
    world = World(users=2_000)
    streams = 100 if not position_credit else 30
    flagged = 0
    for seed in range(streams):
        stream = simulate(
            world,
            3_000,
            1_000 + seed,
            designs=("interleaving",),
            same_rankers=True,
            position_credit=position_credit,
        )
        flagged += interleaving_verdict(stream, world, LOOKS)[0] is not None
    if position_credit:
        assert flagged >= 0.9 * streams
    else:
        assert flagged / streams <= ALPHA_LIMIT
