"""The preference test's verdict in words: a team beats the other only for the test's decision
and while the printed band agrees; when the rankers change after it the verdict is kept and
the views say that the band since the start holds 0 again or has turned to the other team."""

from __future__ import annotations

from typing import Any

import pytest

from evald.demo.live import interleaving_lines
from evald.interleaving.fold import PreferenceState, Settings, fold_window
from evald.interleaving.report import band_favours, record, verdict
from evald.interleaving.windows import PartitionCredit
from evald.top.interleaving import Preference, parts

CELL = (("web",), "A", "B")
SETTINGS = Settings(alpha=0.05, tuning_n=5000.0, min_n=100)


def _fold(plan: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """The record after each look of windows of (wins of A, wins of B, ties), list level."""
    state, out = PreferenceState(), []
    for look, (a, b, t) in enumerate(plan):
        d = [1] * a + [-1] * b + [0] * t
        credit = PartitionCredit(60_000, 0)
        n = len(d)
        credit.observe(
            [0] * n, [CELL] * n, [i % 2 == 0 for i in range(n)], d, [True] * n, [False] * n, None
        )
        state = fold_window(state, (look + 1) * 60_000, credit.windows[0], SETTINGS)
        out.append(record(state, CELL, ["surface"], SETTINGS))
    return out


def _top(r: dict[str, Any]) -> list[str]:
    p = Preference("surface=web", "A", "B", r["preference"], r["lower"], r["upper"], r["winner"])
    return parts(p)[1]


def test_a_verdict_the_band_since_reverses_is_kept_and_the_reversal_said() -> None:
    # B wins clearly for three looks (the test decides for B), then A wins for long enough
    # that the band since the start excludes 0 on A's side
    looks = _fold([(100, 300, 100)] * 3 + [(400, 50, 50)] * 6)
    decided = next(r for r in looks if r["winner"] is not None)
    assert decided["winner"] == "B" and decided["upper"] < 0
    last = looks[-1]
    assert last["winner"] == "B" and last["lower"] > 0  # the band flipped sign, verdict kept
    assert band_favours("A", "B", last["lower"], last["upper"]) == "A"
    assert verdict(last).endswith("; reversed since: the band now favours A")
    assert verdict(last).startswith("B won (decided at 1970-01-01T00:01:00")
    demo = interleaving_lines([last])
    assert demo[1].startswith("  web    +0.") and " ▼  B won at 00:01:00 (" in demo[1]
    assert demo[2] == "  web    reversed since: the band now favours A"
    assert _top(last)[0].endswith(" B won") and _top(last)[1] == "reversed since: A ahead"
    # while the band agrees with the verdict nothing more is said; once it holds 0 again,
    # that no difference is shown now (B beats A beside a band across 0 claimed too much)
    for r in looks:
        if r["winner"] is not None and r["upper"] < 0:
            assert verdict(r).startswith("B beats A") and len(interleaving_lines([r])) == 2
            assert _top(r) == [_top(r)[0]] and _top(r)[0].endswith("B beats A")
        elif r["winner"] is not None and r["lower"] <= 0:
            assert "beats" not in verdict(r) and "no difference shown now" in verdict(r)
            assert interleaving_lines([r])[2].endswith(
                "no difference shown now: the band holds 0 again"
            )
            assert _top(r)[1] == "no difference shown now"
    assert any(r["winner"] and r["lower"] <= 0 <= r["upper"] for r in looks)  # the band held 0


def test_the_band_favours_a_team_only_when_it_excludes_0() -> None:
    assert band_favours("A", "B", 0.1, 0.2) == "A"
    assert band_favours("A", "B", -0.2, -0.1) == "B"
    assert band_favours("A", "B", -0.2, 0.1) is None
    assert band_favours("A", "B", 0.0, 0.1) is None
    assert band_favours("A", "B", None, None) is None
    assert band_favours("A", "B", float("nan"), float("nan")) is None


def _record(lower: float, upper: float, winner: str | None) -> dict[str, Any]:
    return {
        "segment": {"surface": "web"},
        "team_a": "A",
        "team_b": "B",
        "preference": (lower + upper) / 2,
        "lower": lower,
        "upper": upper,
        "winner": winner,
        "decided_at": None if winner is None else "1970-01-01T00:05:00.000Z",
        "compared": 1234,
    }


def _words(r: dict[str, Any]) -> tuple[str, str, str]:
    """What each view says of the record: replay's verdict, the demo's lines, top's items."""
    return verdict(r), "\n".join(interleaving_lines([r])[1:]), " · ".join(_top(r))


@pytest.mark.parametrize(
    ("lower", "upper", "winner", "said"),
    [
        (0.02, 0.1, "A", "A beats B"),
        (-0.1, -0.02, "B", "B beats A"),
        (-0.088, 0.048, None, "no difference shown yet"),  # -0.020±0.068
    ],
)
def test_a_team_is_said_ahead_only_when_the_test_decided_for_it(
    lower: float, upper: float, winner: str | None, said: str
) -> None:
    """The words follow the test: ``beats`` (top, replay) and ``won at`` (the demo) for the
    team the test decided for, with the band printed beside them on its side; an undecided
    pair whose band holds 0 says no difference is shown yet, naming no team."""
    replay, demo, top = _words(_record(lower, upper, winner))
    if winner is None:
        assert replay == "no difference shown yet (the band holds 0)"
        assert demo.endswith("]  no difference shown yet (1,234 lists)") and "\n" not in demo
        assert top == "A vs B -0.020±0.068 no difference shown yet"
        for text in (replay, demo, top):
            assert not any(word in text for word in ("beats", "won", "ahead", "favours"))
    else:
        assert replay == f"{said} (decided at 1970-01-01T00:05:00.000Z)"
        assert demo.endswith(f"  {winner} won at 00:05:00 (1,234 lists)") and "\n" not in demo
        assert top.endswith(f"±0.040 {said}")


def test_a_verdict_whose_band_holds_0_again_says_no_difference_now() -> None:
    """The test decided for B and keeps its decision; the band since the start has come back
    across 0 (-0.020±0.068): no view says B beats A beside it (what top printed), each says
    B won then and that no difference is shown now."""
    replay, demo, top = _words(_record(-0.088, 0.048, "B"))
    assert replay == (
        "B won (decided at 1970-01-01T00:05:00.000Z); no difference shown now (the band holds 0)"
    )
    assert demo.split("\n")[0].endswith("[-0.088, +0.048] ▼  B won at 00:05:00 (1,234 lists)")
    assert demo.split("\n")[1] == "  web    no difference shown now: the band holds 0 again"
    assert top == "A vs B -0.020±0.068 B won · no difference shown now"
    assert "beats" not in replay + demo + top
