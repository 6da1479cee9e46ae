"""What a fitted click model gives a list: debiased measures and inverse-propensity click rates.

**Debiased measures** (reported under ``relevance = <model>``): each list is scored by the same
measures as the raw ones, with the model's relevance of each served (query, item) pair as its
grade instead of the user's action: PBM's and the cascade model's attractiveness, DBN's
attractiveness × satisfaction, COEC's clicks over expected clicks; a pair the model does not
keep gets the model's prior. The grade is the relevance divided by the model's
``relevant_at`` (0.5; COEC 1: clicked as often as its ranks predict), so binary measures (RR,
P, AP, ...) count a pair relevant from there on, while nDCG, whose gains are linear in the
grade, does not change with the scale. Only the top ``depth`` ranks are read (the model's
depth), and the ideal ranking is the served grades sorted, as for the raw measures. Unlike a
raw measure, a list with no click is not 0: its items keep their relevance.

**IPS click rates** (Joachims, Swaminathan & Schnabel 2017): at each shown rank r of segment
s, a click weighs w = min(1 / θ[s, r], ``clip``), θ the model's examination. Over N lists,

    IPS-CTR@k   = Σ w c / (N k)          (unbiased for the mean attractiveness of the top k
                                          when no weight is clipped)
    SNIPS-CTR@k = Σ w c / Σ w θ          (self-normalised: Σ w θ = N k when no weight is
                                          clipped, so the two agree; clipped, SNIPS divides by
                                          the expected weight instead of assuming it)

COEC has no examination curve (its per-rank rate mixes bias with the ranker's quality), so it
gives no IPS rates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evald.clicks.model import ClickModel
from evald.clicks.sessions import Sessions
from evald.metrics import Batch, evaluate, parse_measures


def relevance_grades(model: ClickModel, sessions: Sessions) -> list[list[float]]:
    """Each list's grades per shown rank: relevance / ``relevant_at`` (the prior for a pair
    not kept)."""
    grades = model.relevance(model.pairs.lookup(sessions.pairs)) / model.relevant_at
    return [row[:length].tolist() for row, length in zip(grades, sessions.lengths, strict=True)]


def debiased_values(
    model: ClickModel, sessions: Sessions, measures: Sequence[str]
) -> dict[str, np.ndarray]:
    """Per-list values of ``measures`` scored on the model's relevance."""
    parsed = parse_measures(list(measures))
    if not len(sessions):
        return {str(m): np.zeros(0) for m in parsed}
    batch = Batch.from_served_grades(relevance_grades(model, sessions))
    return {str(m): v for m, v in evaluate(parsed, batch).items()}


@dataclass(frozen=True, slots=True)
class IPS:
    weighted_clicks: float  # Σ w c
    expected_weight: float  # Σ w θ
    slots: float  # Σ over lists of the ranks read (N k for full lists)

    @property
    def ips(self) -> float:
        return self.weighted_clicks / self.slots if self.slots else float("nan")

    @property
    def snips(self) -> float:
        return self.weighted_clicks / self.expected_weight if self.expected_weight else float("nan")


#: the smallest examination whose inverse is finite: 1 / 2^-1024 rounds to infinity, and any
#: larger double (a subnormal one too) has an inverse at most the largest double
_INVERTIBLE = float(np.ldexp(1.0, -1024))


def inverse_propensity(theta: np.ndarray, clip: float) -> np.ndarray:
    """min(1 / θ, ``clip``) per cell; θ <= 0 or NaN (never examined, never shown) weighs
    ``clip``. The inverse is taken only where it is finite: a fitted θ of a subnormal 1e-320
    would overflow (a numpy warning in the daemon's log) to a weight that is clipped anyway,
    so the weights are those of the plain formula to the bit, with no warning."""
    w = np.full(theta.shape, clip, dtype=np.float64)
    np.divide(1.0, theta, out=w, where=theta > _INVERTIBLE)
    return np.minimum(w, clip)


def ips(sessions: Sessions, examination: np.ndarray, clip: float) -> IPS:
    """IPS sums of ``sessions`` with examination (segments, depth), weights clipped at
    ``clip`` (a rank never examined, θ = 0, or never shown, NaN, weighs ``clip``)."""
    theta = np.nan_to_num(examination, nan=0.0)[sessions.segments]
    w = inverse_propensity(theta, clip)
    shown = sessions.shown()
    weight = sessions.weights[:, None] * shown
    return IPS(
        weighted_clicks=float((w * sessions.clicks * weight).sum()),
        expected_weight=float((w * theta * weight).sum()),
        slots=float(weight.sum()),
    )
