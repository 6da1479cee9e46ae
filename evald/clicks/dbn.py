"""The dynamic Bayesian network click model (DBN; Chapelle & Zhang, WWW 2009).

Assumptions (Chuklin et al. 2015, §3.8): the user examines rank 1; an examined item is clicked
with its attractiveness a[q, d]; after a click the user is satisfied with probability s[q, d]
and stops; unsatisfied (or not clicked), the next rank is examined with probability γ (the
continuation, per segment). Relevance is a · s: attractive items that do not satisfy (clicked,
then the user goes on) are told apart from the ones that end the search, which no
position-only model can do.

EM (Chuklin et al. §4.3, by forward-backward on the examination chain): with l the last
clicked rank, every rank up to l was examined; after l, with Z_r = P(no click from r on |
E_r = 1) computed backwards, P(S_l = 1 | C) = s_l / T with T = s_l + (1 - s_l)(1 - γ + γ Z_{l+1}),
P(E_{l+1} = 1 | C) = (1 - s_l) γ Z_{l+1} / T, and down the tail e_{r+1} = e_r (1 - a_r) γ
Z_{r+1} / Z_r. Then P(A_r = 1 | C) is c_r up to l and (1 - e_r) a_r below; the M-step
averages the attractiveness posteriors per pair, the satisfaction posteriors per pair over its
clicks, and γ is the expected continued transitions over the expected unsatisfied examinations.

Online (``observe``): each list's E-step runs once, with the parameters current when it comes,
and its expected counts are added (incremental EM, Neal & Hinton 1998); a refit is the M-step.
Those early E-steps are never redone, so the online estimate does NOT converge to the batch fit:
on 60,000 simulated lists (γ = 0.9) it ends at γ = 0.856 where the batch EM finds 0.899
(docs/click-models.md). ``evald replay`` and ``evald judge`` therefore fit DBN with
``fit_batch``: the batch EM over all sessions, every E-step redone with the latest parameters,
to convergence (tested against an enumeration of every hidden path).

Priors: a and s shrink to their means μa, μs with ``prior_strength`` pseudo-sessions; γ has
none. Start: a = s = γ = 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from evald.clicks.model import MAX_ITERATIONS, TOLERANCE, ClickModel, grown
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings

START = 0.5
#: lists per E-step pass of the batch EM (bounds its temporary arrays)
CHUNK = 65_536


@dataclass(frozen=True, slots=True)
class Expectations:
    """One E-step's posteriors of a batch of sessions (n, depth) and (n,)."""

    attracted: np.ndarray  # P(A_r = 1 | C) on shown ranks
    satisfied: np.ndarray  # P(S_r = 1 | C) on clicked ranks (0 elsewhere)
    continued: np.ndarray  # (n,) expected transitions r -> r + 1 taken
    unsatisfied: np.ndarray  # (n,) expected examinations that could continue
    examination: np.ndarray  # P(E_r = 1), not conditioned on the clicks (the curve)


def expectations(
    a: np.ndarray, s: np.ndarray, gamma: np.ndarray, clicks: np.ndarray, shown: np.ndarray
) -> Expectations:
    """The DBN E-step of sessions with attractiveness ``a``, satisfaction ``s`` (n, depth) and
    continuation ``gamma`` (n,)."""
    n, depth = a.shape
    c = clicks & shown
    has = c.any(axis=1)
    last = np.where(has, depth - 1 - np.argmax(c[:, ::-1], axis=1), -1)
    g = gamma
    z = np.ones((n, depth + 1))
    for r in range(depth - 1, -1, -1):
        z[:, r] = np.where(shown[:, r], (1.0 - a[:, r]) * ((1.0 - g) + g * z[:, r + 1]), 1.0)
    rows = np.arange(n)
    s_last = s[rows, np.maximum(last, 0)]
    z_next = z[rows, last + 1]
    t = s_last + (1.0 - s_last) * ((1.0 - g) + g * z_next)
    sat_last = np.where(has, s_last / np.where(t > 0, t, 1.0), 0.0)
    current = np.where(has, (1.0 - s_last) * g * z_next / np.where(t > 0, t, 1.0), 1.0)
    exam = np.zeros((n, depth))
    for r in range(depth):
        exam[:, r] = np.where(r <= last, 1.0, np.where(shown[:, r], current, 0.0))
        tail = (r > last) & shown[:, r]
        ratio = (1.0 - a[:, r]) * g * z[:, r + 1] / np.where(z[:, r] > 0, z[:, r], 1.0)
        current = np.where(tail, current * ratio, current)
    ranks = np.arange(depth)
    before = ranks <= last[:, None]
    attracted = np.where(shown, np.where(before, c, (1.0 - exam) * a), 0.0)
    satisfied = np.where(c & (ranks == last[:, None]), sat_last[:, None], 0.0)
    step = shown[:, 1:]  # a transition r -> r + 1 exists
    continued = (step * exam[:, 1:]).sum(axis=1)
    at_last = ranks[:-1] == last[:, None]
    unsatisfied = (step * (exam[:, :-1] - at_last * sat_last[:, None])).sum(axis=1)
    return Expectations(
        attracted, satisfied, continued, unsatisfied, marginal_examination(a, s, g, shown)
    )


