"""`evald top`'s interleaving lines: the preference of each pair of teams since the start and
the test's verdict, read from the exported ``evald_interleaving_*`` series (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from evald.interleaving.report import NO_BAND, NONE_NOW, NONE_YET, band_favours

LabelKey = tuple[tuple[str, str], ...]

#: the series read (beside what model.READ lists)
READ = frozenset(
    {
        "evald_interleaving_preference",
        "evald_interleaving_lower",
        "evald_interleaving_upper",
        "evald_interleaving_verdict",
    }
)
_PAIR = frozenset({"team_a", "team_b"})


@dataclass(frozen=True)
class Preference:
    """One (segment, pair): the preference of team_a over team_b and its always-valid band
    (NaN before ``interleaving.min_n`` compared lists), and the decided winner (None: not yet)."""

    segment: str
    team_a: str
    team_b: str
    preference: float
    lower: float
    upper: float
    winner: str | None


def preferences(series: Mapping[str, Mapping[LabelKey, float]]) -> list[Preference]:
    """Every exported pair, by segment then pair."""
    out = []
    for key, value in sorted(series.get("evald_interleaving_preference", {}).items()):
        labels = dict(key)
        segment = " ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in _PAIR)
        a, b = labels.get("team_a", "?"), labels.get("team_b", "?")
        verdict = series.get("evald_interleaving_verdict", {}).get(key, 0.0)
        out.append(
            Preference(
                segment,
                a,
                b,
                value,
                series.get("evald_interleaving_lower", {}).get(key, math.nan),
                series.get("evald_interleaving_upper", {}).get(key, math.nan),
                a if verdict > 0 else b if verdict < 0 else None,
            )
        )
    return out


def parts(p: Preference) -> tuple[str, list[str]]:
    """``interleaving surface=web:`` and ``A vs B +0.120±0.041 A beats B``: the line's segment
    and what it says of the pair, apart, so that a line too long for the terminal wraps between
    them rather than losing the verdict. ``beats`` only for the test's winner while the printed
    band still excludes 0 for it: before the test decides the pair reads ``no difference shown
    yet``; a verdict whose band since the start has come back to 0 (the test keeps its
    decision) reads ``B won`` and a second item, ``no difference shown now``, and one the band
    contradicts (the rankers changed after the test stopped) ``B won`` and ``reversed since: A
    ahead``."""
    head = f"interleaving {p.segment}:"
    body = f"{p.team_a} vs {p.team_b} {p.preference:+.3f}"
    if not math.isfinite(p.lower):
        return head, [f"{body}, {NO_BAND}"]
    body += f"±{(p.upper - p.lower) / 2:.3f}"
    if p.winner is None:
        return head, [f"{body} {NONE_YET}"]
    favoured = band_favours(p.team_a, p.team_b, p.lower, p.upper)
    if favoured == p.winner:
        loser = p.team_b if p.winner == p.team_a else p.team_a
        return head, [f"{body} {p.winner} beats {loser}"]
    now = NONE_NOW if favoured is None else f"reversed since: {favoured} ahead"
    return head, [f"{body} {p.winner} won", now]
