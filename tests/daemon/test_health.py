"""/readyz and a session that owns no partition: ready only as a standby, else it rejoins."""

from __future__ import annotations

from settable_clock import SettableClock

from evald.daemon.health import TWIN_WINDOW_S, Health
from evald.daemon.stats import DaemonStats


def joined(clock: SettableClock) -> Health:
    health = Health(DaemonStats(), clock, stall_timeout_s=60.0)
    health.broker_ok = health.joined = True
    return health


def test_joined_with_no_partition_is_not_ready() -> None:
    health = joined(SettableClock())
    assert health.ready(connected=True, waiting=[], owned=0) == (
        False,
        "joined the group with no partition assigned",
    )
    assert health.ready(connected=True, waiting=[], owned=2) == (True, "ok")


def test_more_members_than_partitions_makes_a_ready_standby_until_it_owns_one() -> None:
    clock = SettableClock()
    health = joined(clock)
    assert health.unassigned_for(0) == 0.0
    clock.now += 7.0
    assert health.unassigned_for(0) == 7.0
    assert health.judge_unassigned(7.0, members=3, partitions=2) is None
    assert health.ready(connected=True, waiting=[], owned=0) == (True, "ok")
    assert health.unassigned_for(0) == 0.0  # judged again one more timeout later
    clock.now += 1.0
    assert health.unassigned_for(3) == 0.0  # it owns partitions: no longer a standby
    assert not health.standby


def test_owning_none_while_the_group_has_partitions_to_spare_means_rejoin() -> None:
    clock = SettableClock()
    health = joined(clock)
    health.unassigned_for(0)
    clock.now += 6.5
    idle = health.unassigned_for(0)
    why = health.judge_unassigned(idle, members=1, partitions=3)
    assert why == (
        "no partition assigned for 6s although the group has 1 member(s) for 3 partition(s): "
        "rejoining"
    )
    assert health.ready(connected=True, waiting=[], owned=0)[0] is False


def test_the_unassigned_time_counts_only_while_joined() -> None:
    clock = SettableClock()
    health = joined(clock)
    health.unassigned_for(0)
    clock.now += 5.0
    health.reset_session()
    assert health.unassigned_for(0) == 0.0 and not health.joined


def test_fences_are_counted_in_a_row_until_a_commit_however_far_apart() -> None:
    """A twin fences at every session, but a fence cycle (rejoin, restore, backoff) can take
    minutes: counted in a time window, three fences were never seen together. A takeover or
    a zombie fences once, and the next session commits."""
    clock = SettableClock()
    health = Health(DaemonStats(), clock, stall_timeout_s=60.0)

    def fenced(commits: int) -> int:
        clock.now += TWIN_WINDOW_S + 1  # farther apart than the window counts
        return health.fenced(commits=commits)

    assert [fenced(5) for _ in range(3)] == [1, 2, 3]
    assert fenced(6) == 1  # a commit came between: counted afresh
    assert fenced(6) == 2


def test_fences_close_together_are_a_twin_even_with_commits_between() -> None:
    """Under steady traffic each twin's session may commit once before the other fences it:
    counted by commits alone, the count went back to 1 at every fence and the twin was never
    named. Three fences within TWIN_WINDOW_S are; a takeover now and then is not."""
    clock = SettableClock()
    health = Health(DaemonStats(), clock, stall_timeout_s=60.0)
    counts = []
    for commits in (5, 6, 7):
        counts.append(health.fenced(commits=commits))
        clock.now += 100.0
    assert counts == [1, 2, 3]
    apart = Health(DaemonStats(), clock, stall_timeout_s=60.0)
    spaced = []
    for commits in (5, 6, 7):
        spaced.append(apart.fenced(commits=commits))
        clock.now += TWIN_WINDOW_S + 1
    assert spaced == [1, 1, 1]


def test_the_error_naming_a_twin_is_logged_at_most_every_five_minutes() -> None:
    clock = SettableClock()
    health = Health(DaemonStats(), clock, stall_timeout_s=60.0)
    assert health.twin_due(clock())
    clock.now += 299.0
    assert not health.twin_due(clock())
    clock.now += 1.0
    assert health.twin_due(clock())
