"""Two rankers with a known small quality gap, users who click with position bias: how many
impressions interleaving needs for the right verdict against an A/B split of the same traffic,
with the same always-valid test (docs/statistics.md, "Interleaving: the figures").

The world (pure, seeded): each impression is a fresh query with ``pool`` candidates of latent
relevance grade 0..3 (prior ``relevance``); a ranker orders them by grade plus Gaussian noise of
its own sd (A less noisy than B: the gap), and serves its top ``depth``. A user examines rank r
with probability 1/r^eta (position-based model) and clicks an examined item of grade g with
probability ``attractiveness[g]`` times the user's own propensity (lognormal, mean 1: users
differ far more than rankers do, which is what makes A/B splits slow). Users come back:
impression i belongs to user ``users[i]``, drawn in proportion to a lognormal activity.

* **interleaving**: every impression is a team-draft list of A and B (``draft.team_draft_batch``),
  credited as evald credits it (clicks per team, ``credit.py``); the per-list outcome d feeds
  the one-sample confidence sequence (``sequential.mean_bound``), variance clustered by user;
* **A/B**: users are split into two arms for good (a hash of the user); each impression is the
  arm's own list; the per-list measure (clicks on the list, or nDCG@10 with clicks as grades)
  feeds the two-sample sequence (``sequential.half_width``), variance clustered by user as
  ``clustered.contrast`` computes it.

Both look after every ``step`` impressions at α; the verdict is the first look whose band
excludes 0, right when its sign favours A. ``position_credit`` breaks the credit (even ranks to
A, odd to B, whoever contributed them): the negative control.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from evald.interleaving.draft import team_draft_batch
from evald.statistics.bootstrap import DEFAULT_SEED, cluster_key, poisson_weights
from evald.statistics.sequential import half_width

NDCG_DEPTH = 10


@dataclass(frozen=True)
class World:
    """The traffic model (see the module docstring); ``noise`` = (sd of A, sd of B)."""

    pool: int = 30
    depth: int = 10
    relevance: tuple[float, ...] = (0.55, 0.25, 0.12, 0.08)
    attractiveness: tuple[float, ...] = (0.02, 0.15, 0.40, 0.80)
    eta: float = 1.0
    noise: tuple[float, float] = (1.0, 1.2)
    #: sd of the log of a user's click propensity
    user_sd: float = 1.0
    users: int = 20_000
    #: sd of the log of a user's activity (their share of the impressions; lognormal)
    activity: float = 1.0
    #: Beta(r, r) shape of the queries' richness in relevant candidates (small: very unequal)
    richness: float = 0.7
    #: share of the rankers' noise variance they have in common (versions of one system)
    shared: float = 0.85


@dataclass(frozen=True)
class Looks:
    """How a stream is tested: every ``step`` impressions, at ``alpha``, ``tuning_n``."""

    step: int = 100
    alpha: float = 0.05
    tuning_n: float = 5000.0
    min_n: int = 100
    replicates: int = 100


@dataclass
class Stream:
    """One simulated stream's per-impression values."""

    users: NDArray[np.int64]
    #: interleaving: the outcome d per impression (+1 A won, -1 B won, 0 tie) and whether
    #: it was compared (some click on either team)
    d: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    compared: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))
    #: A/B: the arm per impression (0 A, 1 B) and the per-list measures
    arm: NDArray[np.int8] = field(default_factory=lambda: np.zeros(0, np.int8))
    clicks: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    ndcg: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))


