"""Which ranker ("team") contributed each item of an interleaved list, and the checks on it.

An interleaved impression says how it was made (``interleaving``: one of :data:`METHODS`) and,
per item, the team that contributed it (``teams``, aligned with ``items``). Balanced
interleaving credits by the rankers' own lists, not by who placed an item (Joachims 2002;
Chapelle, Joachims, Radlinski & Yue, TOIS 2012), so a balanced impression also gives
``rankings``: team -> that ranker's list of item ids. :func:`problem` is the one rule every
decoder applies; :class:`Teams` is what the join keeps per interleaved list (docs/semantics.md,
"Interleaved impressions").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TEAM_DRAFT = "team_draft"
BALANCED = "balanced"
MULTILEAVE = "team_draft_multileave"
#: the interleaving methods evald credits
METHODS: tuple[str, ...] = (TEAM_DRAFT, BALANCED, MULTILEAVE)
#: methods that interleave exactly two rankers
TWO_TEAMS = frozenset({TEAM_DRAFT, BALANCED})


@dataclass(frozen=True, slots=True)
class Teams:
    """An interleaved list's method and the team of each rank (None: a rank whose team no
    record gave, in a list made of several records); for balanced interleaving, ``ranks[t][i]``
    is the 1-based rank of item i in the list of team ``order[t]`` (0: not in it).

    Frozen and hashable, so the join keeps one copy per distinct value (team-draft lists of a
    pair of rankers take few distinct shapes)."""

    method: str
    names: tuple[str | None, ...]
    ranks: tuple[tuple[int, ...], ...] | None = None

    @property
    def order(self) -> tuple[str, ...]:
        """The distinct teams of the list, sorted by name (the pairs' order)."""
        return tuple(sorted({name for name in self.names if name is not None}))

    @property
    def complete(self) -> bool:
        """Every rank has its team."""
        return None not in self.names


def problem(
    items: Sequence[str],
    teams: Sequence[str] | None,
    method: str | None,
    rankings: Mapping[str, Sequence[str]] | None = None,
) -> tuple[str, str] | None:
    """What is wrong with an impression's team data, as (reason, detail), or None.

    ``missing_field``: teams without a method or a method without teams; ``unknown_interleaving``:
    a method not in :data:`METHODS`; ``bad_teams``: a teams list not aligned with the items, an
    empty team name, more than two teams in a two-ranker method, a team missing (a list of two
    or more items with a single team: every draft round gives each ranker a pick), and for
    balanced interleaving rankings that are absent, name other teams, or miss a placed item.
    """
    if teams is None and method is None:
        return None
    if method is None:
        return "missing_field", "interleaving: missing (teams are given)"
    if teams is None:
        return "missing_field", "teams: missing (interleaving is given)"
    if method not in METHODS:
        known = ", ".join(METHODS)
        return "unknown_interleaving", f"interleaving: {method!r} is not one of {known}"
    if len(teams) != len(items):
        count = f"{len(teams)} team" + ("" if len(teams) == 1 else "s")
        return "bad_teams", f"teams: {count} for {len(items)} items"
    shape = shape_problem(teams, method)
    if shape is not None:
        return "bad_teams", shape
    if method == BALANCED:
        return _balanced_problem(items, teams, sorted(set(teams)), rankings)
    return None


def shape_problem(teams: Sequence[str], method: str) -> str | None:
    """What is wrong with the teams of a list of a known method, in words, or None: an empty
    name, more than two teams in a two-ranker method, or a team missing (two or more items, a
    single team). Also checked when a list made of several records closes."""
    for index, name in enumerate(teams):
        if not name:
            return f"teams/{index}: empty team name"
    distinct = sorted(set(teams))
    if method in TWO_TEAMS and len(distinct) > 2:
        return f"{method} interleaves two rankers, the list has {_names(distinct)}"
    if len(teams) >= 2 and len(distinct) < 2:
        return (
            f"a team is missing: a {method} list of {len(teams)} items has only team "
            f"{distinct[0]!r}"
        )
    return None


def _balanced_problem(
    items: Sequence[str],
    teams: Sequence[str],
    distinct: list[str],
    rankings: Mapping[str, Sequence[str]] | None,
) -> tuple[str, str] | None:
    if rankings is None:
        return "missing_field", "rankings: missing (balanced interleaving credits by them)"
    if sorted(rankings) != distinct or len(distinct) != 2:
        return "bad_teams", (
            f"rankings: one list per team of the list ({_names(distinct)}), "
            f"got {_names(sorted(rankings))}"
        )
    for index, (item, team) in enumerate(zip(items, teams, strict=True)):
        if item not in rankings[team]:
            return "bad_teams", f"items/{index}: {item!r} is not in team {team!r}'s ranking"
    return None


def _names(names: Sequence[str]) -> str:
    return f"{len(names)} ({', '.join(repr(n) for n in names)})" if names else "none"


def teams_of(
    items: Sequence[str],
    teams: Sequence[str],
    method: str,
    rankings: Mapping[str, Sequence[str]] | None = None,
) -> Teams:
    """The :class:`Teams` of a checked impression (``problem`` returned None)."""
    names = tuple(teams)
    if method != BALANCED or rankings is None:
        return Teams(method, names)
    order = sorted(set(names))
    ranks = []
    for team in order:
        first: dict[str, int] = {}
        for rank, item in enumerate(rankings[team], 1):
            first.setdefault(item, rank)
        ranks.append(tuple(first.get(item, 0) for item in items))
    return Teams(method, names, tuple(ranks))
