"""The position-based model (PBM), fitted by EM on its sufficient statistics.

Assumptions (Richardson et al. 2007; Craswell et al. 2008; Chuklin, Markov & de Rijke 2015,
§3.4): a user examines rank r of a segment's lists with probability θ[s, r], whatever is shown
there and whatever happened above; an examined item is clicked with probability α[q, d], its
attractiveness for the query, whatever its rank. So P(C_r = 1) = θ[s, r] · α[q, d].

EM (Chuklin et al. §4.3): for an observation of pair p at (s, r) with click c,

    P(A = 1 | c) = c + (1 - c) · α (1 - θ) / (1 - α θ)
    P(E = 1 | c) = c + (1 - c) · θ (1 - α) / (1 - α θ)

and the M-step averages them: α[p] over the pair's observations, θ[s, r] over the cell's.
Both only need, per (pair, segment, rank), the weighted impressions n and clicks c
(``RankCounts``): one iteration costs one pass over those rows, and the fit is the batch EM
of every session they came from.

Conventions (docs/click-models.md):
- prior: α[p] = (Σ P(A = 1 | c) + m μ) / (n_p + m) with m = ``prior_strength`` pseudo-sessions
  at μ, the mean attractiveness over every observation (of the same iteration); a cold pair
  (never seen, or evicted) is μ.
- scale: α θ is all the data can see ((cα)(θ/c) explains the clicks as well), so after each
  M-step θ is divided by its largest value over the cells with data, and α and μ multiplied by
  it: the most examined (segment, rank) is examined always. A likelihood-preserving move;
  monotone EM is kept.
- start: α = μ = 0.5, θ = 0.5 (θ = 1 would be a fixed point of EM: nothing ever moves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.clicks.counts import RankCounts
from evald.clicks.model import MAX_ITERATIONS, TOLERANCE, ClickModel, grown
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings

START = 0.5


@dataclass(frozen=True, slots=True)
class _Rows:
    """What an EM iteration reads of ``RankCounts`` (``PBM._rows``), valid while ``counts``
    is at ``key`` (its version, the slots allocated, the segments)."""

    counts: RankCounts
    key: tuple[int, int, int]
    slot: np.ndarray
    cells: np.ndarray  # segment * depth + rank: the row's (segment, rank) in θ, flat
    n: np.ndarray
    c: np.ndarray
    rest: np.ndarray  # n - c: the impressions without a click
    total: float  # Σ n
    pair_n: np.ndarray  # Σ n per slot (the M-step's denominator of α)
    cell_n: np.ndarray  # Σ n per (segment, rank) (that of θ)


class PBM(ClickModel):
    """Examination per (segment, rank) times attractiveness per (query, item)."""

    name = "pbm"

    def __init__(self, settings: ClickSettings) -> None:
        super().__init__(settings)
        self.counts = RankCounts()
        self.alpha = np.zeros(0)
        self.theta = np.zeros((0, self.depth))
        self.mu = START
        self._cached: _Rows | None = None

    def _new_segment(self) -> None:
        self.theta = np.vstack([self.theta, np.full((1, self.depth), START)])

    def _grow_pairs(self) -> None:
        self.alpha = grown(self.alpha, self.pairs.size, self.mu)

    def _add(self, sessions: Sessions, slots: np.ndarray, weights: np.ndarray) -> None:
        self.counts.add_cells(slots >= 0, slots, sessions.segments, sessions.clicks, weights)

    def refit(self, iterations: int | None = None) -> None:
        super().refit(iterations)
        self._cached = None  # the rows change before the next refit: hold no copies till then

    def fit(self, tolerance: float = TOLERANCE, max_iterations: int = MAX_ITERATIONS) -> int:
        try:
            return super().fit(tolerance, max_iterations)
        finally:
            self._cached = None

    def _rows(self) -> _Rows:
        """The rows as EM reads them, with what its iterations do not change: computed once
        per refit (of 20 iterations) instead of once per iteration."""
        key = (self.counts.version, self.pairs.size, len(self.segments))
        rows = self._cached
        if rows is None or rows.counts is not self.counts or rows.key != key:
            slot, segment, rank, n, c = self.counts.view()
            cells = segment * self.depth + rank
            rows = self._cached = _Rows(
                self.counts,
                key,
                slot,
                cells,
                n,
                c,
                n - c,
                float(n.sum()),
                np.bincount(slot, n, minlength=self.pairs.size),
                np.bincount(cells, n, minlength=len(self.segments) * self.depth).reshape(
                    -1, self.depth
                ),
            )
        return rows

    def _posteriors(self) -> tuple[np.ndarray, np.ndarray]:
        """Expected attracted and examined counts of every row under the current parameters."""
        rows = self._rows()
        c, rest = rows.c, rows.rest
        a = self.alpha[rows.slot]
        t = self.theta.reshape(-1)[rows.cells]
        d = 1.0 - a * t
        if (d > 0).all():  # the usual case: the same values as below without the masks
            return c + rest * a * (1.0 - t) / d, c + rest * t * (1.0 - a) / d
        safe = np.where(d > 0, d, 1.0)
        attracted = c + np.where(d > 0, rest * a * (1.0 - t) / safe, 0.0)
        examined = c + np.where(d > 0, rest * t * (1.0 - a) / safe, 0.0)
        return attracted, examined

    def _attractiveness(self, attracted: np.ndarray) -> tuple[np.ndarray, float]:
        """α per slot from the rows' expected attracted counts (the prior included), and μ."""
        rows = self._rows()
        mu = float(attracted.sum()) / rows.total if rows.total > 0 else self.mu
        num = np.bincount(rows.slot, attracted, minlength=self.pairs.size)
        den = rows.pair_n
        m = self.settings.prior_strength
        with np.errstate(invalid="ignore", divide="ignore"):
            alpha = np.where(den + m > 0, (num + m * mu) / (den + m), mu)
        return alpha, mu

    def _examination(self, examined: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """θ per (segment, rank) from the rows' expected examined counts, and where data was."""
        rows = self._rows()
        size = len(self.segments) * self.depth
        num = np.bincount(rows.cells, examined, minlength=size).reshape(-1, self.depth)
        den = rows.cell_n
        data = den > 0
        theta = np.where(data, num / np.where(data, den, 1.0), self.theta)
        return theta, data

    def _step(self) -> float:
        if not len(self.counts):
            return 0.0
        attracted, examined = self._posteriors()
        alpha, mu = self._attractiveness(attracted)
        theta, data = self._examination(examined)
        top = float(theta[data].max()) if data.any() else 1.0
        if top > 0:
            theta = np.where(data, theta / top, theta)
            alpha = alpha * top
            mu *= top
        change = _largest_change(self.alpha, alpha, self.pairs.live())
        change = max(change, float(np.abs(theta - self.theta).max(initial=0.0)))
        self.alpha, self.theta, self.mu = alpha, theta, mu
        return change

    def _scale(self, factor: float) -> None:
        self.counts.scale(factor)

    def _drop(self, slots: np.ndarray) -> None:
        self.counts.drop_slots(slots)
        self.alpha[slots] = self.mu

    def _merge(
        self, other: Any, slot_map: np.ndarray, segment_map: np.ndarray, factor: float
    ) -> None:
        slot, segment, rank, n, c = other.counts.view()
        self.counts.add(slot_map[slot], segment_map[segment], rank, n * factor, c * factor)

    # ------------------------------------------------------------------ reading

    def relevance(self, slots: np.ndarray) -> np.ndarray:
        if not len(self.alpha):
            return np.full(slots.shape, self.mu)
        return np.where(slots >= 0, self.alpha[np.maximum(slots, 0)], self.mu)

    def curve(self) -> np.ndarray:
        return self.theta.copy()

    def click_probabilities(self, sessions: Sessions) -> tuple[np.ndarray, np.ndarray]:
        a = self.relevance(self.pairs.lookup(sessions.pairs))
        q = a * self.theta[sessions.segments]
        return q, q

    def parameters(self, segment: int = 0) -> dict[str, Any]:
        return {
            "examination": self.by_rank(self.theta[segment], segment),
            "prior_attractiveness": self.mu,
        }

    # ------------------------------------------------------------------ state

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**self.counts.arrays("rows"), "alpha": self.alpha, "theta": self.theta}

    def _meta(self) -> dict[str, Any]:
        return {"mu": self.mu}

    def _load(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.counts = RankCounts.build("rows", arrays)
        self.alpha = arrays["alpha"].astype(np.float64)
        self.theta = arrays["theta"].astype(np.float64).reshape(len(self.segments), self.depth)
        self.mu = float(meta["mu"])


def _largest_change(old: np.ndarray, new: np.ndarray, live: np.ndarray) -> float:
    if not len(live):
        return 0.0
    return float(np.abs(new[live] - old[live]).max())
