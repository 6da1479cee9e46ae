"""What a restore refuses, as pure rules (evald.daemon.main.restore_checks); the restore protocol
around them is in test_restore.py."""

from __future__ import annotations

import pytest

from evald.config import ComparisonConfig
from evald.daemon.main.restore_checks import (
    Refusal,
    credit_lost,
    lost_comparisons,
    statistics_lost,
)

WIDTH = 300_000


def comparison(name: str, start: int) -> ComparisonConfig:
    return ComparisonConfig(name=name, label="arm", control="c", treatments=["t"], start=start)


@pytest.mark.parametrize(
    ("start", "lost"),
    [
        (0, True),  # folds every window: the ones up to the mark are gone
        (10 * WIDTH - WIDTH, True),  # its first window ends at the mark
        (10 * WIDTH - WIDTH + 1, False),  # its first window starts at the mark
        (10 * WIDTH, False),
        (20 * WIDTH, False),
    ],
)
def test_a_comparison_needs_the_lost_shares_only_if_a_window_it_folds_ended_by_the_mark(
    start: int, lost: bool
) -> None:
    got = lost_comparisons([comparison("ab", start)], WIDTH, 10 * WIDTH)
    assert got == (["ab"] if lost else [])
    assert lost_comparisons([comparison("ab", 0)], WIDTH, None) == []  # nothing published


def test_lost_shares_are_refused_at_the_latest_mark_of_the_partitions_restored() -> None:
    comparisons = [comparison("ab", 0), comparison("later", 30 * WIDTH)]
    with pytest.raises(Refusal) as caught:
        statistics_lost("s", {0: 10 * WIDTH, 3: 12 * WIDTH}, comparisons, WIDTH)
    message = str(caught.value)
    assert "the comparisons ['ab'] would silently miss" in message
    assert "set their start to 1970-01-01T01:00:00.000Z or later" in message  # 12 windows
    warning = statistics_lost("s", {0: 10 * WIDTH}, [comparison("later", 30 * WIDTH)], WIDTH)
    assert "no configured comparison folds those windows" in warning


@pytest.mark.parametrize(
    ("start", "lost"),
    [(0, True), (9 * WIDTH, True), (9 * WIDTH + 1, False), (12 * WIDTH, False)],
)
def test_lost_credit_shares_are_refused_while_the_interleaving_test_folds_their_windows(
    start: int, lost: bool
) -> None:
    """The credit marks of partitions 0 and 3; the test folds windows from ``start`` on."""
    marks = {0: 10 * WIDTH, 3: 8 * WIDTH}
    if not lost:
        warning = credit_lost("s", marks, start, WIDTH)
        assert "the interleaving test starts after those windows" in warning
        return
    with pytest.raises(Refusal) as caught:
        credit_lost("s", marks, start, WIDTH)
    message = str(caught.value)
    assert "the interleaving test would silently miss those windows' lists" in message
    assert "(0 up to 1970-01-01T00:50:00.000Z, 3 up to 1970-01-01T00:40:00.000Z)" in message
    assert "set interleaving.start to 1970-01-01T00:50:00.000Z or later" in message
