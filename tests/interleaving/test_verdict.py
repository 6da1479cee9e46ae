"""The preference test's verdict in words, when the rankers change after it: the verdict is
kept and the views say that the band since the start has turned to the other team."""

from __future__ import annotations

from typing import Any

from evald.demo.live import interleaving_lines
from evald.interleaving.fold import PreferenceState, Settings, fold_window
from evald.interleaving.report import record, reversed_to, verdict
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
    assert reversed_to("B", "A", "B", last["lower"], last["upper"]) == "A"
    assert verdict(last).endswith("; reversed since: the band now favours A")
    assert verdict(last).startswith("B beats A (decided at 1970-01-01T00:01:00")
    demo = interleaving_lines([last])
    assert demo[1].startswith("  web    +0.") and " ▼  B won at 00:01:00 (" in demo[1]
    assert demo[2] == "  web    reversed since: the band now favours A"
    assert _top(last)[0].endswith(" B won") and _top(last)[1] == "reversed since: A ahead"
    # while the band still agrees with the verdict, or holds 0 again, nothing more is said
    for r in looks:
        if r["winner"] is not None and r["lower"] <= 0:
            assert "reversed" not in verdict(r) and len(interleaving_lines([r])) == 2
            assert len(_top(r)) == 1 and _top(r)[0].endswith("B beats A")
    assert any(r["winner"] and r["lower"] <= 0 <= r["upper"] for r in looks)  # the band held 0


def test_no_reversal_without_a_verdict_or_a_band() -> None:
    assert reversed_to(None, "A", "B", 0.1, 0.2) is None
    assert reversed_to("A", "A", "B", 0.1, 0.2) is None
    assert reversed_to("A", "A", "B", -0.2, 0.1) is None
    assert reversed_to("A", "A", "B", None, None) is None
    assert reversed_to("A", "A", "B", float("nan"), float("nan")) is None
    assert reversed_to("B", "A", "B", 0.1, 0.2) == "A"
    assert reversed_to("A", "A", "B", -0.2, -0.1) == "B"
