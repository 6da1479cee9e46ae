"""COEC: clicks over expected clicks (Zhang & Jones 2007), with rank priors from the stream.

Not a generative model of a session but a normalisation: each rank r of a segment has a prior
click-through rate ctr[s, r] (clicks over impressions of every item shown there), and a pair's
COEC is its clicks over the clicks an average item would have earned in the same impressions:

    COEC[p] = (Σ c + m) / (Σ n · ctr[s, r] + m)

summed over the pair's (segment, rank) cells, with m = ``prior_strength`` pseudo-clicks at 1
(an unseen pair is average: COEC 1). Above 1: clicked more than its ranks explain. This is how
OpenSearch's Search Relevance Workbench derives implicit judgments, computed here on the stream
and per segment. Statistics: ``RankCounts`` (exact, additive, mergeable), the rank priors
recomputed from them at each refit.

As a click model for likelihood and perplexity it predicts P(C = 1) = min(1, COEC[p] ·
ctr[s, r]), independently at each rank (clicks above do not matter). Its curve is the rank
prior itself (``rank_ctr``), not an examination probability: it mixes position bias with the
ranker's quality at each rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evald.clicks.counts import RankCounts
from evald.clicks.model import ClickModel, grown
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings


class COEC(ClickModel):
    """Per-rank click priors per segment; clicks over expected clicks per (query, item)."""

    name = "coec"
    curve_name = "rank_ctr"
    relevant_at = 1.0  # clicked at least as often as its ranks predict

    def __init__(self, settings: ClickSettings) -> None:
        super().__init__(settings)
        self.counts = RankCounts()
        self.coec = np.zeros(0)
        self.ctr = np.zeros((0, self.depth))

    def _new_segment(self) -> None:
        self.ctr = np.vstack([self.ctr, np.zeros((1, self.depth))])

    def _grow_pairs(self) -> None:
        self.coec = grown(self.coec, self.pairs.size, 1.0)

    def _add(self, sessions: Sessions, slots: np.ndarray, weights: np.ndarray) -> None:
        self.counts.add_cells(slots >= 0, slots, sessions.segments, sessions.clicks, weights)

    def _step(self) -> float:
        slot, segment, rank, n, c = self.counts.view()
        cells = segment * self.depth + rank
        size = len(self.segments) * self.depth
        clicks = np.bincount(cells, c, minlength=size).reshape(-1, self.depth)
        shown = np.bincount(cells, n, minlength=size).reshape(-1, self.depth)
        ctr = np.where(shown > 0, clicks / np.where(shown > 0, shown, 1.0), 0.0)
        expected = n * ctr[segment, rank]
        m = self.settings.prior_strength
        num = np.bincount(slot, c, minlength=self.pairs.size) + m
        den = np.bincount(slot, expected, minlength=self.pairs.size) + m
        with np.errstate(invalid="ignore", divide="ignore"):
            coec = np.where(den > 0, num / den, 1.0)
        live = self.pairs.live()
        change = float(np.abs(coec[live] - self.coec[live]).max(initial=0.0))
        change = max(change, float(np.abs(ctr - self.ctr).max(initial=0.0)))
        self.coec, self.ctr = coec, ctr
        return change

    def _scale(self, factor: float) -> None:
        self.counts.scale(factor)

    def _drop(self, slots: np.ndarray) -> None:
        self.counts.drop_slots(slots)
        self.coec[slots] = 1.0

    def _merge(
        self, other: Any, slot_map: np.ndarray, segment_map: np.ndarray, factor: float
    ) -> None:
        slot, segment, rank, n, c = other.counts.view()
        self.counts.add(slot_map[slot], segment_map[segment], rank, n * factor, c * factor)

    # ------------------------------------------------------------------ reading

    def relevance(self, slots: np.ndarray) -> np.ndarray:
        if not len(self.coec):
            return np.ones(slots.shape)
        return np.where(slots >= 0, self.coec[np.maximum(slots, 0)], 1.0)

    def curve(self) -> np.ndarray:
        return self.ctr.copy()

    def click_probabilities(self, sessions: Sessions) -> tuple[np.ndarray, np.ndarray]:
        q = np.minimum(
            1.0, self.relevance(self.pairs.lookup(sessions.pairs)) * self.ctr[sessions.segments]
        )
        return q, q

    def parameters(self, segment: int = 0) -> dict[str, Any]:
        return {"rank_ctr": self.by_rank(self.ctr[segment], segment)}

    # ------------------------------------------------------------------ state

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**self.counts.arrays("rows"), "coec": self.coec, "ctr": self.ctr}

    def _load(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.counts = RankCounts.build("rows", arrays)
        self.coec = arrays["coec"].astype(np.float64)
        self.ctr = arrays["ctr"].astype(np.float64).reshape(len(self.segments), self.depth)