def marginal_examination(
    a: np.ndarray, s: np.ndarray, gamma: np.ndarray, shown: np.ndarray
) -> np.ndarray:
    """P(E_r = 1) before any click is seen: 1 at the top, then ε_{r+1} = ε_r γ (1 - a_r s_r)."""
    keep = gamma[:, None] * (1.0 - a * s)
    eps = np.cumprod(np.hstack([np.ones((len(a), 1)), keep[:, :-1]]), axis=1)
    return np.where(shown, eps, 0.0)


class DBN(ClickModel):
    """Attractiveness and satisfaction per (query, item), continuation per segment."""

    name = "dbn"

    def __init__(self, settings: ClickSettings) -> None:
        super().__init__(settings)
        #: per slot: Σ P(A=1|C), lists shown, Σ P(S=1|C), clicks (all weighted)
        self.stats = np.zeros((0, 4))
        self.a = np.zeros(0)
        self.s = np.zeros(0)
        self.mu = np.array([START, START])
        #: per segment: expected continued transitions, expected unsatisfied examinations
        self.moves = np.zeros((0, 2))
        self.gamma = np.zeros(0)
        #: per (segment, rank): weighted lists shown, Σ P(E_r = 1) (the curve)
        self.reach = np.zeros((0, 2, self.depth))

    def _new_segment(self) -> None:
        self.moves = np.vstack([self.moves, np.zeros((1, 2))])
        self.gamma = np.append(self.gamma, START)
        self.reach = np.concatenate([self.reach, np.zeros((1, 2, self.depth))])

    def _grow_pairs(self) -> None:
        size = self.pairs.size
        if len(self.a) < size:
            old = len(self.a)
            self.stats = np.vstack([self.stats, np.zeros((size - old, 4))])
            self.a = grown(self.a, size, self.mu[0])
            self.s = grown(self.s, size, self.mu[1])

    def _gathered(self, slots: np.ndarray, segments: np.ndarray) -> tuple[np.ndarray, ...]:
        """(a, s, γ) of sessions' cells; a cold pair gets the means."""
        a = self.relevance_parts(slots)
        return a[0], a[1], self.gamma[segments]

    def relevance_parts(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(attractiveness, satisfaction) of ``slots`` (the means where -1)."""
        if not len(self.a):
            return np.full(slots.shape, self.mu[0]), np.full(slots.shape, self.mu[1])
        safe = np.maximum(slots, 0)
        kept = slots >= 0
        return np.where(kept, self.a[safe], self.mu[0]), np.where(kept, self.s[safe], self.mu[1])

    def _add(self, sessions: Sessions, slots: np.ndarray, weights: np.ndarray) -> None:
        """The E-step of every shown rank; a cold pair (slot -1: evicted, in a batch fit)
        takes the means and adds nothing to the per-pair statistics."""
        a, s, g = self._gathered(slots, sessions.segments)
        post = expectations(a, s, g, sessions.clicks, sessions.shown())
        self._accumulate(post, sessions, slots, weights)

    def _accumulate(
        self, post: Expectations, sessions: Sessions, slots: np.ndarray, weights: np.ndarray
    ) -> None:
        """Add a piece's posteriors; bincount per column (np.add.at on rows took 60% of an
        E-step)."""
        shown = sessions.shown()
        kept = slots >= 0
        w = np.broadcast_to(weights[:, None], shown.shape)
        where, wk = slots[kept], w[kept]
        size = len(self.stats)
        columns = (post.attracted[kept], None, post.satisfied[kept], sessions.clicks[kept])
        for j, column in enumerate(columns):
            mass = wk if column is None else wk * column
            self.stats[:, j] += np.bincount(where, mass, minlength=size)
        segs = sessions.segments
        k = len(self.segments)
        self.moves[:, 0] += np.bincount(segs, post.continued * weights, minlength=k)
        self.moves[:, 1] += np.bincount(segs, post.unsatisfied * weights, minlength=k)
        cells = (np.broadcast_to(segs[:, None], shown.shape) * self.depth + np.arange(self.depth))[
            shown
        ]
        for j, mass in enumerate((w[shown], (post.examination * w)[shown])):
            self.reach[:, j] += np.bincount(cells, mass, minlength=k * self.depth).reshape(
                k, self.depth
            )

    def _step(self) -> float:
        live = self.pairs.live()
        stats = self.stats
        totals = stats[live].sum(axis=0)
        mu = self.mu.copy()
        if totals[1] > 0:
            mu[0] = totals[0] / totals[1]
        if totals[3] > 0:
            mu[1] = totals[2] / totals[3]
        m = self.settings.prior_strength
        with np.errstate(invalid="ignore", divide="ignore"):
            a = np.where(stats[:, 1] + m > 0, (stats[:, 0] + m * mu[0]) / (stats[:, 1] + m), mu[0])
            s = np.where(stats[:, 3] + m > 0, (stats[:, 2] + m * mu[1]) / (stats[:, 3] + m), mu[1])
            gamma = np.where(self.moves[:, 1] > 0, self.moves[:, 0] / self.moves[:, 1], self.gamma)
        gamma = np.clip(gamma, 0.0, 1.0)
        change = max(
            float(np.abs(a[live] - self.a[live]).max(initial=0.0)),
            float(np.abs(s[live] - self.s[live]).max(initial=0.0)),
            float(np.abs(gamma - self.gamma).max(initial=0.0)),
        )
        self.a, self.s, self.gamma, self.mu = a, s, gamma, mu
        return change

    def fit_batch(
        self, sessions: Sessions, tolerance: float = TOLERANCE, max_iterations: int = MAX_ITERATIONS
    ) -> int:
        """Batch EM over ``sessions`` (the ones observed), to convergence: each iteration
        redoes every E-step with the latest parameters. Returns the iterations run."""
        slots = np.where(sessions.shown(), self.pairs.lookup(sessions.pairs), -1)
        weights = self.horizon.weights(sessions.ts) * sessions.weights
        done = 0
        while done < max_iterations:
            done += 1
            self.stats[:] = 0.0
            self.moves[:] = 0.0
            self.reach[:] = 0.0
            for start in range(0, len(sessions), CHUNK):
                piece = slice(start, start + CHUNK)
                self._add(sessions.take(piece), slots[piece], weights[piece])
            if self._step() < tolerance:
                break
        self.fits += 1
        return done

    def _scale(self, factor: float) -> None:
        self.stats *= factor
        self.moves *= factor
        self.reach *= factor

    def _drop(self, slots: np.ndarray) -> None:
        self.stats[slots] = 0.0
        self.a[slots] = self.mu[0]
        self.s[slots] = self.mu[1]

    def _merge(
        self, other: Any, slot_map: np.ndarray, segment_map: np.ndarray, factor: float
    ) -> None:
        live = other.pairs.live()
        np.add.at(self.stats, slot_map[live], other.stats[live] * factor)
        np.add.at(self.moves, segment_map, other.moves * factor)
        np.add.at(self.reach, segment_map, other.reach * factor)

    # ------------------------------------------------------------------ reading

    def relevance(self, slots: np.ndarray) -> np.ndarray:
        a, s = self.relevance_parts(slots)
        return a * s

    def curve(self) -> np.ndarray:
        shown, exam = self.reach[:, 0], self.reach[:, 1]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(shown > 0, exam / np.where(shown > 0, shown, 1.0), np.nan)

    def click_probabilities(self, sessions: Sessions) -> tuple[np.ndarray, np.ndarray]:
        slots = self.pairs.lookup(sessions.pairs)
        a, s, g = self._gathered(slots, sessions.segments)
        shown = sessions.shown()
        full = marginal_examination(a, s, g, shown) * a
        conditional = np.zeros_like(a)
        p = np.ones(len(a))
        for r in range(self.depth):
            conditional[:, r] = p * a[:, r]
            clicked = sessions.clicks[:, r]
            unclicked = p * (1.0 - a[:, r]) * g / np.maximum(1.0 - p * a[:, r], 1e-300)
            p = np.where(clicked, g * (1.0 - s[:, r]), unclicked)
        return conditional, full

    def parameters(self, segment: int = 0) -> dict[str, Any]:
        curve = self.curve()[segment]
        return {
            "examination": [None if v != v else float(v) for v in curve.tolist()],
            "continuation": float(self.gamma[segment]),
            "prior_attractiveness": float(self.mu[0]),
            "prior_satisfaction": float(self.mu[1]),
        }

    # ------------------------------------------------------------------ state

    def _arrays(self) -> dict[str, np.ndarray]:
        return {
            "stats": self.stats,
            "a": self.a,
            "s": self.s,
            "mu": self.mu,
            "moves": self.moves,
            "gamma": self.gamma,
            "reach": self.reach,
        }

    def _load(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        k = len(self.segments)
        self.stats = arrays["stats"].astype(np.float64).reshape(-1, 4)
        self.a, self.s = arrays["a"].astype(np.float64), arrays["s"].astype(np.float64)
        self.mu = arrays["mu"].astype(np.float64)
        self.moves = arrays["moves"].astype(np.float64).reshape(k, 2)
        self.gamma = arrays["gamma"].astype(np.float64)
        self.reach = arrays["reach"].astype(np.float64).reshape(k, 2, self.depth)
