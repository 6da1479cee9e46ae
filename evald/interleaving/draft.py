"""The interleaving methods themselves: how a served list is made from the rankers' lists.

evald credits lists that others made; these make lists for the simulations, the demo's traffic
and the tests (their team data are what a real interleaver writes):

* :func:`team_draft` (Radlinski, Kurup & Joachims, CIKM 2008): rounds; in each a fair coin says
  which ranker picks first, then each picks its highest-ranked item not yet in the list;
* :func:`balanced` (Joachims, KDD 2002): one coin for the whole list; the ranker whose pointer
  is behind (ties: the coin's) places its next item unless it is already in the list;
* :func:`multileave` (Schuth et al., CIKM 2014, team-draft multileaving): each round a random
  order of all rankers, each picking its highest-ranked item not yet in the list.

:func:`team_draft_batch` is team draft over many lists at once, in numpy, for the simulations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from numpy.typing import NDArray


def _next(ranking: Sequence[str], start: int, taken: set[str]) -> int:
    """The index of ``ranking``'s first item at or after ``start`` not in ``taken``."""
    while start < len(ranking) and ranking[start] in taken:
        start += 1
    return start


def team_draft(
    a: Sequence[str],
    b: Sequence[str],
    length: int,
    a_first: Callable[[], bool],
    names: tuple[str, str] = ("A", "B"),
) -> tuple[list[str], list[str]]:
    """(items, teams) of a team-draft list of at most ``length`` items; ``a_first()`` is the
    round's coin. A ranker with nothing left passes; the list ends when both have nothing."""
    items: list[str] = []
    teams: list[str] = []
    taken: set[str] = set()
    pointers = [0, 0]
    lists = (a, b)
    while len(items) < length:
        order = (0, 1) if a_first() else (1, 0)
        placed = False
        for side in order:
            if len(items) >= length:
                break
            pointers[side] = _next(lists[side], pointers[side], taken)
            if pointers[side] < len(lists[side]):
                item = lists[side][pointers[side]]
                items.append(item)
                teams.append(names[side])
                taken.add(item)
                placed = True
        if not placed:
            break
    return items, teams


def balanced(
    a: Sequence[str],
    b: Sequence[str],
    length: int,
    a_first: bool,
    names: tuple[str, str] = ("A", "B"),
) -> tuple[list[str], list[str]]:
    """(items, teams) of a balanced-interleaving list: ``teams[i]`` is the ranker that placed
    item i (credit reads the rankers' own lists, ``credit.balanced_credits``)."""
    items: list[str] = []
    teams: list[str] = []
    taken: set[str] = set()
    ka = kb = 0
    while len(items) < length and (ka < len(a) or kb < len(b)):
        a_turn = kb >= len(b) or (ka < len(a) and (ka < kb or (ka == kb and a_first)))
        side, ranking, k = (0, a, ka) if a_turn else (1, b, kb)
        item = ranking[k]
        if item not in taken:
            items.append(item)
            teams.append(names[side])
            taken.add(item)
        if a_turn:
            ka += 1
        else:
            kb += 1
    return items, teams


def multileave(
    lists: Mapping[str, Sequence[str]],
    length: int,
    shuffle: Callable[[list[str]], list[str]],
) -> tuple[list[str], list[str]]:
    """(items, teams) of a team-draft multileaved list; ``shuffle`` orders the rankers of a
    round (a random permutation)."""
    items: list[str] = []
    teams: list[str] = []
    taken: set[str] = set()
    pointers = dict.fromkeys(lists, 0)
    while len(items) < length:
        placed = False
        for team in shuffle(list(lists)):
            if len(items) >= length:
                break
            ranking = lists[team]
            pointers[team] = _next(ranking, pointers[team], taken)
            if pointers[team] < len(ranking):
                item = ranking[pointers[team]]
                items.append(item)
                teams.append(team)
                taken.add(item)
                placed = True
        if not placed:
            break
    return items, teams


def team_draft_batch(
    rank_a: NDArray[np.int64],
    rank_b: NDArray[np.int64],
    length: int,
    rng: np.random.Generator,
) -> tuple[NDArray[np.int64], NDArray[np.int8]]:
    """Team draft over n lists at once: ``rank_a[i]`` and ``rank_b[i]`` are the top ``length``
    (or more) of two rankings of one pool of candidates numbered 0..pool−1 (distinct within
    a row); returns the candidates of each list (n, length) and their teams (0: a, 1: b).
    Equal to :func:`team_draft` with the same coins (tests/interleaving/test_draft.py)."""
    n, depth = rank_a.shape
    if length > depth:
        raise ValueError("a list of `length` items needs each ranker's top `length`")
    pool = int(max(rank_a.max(initial=0), rank_b.max(initial=0))) + 1
    rows = np.arange(n)
    taken = np.zeros((n, pool), dtype=bool)
    out = np.zeros((n, length), dtype=np.int64)
    team = np.zeros((n, length), dtype=np.int8)
    for position in range(0, length, 2):
        a_first = rng.random(n) < 0.5
        for step in range(min(2, length - position)):
            side = np.where(a_first == (step == 0), 0, 1).astype(np.int8)
            ranking = np.where(side[:, None] == 0, rank_a, rank_b)
            free = ~np.take_along_axis(taken, ranking, axis=1)
            pick = ranking[rows, np.argmax(free, axis=1)]
            taken[rows, pick] = True
            out[:, position + step] = pick
            team[:, position + step] = side
    return out, team
