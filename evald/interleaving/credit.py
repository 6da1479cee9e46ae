"""Credit of one interleaved list when it closes: pure functions of its teams and its grades.

Per rank the *gain* is what a team earns there: 1 for a clicked item (any positive feedback:
a click, or an action past it) with ``credit: clicks``, the item's grade with ``credit: grades``
(the graded actions as weights). Then:

* team-draft interleaving (Radlinski, Kurup & Joachims, CIKM 2008) and team-draft
  multileaving (Schuth, Sietsma, Whiteson, Lefortier & de Rijke, CIKM 2014): a team's credit
  is the sum of the gains of the items it contributed;
* balanced interleaving (Joachims, KDD 2002; the rule as Chapelle, Joachims, Radlinski & Yue,
  TOIS 2012, §2.1 state it): with d the lowest clicked item of the list and k the smaller of
  its ranks in the two rankers' own lists (a list it is not in does not count), a team's
  credit is the sum of the gains of the clicked items within its own top k.

Each pair of teams (a < b by name) both present in the list is compared once: a wins when its
credit is larger, b when b's is, a tie when they are equal and not both 0; a list where neither
earned anything compares nothing (``Outcome.compared`` False). ``lead`` says whether a's first
item comes before b's (the draft's coin flip: the sample-ratio guard checks it is fair).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from evald.interleaving.teams import BALANCED, Teams

#: what a rank's gain is: 1 per clicked item, or its grade
CREDITS: tuple[str, ...] = ("clicks", "grades")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One pair of teams in one list: ``d`` is +1 (a won), -1 (b won) or 0 (a tie, or not
    compared when ``compared`` is False); ``lead``: a's first item precedes b's."""

    team_a: str
    team_b: str
    d: int
    compared: bool
    lead: bool


def gains(grades: Sequence[float], credit: str) -> list[float]:
    """Each rank's gain: 1.0 where the grade is positive (``clicks``) or the grade (``grades``)."""
    if credit == "clicks":
        return [1.0 if g > 0 else 0.0 for g in grades]
    return [float(g) if g > 0 else 0.0 for g in grades]


def team_credits(teams: Teams, gain: Sequence[float]) -> dict[str, float]:
    """Credit per team present in the list (see the module docstring)."""
    if teams.method == BALANCED:
        return balanced_credits(teams, gain)
    credits = dict.fromkeys(teams.order, 0.0)
    for name, g in zip(teams.names, gain, strict=True):
        if g and name is not None:
            credits[name] += g
    return credits


def balanced_credits(teams: Teams, gain: Sequence[float]) -> dict[str, float]:
    """Balanced interleaving's credit: the gains of the clicked items within each team's own
    top k, k = the lowest clicked item's best rank in the two rankers' lists."""
    order = teams.order
    credits = dict.fromkeys(order, 0.0)
    clicked = [i for i, g in enumerate(gain) if g]
    if not clicked or teams.ranks is None:
        return credits
    lowest = clicked[-1]
    k = min(own[lowest] for own in teams.ranks if own[lowest])
    for team, own in zip(order, teams.ranks, strict=True):
        credits[team] = sum(gain[i] for i in clicked if 0 < own[i] <= k)
    return credits


def outcomes(teams: Teams, credits: dict[str, float]) -> list[Outcome]:
    """One :class:`Outcome` per pair of teams present in the list, pairs ordered by name."""
    first: dict[str, int] = {}
    for index, name in enumerate(teams.names):
        if name is not None and name not in first:
            first[name] = index
    out = []
    for a, b in combinations(teams.order, 2):
        ca, cb = credits[a], credits[b]
        compared = bool(ca or cb)
        d = (ca > cb) - (ca < cb)
        out.append(Outcome(a, b, d, compared, first[a] < first[b]))
    return out


def credit_list(teams: Teams, grades: Sequence[float], credit: str) -> list[Outcome]:
    """The outcomes of one closed list from its grades in served order."""
    return outcomes(teams, team_credits(teams, gains(grades, credit)))
