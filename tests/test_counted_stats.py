"""The engine's counters as flat counts: the form a checkpoint carries them in, and back."""

from __future__ import annotations

from evald.stats import MAX_SKIPPED_ACTIONS, OTHER, Stats


def counting() -> Stats:
    stats = Stats()
    stats.events[("impression", "accepted")] = 7
    stats.events[("feedback", "duplicate")] = 2
    stats.rejected["invalid_json"] = 3
    stats.unattributed["orphaned"] = 4
    stats.finalized["window"] = 6
    stats.count_skipped("page/view", 64)
    stats.abandoned = 5
    stats.watermark_outliers = 1
    return stats


def test_counted_counts_add_back_to_the_same_counters() -> None:
    stats = counting()
    again = Stats()
    again.add(stats.counted())
    assert again.counted() == stats.counted()
    assert again.skipped == {"page/view": 1}  # a slash in an action survives
    assert again.events[("feedback", "duplicate")] == 2


def test_a_key_this_version_does_not_know_is_ignored() -> None:
    stats = Stats()
    stats.add({"events/impression/accepted": 2, "events/robot/accepted": 9, "newer/thing": 1})
    assert stats.counted() == {"events/impression/accepted": 2}


def test_merged_sums_the_parts_lag_included() -> None:
    a, b = counting(), counting()
    a.observe_lag(0.2, 3)
    b.observe_lag(20.0, 1)
    total = Stats.merged([a, b])
    assert total.counted() == {key: 2 * n for key, n in a.counted().items()}
    assert total.lag_count == 4 and sum(total.lag_counts) == 4
    assert total.lag_sum == 0.2 * 3 + 20.0


def test_adding_skipped_actions_keeps_their_bound() -> None:
    stats = Stats()
    stats.add({f"skipped/a{i}": 1 for i in range(MAX_SKIPPED_ACTIONS + 5)})
    assert len(stats.skipped) == MAX_SKIPPED_ACTIONS + 1 and stats.skipped[OTHER] == 5
