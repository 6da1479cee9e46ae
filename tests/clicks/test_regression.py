"""Regression EM: attractiveness shared through pair features, per-pair fallback."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from evald.clicks import simulate as sim
from evald.clicks.models import build, new_model
from evald.clicks.pbm import PBM
from evald.clicks.regression import RegressionPBM
from evald.clicks.settings import ClickSettings

THETA = 1.0 / np.arange(1, 11) ** 0.7
W_TRUE = np.asarray([-1.0, 1.5, -0.8])  # intercept, two features
BATCH = ClickSettings(
    model="regression", half_life=None, first_refit=10**9, refit_every=10**9, prior_strength=0.0
)


def world_with_features(rng: np.random.Generator) -> tuple[sim.World, np.ndarray]:
    """200 queries x 15 items, attractiveness σ(x · W_TRUE): many pairs, few lists each."""
    x = np.concatenate([np.ones((200, 15, 1)), rng.normal(size=(200, 15, 2))], axis=2)
    attract = 1.0 / (1.0 + np.exp(-(x @ W_TRUE)))
    return sim.World(attract, np.ones_like(attract)), x


def test_regression_em_recovers_the_weights_and_beats_per_pair_pbm_on_sparse_pairs() -> None:
    rng = np.random.default_rng(31)
    world, x = world_with_features(rng)
    q, items = sim.serve(rng, world, world.attractiveness, 6_000, 10)  # 30 lists a query
    attract, _ = sim.gathered(world, q, items)
    log = sim.sessions_of(world, q, items, sim.pbm_clicks(rng, attract, THETA))
    keys = world.key(np.arange(200)[:, None], np.arange(15)[None, :])
    fitted = {}
    for name in ("regression", "pbm"):
        model = new_model(replace(BATCH, model=name))
        model.segment(("all",))
        if isinstance(model, RegressionPBM):
            model.set_features(keys.ravel(), x.reshape(-1, 3))
        model.observe(log)
        model.fit(tolerance=1e-7)
        fitted[name] = model
    regression = fitted["regression"]
    assert isinstance(regression, RegressionPBM)
    assert np.abs(regression.w - W_TRUE).max() < 0.15  # measured 0.04
    assert np.abs(regression.curve()[0] - THETA).max() < 0.03
    err = {
        name: float(np.abs(m.relevance(m.pairs.lookup(keys)) - world.attractiveness).mean())
        for name, m in fitted.items()
    }
    assert err["regression"] < 0.03 < err["pbm"]  # measured 0.005 and 0.13


def test_pairs_without_features_fall_back_to_per_pair_attractiveness() -> None:
    """With no features at all, regression EM is PBM, parameter for parameter."""
    rng = np.random.default_rng(32)
    world = sim.World.draw(rng, 20, 15)
    q, items = sim.serve(rng, world, world.attractiveness, 5_000, 10)
    attract, _ = sim.gathered(world, q, items)
    log = sim.sessions_of(world, q, items, sim.pbm_clicks(rng, attract, THETA))
    plain, regression = new_model(replace(BATCH, model="pbm")), new_model(BATCH)
    for m in (plain, regression):
        m.segment(("all",))
        m.observe(log)
        m.refit(iterations=30)
    assert isinstance(plain, PBM) and isinstance(regression, PBM)
    np.testing.assert_allclose(regression.alpha, plain.alpha, rtol=0, atol=1e-12)
    np.testing.assert_allclose(regression.theta, plain.theta, rtol=0, atol=1e-12)


def test_regression_snapshot_keeps_features_and_weights() -> None:
    rng = np.random.default_rng(33)
    world, x = world_with_features(rng)
    q, items = sim.serve(rng, world, world.attractiveness, 500, 10)
    attract, _ = sim.gathered(world, q, items)
    log = sim.sessions_of(world, q, items, sim.pbm_clicks(rng, attract, THETA))
    model = new_model(replace(BATCH, first_refit=200, refit_every=200))
    assert isinstance(model, RegressionPBM)
    model.set_features(
        world.key(np.arange(200)[:, None], np.arange(15)[None, :]).ravel(), x.reshape(-1, 3)
    )
    model.segment(("all",))
    model.observe(log.take(slice(0, 250)))
    copy = build(model.snapshot())
    for m in (model, copy):
        m.observe(log.take(slice(250, None)))
    assert copy.snapshot() == model.snapshot()