def _queries(world: World, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
    """The candidates' grades: per query, the prior's chance of a relevant candidate is
    scaled by the query's richness (Beta, mean 1 after scaling), so queries range from
    nothing relevant to plenty, as real ones do."""
    p = np.asarray(world.relevance, dtype=np.float64) / np.sum(world.relevance)
    richness = rng.beta(world.richness, world.richness, n) * 2.0
    relevant = np.minimum(richness * (1.0 - p[0]), 1.0)
    graded = rng.random((n, world.pool)) < relevant[:, None]
    upper = p[1:] / p[1:].sum()
    grade = 1 + np.searchsorted(np.cumsum(upper), rng.random((n, world.pool)), side="right")
    return np.where(graded, np.minimum(grade, len(p) - 1), 0).astype(np.int64)


def _ranking(
    grades: NDArray[np.int64],
    sd: float,
    depth: int,
    shared: NDArray[np.float64],
    world: World,
    rng: np.random.Generator,
) -> NDArray[np.int64]:
    """A ranker's top ``depth`` candidates (grade + sd × noise, highest first), the noise a
    share ``world.shared`` of it common to both rankers (they are versions of one system):
    a team-draft list of ``depth`` items never reaches deeper into either ranker's list."""
    own = rng.standard_normal(grades.shape)
    noise = np.sqrt(world.shared) * shared + np.sqrt(1.0 - world.shared) * own
    score = grades + noise * sd
    top = np.argpartition(-score, depth - 1, axis=1)[:, :depth]
    order = np.argsort(-np.take_along_axis(score, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)


def _user_stream(world: World, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
    weights = np.exp(rng.standard_normal(world.users) * world.activity)
    return rng.choice(world.users, size=n, p=weights / weights.sum())


def _clicks(
    world: World,
    grades_served: NDArray[np.int64],
    propensity: NDArray[np.float64],
    rng: np.random.Generator,
) -> NDArray[np.bool_]:
    exam = 1.0 / np.arange(1, grades_served.shape[1] + 1, dtype=np.float64) ** world.eta
    p = exam * np.asarray(world.attractiveness)[grades_served] * propensity[:, None]
    return rng.random(grades_served.shape) < np.minimum(p, 1.0)


def simulate(
    world: World,
    n: int,
    seed: int,
    *,
    designs: tuple[str, ...] = ("interleaving", "ab"),
    same_rankers: bool = False,
    position_credit: bool = False,
) -> Stream:
    """``n`` impressions of each design in ``designs`` (seeded); the users, their propensities,
    the queries and the rankings come from generators of their own, so the two designs see the
    same traffic (and a shorter stream is the start of a longer one). ``same_rankers``: B is A
    (the A/A stream); ``position_credit``: the broken credit."""
    users_rng, query_rng, rank_rng, draft_rng, click_rng, ab_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(6)
    )
    users = _user_stream(world, users_rng, n)
    log_prop = users_rng.standard_normal(world.users) * world.user_sd - world.user_sd**2 / 2
    propensity = np.exp(log_prop)[users]
    grades = _queries(world, query_rng, n)
    common = rank_rng.standard_normal(grades.shape)
    rank_a = _ranking(grades, world.noise[0], world.depth, common, world, rank_rng)
    if same_rankers:
        rank_b = rank_a
    else:
        rank_b = _ranking(grades, world.noise[1], world.depth, common, world, rank_rng)
    stream = Stream(users)
    if "interleaving" in designs:
        _interleave(
            stream, world, grades, rank_a, rank_b, propensity, draft_rng, click_rng, position_credit
        )
    if "ab" in designs:
        arm = ((users.astype(np.uint64) * np.uint64(2654435761)) >> np.uint64(16)) & np.uint64(1)
        stream.arm = arm.astype(np.int8)
        own = np.where(stream.arm[:, None] == 0, rank_a, rank_b)
        clicked = _clicks(world, np.take_along_axis(grades, own, axis=1), propensity, ab_rng)
        stream.clicks = clicked.sum(axis=1).astype(np.float64)
        stream.ndcg = _ndcg(clicked.astype(np.float64))
    return stream


def _interleave(
    stream: Stream,
    world: World,
    grades: NDArray[np.int64],
    rank_a: NDArray[np.int64],
    rank_b: NDArray[np.int64],
    propensity: NDArray[np.float64],
    draft_rng: np.random.Generator,
    click_rng: np.random.Generator,
    position_credit: bool,
) -> None:
    """Team draft of A and B, credited by clicks per team (or by position: the control)."""
    served, team = team_draft_batch(rank_a, rank_b, world.depth, draft_rng)
    clicked = _clicks(world, np.take_along_axis(grades, served, axis=1), propensity, click_rng)
    if position_credit:
        team = np.broadcast_to((np.arange(world.depth) % 2).astype(np.int8), team.shape)
    credit_a = (clicked & (team == 0)).sum(axis=1)
    credit_b = (clicked & (team == 1)).sum(axis=1)
    stream.d = np.sign(credit_a - credit_b).astype(np.int64)
    stream.compared = (credit_a + credit_b) > 0


def _ndcg(gains: NDArray[np.float64]) -> NDArray[np.float64]:
    """nDCG@10 with the clicks as grades and the ideal from the served grades, as evald scores
    a list (every served item judged: docs/semantics.md §4)."""
    cut = gains[:, :NDCG_DEPTH]
    discount = 1.0 / np.log2(np.arange(2, cut.shape[1] + 2))
    dcg = cut @ discount
    ideal = -np.sort(-cut, axis=1) @ discount
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ideal > 0, dcg / np.where(ideal > 0, ideal, 1.0), 0.0)


def _weights(replicates: int, world: World) -> NDArray[np.float64]:
    """Every user's replicate weights (row u: user u), as evald hashes the user id "u<u>"."""
    keys = np.asarray([cluster_key(f"u:u{u}") for u in range(world.users)], dtype=np.uint64)
    return poisson_weights(keys, replicates, DEFAULT_SEED).astype(np.float64)


def _cumulative(
    y: NDArray[np.float64],
    users: NDArray[np.int64],
    w_user: NDArray[np.float64],
    ends: NDArray[np.int64],
) -> tuple[NDArray[np.float64], ...]:
    """At each look end: n, Σy, Σy², and the replicate sums Σ w·y, Σ w (looks × B)."""
    counts = np.arange(1, len(y) + 1)[ends - 1].astype(np.float64)
    total = np.cumsum(y)[ends - 1]
    squares = np.cumsum(y * y)[ends - 1]
    starts = np.concatenate([[0], ends[:-1]])
    b = w_user.shape[1]
    weighted = np.zeros((len(ends), b))
    weights = np.zeros((len(ends), b))
    for i, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        w = w_user[users[lo:hi]]
        weighted[i] = y[lo:hi] @ w
        weights[i] = w.sum(axis=0)
    return counts, total, squares, np.cumsum(weighted, 0), np.cumsum(weights, 0)


def _sketch(
    n: NDArray[np.float64],
    total: NDArray[np.float64],
    weighted: NDArray[np.float64],
    weights: NDArray[np.float64],
) -> NDArray[np.float64]:
    """The replicate deviations D_b = (T_b − ȳ W_b)/n at each look (looks × B)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = (total / n)[:, None]
        return (weighted - mean * weights) / n[:, None]


def _list_variance(
    n: NDArray[np.float64], total: NDArray[np.float64], squares: NDArray[np.float64]
) -> NDArray[np.float64]:
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.clip((squares - total * total / n) / (n - 1), 0.0, None)
        return var / n


def interleaving_verdict(stream: Stream, world: World, looks: Looks) -> tuple[int | None, int]:
    """(impressions at the first look whose band excludes 0, its sign: +1 A better, −1 B);
    (None, 0) when it never does. Each look counts every impression so far (compared or not)."""
    keep = np.flatnonzero(stream.compared)
    if keep.size < 2:
        return None, 0
    y = stream.d[keep].astype(np.float64)
    users = stream.users[keep]
    ends_all = np.arange(looks.step, len(stream.d) + 1, looks.step)
    ends = np.searchsorted(keep, ends_all, side="left")  # compared lists before each look
    valid = ends >= 2
    ends_all, ends = ends_all[valid], ends[valid]
    w_user = _weights(looks.replicates, world)
    n, total, squares, weighted, weights = _cumulative(y, users, w_user, ends)
    se2 = np.fmax(
        _list_variance(n, total, squares),
        np.mean(_sketch(n, total, weighted, weights) ** 2, axis=1),
    )
    return _first(n, total / n, se2, ends_all, looks, n)


def ab_verdict(
    stream: Stream, world: World, looks: Looks, measure: str = "clicks"
) -> tuple[int | None, int]:
    """The same for the A/B split on ``measure`` (``clicks`` or ``ndcg``): mean(A) − mean(B)."""
    y_all = stream.clicks if measure == "clicks" else stream.ndcg
    ends_all = np.arange(looks.step, len(y_all) + 1, looks.step)
    w_user = _weights(looks.replicates, world)
    sides = []
    for arm in (0, 1):
        idx = np.flatnonzero(stream.arm == arm)
        ends = np.searchsorted(idx, ends_all, side="left")
        sides.append((ends, _cumulative_at(y_all[idx], stream.users[idx], w_user, ends)))
    (ea, (na, ta, qa, wya, wa)), (eb, (nb, tb, qb, wyb, wb)) = sides
    ok = (ea >= 2) & (eb >= 2)
    diff = ta / np.where(na > 0, na, 1) - tb / np.where(nb > 0, nb, 1)
    var_list = _list_variance(na, ta, qa) + _list_variance(nb, tb, qb)
    contrast = _sketch(na, ta, wya, wa) - _sketch(nb, tb, wyb, wb)
    se2 = np.fmax(var_list, np.mean(contrast**2, axis=1))
    n = na + nb
    smaller = np.minimum(na, nb)
    return _first(n[ok], diff[ok], se2[ok], ends_all[ok], looks, smaller[ok])


def _cumulative_at(
    y: NDArray[np.float64],
    users: NDArray[np.int64],
    w_user: NDArray[np.float64],
    ends: NDArray[np.int64],
) -> tuple[NDArray[np.float64], ...]:
    """``_cumulative`` at ends that may repeat or be 0 (looks before an arm's first list)."""
    out = [np.zeros(len(ends)) for _ in range(3)] + [
        np.zeros((len(ends), w_user.shape[1])) for _ in range(2)
    ]
    positive = ends > 0
    if positive.any():
        got = _cumulative(y, users, w_user, ends[positive])
        for target, value in zip(out, got, strict=True):
            target[positive] = value
    return tuple(out)


def _first(
    n: NDArray[np.float64],
    estimate: NDArray[np.float64],
    se2: NDArray[np.float64],
    impressions: NDArray[np.int64],
    looks: Looks,
    per_side: NDArray[np.float64],
) -> tuple[int | None, int]:
    half = half_width(n, se2, looks.alpha, looks.tuning_n)
    decided = (per_side >= looks.min_n) & np.isfinite(half) & (np.abs(estimate) > half)
    hits = np.flatnonzero(decided)
    if hits.size == 0:
        return None, 0
    first = hits[0]
    return int(impressions[first]), int(np.sign(estimate[first]))
