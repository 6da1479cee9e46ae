"""COEC by its definition, and log-likelihood / perplexity computed the standard way."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from evald.clicks import simulate as sim
from evald.clicks.coec import COEC
from evald.clicks.models import new_model
from evald.clicks.quality import quality, score
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings

BATCH = ClickSettings(
    model="coec", depth=3, half_life=None, first_refit=10**9, refit_every=10**9, prior_strength=0.0
)


def test_coec_is_clicks_over_expected_clicks_with_rank_priors_from_the_data() -> None:
    log = Sessions.build(
        [[1, 2, 3], [2, 1, 3], [1, 3, 2], [3, 2, 1]],
        [[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 0, 1]],
        depth=3,
    )
    model = new_model(BATCH)
    model.segment(("all",))
    model.observe(log)
    model.fit()
    assert isinstance(model, COEC)
    ctr = [2 / 4, 1 / 4, 2 / 4]  # clicks over impressions at each rank, every item
    assert model.curve()[0].tolist() == ctr
    # pair 1: ranks 1, 2, 1, 3 -> expected 0.5 + 0.25 + 0.5 + 0.5 = 1.75; clicks 3
    # pair 2: ranks 2, 1, 3, 2 -> expected 0.25 + 0.5 + 0.5 + 0.25 = 1.5; clicks 2
    # pair 3: ranks 3, 3, 2, 1 -> expected 0.5 + 0.5 + 0.25 + 0.5 = 1.75; clicks 0
    got = model.relevance(model.pairs.lookup(np.asarray([1, 2, 3, 99])))
    assert got.tolist() == pytest.approx([3 / 1.75, 2 / 1.5, 0.0, 1.0])  # 99: cold = 1
    # the prior: m pseudo-clicks at COEC 1
    smooth = new_model(replace(BATCH, prior_strength=2.0))
    smooth.segment(("all",))
    smooth.observe(log)
    smooth.fit()
    assert smooth.relevance(smooth.pairs.lookup(np.asarray([3]))).tolist() == pytest.approx(
        [(0 + 2) / (1.75 + 2)]
    )


def test_coec_orders_items_as_attractiveness_where_raw_ctr_does_not() -> None:
    """A ranker blind to attractiveness serves some items high and some low; clicks reward
    the high ones for their position. COEC's order of each query's items agrees with the
    attractiveness (Spearman) better than the raw click-through rate's."""
    rng = np.random.default_rng(12)
    world = sim.World.draw(rng, 30, 15)
    theta = 1.0 / np.arange(1, 11)
    blind = rng.normal(size=world.shape)
    q, items = sim.serve(rng, world, blind, 40_000, 10, noise=1.0)
    attract, _ = sim.gathered(world, q, items)
    log = sim.sessions_of(world, q, items, sim.pbm_clicks(rng, attract, theta))
    model = new_model(replace(BATCH, depth=10))
    model.segment(("all",))
    model.observe(log)
    model.fit()
    keys = world.key(np.arange(30)[:, None], np.arange(15)[None, :])
    coec = model.relevance(model.pairs.lookup(keys))
    clicks = np.bincount(log.pairs.ravel(), log.clicks.ravel(), minlength=30 * 15 + 1)[keys]
    shown = np.bincount(log.pairs.ravel(), minlength=30 * 15 + 1)[keys]
    ctr = clicks / np.maximum(shown, 1)

    def spearman(x: np.ndarray) -> float:
        rx = np.argsort(np.argsort(x, axis=1), axis=1)
        ry = np.argsort(np.argsort(world.attractiveness, axis=1), axis=1)
        return float(np.mean([np.corrcoef(a, b)[0, 1] for a, b in zip(rx, ry, strict=True)]))

    # measured with this seed: COEC 0.968, raw CTR 0.907
    assert spearman(coec) > 0.95
    assert spearman(coec) - spearman(ctr) > 0.04


def test_perplexity_and_log_likelihood_by_hand() -> None:
    log = Sessions.build([[1, 2], [1, 2]], [[1, 0], [0, 0]], depth=2)
    full = np.asarray([[0.5, 0.2], [0.5, 0.2]])
    conditional = np.asarray([[0.5, 0.1], [0.5, 0.4]])
    q = score(conditional, full, log)
    assert q.perplexity_at == [pytest.approx(2.0), pytest.approx(2 ** -math.log2(0.8))]
    assert q.perplexity == pytest.approx((2.0 + 1 / 0.8) / 2)
    expected_ll = (math.log(0.5) + math.log(0.9) + math.log(0.5) + math.log(0.6)) / 2
    assert q.log_likelihood == pytest.approx(expected_ll)


def test_weights_count_as_repeated_sessions() -> None:
    one = Sessions.build([[1, 2], [1, 2], [1, 2]], [[1, 0], [1, 0], [0, 1]], depth=2)
    two = Sessions.build([[1, 2], [1, 2]], [[1, 0], [0, 1]], depth=2, weights=[2, 1])
    p = np.full((3, 2), 0.3)
    assert score(p, p, one) == score(p[:2], p[:2], two)


def test_the_true_model_is_more_perplexed_by_clicks_it_did_not_make() -> None:
    """Held-out perplexity: PBM fitted on PBM clicks beats COEC's independent rank-CTR
    predictor... and a coin (perplexity 2) is worse than both."""
    rng = np.random.default_rng(21)
    world = sim.World.draw(rng, 20, 15)
    q, items = sim.serve(rng, world, world.attractiveness, 30_000, 10)
    attract, _ = sim.gathered(world, q, items)
    log = sim.sessions_of(
        world, q, items, sim.pbm_clicks(rng, attract, 1.0 / np.arange(1, 11) ** 0.7)
    )
    train, test = log.take(slice(0, 20_000)), log.take(slice(20_000, None))
    result = {}
    for name in ("pbm", "coec", "cascade"):
        model = new_model(replace(BATCH, model=name, depth=10))
        model.segment(("all",))
        model.observe(train)
        model.fit()
        result[name] = quality(model, test)
    coin = score(np.full((10_000, 10), 0.5), np.full((10_000, 10), 0.5), test)
    assert coin.perplexity == pytest.approx(2.0)
    assert result["pbm"].perplexity < result["coec"].perplexity < coin.perplexity
    assert result["pbm"].log_likelihood > result["cascade"].log_likelihood
