"""What the preference test says, as records: ``evald replay``'s ``"interleaving"`` key and its
text summary, and the rows the exposition and ``evald top`` read (pure functions of the fold).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from evald.events import format_timestamp
from evald.interleaving.fold import PairState, PreferenceState, Settings, window_interval
from evald.interleaving.windows import Cell
from evald.stats import Z95

#: compared lists in a window before its (one-look) interval is given
WINDOW_MIN_N = 30


def _num(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _time(ms: int | None) -> str | None:
    return None if ms is None else format_timestamp(ms)


def window_view(pair: PairState, last_end: int | None) -> dict[str, Any] | None:
    """The cell's last folded window when it is the latest window folded: its preference and
    95% interval clustered by user (one look at one window, not always valid)."""
    sums = pair.window
    if sums is None or pair.window_end is None or pair.window_end != last_end:
        return None
    delta, low, high, clustered = window_interval(sums, Z95)
    if sums.compared < WINDOW_MIN_N:
        low = high = math.nan
    return {
        "end": _time(pair.window_end),
        "compared": sums.compared,
        "preference": _num(delta),
        "lower": _num(low),
        "upper": _num(high),
        "clustered": clustered,
    }


def record(
    state: PreferenceState, cell: Cell, label_keys: Sequence[str], settings: Settings
) -> dict[str, Any]:
    """One entry of ``"interleaving"``: the pair's wins, ties, preference since the start with
    its always-valid band and p-value, the sample-ratio guard, and the winner (the team once
    the test decided, else null)."""
    segment, a, b = cell
    pair = state.pairs[cell]
    total, bound = pair.total, pair.bound
    return {
        "segment": dict(zip(label_keys, segment, strict=True)),
        "team_a": a,
        "team_b": b,
        "lists": total.lists,
        "compared": total.compared,
        "wins": {a: total.wins_a, b: total.wins_b},
        "ties": total.ties,
        "preference": _num(total.preference),
        "lower": _num(bound.low),
        "upper": _num(bound.high),
        "p_value": pair.p_value,
        "alpha": state.alpha(settings),
        "clustered": bound.clustered,
        "srm_p_value": state.srm_p_value(cell),
        "winner": pair.winner,
        "decided_at": _time(pair.decided_end),
        "looks": pair.looks,
        "window": window_view(pair, state.last_end),
    }


def records(
    state: PreferenceState | None, label_keys: Sequence[str], settings: Settings
) -> list[dict[str, Any]]:
    """Every cell's record, by segment then pair."""
    if state is None:
        return []
    return [record(state, cell, label_keys, settings) for cell in sorted(state.pairs)]


#: what the views say of a pair while its band since the start holds 0: before the test
#: decides, and after it decided when the band has come back to 0 (the rankers changed, or
#: the estimate moved within the test's error): the decision stands, a difference now is not
#: shown
NONE_YET = "no difference shown yet"
NONE_NOW = "no difference shown now"
#: why a band is absent: too few lists (``min_n``), lists worth too few users (a few users
#: holding them: docs/statistics.md §3, "Heavy users"), or no variance yet
NO_BAND = "no band yet (too few lists or users, or no variance)"


def band_favours(team_a: str, team_b: str, lower: float | None, upper: float | None) -> str | None:
    """The team the band since the start excludes 0 for; None while it holds 0 (or there is
    none yet). A view says a team beats the other only for the decided winner and only while
    this is it: the band is what the view prints beside the words. The test stops at its
    verdict and keeps it, but the rankers may change after it (the demo's regression): the
    band then holds 0 again, or excludes it on the other side, and a view showing both says
    so rather than a band and a verdict that disagree."""
    if lower is None or upper is None:
        return None
    return team_a if lower > 0 else team_b if upper < 0 else None  # NaN: neither


def verdict(r: dict[str, Any]) -> str:
    """The record's verdict in words: who won and when, and whether the band since the start
    still shows it (``beats``), holds 0 again or has turned to the other team since; or what
    it is waiting for."""
    a, b = r["team_a"], r["team_b"]
    winner = r["winner"]
    if winner is not None:
        decided = f"(decided at {r['decided_at']})"
        favoured = band_favours(a, b, r["lower"], r["upper"])
        if favoured == winner:
            return f"{winner} beats {b if winner == a else a} {decided}"
        if favoured is None:
            return f"{winner} won {decided}; {NONE_NOW} (the band holds 0)"
        return f"{winner} won {decided}; reversed since: the band now favours {favoured}"
    if r["lower"] is None:
        return NO_BAND
    return f"{NONE_YET} (the band holds 0)"


def lines(
    recs: list[dict[str, Any]], settings: Settings, credit: str, outcomes: dict[str, int]
) -> list[str]:
    """The text summary's interleaving lines: what happened to the interleaved lists, then
    each pair's wins, preference, band, p-value, draft guard and verdict."""
    counts = ", ".join(f"{k} {v:,}" for k, v in outcomes.items() if v)
    out = [
        f"interleaved lists      {sum(outcomes.values()):,} ({counts})",
        f"interleaving (credit by {credit}; always-valid {1 - settings.alpha:.0%} confidence "
        "sequence on the preference Δ = (wins_a − wins_b)/compared, family-wise):",
    ]
    for r in recs:
        labels = " ".join(f"{k}={v}" for k, v in r["segment"].items())
        a, b = r["team_a"], r["team_b"]
        band = "" if r["lower"] is None else f" [{r['lower']:+.4f}, {r['upper']:+.4f}]"
        pref = "n/a" if r["preference"] is None else f"{r['preference']:+.4f}"
        out.append(f"  {a} vs {b}  {labels}")
        out.append(
            f"    wins {a} {r['wins'][a]:,}, {b} {r['wins'][b]:,}, ties {r['ties']:,} "
            f"(of {r['lists']:,} lists with both teams)"
        )
        out.append(
            f"    preference {pref}{band}  p {r['p_value']:.3g}  "
            f"draft coin p {r['srm_p_value']:.3g}"
        )
        out.append(f"    verdict: {verdict(r)}")
    return out
