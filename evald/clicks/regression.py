"""Regression EM (Wang, Golbandi, Bendersky, Metzler & Najork, WSDM 2018): PBM whose
attractiveness is shared through features of the (query, item) pair.

The E-step is PBM's. The M-step keeps PBM's examination update, but instead of one free
attractiveness per pair it fits α = σ(x · w) to the E-step's expected attracted counts over
every pair that has features, so pairs seen a few times borrow strength from similar ones.
Wang et al. fit a gradient-boosted tree to labels sampled from those posteriors; here the
function is a logistic regression fitted to the posteriors themselves (their expectation,
so no sampling noise), by Newton steps warm-started from the last ``w`` with an L2 penalty
``ridge`` (the features are used as given: scale them comparably). A pair without features
falls back to PBM's per-pair update (the per-item parameters of the paper's fallback).

Scale: as in PBM, θ is divided by its largest value and the expected attracted counts are
multiplied by it before the regression, so α · θ is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evald.clicks.pbm import PBM
from evald.clicks.settings import ClickSettings

#: L2 penalty on the regression weights (not on the intercept column, if the caller adds one)
RIDGE = 1e-3
#: Newton steps per M-step (warm-started, so a few suffice)
NEWTON_STEPS = 3


class RegressionPBM(PBM):
    """PBM with attractiveness σ(x · w) for pairs with features, per pair otherwise."""

    name = "regression"

    def __init__(self, settings: ClickSettings) -> None:
        super().__init__(settings)
        self.features: dict[int, np.ndarray] = {}
        self.w = np.zeros(0)

    def set_features(self, keys: np.ndarray, matrix: np.ndarray) -> None:
        """Features of pairs by key (one row each); every row has the same width."""
        matrix = np.asarray(matrix, np.float64)
        if matrix.ndim != 2 or len(matrix) != len(keys):
            raise ValueError("features: one row per pair key")
        self.features.update(zip(np.asarray(keys).tolist(), matrix, strict=True))
        self.w = np.zeros(matrix.shape[1])

    def _design(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots with features, their feature rows)."""
        live = self.pairs.live()
        keys = self.pairs.keys[live].tolist()
        rows = [i for i, k in enumerate(keys) if k in self.features]
        if not rows:
            return np.zeros(0, np.intp), np.zeros((0, len(self.w)))
        slots = live[rows]
        return slots, np.stack([self.features[keys[i]] for i in rows])

    def _step(self) -> float:
        if not len(self.counts):
            return 0.0
        attracted, examined = self._posteriors()
        theta, data = self._examination(examined)
        top = float(theta[data].max()) if data.any() else 1.0
        if top > 0:
            theta = np.where(data, theta / top, theta)
            attracted = attracted * top
        alpha, mu = self._attractiveness(attracted)
        slots, x = self._design()
        if len(slots):
            slot = self.counts.view()[0]
            n = self.counts.view()[3]
            targets = np.bincount(slot, attracted, minlength=self.pairs.size)[slots]
            trials = np.bincount(slot, n, minlength=self.pairs.size)[slots]
            self.w = logistic_fit(x, targets, trials, self.w)
            alpha[slots] = _sigmoid(x @ self.w)
        change = float(
            np.abs(alpha[self.pairs.live()] - self.alpha[self.pairs.live()]).max(initial=0.0)
        )
        change = max(change, float(np.abs(theta - self.theta).max(initial=0.0)))
        self.alpha, self.theta, self.mu = alpha, theta, mu
        return change

    def parameters(self, segment: int = 0) -> dict[str, Any]:
        return {**super().parameters(segment), "weights": self.w.tolist()}

    def _arrays(self) -> dict[str, np.ndarray]:
        keys = np.asarray(list(self.features), np.int64)
        rows = np.stack(list(self.features.values())) if self.features else np.zeros((0, 0))
        return {**super()._arrays(), "w": self.w, "feature_keys": keys, "feature_rows": rows}

    def _load(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        super()._load(meta, arrays)
        self.w = arrays["w"].astype(np.float64)
        rows = arrays["feature_rows"].astype(np.float64).reshape(-1, len(self.w))
        self.features = dict(zip(arrays["feature_keys"].tolist(), rows, strict=True))


def logistic_fit(
    x: np.ndarray, successes: np.ndarray, trials: np.ndarray, w: np.ndarray, ridge: float = RIDGE
) -> np.ndarray:
    """Weights maximising Σ [s log σ(x·w) + (t - s) log(1 - σ(x·w))] - ridge/2 |w|² (binomial
    logistic regression on soft counts), by ``NEWTON_STEPS`` Newton steps from ``w``."""
    for _ in range(NEWTON_STEPS):
        p = _sigmoid(x @ w)
        gradient = x.T @ (successes - trials * p) - ridge * w
        hessian = (x * (trials * p * (1 - p))[:, None]).T @ x + ridge * np.eye(len(w))
        w = w + np.linalg.solve(hessian, gradient)
    return w


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))
