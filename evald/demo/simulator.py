"""A seeded simulation of a search engine's traffic: served lists and the feedback they earn.

Why a model and not random bytes: the demo must show a *quality* signal. Each query has a
fixed set of candidate items with a latent relevance grade; two model versions in an A/B split
rank the candidates by relevance plus Gaussian noise (treatment slightly less noisy, hence
better). Users examine rank ``r`` with probability ``1 / r**eta`` (position-based model) and
click an examined item with a probability rising with its relevance; a click may lead to
add-to-cart and a cart to a purchase. Feedback happens seconds to ~20 minutes (event time)
after the impression and is delivered with transport jitter; a few events arrive minutes late,
are duplicated, lost, malformed or name an item that was never served, so the engine's health
counters have something to count. After ``regress_at_ms`` the treatment arm's ranker degrades
(its noise grows) for ``regressed_queries`` (default: every query) and its measures visibly
drop; the demo degrades a few known queries, which the drill-down's attribution then names.

A share ``interleave`` of the requests is served instead as one team-draft interleaved list of
the two arms' rankers (``teams`` per item, named by :data:`TEAMS`), labelled with its own arm
:data:`INTERLEAVED` so the A/B segments hold A/B lists only. Its randomness comes from a stream
of its own: with ``interleave=0`` the traffic is byte for byte what it was without the option.

The generator is pure: the same arguments give the same byte-for-byte event sequence. It works
in numpy blocks of requests and pre-encodes ids, so it produces a few hundred thousand events
per second and can feed benchmarks and ``evald produce`` as well as the demo.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from evald.interleaving.draft import team_draft_batch
from evald.interleaving.teams import TEAM_DRAFT

IMPRESSION = "impression"
FEEDBACK = "feedback"
KINDS: tuple[str, str] = (IMPRESSION, FEEDBACK)

#: Arm label -> model label. Index 0 is control ("A"), index 1 treatment ("B").
ARMS: tuple[tuple[str, str], ...] = (("control", "ranker-v1"), ("treatment", "ranker-v2"))
SURFACES: tuple[str, ...] = ("web", "app")
#: Arm label and model label of the interleaved lists (their own segments).
INTERLEAVED: tuple[str, str] = ("interleaved", "team-draft")
#: The teams of an interleaved list: the control and treatment rankers, by model name.
TEAMS: tuple[str, str] = (ARMS[0][1], ARMS[1][1])
ACTIONS: tuple[str, str, str] = ("click", "add_to_cart", "purchase")

#: 2026-01-01T00:00:00Z: a fixed default origin keeps runs reproducible.
DEFAULT_START_MS = 1_767_225_600_000

_MINUTE_MS = 60_000


class SimEvent(NamedTuple):
    """One record as a source would deliver it.

    ``at_ms`` is the simulated *arrival* time (event-time scale, non-decreasing along the
    stream); the JSON's own ``ts`` is when it happened and may be earlier. ``key`` is the
    request id (the Kafka partitioning key for both topics).
    """

    at_ms: int
    kind: str
    value: bytes
    key: bytes


@dataclass(frozen=True)
class ClickModel:
    """Position-biased examination and a click -> add_to_cart -> purchase funnel.

    Tuples are indexed by latent relevance grade 0..3.
    """

    eta: float = 1.0
    attractiveness: tuple[float, ...] = (0.02, 0.30, 0.60, 0.90)
    cart: tuple[float, ...] = (0.0, 0.10, 0.30, 0.50)
    purchase: tuple[float, ...] = (0.0, 0.20, 0.40, 0.60)
    #: median delays (ms) of click after impression, cart after click, purchase after cart
    click_delay_ms: float = 8_000.0
    cart_delay_ms: float = 45_000.0
    purchase_delay_ms: float = 120_000.0
    #: lognormal shape of every delay (heavier tail for larger values)
    delay_sigma: float = 1.0
    #: no feedback happens later than this after its impression
    max_delay_ms: int = 20 * _MINUTE_MS

    def examination(self, depth: int) -> np.ndarray:
        """P(rank r is examined) for r = 1..depth."""
        return 1.0 / np.arange(1, depth + 1, dtype=np.float64) ** self.eta


@dataclass(frozen=True)
class Faults:
    """Rates of realistic dirt in the stream; ``Faults.none()`` gives clean traffic."""

    #: an impression delivered twice (same bytes, a little later)
    duplicate_impression: float = 0.002
    #: a feedback event delivered twice (same event_id)
    duplicate_feedback: float = 0.005
    #: an impression never logged: its feedback becomes orphaned
    lost_impression: float = 0.002
    #: feedback naming an item that was not served
    unknown_item: float = 0.001
    #: extra garbage records (not JSON, bad fields), per generated event
    malformed: float = 0.0005
    #: feedback from an offline client: delivered 2-20 minutes after it happened
    straggler: float = 0.01
    #: median delivery jitter of ordinary feedback
    jitter_ms: float = 400.0

    @classmethod
    def none(cls) -> Faults:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Catalogue:
    """Shape of the simulated corpus: queries, candidates per query, relevance prior."""

    queries: int = 5_000
    items: int = 100_000
    candidates: int = 40
    depth: int = 20
    zipf_s: float = 1.1
    users: int = 200_000
    #: prior P(grade = 0..3) of a candidate
    relevance: tuple[float, ...] = (0.62, 0.24, 0.10, 0.04)
    #: share of requests on each of SURFACES
    surface_share: tuple[float, ...] = (0.7, 0.3)


_MALFORMED: tuple[bytes, ...] = (
    b'{"request_id":"broken","ts":',
    b"not json at all",
    b'{"request_id":"bad-action","ts":1767225600000,"item":"i1","action":"teleport"}',
    b'{"request_id":"bad-items","ts":1767225600000,"items":"i1,i2"}',
    b'{"request_id":"bad-grade","ts":1767225600000,"item":"i1","action":"judgment","grade":-1}',
    b"[1, 2, 3]",
)


@dataclass
class _Pool:
    """Generated records not yet emitted, as parallel arrays (arrival, tie-break, payload)."""

    at: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    seq: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    kind: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))
    value: np.ndarray = field(default_factory=lambda: np.empty(0, object))
    key: np.ndarray = field(default_factory=lambda: np.empty(0, object))


class Simulator:
    """Seeded, endless (or ``stop_ms``-bounded) stream of :class:`SimEvent` in arrival order.

    ``rate`` is the wanted number of events per *wall* second and ``speed`` how much faster
    event time runs than wall time; together they fix the request rate in event time
    (:attr:`qps`). The generator itself never sleeps: pacing is the consumer's job (``at_ms``
    tells when each record is due).

    Long because: its attributes are a run's parameters and the tables computed once from them
    (query CDF, candidates, relevance, record templates), all read by the block generator.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        rate: float = 3_000.0,
        speed: float = 60.0,
        start_ms: int = DEFAULT_START_MS,
        stop_ms: int | None = None,
        regress_at_ms: int | None = None,
        noise: tuple[float, float] = (1.0, 0.7),
        regressed_noise: float = 4.0,
        regressed_queries: Collection[int] | None = None,
        click_model: ClickModel | None = None,
        faults: Faults | None = None,
        catalogue: Catalogue | None = None,
        block: int | None = None,
        run_id: str = "",
        interleave: float = 0.0,
    ) -> None:
        if not 0.0 <= interleave <= 1.0:
            raise ValueError(f"interleave is a share in [0, 1], got {interleave}")
        if not (0 < rate < math.inf and 0 < speed < math.inf):
            raise ValueError(f"rate and speed must be positive and finite, got {rate}, {speed}")
        if block is not None and block <= 0:
            raise ValueError("block must be positive")
        if not re.fullmatch(r"[A-Za-z0-9_.]{0,32}", run_id):
            raise ValueError(f"run id must be up to 32 letters, digits, '_' or '.', got {run_id!r}")
        self.seed = seed
        self.rate = float(rate)
        self.speed = float(speed)
        self.start_ms = int(start_ms)
        self.stop_ms = stop_ms
        self.regress_at_ms = regress_at_ms
        self.noise = noise
        self.regressed_noise = regressed_noise
        self.interleave = float(interleave)
        self.click_model = click_model or ClickModel()
        self.faults = faults if faults is not None else Faults()
        self.catalogue = catalogue or Catalogue()
        #: the catalogue queries (``q{index}``) the regression degrades; None: every one
        self.regressed_queries = None if regressed_queries is None else tuple(regressed_queries)
        self._regressed = _regressed(self.catalogue.queries, regressed_queries)
        #: request ids are ``r{seed}-{n}``, or ``{run_id}-r{seed}-{n}``: a fresh run id keeps a
        #: second run's ids (and event ids) from colliding with the first's
        self._prefix = f"{run_id}-r{seed}-" if run_id else f"r{seed}-"

        cat = self.catalogue
        setup = np.random.default_rng([seed, 1])
        ranks = np.arange(1, cat.queries + 1, dtype=np.float64)
        weights = ranks**-cat.zipf_s
        self._query_cdf = np.cumsum(weights / weights.sum())
        if cat.candidates > cat.items or cat.depth > cat.candidates:
            raise ValueError("need depth <= candidates <= items")
        # distinct candidates per query: a served list never repeats an item
        self._cand = np.stack(
            [setup.choice(cat.items, cat.candidates, replace=False) for _ in range(cat.queries)]
        )
        self._rel = setup.choice(
            len(cat.relevance), size=(cat.queries, cat.candidates), p=np.asarray(cat.relevance)
        ).astype(np.int8)
        self._id_digits = len(str(cat.items - 1))
        self._feedback_template = (
            b'{"request_id":"%%s","ts":%%d,"item":"i%%0%dd","action":"%%s","position":%%d,'
            b'"event_id":"%%s:%%d"}' % self._id_digits
        )
        self._labels = [
            [
                b'{"model":"%s","arm":"%s","surface":"%s"}'
                % (model.encode(), arm.encode(), surface.encode())
                for surface in SURFACES
            ]
            for arm, model in (*ARMS, INTERLEAVED)
        ]
        self._team_tok = [b'"%s"' % name.encode() for name in TEAMS]
        self._action_tok = [a.encode() for a in ACTIONS]
        self._exam = self.click_model.examination(cat.depth)
        self.events_per_request = self._expected_events_per_request(setup)
        #: requests per second of event time
        self.qps = self.rate / self.speed / self.events_per_request
        #: requests per numpy block: ~2 s of event time, bounded for memory and latency
        self.block = block or int(min(65_536, max(4_096, 2.0 * self.qps)))

    # -- public -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[SimEvent]:
        return self.events()

    def events(self) -> Iterator[SimEvent]:
        """The stream from the start; every call restarts the same sequence."""
        rng = np.random.default_rng([self.seed, 2])
        # its own stream, so interleave=0 leaves every other draw where it was
        mixer = np.random.default_rng([self.seed, 3])
        # bucket width ~ the event time one block spans: each block touches few buckets
        pending = _Calendar(max(1, int(self.block * 1000.0 / self.qps)))
        clock = float(self.start_ms)
        next_request = 0
        next_seq = 0
        while True:
            block = self._requests(rng, mixer, clock, next_request)
            if block is None:
                yield from _emit(pending.pop(None))
                return
            new, clock, next_request = block
            new.seq = np.arange(next_seq, next_seq + len(new.at), dtype=np.int64)
            next_seq += len(new.at)
            pending.add(new)
            # every later record arrives at or after the last request of this block
            yield from _emit(pending.pop(int(clock)))

    # -- generation ---------------------------------------------------------------------

    def _expected_events_per_request(self, rng: np.random.Generator) -> float:
        """Mean records per request under this click model, from a pilot of rankings.

        Uses probabilities, not sampled clicks, so it is smooth; only used to turn the
        wanted events/s into a request rate.
        """
        cm, cat = self.click_model, self.catalogue
        q = rng.integers(0, cat.queries, 2048)
        sigma = np.where(rng.random(len(q)) < 0.5, self.noise[0], self.noise[1])
        rel = self._served(rng, q, sigma)[1]
        p_click = self._exam * np.asarray(cm.attractiveness)[rel]
        p_cart = p_click * np.asarray(cm.cart)[rel]
        p_buy = p_cart * np.asarray(cm.purchase)[rel]
        feedback = float((p_click + p_cart + p_buy).sum(axis=1).mean())
        f = self.faults
        per_request = 1.0 + f.duplicate_impression + feedback * (1.0 + f.duplicate_feedback)
        return per_request * (1.0 + f.malformed)

    def _served(
        self, rng: np.random.Generator, q: np.ndarray, sigma: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rank each request's candidates by relevance + N(0, sigma); keep the top ``depth``."""
        cat = self.catalogue
        rel = self._rel[q]
        score = rel + rng.standard_normal(rel.shape) * sigma[:, None]
        order = np.argsort(-score, axis=1, kind="stable")[:, : cat.depth]
        return (
            np.take_along_axis(self._cand[q], order, axis=1),
            np.take_along_axis(rel, order, axis=1),
        )

    def _interleaved(
        self,
        mixer: np.random.Generator,
        q: np.ndarray,
        ts: np.ndarray,
        items: np.ndarray,
        rel: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Replace a share ``interleave`` of the block's lists, in place, by team-draft lists of
        the control and treatment rankers (the treatment's degraded after ``regress_at_ms`` for
        the regressed queries, as its arm's); returns their rows and each item's team (0:
        control, 1: treatment)."""
        depth = self.catalogue.depth
        if self.interleave == 0.0:
            return np.empty(0, np.int64), np.empty((0, depth), np.int8)
        rows = np.flatnonzero(mixer.random(len(q)) < self.interleave)
        rel_all = self._rel[q[rows]]
        rankings = []
        for side in (0, 1):
            sigma = np.full(len(rows), self.noise[side], np.float64)
            if side == 1 and self.regress_at_ms is not None:
                hit = (ts[rows] >= self.regress_at_ms) & self._regressed[q[rows]]
                sigma[hit] = self.regressed_noise
            score = rel_all + mixer.standard_normal(rel_all.shape) * sigma[:, None]
            rankings.append(np.argsort(-score, axis=1, kind="stable").astype(np.int64))
        picks, teams = team_draft_batch(rankings[0], rankings[1], depth, mixer)
        items[rows] = np.take_along_axis(self._cand[q[rows]], picks, axis=1)
        rel[rows] = np.take_along_axis(rel_all, picks, axis=1)
        return rows, teams

    def _team_fields(self, rows: np.ndarray, teams: np.ndarray, n: int) -> list[bytes]:
        """Per request of the block, what its impression adds: the team of each item and the
        method for an interleaved list, nothing for an A/B list."""
        tails = [b""] * n
        tok = self._team_tok
        method = TEAM_DRAFT.encode()
        for row, sides in zip(rows.tolist(), teams.tolist(), strict=True):
            names = b",".join(tok[side] for side in sides)
            tails[row] = b',"teams":[%s],"interleaving":"%s"' % (names, method)
        return tails

    def _item_lists(self, items: np.ndarray) -> tuple[bytes, int]:
        """All served lists of a block as one bytes buffer of fixed-width JSON string lists.

        Item ids are zero-padded (``"i00042"``) so every list has the same byte width and the
        whole block is rendered by numpy instead of joining ids one by one.
        """
        n, depth = items.shape
        d = self._id_digits
        powers = 10 ** np.arange(d - 1, -1, -1, dtype=np.int64)
        cell = np.empty((n, depth, d + 4), np.uint8)
        cell[:, :, 0] = ord('"')
        cell[:, :, 1] = ord("i")
        cell[:, :, 2 : 2 + d] = (items[:, :, None] // powers) % 10 + ord("0")
        cell[:, :, 2 + d] = ord('"')
        cell[:, :, 3 + d] = ord(",")
        flat = cell.reshape(n, depth * (d + 4))[:, :-1]  # no comma after the last id
        return np.ascontiguousarray(flat).tobytes(), flat.shape[1]

    def _requests(
        self, rng: np.random.Generator, mixer: np.random.Generator, clock: float, first: int
    ) -> tuple[_Pool, float, int] | None:
        """One block of requests from event time ``clock``: their records and the new clock.

        Long because: one vectorized pass over the block draws from a single random stream in
        a fixed order (requests, funnel, faults); that order is what makes a seed reproduce a
        stream, and it reads best in one place.
        """
        cat, cm, f = self.catalogue, self.click_model, self.faults
        n = self.block
        ts_f = clock + np.cumsum(rng.exponential(1000.0 / self.qps, n))
        if self.stop_ms is not None:
            n = int(np.searchsorted(ts_f, self.stop_ms))
            if n == 0:
                return None
            ts_f = ts_f[:n]
        ts = ts_f.astype(np.int64)
        q = np.searchsorted(self._query_cdf, rng.random(n))
        q = np.minimum(q, cat.queries - 1)
        user = rng.integers(0, cat.users, n)
        arm = _arm(user)
        surface = np.searchsorted(np.cumsum(cat.surface_share), rng.random(n))
        surface = np.minimum(surface, len(SURFACES) - 1)
        sigma = np.asarray(self.noise, np.float64)[arm]
        if self.regress_at_ms is not None:
            hit = (arm == 1) & (ts >= self.regress_at_ms) & self._regressed[q]
            sigma[hit] = self.regressed_noise
        items, rel = self._served(rng, q, sigma)
        mixed, teams = self._interleaved(mixer, q, ts, items, rel)
        segment = arm.astype(np.int64)
        segment[mixed] = len(ARMS)  # the interleaved lists' own labels

        # the funnel, on the (n, depth) grid
        shape = (n, cat.depth)
        click = rng.random(shape) < self._exam * np.asarray(cm.attractiveness)[rel]
        cart = click & (rng.random(shape) < np.asarray(cm.cart)[rel])
        buy = cart & (rng.random(shape) < np.asarray(cm.purchase)[rel])
        # each step happens a lognormal lag after the previous one (cart after its click ...)
        when = np.zeros(shape)
        cells: list[np.ndarray] = []
        lags: list[np.ndarray] = []
        steps: list[np.ndarray] = []
        for step, (mask, median) in enumerate(
            ((click, cm.click_delay_ms), (cart, cm.cart_delay_ms), (buy, cm.purchase_delay_ms))
        ):
            idx = np.flatnonzero(mask)
            when.flat[idx] += rng.lognormal(np.log(median), cm.delay_sigma, len(idx))
            cells.append(idx)
            lags.append(when.flat[idx])
            steps.append(np.full(len(idx), step, np.int8))
        cell = np.concatenate(cells)
        action = np.concatenate(steps)
        row, rank = np.divmod(cell, cat.depth)
        fb_ts = ts[row] + np.minimum(np.concatenate(lags), cm.max_delay_ms).astype(np.int64)
        delay = rng.exponential(f.jitter_ms, len(cell)) if f.jitter_ms > 0 else 0.0
        straggle = rng.random(len(cell)) < f.straggler
        delay = delay + straggle * rng.uniform(2 * _MINUTE_MS, 20 * _MINUTE_MS, len(cell))
        fb_at = fb_ts + np.asarray(delay, np.float64).astype(np.int64)
        fb_item = items[row, rank]
        unknown = rng.random(len(cell)) < f.unknown_item
        fb_item[unknown] = cat.items + row[unknown]  # never a served id: ids stop at items-1

        rid = [b"%s%d" % (self._prefix.encode(), first + i) for i in range(n)]
        lost = rng.random(n) < f.lost_impression
        imp_rows = np.flatnonzero(~lost)
        labels = self._labels
        lists, width = self._item_lists(items)
        ts_l = ts.tolist()
        arm_l = segment.tolist()
        tails = self._team_fields(mixed, teams, n)
        surf_l = surface.tolist()
        q_l = q.tolist()
        user_l = user.tolist()
        imp_values = [
            b'{"request_id":"%s","ts":%d,"items":[%s],"labels":%s,"query":"q%d","user_id":"u%d"%s}'
            % (
                rid[i],
                ts_l[i],
                lists[i * width : (i + 1) * width],
                labels[arm_l[i]][surf_l[i]],
                q_l[i],
                user_l[i],
                tails[i],
            )
            for i in imp_rows.tolist()
        ]
        imp_keys = [rid[i] for i in imp_rows.tolist()]
        imp_at = ts[imp_rows]

        action_tok = self._action_tok
        template = self._feedback_template
        fb_values = [
            template % (rid[r], t, it, action_tok[a], k + 1, rid[r], 3 * c + a)
            for r, t, it, a, k, c in zip(
                row.tolist(),
                fb_ts.tolist(),
                fb_item.tolist(),
                action.tolist(),
                rank.tolist(),
                cell.tolist(),
                strict=True,
            )
        ]
        fb_keys = [rid[r] for r in row.tolist()]

        # duplicates: the same bytes again, a little later
        dup_i = np.flatnonzero(rng.random(len(imp_values)) < f.duplicate_impression)
        dup_f = np.flatnonzero(rng.random(len(fb_values)) < f.duplicate_feedback)
        dup_i_at = imp_at[dup_i] + rng.integers(1_000, 60_000, len(dup_i))
        dup_f_at = fb_at[dup_f] + rng.integers(1_000, 60_000, len(dup_f))

        end = float(ts_f[-1])
        n_bad = int(rng.binomial(len(imp_values) + len(fb_values), f.malformed))
        bad_at = rng.uniform(clock, end, n_bad).astype(np.int64)
        bad_pick = rng.integers(0, len(_MALFORMED), n_bad).tolist()
        bad_kind = rng.integers(0, 2, n_bad).astype(np.int8)

        block = _Pool(
            at=np.concatenate([imp_at, fb_at, dup_i_at, dup_f_at, bad_at]).astype(np.int64),
            kind=np.concatenate(
                [
                    np.zeros(len(imp_at), np.int8),
                    np.ones(len(fb_at), np.int8),
                    np.zeros(len(dup_i), np.int8),
                    np.ones(len(dup_f), np.int8),
                    bad_kind,
                ]
            ),
            value=_objects(
                imp_values
                + fb_values
                + [imp_values[i] for i in dup_i.tolist()]
                + [fb_values[i] for i in dup_f.tolist()]
                + [_MALFORMED[i] for i in bad_pick]
            ),
            key=_objects(
                imp_keys
                + fb_keys
                + [imp_keys[i] for i in dup_i.tolist()]
                + [fb_keys[i] for i in dup_f.tolist()]
                + [b"malformed"] * n_bad
            ),
        )
        return block, end, first + n


def _regressed(queries: int, picked: Collection[int] | None) -> np.ndarray:
    """Per catalogue query: does the regression degrade it (``picked``; None: every one)."""
    if picked is None:
        return np.ones(queries, bool)
    index = np.asarray(sorted(picked), np.int64)
    if index.size and not 0 <= index[0] <= index[-1] < queries:
        raise ValueError(f"regressed queries must be catalogue indices, got {index}")
    out = np.zeros(queries, bool)
    out[index] = True
    return out


def _arm(user: np.ndarray) -> np.ndarray:
    """Hash users into two arms (Knuth multiplicative hash, high bit) so arms are stable."""
    return ((user.astype(np.uint64) * np.uint64(2654435761)) >> np.uint64(16)) & np.uint64(1)


def _objects(values: list[bytes]) -> np.ndarray:
    out = np.empty(len(values), object)
    out[:] = values
    return out


def _concat(parts: list[_Pool]) -> _Pool:
    if len(parts) == 1:
        return parts[0]
    return _Pool(
        at=np.concatenate([p.at for p in parts]),
        seq=np.concatenate([p.seq for p in parts]),
        kind=np.concatenate([p.kind for p in parts]),
        value=np.concatenate([p.value for p in parts]),
        key=np.concatenate([p.key for p in parts]),
    )


def _slice(p: _Pool, sel: slice | np.ndarray) -> _Pool:
    return _Pool(p.at[sel], p.seq[sel], p.kind[sel], p.value[sel], p.key[sel])


def _emit(p: _Pool) -> Iterator[SimEvent]:
    return map(
        SimEvent._make,
        zip(
            p.at.tolist(),
            [KINDS[k] for k in p.kind.tolist()],
            p.value.tolist(),
            p.key.tolist(),
            strict=True,
        ),
    )


class _Calendar:
    """Records not yet due, bucketed by arrival time (a calendar queue).

    Feedback lands seconds to tens of minutes after its request; keeping one sorted pool would
    re-sort everything pending for every block. Buckets as wide as a block let each block
    sort only what falls due.
    """

    def __init__(self, width_ms: int) -> None:
        self.width = width_ms
        self._buckets: dict[int, list[_Pool]] = {}
        self._order: list[int] = []  # heap of bucket ids present in _buckets

    def add(self, pool: _Pool) -> None:
        bucket = pool.at // self.width
        order = np.argsort(bucket, kind="stable")
        pool = _slice(pool, order)
        ids, starts = np.unique(bucket[order], return_index=True)
        bounds = [*starts.tolist(), len(order)]
        for i, b in enumerate(ids.tolist()):
            part = _slice(pool, slice(bounds[i], bounds[i + 1]))
            parts = self._buckets.get(b)
            if parts is None:
                self._buckets[b] = [part]
                heapq.heappush(self._order, b)
            else:
                parts.append(part)

    def pop(self, horizon: int | None) -> _Pool:
        """Remove and return, sorted by (arrival, creation), all records due at ``horizon``.

        ``None`` pops everything.
        """
        last = None if horizon is None else horizon // self.width
        parts: list[_Pool] = []
        while self._order and (last is None or self._order[0] <= last):
            parts.extend(self._buckets.pop(heapq.heappop(self._order)))
        if not parts:
            return _Pool()
        pool = _concat(parts)
        pool = _slice(pool, np.lexsort((pool.seq, pool.at)))
        if horizon is None:
            return pool
        due = int(np.searchsorted(pool.at, horizon, side="right"))
        if due < len(pool.at):
            assert last is not None
            self._buckets[last] = [_slice(pool, slice(due, None))]
            heapq.heappush(self._order, last)
        return _slice(pool, slice(0, due))
