"""Simulated click logs with known parameters: what the tests recover and the docs plot.

A world has ``queries`` queries with ``items`` candidates each; every candidate has a true
attractiveness (P(click | examined)) and satisfaction (P(stop | clicked), DBN). A ranker serves
each session the top ``depth`` of a Plackett-Luce draw from its scores (Gumbel noise of scale
``noise``: the rank variation that makes position bias identifiable), and users click by PBM,
the cascade model or DBN. Pair keys are ``query * items + item + 1`` (exact, never 0).
Everything is drawn from the ``numpy.random.Generator`` given, so a seed fixes the log.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evald.clicks.sessions import Sessions


@dataclass(frozen=True, slots=True)
class World:
    """True parameters: (queries, items) attractiveness and satisfaction."""

    attractiveness: np.ndarray
    satisfaction: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        q, d = self.attractiveness.shape
        return int(q), int(d)

    @classmethod
    def draw(cls, rng: np.random.Generator, queries: int, items: int) -> World:
        """Attractiveness ~ Beta(1, 2) (most items rarely clicked), satisfaction ~ Beta(2, 2)."""
        return cls(rng.beta(1.0, 2.0, (queries, items)), rng.beta(2.0, 2.0, (queries, items)))

    def key(self, query: np.ndarray, item: np.ndarray) -> np.ndarray:
        return query * self.shape[1] + item + 1

    def split(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query, item) of pair keys."""
        return np.divmod(keys - 1, self.shape[1])


def serve(
    rng: np.random.Generator,
    world: World,
    scores: np.ndarray,
    sessions: int,
    depth: int,
    noise: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(queries (n,), items (n, depth)): each session's query (uniform) and the top ``depth``
    of its candidates by ``scores[query] + noise * Gumbel``."""
    n_queries, n_items = world.shape
    queries = rng.integers(0, n_queries, sessions)
    keyed = scores[queries] + noise * rng.gumbel(size=(sessions, n_items))
    items = np.argsort(-keyed, axis=1, kind="stable")[:, :depth]
    return queries, items


def pbm_clicks(rng: np.random.Generator, attract: np.ndarray, exam: np.ndarray) -> np.ndarray:
    """bool (n, depth): examined (θ per rank) and attracted, independently at every rank."""
    n, depth = attract.shape
    return (rng.random((n, depth)) < exam[:depth]) & (rng.random((n, depth)) < attract)


def dbn_clicks(
    rng: np.random.Generator, attract: np.ndarray, satisfy: np.ndarray, gamma: float
) -> np.ndarray:
    """bool (n, depth) by DBN: rank 1 is examined; an examined item is clicked with its
    attractiveness; after a click the user is satisfied and stops with its satisfaction;
    unsatisfied, the next rank is examined with probability ``gamma``. The cascade model is
    ``gamma = 1`` with satisfaction 1."""
    n, depth = attract.shape
    clicks = np.zeros((n, depth), bool)
    examining = np.ones(n, bool)
    for r in range(depth):
        clicked = examining & (rng.random(n) < attract[:, r])
        clicks[:, r] = clicked
        satisfied = clicked & (rng.random(n) < satisfy[:, r])
        examining = examining & ~satisfied & (rng.random(n) < gamma)
    return clicks


def sessions_of(
    world: World,
    queries: np.ndarray,
    items: np.ndarray,
    clicks: np.ndarray,
    *,
    segments: np.ndarray | None = None,
    ts: np.ndarray | None = None,
) -> Sessions:
    """The simulated log as ``Sessions`` (every list is ``depth`` long)."""
    n, depth = items.shape
    return Sessions(
        world.key(queries[:, None], items).astype(np.int64),
        clicks,
        np.full(n, depth, np.int64),
        np.zeros(n, np.intp) if segments is None else segments.astype(np.intp),
        np.arange(n, dtype=np.int64) if ts is None else ts.astype(np.int64),
        np.ones(n),
    )


def gathered(world: World, queries: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, ...]:
    """(attractiveness, satisfaction) (n, depth) of the served items."""
    return world.attractiveness[queries[:, None], items], world.satisfaction[
        queries[:, None], items
    ]
