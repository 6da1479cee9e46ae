"""StreamClicks: the click model of ``evald run``, fitted online per partition and merged.

Each input partition has its own model (``ClickModel.observe``: its statistics decay with the
horizon's half-life, its pairs are capped, its parameters refitted on a schedule counted in
lists), fed the partition's finalized lists in the order the engine scores them. So a
partition's model is a function of its own stream only, and is part of its checkpointed state
(``PartitionState.click_model``): a restore loads it and the lists re-fed after the checkpoint
are the ones an uninterrupted run scored after it, so the model ends equal to the last bit.

The exported curve is one fit over every partition the process owns: the partitions' statistics
merged (in partition order) into a fresh model, fitted by EM to convergence. It is refitted
when a partition's model refitted (or a partition came or went), never on a timer, so it too
depends only on the partitions' states.

Pair keys must mean the same after a restart in another process, so they are a keyed 8-byte
BLAKE2b of the query and the item (Python's ``hash`` of a string changes per process). The
join keeps item hashes, not ids, so ``ServedTee`` wraps the decoder and remembers each
impression's pair keys by request id until its list is scored; entries whose list can no
longer be scored (re-fed by a restore after their list was emitted) are pruned by event time.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from evald.clicks.model import ClickModel
from evald.clicks.models import build, new_model
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings
from evald.events import Impression

if TYPE_CHECKING:
    from evald.config import ClickModelConfig
    from evald.decode import EventDecoder
    from evald.join.store import Joined

__all__ = ["NONE", "ServedTee", "StreamClicks", "pair_keys"]

#: a label value the list did not carry
NONE = "__none__"
#: the merged fit's stopping rule (largest parameter change) and iteration cap
MERGED_TOLERANCE = 1e-7
MERGED_ITERATIONS = 500


def pair_keys(query: str, items: Sequence[str]) -> bytes:
    """The signed 64-bit keys of (query, item) pairs, little-endian, stable across processes:
    BLAKE2b-64 of the item keyed by the query (0, the padding key, never occurs: it is 1)."""
    base = hashlib.blake2b(query.encode(), digest_size=8)
    out = bytearray()
    for item in items:
        h = base.copy()
        h.update(b"\x1f" + item.encode())
        digest = h.digest()
        out += digest if digest != bytes(8) else (1).to_bytes(8, "little")
    return bytes(out)


class ServedTee:
    """An ``EventDecoder`` that passes everything through and remembers, per request id, the
    event time and the pair keys of the first ``depth`` served items."""

    def __init__(self, decoder: EventDecoder, depth: int) -> None:
        self.decoder = decoder
        self.depth = depth
        self.action_grades = decoder.action_grades
        self.served: dict[str, tuple[int, bytes]] = {}

    def __getattr__(self, name: str) -> Any:  # merges_repeats, reads_record_time, ...
        return getattr(self.decoder, name)

    def _keep(self, event: object) -> None:
        if isinstance(event, Impression) and event.items and event.request_id not in self.served:
            keys = pair_keys(event.query or "", event.items[: self.depth])
            self.served[event.request_id] = (int(event.ts), keys)

    def decode(self, raw: bytes, *args: Any, **kwargs: Any) -> Any:
        event = self.decoder.decode(raw, *args, **kwargs)
        self._keep(event)
        return event

    def decode_many(self, raws: Sequence[bytes], *args: Any, **kwargs: Any) -> Iterator[Any]:
        keep = self._keep
        for position, event in self.decoder.decode_many(raws, *args, **kwargs):
            keep(event)
            yield position, event

    def prune(self, before: int) -> int:
        """Forget entries older than ``before`` (ms): every list that old was scored, so what
        is left of them was re-fed after its list was emitted. Returns how many."""
        stale = [rid for rid, (ts, _) in self.served.items() if ts < before]
        for rid in stale:
            del self.served[rid]
        return len(stale)


class StreamClicks:
    """Per-partition click models and their merged curve (the engine's click component)."""

    def __init__(self, config: ClickModelConfig, label_keys: Sequence[str]) -> None:
        assert config.model is not None
        self.settings = ClickSettings(
            model=config.model,
            depth=config.depth,
            max_pairs=config.max_pairs,
            half_life=config.half_life,
            refit_every=config.refit_every,
            first_refit=min(1_000, config.refit_every),
        ).check()
        self.label_keys = list(label_keys)
        self.models: dict[int, ClickModel] = {}
        self.tee: ServedTee | None = None
        #: lists scored without served items (several-record lists), this process
        self.unmodelled = 0
        #: the merged fit's segments (label values) and curve (segments, depth), and the
        #: lists shown at each (segment, rank) behind it
        self.segments: list[tuple[str, ...]] = []
        self.curve = np.zeros((0, config.depth))
        self.shown = np.zeros((0, config.depth))
        self._merged_of: tuple[tuple[int, int], ...] = ()

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
        model = self._model(partition)
        rows: list[int] = []
        keys: list[bytes] = []
        for i, request_id in enumerate(joined.request_ids):
            found = served.pop(request_id, None)
            if found is None:
                self.unmodelled += 1
                continue
            rows.append(i)
            keys.append(found[1])
        if not rows:
            return
        n = len(rows)
        pairs = np.zeros((n, depth), np.int64)
        lengths = np.zeros(n, np.int64)
        for k, raw in enumerate(keys):
            m = len(raw) // 8
            pairs[k, :m] = np.frombuffer(raw, "<i8")
            lengths[k] = m
        grades = joined.grades[rows]
        width = min(depth, grades.shape[1])
        clicks = np.zeros((n, depth), bool)
        clicks[:, :width] = grades[:, :width] > 0
        clicks &= np.arange(depth) < lengths[:, None]
        segment = model.segment
        label_keys = self.label_keys
        segments = np.asarray(
            [segment(tuple(joined.labels[i].get(k, NONE) for k in label_keys)) for i in rows],
            np.intp,
        )
        ts = joined.ts[rows].astype(np.int64)
        model.observe(Sessions(pairs, clicks, lengths, segments, ts, np.ones(n)))

    def prune(self, before: int | None) -> None:
        """Forget remembered lists older than ``before`` (the engine's complete_before)."""
        tee = self.tee
        if tee is not None and before is not None and len(tee.served) > 4096:
            tee.prune(before)

    def refresh(self) -> bool:
        """Refit the merged curve when a partition's model refitted or the partitions changed
        since the last merge; returns whether it did."""
        of = tuple((p, m.fits) for p, m in sorted(self.models.items()) if m.fits)
        if of == self._merged_of:
            return False
        self._merged_of = of
        merged = new_model(self.settings)
        for p, _ in of:
            merged.merge(self.models[p])
        if of:
            merged.fit(MERGED_TOLERANCE, MERGED_ITERATIONS)
        self.segments = list(merged.segments)
        self.curve = merged.curve().copy()
        self.shown = merged.shown.copy()
        return True

    def rows(self) -> list[tuple[tuple[str, ...], np.ndarray, np.ndarray]]:
        """(label values, curve, lists shown per rank) per segment of the merged fit."""
        return [
            (labels, self.curve[s].copy(), self.shown[s].copy())
            for s, labels in enumerate(self.segments)
        ]

    # ------------------------------------------------------------------ state

    def state(self, partition: int) -> dict[str, Any] | None:
        """The partition's model for its checkpoint: ``{"snapshot": <base64>}``; None before
        it saw a list."""
        model = self.models.get(partition)
        if model is None:
            return None
        return {"snapshot": base64.b64encode(model.snapshot()).decode()}

    def load(self, partition: int, state: dict[str, Any] | None) -> bool:
        """Put back a partition's model from :meth:`state`; None, or a model of other
        settings (engine.click_model was changed), starts it empty. Returns whether it was
        put back. ValueError if the snapshot is not a click model's."""
        self.models.pop(partition, None)
        if state is None:
            return False
        model = build(base64.b64decode(state["snapshot"], validate=True))
        if model.settings != self.settings:
            return False
        self.models[partition] = model
        return True

    def drop(self, partition: int) -> None:
        self.models.pop(partition, None)
