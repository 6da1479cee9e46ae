"""The teams of the pending interleaved lists of one partition (docs/semantics.md, "Interleaved
impressions").

A list's teams come from the impression that gave its items (``teams`` and ``interleaving``,
checked by the decoder). :class:`TeamBook` keeps them per pending slot until the list is taken
for scoring; lists that are not interleaved cost nothing here (one empty-dict check per taken
batch).
"""

from __future__ import annotations

from evald.events import Impression
from evald.interleaving.teams import Teams, teams_of

#: distinct team names kept as one shared string each (beyond: each list keeps its own copies)
MAX_SHARED = 4096


class TeamBook:
    """Teams per pending slot."""

    def __init__(self) -> None:
        self._slots: dict[int, Teams] = {}
        self._names: dict[str, str] = {}

    def give(self, slot: int, event: Impression) -> None:
        """The teams of an impression whose items the slot now holds (the decoder checked
        them: ``teams.problem``)."""
        assert event.teams is not None and event.interleaving is not None
        names = [self._shared(name) for name in event.teams]
        self._slots[slot] = teams_of(event.items, names, event.interleaving, event.rankings)

    def take(self, slots: list[int]) -> list[Teams | None] | None:
        """The teams of ``slots`` (being scored: forgotten here), one per slot, None for a list
        that is not interleaved; None when none of them is."""
        book = self._slots
        if not book:
            return None
        out = [book.pop(slot, None) for slot in slots]
        return out if any(teams is not None for teams in out) else None

    def _shared(self, name: str) -> str:
        """One string object per team name (a pair of rankers' lists repeat two names)."""
        shared = self._names.get(name)
        if shared is not None:
            return shared
        if len(self._names) < MAX_SHARED:
            self._names[name] = name
        return name
