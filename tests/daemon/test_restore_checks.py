"""What a restore refuses, as pure rules (evald.daemon.main.restore_checks); the restore protocol
around them is in test_restore.py."""

from __future__ import annotations

import pytest

from evald.config import ComparisonConfig
from evald.daemon.main.restore_checks import Refusal, lost_comparisons, statistics_lost

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
