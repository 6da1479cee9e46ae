"""Sessions from the engine's stream: which items a list served (from the decoder) and which
of them earned feedback (from the join), for ``evald replay --click-model``.

The join already decides which feedback counts for which list (the attribution window,
lateness, duplicates: docs/semantics.md) and hands each finalized list's grades in served
order to ``Engine.on_joined``. It keeps item hashes, not the query, so ``Tee`` wraps the
decoder and remembers each impression's query and items by request id until its list is
joined. A (query, item) pair's key is Python's 64-bit hash of the two strings (SipHash:
collisions about pairs² / 2⁶⁴), stable within the process, which is all one replay needs;
43 ns a pair where an 8-byte BLAKE2b digest took 691 ns. A list with no query uses its items alone
(query "").

A list counts as clicked at a rank when its grade there is > 0 (any graded action: a click,
an add to cart, a purchase). Lists made of several records (``shown`` items of a mapping,
docs/mapping.md) carry no items in their impression and are not modelled (counted in
``unmodelled``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from evald.clicks.sessions import Sessions, concat
from evald.decode import EventDecoder
from evald.events import Impression
from evald.join.store import Joined

NONE = "__none__"


def pair_key(query: str, item: str) -> int:
    """A signed 64-bit key of a (query, item) pair, stable within the process (never 0, the
    padding key)."""
    return hash((query, item)) or 1


class Tee:
    """An ``EventDecoder`` that passes everything through and remembers served lists."""

    def __init__(self, decoder: EventDecoder) -> None:
        self.decoder = decoder
        self.action_grades = decoder.action_grades
        self.served: dict[str, tuple[str, list[str]]] = {}

    def __getattr__(self, name: str) -> Any:  # merges_repeats, reads_record_time, ...
        return getattr(self.decoder, name)

    def _keep(self, event: object) -> None:
        if isinstance(event, Impression) and event.items:
            self.served.setdefault(event.request_id, (event.query or "", event.items))

    def decode(self, raw: bytes, *args: Any, **kwargs: Any) -> Any:
        event = self.decoder.decode(raw, *args, **kwargs)
        self._keep(event)
        return event

    def decode_many(self, raws: Sequence[bytes], *args: Any, **kwargs: Any) -> Iterator[Any]:
        for position, event in self.decoder.decode_many(raws, *args, **kwargs):
            self._keep(event)
            yield position, event


class Collector:
    """Finalized lists as ``Sessions`` cut to ``depth``; segments numbered by label values."""

    def __init__(self, tee: Tee, label_keys: Sequence[str], depth: int) -> None:
        self.tee = tee
        self.label_keys = list(label_keys)
        self.depth = depth
        self.segments: list[tuple[str, ...]] = []
        self._segment: dict[tuple[str, ...], int] = {}
        self._parts: list[Sessions] = []
        self.unmodelled = 0

    def on_joined(self, partition: int, joined: Joined) -> None:
        """The engine's hook: one call per scored batch of lists."""
        served = self.tee.served
        rows: list[int] = []
        pairs: list[list[int]] = []
        for i, request_id in enumerate(joined.request_ids):
            found = served.pop(request_id, None)
            if found is None:
                self.unmodelled += 1
                continue
            query, items = found
            rows.append(i)
            pairs.append([pair_key(query, item) for item in items[: self.depth]])
        if not rows:
            return
        grades = joined.grades[rows]
        clicks = [(grades[k, : len(p)] > 0).tolist() for k, p in enumerate(pairs)]
        segments = [self._number(joined.labels[i]) for i in rows]
        self._parts.append(
            Sessions.build(
                pairs, clicks, depth=self.depth, segments=segments, ts=joined.ts[rows].tolist()
            )
        )

    def _number(self, labels: dict[str, str]) -> int:
        values = tuple(labels.get(k, NONE) for k in self.label_keys)
        found = self._segment.get(values)
        if found is None:
            found = self._segment[values] = len(self.segments)
            self.segments.append(values)
        return found

    def sessions(self) -> Sessions:
        """Every list collected, in the order the engine scored them."""
        if not self._parts:
            return Sessions.build([], [], depth=self.depth)
        return concat(self._parts)
