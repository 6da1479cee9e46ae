"""ClickModel: what every click model shares - bounded pairs, the horizon, the refit schedule,
the segments, and its state as bytes.

A model is fed sessions in order (``observe``). It keeps statistics per (query, item) pair (at
most ``max_pairs`` pairs, ``PairTable``) and per segment, decayed by the horizon, and refits its
parameters from them after a number of lists fixed by the data (``first_refit``, doubling up
to ``refit_every``), never by how the sessions were batched: the same sessions in the same
order give the same parameters to the last bit: ``observe`` cuts a batch at every refit and at
every move of the horizon's reference (tested: a log fed whole and in pieces of 333 gives the
same snapshot, byte for byte).

``snapshot()`` is the whole state as bytes (``evald.snapshot`` codec: raw floats, JSON
metadata) and ``build(raw)`` rebuilds it exactly. ``merge`` adds another partition's
statistics (see each model for what that means for its fit).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from evald import snapshot
from evald.clicks.horizon import Horizon
from evald.clicks.pairs import PairTable
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings

#: the snapshot's ``kind``: a click model's state, not the window aggregates
KIND = "click-model"
#: ``fit``'s default stopping rule: the largest parameter change of one EM iteration
TOLERANCE = 1e-9
MAX_ITERATIONS = 1000


def grown(values: np.ndarray, size: int, fill: float) -> np.ndarray:
    """``values`` extended to ``size`` with ``fill`` (new pair slots start at the prior);
    ``values`` itself when it is that long already."""
    if len(values) >= size:
        return values
    out = np.full(size, fill)
    out[: len(values)] = values
    return out


class ClickModel(ABC):
    """The shared machinery; subclasses hold the statistics and the fit."""

    name: ClassVar[str]
    #: what the curve of ``curve()`` is: "examination" (a probability per rank) or "rank_ctr"
    curve_name: ClassVar[str] = "examination"
    #: the relevance at which a pair counts as relevant for binary measures (grade 1)
    relevant_at: ClassVar[float] = 0.5

    def __init__(self, settings: ClickSettings) -> None:
        self.settings = settings.check()
        self.depth = settings.depth
        self.pairs = PairTable(settings.max_pairs)
        self.horizon = Horizon(settings.half_life)
        #: segment label values, index = the segment number sessions carry
        self.segments: list[tuple[str, ...]] = []
        self._segment_index: dict[tuple[str, ...], int] = {}
        #: lists observed (unweighted), and the count at which the next refit is due
        self.seen = 0
        self.next_refit = settings.first_refit
        #: refits done: 0 means every parameter is still its initial value or prior
        self.fits = 0
        #: lists shown per (segment, rank), undecayed: the evidence behind each curve point
        self.shown = np.zeros((0, self.depth))
        #: ``shown`` as of the last ``refit``: the evidence behind the parameters it set, a
        #: function of the lists observed and never of how they were batched
        self.fitted_shown = np.zeros((0, self.depth))

    # ------------------------------------------------------------------ segments

    def segment(self, labels: tuple[str, ...]) -> int:
        """The number of a segment's label values, added the first time."""
        index = self._segment_index.get(labels)
        if index is None:
            index = self._segment_index[labels] = len(self.segments)
            self.segments.append(labels)
            self.shown = np.vstack([self.shown, np.zeros((1, self.depth))])
            self._new_segment()
        return index

    @abstractmethod
    def _new_segment(self) -> None:
        """Grow the per-segment parameters by one segment."""

    def refit_read(self, segments: np.ndarray) -> np.ndarray:
        """Per list of ``segments``, whether a refit has read its segment: until one has, its
        parameters are the initial ones, so the IPS and debiased sums leave the list out."""
        fitted = self.fitted_shown
        read = segments < len(fitted)
        read[read] = fitted[segments[read], 0] > 0
        return read

    # ------------------------------------------------------------------ input

    def observe(self, sessions: Sessions, slots: np.ndarray | None = None) -> None:
        """Add ``sessions`` (in order; segments numbered by ``segment``), refitting when due.
        ``slots``: ``pairs.lookup(sessions.pairs)`` when the caller has it already (it holds
        until the first piece is added: pairs are inserted and evicted then)."""
        if sessions.depth != self.depth:
            raise ValueError(f"sessions have depth {sessions.depth}, the model {self.depth}")
        if len(sessions) and int(sessions.segments.max()) >= len(self.segments):
            raise ValueError("a session's segment was never declared with segment()")
        start, n = 0, len(sessions)
        while start < n:
            jump = start + self.horizon.first_jump(sessions.ts[start:])
            if jump == start:
                self._rescale(self.horizon.advance(int(sessions.ts[start])))
                jump = start + 1 + self.horizon.first_jump(sessions.ts[start + 1 :])
            stop = min(n, jump, start + self.next_refit - self.seen)
            part = sessions.take(slice(start, stop))
            known = slots[start:stop] if slots is not None and start == 0 else None
            self._add_piece(part, self.pairs.lookup(part.pairs) if known is None else known)
            self.seen += stop - start
            if self.seen >= self.next_refit:
                self.refit()
            start = stop

    def _add_piece(self, part: Sessions, slots: np.ndarray) -> None:
        """Insert the piece's new pairs, add its statistics, then evict past the cap."""
        shown = part.shown()
        full = np.full(slots.shape, -1, np.intp)
        full[shown] = self.pairs.insert(part.pairs[shown], slots[shown])
        self._grow_pairs()
        weights = self.horizon.weights(part.ts) * part.weights
        cells = np.broadcast_to(weights[:, None], shown.shape)[shown]
        np.add.at(self.pairs.weight, full[shown], cells)
        segments = np.broadcast_to(part.segments[:, None], shown.shape)[shown]
        multiplicity = np.broadcast_to(part.weights[:, None], shown.shape)[shown]
        np.add.at(self.shown, (segments, np.nonzero(shown)[1]), multiplicity)
        self._add(part, full, weights)
        dropped = self.pairs.evict()
        if len(dropped):
            self._drop(dropped)

    def _rescale(self, factor: float) -> None:
        if factor != 1.0:
            self.pairs.scale(factor)
            self._scale(factor)

    def refit(self, iterations: int | None = None) -> None:
        """``iterations`` EM steps (default: the settings') from the current parameters, and
        the next refit scheduled (the gap doubles up to ``refit_every``)."""
        for _ in range(iterations or self.settings.iterations):
            self._step()
        self.fits += 1
        self.fitted_shown = self.shown.copy()
        gap = min(self.settings.refit_every, max(self.settings.first_refit, self.seen))
        self.next_refit = self.seen + gap

    def fit(self, tolerance: float = TOLERANCE, max_iterations: int = MAX_ITERATIONS) -> int:
        """EM to convergence on the statistics held (largest parameter change below
        ``tolerance``); returns the iterations run. Does not move the refit schedule."""
        for done in range(1, max_iterations + 1):
            if self._step() < tolerance:
                self.fits += 1
                return done
        self.fits += 1
        return max_iterations

    def merge(self, other: ClickModel) -> None:
        """Add ``other``'s statistics (another partition's model of the same settings) to
        this one's: pairs by key, segments by label values, at the newer horizon reference.
        Parameters are not refitted here (call ``refit`` or ``fit``)."""
        if other.name != self.name or other.settings != self.settings:
            raise ValueError("only models of the same kind and settings merge")
        refs = [r for r in (self.horizon.ref, other.horizon.ref) if r is not None]
        target = max(refs) if refs else None
        self._rescale(self.horizon.factor_to(target))
        factor = other.horizon.factor_to(target)
        self.horizon.ref = target
        segments = np.asarray([self.segment(labels) for labels in other.segments], np.intp)
        live = other.pairs.live()
        keys = other.pairs.keys[live]
        slots = self.pairs.insert(keys, self.pairs.lookup(keys))
        self._grow_pairs()
        slot_map = np.full(other.pairs.size, -1, np.intp)
        slot_map[live] = slots
        np.add.at(self.pairs.weight, slots, other.pairs.weight[live] * factor)
        np.add.at(self.shown, segments, other.shown)
        self._merge(other, slot_map, segments, factor)
        self.seen += other.seen
        dropped = self.pairs.evict()
        if len(dropped):
            self._drop(dropped)

    # ------------------------------------------------------------------ what subclasses hold

    @abstractmethod
    def _merge(
        self, other: Any, slot_map: np.ndarray, segment_map: np.ndarray, factor: float
    ) -> None:
        """Add ``other``'s statistics, its slot s at ``slot_map[s]`` and its segment g at
        ``segment_map[g]``, multiplied by ``factor`` (the horizons aligned)."""

    @abstractmethod
    def _grow_pairs(self) -> None:
        """Grow the per-pair arrays to ``pairs.size`` (new slots start at the prior)."""

    @abstractmethod
    def _add(self, sessions: Sessions, slots: np.ndarray, weights: np.ndarray) -> None:
        """Add a piece's statistics; ``slots`` (n, depth) with -1 where not shown,
        ``weights`` (n,) each session's weight (horizon times multiplicity)."""

    @abstractmethod
    def _step(self) -> float:
        """One EM iteration (or closed-form fit) from the statistics; returns the largest
        parameter change."""

    @abstractmethod
    def _scale(self, factor: float) -> None:
        """Multiply every decayed statistic by ``factor`` (the horizon's reference moved)."""

    @abstractmethod
    def _drop(self, slots: np.ndarray) -> None:
        """Forget the statistics of evicted slots and reset their parameters to the prior."""

    # ------------------------------------------------------------------ reading

    @abstractmethod
    def relevance(self, slots: np.ndarray) -> np.ndarray:
        """float64 of ``slots``' shape: each pair's relevance under the model (the prior
        where the slot is -1); the grade debiased measures use."""

    @abstractmethod
    def curve(self) -> np.ndarray:
        """float64 (segments, depth): the fitted per-rank curve (``curve_name``)."""

    @abstractmethod
    def click_probabilities(self, sessions: Sessions) -> tuple[np.ndarray, np.ndarray]:
        """(conditional, full) click probabilities (n, depth): P(C_r = 1 | clicks above)
        and P(C_r = 1), what log-likelihood and perplexity read (Chuklin et al., ch. 4)."""

    def parameters(self, segment: int = 0) -> dict[str, Any]:
        """The fitted parameters of a segment as plain values (the summary's)."""
        return {self.curve_name: self.by_rank(self.curve()[segment], segment)}

    def by_rank(self, values: np.ndarray, segment: int) -> list[float | None]:
        """A segment's per-rank values for a summary: null at a rank none of its lists reached
        (what a fit holds there is its start value or 0, which would read as a measurement)."""
        return [
            float(v) if shown > 0 and v == v else None
            for v, shown in zip(values.tolist(), self.shown[segment].tolist(), strict=True)
        ]

    # ------------------------------------------------------------------ state

    @abstractmethod
    def _arrays(self) -> dict[str, np.ndarray]:
        """The subclass's state arrays (float64 / int64)."""

    @abstractmethod
    def _load(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Set the subclass's state from ``_arrays``' output and ``_meta``'s."""

    def _meta(self) -> dict[str, Any]:
        return {}

    def snapshot(self, level: int = snapshot.COMPRESS_LEVEL) -> bytes:
        """The whole state, exactly (raw float bytes; ``build`` reads it back); ``level``:
        the codec's zlib level (0: stored, for a caller that compresses faster)."""
        meta = {
            "kind": KIND,
            "model": self.name,
            "settings": self.settings.to_json(),
            "segments": [list(s) for s in self.segments],
            "ref": self.horizon.ref,
            "seen": self.seen,
            "next_refit": self.next_refit,
            "fits": self.fits,
            "pairs": self.pairs.meta(),
            "own": self._meta(),
        }
        arrays = {
            **self.pairs.arrays(),
            "shown": self.shown,
            "fitted_shown": self.fitted_shown,
            **self._arrays(),
        }
        return snapshot.encode(meta, arrays, level)

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.segments = [tuple(str(v) for v in s) for s in meta["segments"]]
        self._segment_index = {s: i for i, s in enumerate(self.segments)}
        self.horizon.ref = None if meta["ref"] is None else int(meta["ref"])
        self.seen, self.next_refit, self.fits = (
            int(meta["seen"]),
            int(meta["next_refit"]),
            int(meta["fits"]),
        )
        self.pairs = PairTable.build(meta["pairs"], arrays)
        self.shown = arrays["shown"].astype(np.float64).reshape(len(self.segments), self.depth)
        fitted = arrays.get("fitted_shown", np.zeros(0))
        self.fitted_shown = fitted.astype(np.float64).reshape(-1, self.depth)
        self._load(meta["own"], arrays)
