"""StreamClicks: the click model of ``evald run``, fitted online per partition and merged.

Each input partition has its own model (``ClickModel.observe``: its statistics decay with the
horizon's half-life, its pairs are capped, its parameters refitted on a schedule counted in
lists), fed the partition's finalized lists in the order the engine scores them. So a
partition's model is a function of its own stream only, and is part of its checkpointed state
(``PartitionState.click_model``): a restore loads it and the lists re-fed after the checkpoint
are the ones an uninterrupted run scored after it, so the model ends equal to the last bit.

The exported curve pools the partitions the process owns: per (segment, rank) the mean of the
partitions' fitted curves weighted by the lists each had shown there at its last refit
(``refresh``). Both are set by refits only, which come at counts of lists, so the curve too
depends only on the partitions' states, never on batching or on when a restart came.

Pair keys must mean the same after a restart in another process (Python's ``hash`` of a
string changes per process): the query and the item each get an 8-byte BLAKE2b digest
(remembered, as they repeat) and the pair's key mixes the two (``pair_keys``). The join keeps
item hashes, not ids, so ``ServedTee`` wraps the decoder and remembers each impression's query
and items by request id until its list is scored; entries whose list can no longer be scored
(re-fed by a restore after their list was emitted) are pruned by event time.

A partition's IPS and debiased sums are its whole history (checkpointed, they move with it);
the counters export what this process scored (``scored``: each partition's sums beyond those
it loaded, a dropped partition's share kept), so that summed over instances each list counts
once through rebalances and restarts (evald/clicks/totals.py).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

from evald.clicks import debias, listlog
from evald.clicks.live_measures import DebiasedSums
from evald.clicks.model import ClickModel
from evald.clicks.models import build, new_model
from evald.clicks.pbm import PBM
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings
from evald.clicks.totals import ClickTotals, IpsSums, add_ips
from evald.events import Impression

if TYPE_CHECKING:
    from evald.config import ClickModelConfig
    from evald.decode import EventDecoder
    from evald.join.store import Joined
    from evald.segments import SegmentIndex

__all__ = ["ServedTee", "StableKeys", "StreamClicks", "ips_add", "pair_keys", "stable_key"]

log = logging.getLogger(__name__)


#: splitmix64's multipliers (Steele, Lea & Flood 2014), to mix a query's and an item's keys
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
#: the prefix of a checkpointed model compressed by LZ4 (a model snapshot starts b"EVSN")
LZ4 = b"EVL4"
#: strings whose key a ``StableKeys`` remembers before it starts over
CACHED_KEYS = 1 << 20
#: a partition's checkpoint takes a new snapshot once the lists logged since the last one
#: reach this share of the snapshot's size (a restore re-observes at most a snapshot's worth)
#: or ``LOG_MAX_BYTES`` (the log rides inline in the checkpoint record, base64, well under
#: Kafka's 1 MiB)
LOG_SHARE = 1.0
LOG_MAX_BYTES = 192 * 1024


def stable_key(text: str) -> int:
    """A string's signed 64-bit key, the same in every process: BLAKE2b-64 of its UTF-8."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class StableKeys:
    """``stable_key`` of strings, remembered (queries and items repeat: a lookup is a dict get
    where a digest costs half a microsecond); forgets everything past ``CACHED_KEYS``."""

    def __init__(self) -> None:
        self._known: dict[str, int] = {}

    def many(self, texts: list[str]) -> np.ndarray:
        """int64 keys of ``texts``, looked up in one pass; the unknown ones digested. An
        unknown text reads as 0 and the zeros are found by numpy (a key that is 0 itself is
        digested again each time: the same key, found slower)."""
        known = self._known
        keys = np.fromiter(map(known.get, texts, repeat(0)), np.int64, len(texts))
        missing = np.flatnonzero(keys == 0)
        if len(missing):
            if len(known) + len(texts) > CACHED_KEYS:
                known.clear()
            unknown = [texts[i] for i in missing.tolist()]
            fresh = [text for text in dict.fromkeys(unknown) if text not in known]
            known.update(zip(fresh, map(stable_key, fresh), strict=True))
            keys[missing] = np.fromiter(map(known.__getitem__, unknown), np.int64, len(unknown))
        return keys


