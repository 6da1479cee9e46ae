"""The interleaving test as series rows: pure functions of replay's records
(``report.record``), read by the exposition's series table (``exposition/series.py``) and so by
``evald top``.

Every row is labelled by the segment label values (in the configured key order), ``team_a`` and
``team_b`` (the pair, a before b by name). A value that is not known yet (no band before
``interleaving.min_n`` compared lists) is left out, so an alert on it cannot fire on low
traffic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Row = tuple[tuple[str, ...], float]

#: part -> (series name, help): one gauge per (segment, pair)
PARTS: dict[str, tuple[str, str]] = {
    "preference": (
        "evald_interleaving_preference",
        "Interleaving preference since the start, (wins_a - wins_b) / compared lists, in "
        "[-1, 1]: positive when users prefer team_a.",
    ),
    "lower": (
        "evald_interleaving_lower",
        "Lower bound of the always-valid confidence sequence on the preference (at "
        "evald_interleaving_alpha); above 0: team_a beats team_b. Absent below "
        "interleaving.min_n compared lists, lists worth too few users or no variance.",
    ),
    "upper": (
        "evald_interleaving_upper",
        "Upper bound of the always-valid confidence sequence on the preference; below 0: "
        "team_b beats team_a. Absent below interleaving.min_n compared lists, lists worth too "
        "few users or no variance.",
    ),
    "p_value": (
        "evald_interleaving_p_value",
        "Always-valid p-value of no preference (running minimum of 1/e-value).",
    ),
    "alpha": (
        "evald_interleaving_alpha",
        "Level each pair's sequence runs at: interleaving.alpha / family size (segments x pairs).",
    ),
    "srm_p_value": (
        "evald_interleaving_srm_p_value",
        "Always-valid p-value of the guard on the draft's coin (team_a leads half the lists), "
        "family-wise; the preference is not trusted while it is below interleaving.srm_alpha.",
    ),
    "compared": (
        "evald_interleaving_compared_lists",
        "Interleaved lists showing both teams in which either earned credit, since the start.",
    ),
    "ties": ("evald_interleaving_ties", "Compared lists where both teams earned equal credit."),
    "verdict": (
        "evald_interleaving_verdict",
        "The test's decision: 1 once team_a won, -1 once team_b won (kept from the first look "
        "whose band excluded 0), 0 before.",
    ),
}

#: the wins of each team of a pair, labelled ``team`` beside the pair
WINS = (
    "evald_interleaving_wins",
    "Compared lists the team (label team, one of team_a, team_b) won, since the start.",
)


def _labels(record: dict[str, Any], keys: Sequence[str]) -> tuple[str, ...]:
    segment = record["segment"]
    return (*(segment[key] for key in keys), record["team_a"], record["team_b"])


def _value(record: dict[str, Any], part: str) -> float | None:
    if part == "verdict":
        winner = record["winner"]
        return 0.0 if winner is None else 1.0 if winner == record["team_a"] else -1.0
    value = record[part]
    return None if value is None else float(value)


def part_rows(part: str) -> Callable[[tuple[Sequence[str], list[dict[str, Any]]]], Iterable[Row]]:
    """Rows of one ``PARTS`` series from (label keys, records)."""

    def rows(state: tuple[Sequence[str], list[dict[str, Any]]]) -> Iterable[Row]:
        keys, records = state
        for record in records:
            value = _value(record, part)
            if value is not None and math.isfinite(value):
                yield _labels(record, keys), value

    return rows


def win_rows(state: tuple[Sequence[str], list[dict[str, Any]]]) -> Iterable[Row]:
    """Rows of ``evald_interleaving_wins``: one per team of each pair."""
    keys, records = state
    for record in records:
        labels = _labels(record, keys)
        for team, wins in record["wins"].items():
            yield (*labels, team), float(wins)
