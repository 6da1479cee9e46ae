"""Segments: impression labels -> a bounded set of segment tuples.

Only the configured label keys form a segment. Each key accepts its first ``cap`` distinct
values; later new values become ``__other__`` and a missing key is ``__none__``. The per-key
cap alone still allows ``(cap + 1) ** len(keys)`` combinations (132,651 with the defaults), so
the index also keeps at most ``max_segments`` combinations, first come first kept; any later
new combination goes to the overflow segment, every label ``__other__``. At most
``max_segments + 1`` segments exist whatever the input, which bounds the Prometheus series and
the per-segment arrays (docs/semantics.md, section 5).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

OTHER = "__other__"
NONE = "__none__"


class SegmentIndex:
    """Assigns dense integer ids to segment tuples; ids are stable for the process lifetime.

    ``max_segments`` (None: no limit) counts the combinations kept in their own right; the
    overflow segment comes on top of them.
    """

    def __init__(self, keys: Sequence[str], cap: int, max_segments: int | None = None) -> None:
        self.keys: tuple[str, ...] = tuple(keys)
        self.cap = cap
        self.max_segments = max_segments
        self._accepted: list[dict[str, str]] = [{} for _ in self.keys]
        self._ids: dict[tuple[str, ...], int] = {}
        self._overflow: tuple[str, ...] = (OTHER,) * len(self.keys)
        self._kept = 0  # segments admitted in their own right (not the folded overflow)
        #: segment tuples by id, values in the order of ``keys``
        self.segments: list[tuple[str, ...]] = []

    def __len__(self) -> int:
        return len(self.segments)

    def value_counts(self) -> list[int]:
        """Distinct accepted values per key (``__other__`` / ``__none__`` not included)."""
        return [len(values) for values in self._accepted]

    @property
    def overflow_id(self) -> int | None:
        """Id of the all-``__other__`` segment (where refused combinations go), if it exists."""
        return self._ids.get(self._overflow)

    def segment_of(self, labels: Mapping[str, str]) -> int:
        """Id of the segment an impression with ``labels`` belongs to (creating it if new).

        A new value is accepted for its key only when its combination is kept, so refused
        combinations do not use up the per-key caps.
        """
        return self._admit(tuple(labels.get(key) for key in self.keys), folded=False)

    def id_of(self, segment: Sequence[str]) -> int:
        """Id of a segment tuple as ``segments`` holds it (values in ``keys`` order, with
        ``__none__`` / ``__other__`` already folded), admitted as ``segment_of`` would admit
        its labels: how a snapshot written by another process maps back to local ids."""
        if len(segment) != len(self.keys):
            raise ValueError(f"a segment has {len(self.keys)} values, got {len(segment)}")
        return self._admit(tuple(segment), folded=True)

    def _admit(self, raw: tuple[str | None, ...], *, folded: bool) -> int:
        values = []
        new_values: list[tuple[dict[str, str], str]] = []
        for value, accepted in zip(raw, self._accepted, strict=True):
            if value is None or (folded and value in (NONE, OTHER)):
                values.append(NONE if value is None else value)
                continue
            known = accepted.get(value)
            if known is None:
                if len(accepted) >= self.cap:
                    known = OTHER
                else:
                    known = value
                    new_values.append((accepted, value))
            values.append(known)
        segment = tuple(values)
        found = self._ids.get(segment)
        if found is not None:
            return found
        if (folded and segment == self._overflow) or (
            self.max_segments is not None and self._kept >= self.max_segments
        ):
            return self._add(self._overflow)
        for accepted, value in new_values:
            accepted[value] = value
        self._kept += 1
        return self._add(segment)

    def _add(self, segment: tuple[str, ...]) -> int:
        found = self._ids.get(segment)
        if found is None:
            found = self._ids[segment] = len(self.segments)
            self.segments.append(segment)
        return found

    def labels_of(self, segment_id: int) -> dict[str, str]:
        """The segment as a ``{key: value}`` dict (Prometheus label pairs)."""
        return dict(zip(self.keys, self.segments[segment_id], strict=True))


class LabelTable:
    """Interns the label dicts of pending impressions so identical dicts are stored once.

    Results must carry the impression's labels exactly as given, but thousands of pending
    impressions share a handful of label sets. Entries are reference counted and recycled when
    no pending impression uses them, so the table is bounded by the pending state.
    """

    def __init__(self, segments: SegmentIndex) -> None:
        self._segments = segments
        self._ids: dict[tuple[tuple[str, str], ...], int] = {}
        self._keys: list[tuple[tuple[str, str], ...] | None] = []
        self.labels: list[dict[str, str] | None] = []
        self.segment: list[int] = []
        self._refs: list[int] = []
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._ids)

    def acquire(self, labels: dict[str, str]) -> int:
        """Id for ``labels`` with one more reference."""
        key = tuple(labels.items())
        found = self._ids.get(key)
        if found is not None:
            self._refs[found] += 1
            return found
        segment = self._segments.segment_of(labels)
        if self._free:
            found = self._free.pop()
            self._keys[found], self.labels[found] = key, labels
            self.segment[found], self._refs[found] = segment, 1
        else:
            found = len(self.labels)
            self._keys.append(key)
            self.labels.append(labels)
            self.segment.append(segment)
            self._refs.append(1)
        self._ids[key] = found
        return found

    def release(self, label_id: int, count: int = 1) -> None:
        """Drop ``count`` references; the entry is recycled at zero."""
        self._refs[label_id] -= count
        if self._refs[label_id] == 0:
            key = self._keys[label_id]
            assert key is not None
            del self._ids[key]
            self._keys[label_id] = self.labels[label_id] = None
            self._free.append(label_id)
