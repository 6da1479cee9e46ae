"""QueryTable: the normalised queries of pending impressions, interned.

A pending impression keeps its query as an id into this table (a column of the pending store),
not as a string of its own: thousands of pending lists share a few hundred queries. Entries are
reference counted and recycled when no pending impression uses them, so the table is bounded
by the pending state however many distinct queries the input holds.
"""

from __future__ import annotations

from collections.abc import Callable

#: the id of "no query" (an impression without one, or one the rule left empty)
NO_QUERY = 0


class QueryTable:
    """Normalised query text <-> a small id with a reference count; id 0 is no query."""

    def __init__(self, normalize: Callable[[str | None], str]) -> None:
        self._normalize = normalize
        self._ids: dict[str, int] = {}
        self.texts: list[str] = [""]
        self._refs: list[int] = [0]
        self._free: list[int] = []

    def __len__(self) -> int:
        """Distinct queries held (no query not counted)."""
        return len(self._ids)

    def acquire(self, raw: str | None) -> int:
        """The id of ``raw``'s normalised query, with one more reference (0: no query)."""
        text = self._normalize(raw)
        if not text:
            return NO_QUERY
        found = self._ids.get(text)
        if found is not None:
            self._refs[found] += 1
            return found
        if self._free:
            found = self._free.pop()
            self.texts[found], self._refs[found] = text, 1
        else:
            found = len(self.texts)
            self.texts.append(text)
            self._refs.append(1)
        self._ids[text] = found
        return found

    def release(self, query_id: int, count: int = 1) -> None:
        """Drop ``count`` references; the entry is recycled at zero."""
        if query_id == NO_QUERY:
            return
        self._refs[query_id] -= count
        if self._refs[query_id] == 0:
            del self._ids[self.texts[query_id]]
            self.texts[query_id] = ""
            self._free.append(query_id)