def pair_keys(queries: np.ndarray, items: np.ndarray) -> np.ndarray:
    """int64 keys of (query, item) pairs from their ``stable_key``s (broadcast): splitmix64's
    finalizer of query · golden + item, so the same pair has the same key in every process;
    never 0 (the padding key)."""
    with np.errstate(over="ignore"):
        z = queries.astype(np.uint64) * _GOLDEN + items.astype(np.uint64)
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z = z ^ (z >> np.uint64(31))
    keys = z.view(np.int64)
    keys[keys == 0] = 1
    return keys


class ServedTee:
    """An ``EventDecoder`` that passes everything through and remembers, per request id, the
    event time, query and first ``depth`` served items of each impression."""

    def __init__(self, decoder: EventDecoder, depth: int) -> None:
        self.decoder = decoder
        self.depth = depth
        self.action_grades = decoder.action_grades
        self.served: dict[str, tuple[int, str, list[str]]] = {}

    def __getattr__(self, name: str) -> Any:  # merges_repeats, reads_record_time, ...
        return getattr(self.decoder, name)

    def _keep(self, event: object) -> None:
        if isinstance(event, Impression) and event.items and event.request_id not in self.served:
            self.served[event.request_id] = (event.ts, event.query or "", event.items[: self.depth])

    def decode(self, raw: bytes, *args: Any, **kwargs: Any) -> Any:
        event = self.decoder.decode(raw, *args, **kwargs)
        self._keep(event)
        return event

    def decode_many(self, raws: Sequence[bytes], *args: Any, **kwargs: Any) -> Iterator[Any]:
        served, depth = self.served, self.depth  # ``_keep`` inlined: a call per event saved
        for position, event in self.decoder.decode_many(raws, *args, **kwargs):
            if isinstance(event, Impression) and event.items and event.request_id not in served:
                served[event.request_id] = (event.ts, event.query or "", event.items[:depth])
            yield position, event

    def prune(self, before: int) -> int:
        """Forget entries older than ``before`` (ms): every list that old was scored, so what
        is left of them was re-fed after its list was emitted. Returns how many."""
        stale = [rid for rid, (ts, _, _) in self.served.items() if ts < before]
        for rid in stale:
            del self.served[rid]
        return len(stale)


#: IPS sums are kept in units of 2^-32: integers add up the same in any grouping, so the
#: sums do not depend on how lists were batched (nor on a restart) to the last bit
IPS_UNIT = float(1 << 32)


def ips_add(
    sums: dict[tuple[str, ...], list[int]], model: ClickModel, piece: Sessions, clip: float
) -> None:
    """Add to ``sums`` (per segment: Σ w·c, Σ w·θ in units of 2^-32, ranks shown) the lists
    of ``piece``, weighed by the curve of the model's last refit: at a shown rank r,
    w = min(1 / θ[r], clip) (docs/click-models.md, "IPS in evald run"). A list whose segment
    no refit has read yet is not counted (its curve is still the initial one)."""
    if not len(piece):
        return
    counted = model.refit_read(piece.segments)
    if counted.any():
        part = piece if counted.all() else piece.take(counted)
        _ips_sums(sums, model, part, ips_weights(model, clip))


