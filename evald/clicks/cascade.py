"""The cascade model (Craswell, Zoeter, Taylor & Ramsey 2008), in closed form.

Assumptions (Chuklin et al. 2015, §3.3): the user scans the list from the top, one rank after
the other; an examined item is clicked with its attractiveness α[q, d], and the first click
ends the scan. So every rank up to the first click was examined and nothing below it was, and
the maximum-likelihood α is clicks over examinations counted on those ranks only: a closed
form, no EM. Sessions with several clicks do not fit the model; as usual (Chuklin et al.
§4.3) only the ranks up to the first click are read.

Statistics: ``RankCounts`` of the examined ranks (impressions = examinations, clicks = the
first click) - exact, additive, mergeable. The curve is the cascade's examination: per
(segment, rank), the share of lists with no click above the rank (every rank of a list with no
click was examined), the model's own reading of the data.

Prior: α[p] = (clicks + m μ) / (examinations + m), μ the clicks over examinations of every pair.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evald.clicks.counts import RankCounts
from evald.clicks.model import ClickModel, grown
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings

START = 0.5


def examined_ranks(clicks: np.ndarray, shown: np.ndarray) -> np.ndarray:
    """bool (n, depth): the ranks a cascade user examined - up to and including the first
    click, or every shown rank when there was none."""
    before = np.cumsum(clicks, axis=1) - clicks  # clicks strictly above each rank
    return shown & (before == 0)


class Cascade(ClickModel):
    """Attractiveness per (query, item); examination read off the first click."""

    name = "cascade"

    def __init__(self, settings: ClickSettings) -> None:
        super().__init__(settings)
        self.counts = RankCounts()
        self.alpha = np.zeros(0)
        self.mu = START
        #: weighted lists per (segment, rank): shown there, and examined there (no click above)
        self.reach = np.zeros((0, 2, self.depth))

    def _new_segment(self) -> None:
        self.reach = np.concatenate([self.reach, np.zeros((1, 2, self.depth))])

    def _grow_pairs(self) -> None:
        self.alpha = grown(self.alpha, self.pairs.size, self.mu)

    def _add(self, sessions: Sessions, slots: np.ndarray, weights: np.ndarray) -> None:
        shown = slots >= 0
        examined = examined_ranks(sessions.clicks & shown, shown)
        w = np.broadcast_to(weights[:, None], shown.shape)
        segments = np.broadcast_to(sessions.segments[:, None], shown.shape)
        ranks = np.broadcast_to(np.arange(self.depth), shown.shape)
        self.counts.add_cells(examined, slots, sessions.segments, sessions.clicks, weights)
        np.add.at(self.reach[:, 0], (segments[shown], ranks[shown]), w[shown])
        np.add.at(self.reach[:, 1], (segments[examined], ranks[examined]), w[examined])

    def _step(self) -> float:
        slot, _, _, n, c = self.counts.view()
        total = float(n.sum())
        mu = float(c.sum()) / total if total > 0 else self.mu
        size = self.pairs.size
        num = np.bincount(slot, c, minlength=size)
        den = np.bincount(slot, n, minlength=size)
        m = self.settings.prior_strength
        with np.errstate(invalid="ignore", divide="ignore"):
            alpha = np.where(den + m > 0, (num + m * mu) / (den + m), mu)
        live = self.pairs.live()
        change = float(np.abs(alpha[live] - self.alpha[live]).max(initial=0.0))
        self.alpha, self.mu = alpha, mu
        return max(change, 0.0)

    def _scale(self, factor: float) -> None:
        self.counts.scale(factor)
        self.reach *= factor

    def _drop(self, slots: np.ndarray) -> None:
        self.counts.drop_slots(slots)
        self.alpha[slots] = self.mu

    def _merge(
        self, other: Any, slot_map: np.ndarray, segment_map: np.ndarray, factor: float
    ) -> None:
        slot, segment, rank, n, c = other.counts.view()
        self.counts.add(slot_map[slot], segment_map[segment], rank, n * factor, c * factor)
        np.add.at(self.reach, segment_map, other.reach * factor)

    # ------------------------------------------------------------------ reading

    def relevance(self, slots: np.ndarray) -> np.ndarray:
        if not len(self.alpha):
            return np.full(slots.shape, self.mu)
        return np.where(slots >= 0, self.alpha[np.maximum(slots, 0)], self.mu)

    def curve(self) -> np.ndarray:
        shown, examined = self.reach[:, 0], self.reach[:, 1]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(shown > 0, examined / np.where(shown > 0, shown, 1.0), np.nan)

    def click_probabilities(self, sessions: Sessions) -> tuple[np.ndarray, np.ndarray]:
        a = self.relevance(self.pairs.lookup(sessions.pairs))
        full = a * np.cumprod(np.hstack([np.ones((len(a), 1)), 1.0 - a[:, :-1]]), axis=1)
        above = np.cumsum(sessions.clicks, axis=1) - sessions.clicks
        conditional = np.where(above == 0, a, 0.0)
        return conditional, full

    def parameters(self, segment: int = 0) -> dict[str, Any]:
        return {"examination": _nan_free(self.curve()[segment]), "prior_attractiveness": self.mu}

    # ------------------------------------------------------------------ state

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**self.counts.arrays("rows"), "alpha": self.alpha, "reach": self.reach}

    def _meta(self) -> dict[str, Any]:
        return {"mu": self.mu}

    def _load(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.counts = RankCounts.build("rows", arrays)
        self.alpha = arrays["alpha"].astype(np.float64)
        self.reach = arrays["reach"].astype(np.float64).reshape(len(self.segments), 2, self.depth)
        self.mu = float(meta["mu"])


def _nan_free(values: np.ndarray) -> list[float | None]:
    """A curve as JSON-able values: a rank never shown is null."""
    return [None if v != v else float(v) for v in values.tolist()]
