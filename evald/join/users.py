"""UserIds: the user ids of pending impressions, interned and reference counted.

A user has many lists in a window, so a pending impression stores a 4-byte id (0: no user id)
instead of its own copy of the string; an entry is recycled when no pending impression uses it,
so the table is bounded by the pending state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


class UserIds:
    """user id <-> small int (1, 2, ...; 0 is "none"), reference counted."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._names: list[str | None] = [None]  # index 0: no user id
        self._refs: list[int] = [0]
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._ids)

    def acquire(self, user_id: str | None) -> int:
        """The id of ``user_id`` with one more reference; 0 (no reference) for None or ""."""
        if not user_id:
            return 0
        found = self._ids.get(user_id)
        if found is not None:
            self._refs[found] += 1
            return found
        if self._free:
            found = self._free.pop()
            self._names[found], self._refs[found] = user_id, 1
        else:
            found = len(self._names)
            self._names.append(user_id)
            self._refs.append(1)
        self._ids[user_id] = found
        return found

    def names(self, ids: Iterable[int]) -> list[str | None]:
        """The user id of each id (None for 0)."""
        names = self._names
        return [names[i] for i in ids]

    def release(self, ids: Iterable[int]) -> None:
        """Drop one reference per id in ``ids`` (0s ignored); entries at zero are recycled."""
        refs, names = self._refs, self._names
        for user, count in Counter(ids).items():
            if not user:
                continue
            refs[user] -= count
            if not refs[user]:
                name = names[user]
                assert name is not None
                del self._ids[name]
                names[user] = None
                self._free.append(user)