def ips_weights(model: ClickModel, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """(w · 2^32, w · θ · 2^32) per (segment, rank), from the curve of the model's last
    refit (``ips_add``): what every list of a segment reads, the same until the next refit."""
    theta = np.nan_to_num(model.curve(), nan=0.0)
    w = debias.inverse_propensity(theta, clip)
    return w * IPS_UNIT, w * theta * IPS_UNIT


def _ips_sums(
    sums: dict[tuple[str, ...], list[int]],
    model: ClickModel,
    part: Sessions,
    weights: tuple[np.ndarray, np.ndarray],
) -> None:
    """``ips_add`` of lists every one of which a refit has read. Each list reads its
    segment's row of ``ips_weights`` (the same arithmetic, element by element, as one
    segment at a time: the sums do not change by a bit)."""
    clicked_w, expected_w = weights
    rows, shown = part.segments, part.shown()
    clicked = np.rint(clicked_w[rows] * (part.clicks & shown)).astype(np.int64)
    expected = np.rint(expected_w[rows] * shown).astype(np.int64)
    per = np.zeros((len(model.fitted_shown), 3), np.int64)
    np.add.at(per, rows, np.stack([clicked.sum(1), expected.sum(1), shown.sum(1)], axis=1))
    for s in np.flatnonzero(np.bincount(rows, minlength=len(per))).tolist():
        row = sums.setdefault(model.segments[s], [0, 0, 0])
        row[0] += int(per[s, 0])
        row[1] += int(per[s, 1])
        row[2] += int(per[s, 2])


def _snapshot_of(state: Any) -> tuple[str, int, bytes]:
    """A checkpointed state's snapshot: its base64 text, its packed size and its bytes
    unpacked; ValueError naming what is damaged."""
    if not isinstance(state, dict):
        raise ValueError(f"the click model's state is not an object: {type(state).__name__}")
    try:
        text = state["snapshot"]
        raw = base64.b64decode(text, validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the click model's snapshot is not base64 text: {exc!r}") from None
    size = len(raw)
    if raw.startswith(LZ4):
        import lz4.frame

        try:
            raw = lz4.frame.decompress(raw[len(LZ4) :])
        except RuntimeError as exc:  # what the lz4 binding raises on a damaged frame
            raise ValueError(f"the click model's snapshot is damaged: {exc}") from None
    return text, size, raw


def _ips_of(state: dict[str, Any]) -> dict[tuple[str, ...], list[int]]:
    """A checkpointed state's IPS sums per segment; ValueError when they are not sums."""
    try:
        ips = {tuple(map(str, row[0])): [int(x) for x in row[1:]] for row in state.get("ips", [])}
        if any(len(sums) != 3 for sums in ips.values()):
            raise ValueError("[labels, clicks, expected, ranks] per segment expected")
    except (TypeError, ValueError, IndexError, OverflowError) as exc:  # inf: OverflowError
        raise ValueError(f"the click model's IPS sums are unreadable: {exc}") from None
    return ips


class StreamClicks:
    """Per-partition click models and their merged curve (the engine's click component)."""

    def __init__(
        self,
        config: ClickModelConfig,
        segment_index: SegmentIndex,
        measures: Sequence[str] = (),
    ) -> None:
        assert config.model is not None
        self.settings = ClickSettings(
            model=config.model,
            depth=config.depth,
            max_pairs=config.max_pairs,
            half_life=config.half_life,
            refit_every=config.refit_every,
            first_refit=min(1_000, config.refit_every),
        ).check()
        #: the engine's segments: a list's label values from its segment id
        self.segment_index = segment_index
        self.models: dict[int, ClickModel] = {}
        self.tee: ServedTee | None = None
        self._keys = StableKeys()
        #: lists scored without served items (several-record lists), this process
        self.unmodelled = 0
        #: the pooled curve's segments (label values, sorted), curve (segments, depth; NaN
        #: where no list was shown) and the lists shown at each (segment, rank) behind it
        self.segments: list[tuple[str, ...]] = []
        self.curve = np.zeros((0, config.depth))
        self.shown = np.zeros((0, config.depth))
        self._merged_of: tuple[tuple[int, int], ...] = ()
        #: per partition: its last snapshot (the checkpoint's base64) and its packed size,
        #: and the batches it observed since (``listlog``), with their total size
        self._base: dict[int, tuple[str, int]] = {}
        #: per partition and segment (label values) the IPS sums (``ips_add``), and as of
        #: the partition's last snapshot (what its checkpoint carries beside the log)
        self._ips: dict[int, IpsSums] = {}
        self._base_ips: dict[int, IpsSums] = {}
        #: per partition its IPS sums as loaded (its earlier lives'), and what this process
        #: scored of the partitions it dropped (``scored``)
        self._loaded_ips: dict[int, IpsSums] = {}
        self._retired_ips: IpsSums = {}
        self._log: dict[int, list[bytes]] = {}
        self._log_text: dict[int, listlog.Base64Log] = {}
        #: per partition ``ips_weights`` and the (model, refits, segments) they are of
        self._weights: dict[int, tuple[tuple[ClickModel, int, int], Any]] = {}
        self._logged: dict[int, int] = {}
        #: the configured measures scored on the model's relevance (``live_measures``)
        self.debiased = DebiasedSums(measures)

    def wrap(self, decoder: EventDecoder) -> ServedTee:
        self.tee = ServedTee(decoder, self.settings.depth)
        return self.tee

    def _model(self, partition: int) -> ClickModel:
        model = self.models.get(partition)
        if model is None:
            model = self.models[partition] = new_model(self.settings)
        return model

    def observe(self, partition: int, joined: Joined) -> None:
        """Add a scored batch of the partition's lists (the engine's ``_score``)."""
        served = self.tee.served if self.tee is not None else {}
        depth = self.settings.depth
        popped = list(map(served.pop, joined.request_ids, repeat(None)))
        found = [entry for entry in popped if entry is not None]
        rows: list[int] | slice = slice(None)  # the lists modelled: all, or those found
        if len(found) < len(popped):
            rows = [i for i, entry in enumerate(popped) if entry is not None]
            self.unmodelled += len(popped) - len(found)
            if not found:
                return
        n = len(found)
        texts: list[str] = []  # per list its query, then its items
        for _, query, shown in found:
            texts.append(query)
            texts += shown
        keys = self._keys.many(texts)
        length = np.fromiter(map(len, (entry[2] for entry in found)), np.int64, n)
        starts = np.cumsum(length + 1) - (length + 1)  # each list's query in ``keys``
        mask = np.arange(depth) < length[:, None]
        at = np.where(mask, starts[:, None] + 1 + np.arange(depth), 0)
        pairs = np.where(mask, pair_keys(keys[starts][:, None], keys[at]), 0)
        grades = joined.grades[rows]
        width = min(depth, grades.shape[1])
        clicks = np.zeros((n, depth), bool)
        clicks[:, :width] = grades[:, :width] > 0
        clicks &= mask
        ids = joined.segment_ids[rows]
        distinct = np.unique(ids)
        inverse = np.searchsorted(distinct, ids).astype(np.intp)
        table = self.segment_index.segments
        labels = [table[i] for i in distinct.tolist()]
        ts = joined.ts[rows].astype(np.int64)
        sessions = Sessions(pairs, clicks, length, inverse, ts, np.ones(n))
        self._observe(partition, labels, sessions)
        batch = listlog.encode(sessions, labels, sessions.segments)
        self._log.setdefault(partition, []).append(batch)
        self._logged[partition] = self._logged.get(partition, 0) + len(batch)

    def _observe(self, partition: int, labels: list[tuple[str, ...]], sessions: Sessions) -> None:
        """Observe ``sessions`` whose segments index ``labels``, declared in that order; each
        piece between refits is first counted in the IPS sums with the curve it meets."""
        model = self._model(partition)
        numbers = np.asarray([model.segment(x) for x in labels], np.intp)
        numbered = Sessions(
            sessions.pairs,
            sessions.clicks,
            sessions.lengths,
            numbers[sessions.segments] if len(sessions) else sessions.segments,
            sessions.ts,
            sessions.weights,
        )
        sums = self._ips.setdefault(partition, {})
        start, n = 0, len(numbered)
        while start < n:  # cut where the model refits: a list's weight is the same however
            stop = min(n, start + max(model.next_refit - model.seen, 1))  # lists are batched
            piece = numbered.take(slice(start, stop))
            slots = model.pairs.lookup(piece.pairs)  # one lookup for the scores and the fit
            counted = model.refit_read(piece.segments)  # the lists IPS and debiased sums read
            if counted.any():
                every = counted.all()
                part = piece if every else piece.take(counted)
                _ips_sums(sums, model, part, self._ips_weights(partition, model))
                self.debiased.add_read(partition, model, part, slots if every else slots[counted])
            model.observe(piece, slots)
            start = stop

    def _ips_weights(self, partition: int, model: ClickModel) -> tuple[np.ndarray, np.ndarray]:
        """``ips_weights`` of the partition's model, computed once per refit: PBM's curve moves
        only when it refits (a cascade's or DBN's reads counts every list updates, so one of
        those, were the stream to fit it, is weighed afresh each time)."""
        if not isinstance(model, PBM):
            return ips_weights(model, self.settings.ips_clip)
        key = (model, model.fits, len(model.segments))
        held = self._weights.get(partition)
        if held is None or held[0] != key:
            held = self._weights[partition] = (key, ips_weights(model, self.settings.ips_clip))
        return held[1]

    def prune(self, before: int | None, pending: int) -> None:
        """Forget remembered lists older than ``before`` (the engine's complete_before) once
        they are many more than the ``pending`` impressions (a scan is not free)."""
        tee = self.tee
        if tee is not None and before is not None and len(tee.served) > 2 * pending + 4096:
            tee.prune(before)

    def refresh(self) -> bool:
        """Recompute the exported curve when a partition's model refitted or the partitions
        changed since the last time; returns whether it did.

        Per (segment, rank), the partitions' curves as of their last refit, each weighted by
        the lists it had shown there then (``fitted_shown``): what every partition's fit says,
        pooled by its evidence. Both are set only by a refit, at a count of lists, so the curve
        is the same however the lists were batched and whenever a restart came."""
        of = tuple((p, m.fits) for p, m in sorted(self.models.items()) if m.fits)
        if of == self._merged_of:
            return False
        self._merged_of = of
        depth = self.settings.depth
        weighted: dict[tuple[str, ...], np.ndarray] = {}
        shown: dict[tuple[str, ...], np.ndarray] = {}
        for p, _ in of:
            model = self.models[p]
            curve, fitted = model.curve(), model.fitted_shown
            for s in range(len(fitted)):
                labels = model.segments[s]
                if labels not in shown:
                    weighted[labels], shown[labels] = np.zeros(depth), np.zeros(depth)
                weighted[labels] += fitted[s] * np.nan_to_num(curve[s])
                shown[labels] += fitted[s]
        self.segments = sorted(shown)
        self.shown = np.asarray([shown[k] for k in self.segments]).reshape(-1, depth)
        total = np.asarray([weighted[k] for k in self.segments]).reshape(-1, depth)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.curve = np.where(self.shown > 0, total / np.maximum(self.shown, 1e-300), np.nan)
        return True

    def rows(self) -> list[tuple[tuple[str, ...], np.ndarray, np.ndarray]]:
        """(label values, curve, lists shown per rank) per segment of the pooled curve."""
        return [
            (labels, self.curve[s].copy(), self.shown[s].copy())
            for s, labels in enumerate(self.segments)
        ]

    # ------------------------------------------------------------------ state

    def state(self, partition: int) -> dict[str, Any] | None:
        """The partition's model for its checkpoint: ``{"snapshot": <base64>, "log":
        <base64>}``, its last snapshot and the lists observed since (``listlog``; no "log"
        when none); None before it saw a list.

        The snapshot is taken again only when the log reached its size or ``LOG_MAX_BYTES``:
        in between, every commit names the same snapshot (the same string: the transaction
        names the records it already committed) and logs what changed. Its body is stored
        and compressed by LZ4 (3 ms for a model of 20,000 pairs where zlib took 25)."""
        model = self.models.get(partition)
        if model is None:
            return None
        base = self._base.get(partition)
        logged = self._logged.get(partition, 0)
        if base is None or logged >= min(LOG_SHARE * base[1], LOG_MAX_BYTES):
            import lz4.frame  # here: an install without the lz4 extra runs all but this model

            packed = LZ4 + lz4.frame.compress(model.snapshot(level=0))
            base = self._base[partition] = (base64.b64encode(packed).decode(), len(packed))
            self._log[partition], self._logged[partition] = [], 0
            self._base_ips[partition] = {k: list(v) for k, v in self._ips_of(partition).items()}
            self.debiased.mark(partition)
            logged = 0
        doc: dict[str, Any] = {"snapshot": base[0]}
        ips = self._base_ips.get(partition)
        if ips:
            doc["ips"] = [[list(labels), *sums] for labels, sums in sorted(ips.items())]
        debiased = self.debiased.state(partition)
        if debiased is not None:
            doc["debiased"] = debiased
        if logged:
            text = self._log_text.setdefault(partition, listlog.Base64Log())
            doc["log"] = text.text(self._log[partition])
        return doc

    def load(self, partition: int, state: dict[str, Any] | None) -> bool:
        """Put back a partition's model from :meth:`state`: its snapshot, then its log
        observed again; None, or a model of other settings (engine.click_model was changed),
        starts it empty, and says so in a warning naming the settings. Returns whether it was
        put back. ValueError naming the part when the state is damaged (not base64, a
        snapshot that is not a click model's, a log that is not a log of lists, sums that are
        not sums): never a model silently started empty. The exported curve is recomputed
        (``refresh``), so it counts the partition as loaded, as a drop leaves it. What this
        process scored of the partition before stays in :meth:`scored`, the sums loaded (its
        earlier lives') are not counted there."""
        self._retire(partition)
        self._forget(partition)
        try:
            loaded = self._load(partition, state)
        except ValueError:
            self._forget(partition)  # nothing half-loaded stays behind the error
            raise
        finally:
            self.refresh()
        self._loaded_ips[partition] = {k: list(v) for k, v in self._ips_of(partition).items()}
        self.debiased.loaded(partition)
        return loaded

    def _load(self, partition: int, state: dict[str, Any] | None) -> bool:
        if state is None:
            return False
        text, size, raw = _snapshot_of(state)
        model = build(raw)
        if model.settings != self.settings:
            changed = [
                f"{name} {getattr(model.settings, name)!r} -> {getattr(self.settings, name)!r}"
                for name in model.settings.to_json()
                if getattr(model.settings, name) != getattr(self.settings, name)
            ]
            log.warning(
                "partition %d: its checkpointed click model has other settings (%s): its fit, "
                "IPS and debiased sums start afresh",
                partition,
                ", ".join(changed),
            )
            return False
        self.models[partition] = model
        ips = _ips_of(state)
        self._ips[partition] = {k: list(v) for k, v in ips.items()}
        self._base_ips[partition] = ips
        debiased = state.get("debiased")
        if not self.debiased.load(partition, debiased) and debiased:
            log.warning(
                "partition %d: its checkpointed debiased sums are of the measures %s, not %s: "
                "they start again",
                partition,
                debiased.get("measures"),
                self.debiased.names,
            )
        try:
            log_bytes = base64.b64decode(state.get("log", ""), validate=True)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the click model's log is not base64 text: {exc!r}") from None
        batches = list(listlog.decode(log_bytes, self.settings.depth))
        for labels, sessions in batches:
            self._observe(partition, labels, sessions)
        self._base[partition] = (text, size)
        self._log[partition] = [log_bytes] if log_bytes else []
        self._logged[partition] = len(log_bytes)
        return True

    def drop(self, partition: int) -> None:
        """Forget a partition (revoked): its model, sums and its share of the exported curve,
        at once (not at the next ``refresh`` of a tick: a scrape before it would still see
        the partition in the curve and not in the IPS sums). What this process scored of it
        stays in :meth:`scored`."""
        self._retire(partition)
        self._forget(partition)
        self.refresh()

    def _retire(self, partition: int) -> None:
        """Keep what this process scored of the partition's sums (they leave with it)."""
        add_ips(self._retired_ips, self._ips_of(partition))
        add_ips(self._retired_ips, self._loaded_ips.pop(partition, {}), -1)
        self.debiased.retire(partition)

    def _forget(self, partition: int) -> None:
        self.models.pop(partition, None)
        self._base.pop(partition, None)
        self._log.pop(partition, None)
        self._log_text.pop(partition, None)
        self._logged.pop(partition, None)
        self._ips.pop(partition, None)
        self._base_ips.pop(partition, None)
        self._loaded_ips.pop(partition, None)
        self._weights.pop(partition, None)
        self.debiased.drop(partition)

    def _ips_of(self, partition: int) -> dict[tuple[str, ...], list[int]]:
        return self._ips.get(partition, {})

    def scored(self) -> ClickTotals:
        """The IPS and debiased sums this process scored (a new value): per partition owned
        its sums beyond those it loaded, plus the share of the partitions it dropped. What
        the counters show (``Engine.click_totals``): they never go down within the process,
        and summed over processes they count each list once, by the one that scored it."""
        ips = {labels: list(row) for labels, row in self._retired_ips.items()}
        for partition, sums in self._ips.items():
            add_ips(ips, sums)
            add_ips(ips, self._loaded_ips.get(partition, {}), -1)
        return ClickTotals(tuple(self.debiased.names), ips, self.debiased.scored())

    def ips_rows(self) -> list[tuple[tuple[str, ...], float, float, float]]:
        """Per segment (label values, sorted), over the partitions this process owns, their
        whole history (what their checkpoints carry): the IPS-weighted clicks, their expected
        weight and the ranks shown (``ips_add``)."""
        total: dict[tuple[str, ...], list[int]] = {}
        for sums in self._ips.values():
            for labels, row in sums.items():
                into = total.setdefault(labels, [0, 0, 0])
                for i in range(3):
                    into[i] += row[i]
        return [
            (labels, row[0] / IPS_UNIT, row[1] / IPS_UNIT, float(row[2]))
            for labels, row in sorted(total.items())
        ]
