"""What /readyz and /healthz say about the loop: readiness, the stall signal, the lag probe,
and the counts behind naming a second process with this instance's ids and a bootstrap
address that is another service (reach.py)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from kafka import TopicPartition
from kafka.errors import KafkaError

from evald.daemon.main.inputs import Inputs
from evald.daemon.main.merge import KINDS
from evald.daemon.reach import Misdirected
from evald.daemon.stats import DaemonStats

__all__ = ["TWIN_FENCES", "TWIN_LOG_S", "TWIN_WINDOW_S", "EndOffsets", "Health"]

log = logging.getLogger("evald.daemon")

#: sessions fenced by another holder of this instance's ids that mean another process runs
#: with them (Health.fenced): in a row with no commit between them (a twin's fence cycle,
#: rejoin, restore and backoff, may take minutes), or within TWIN_WINDOW_S however many
#: commits came between (under steady traffic each twin may commit once before it is fenced)
TWIN_FENCES = 3
TWIN_WINDOW_S = 600.0
#: the ERROR naming a twin is logged at most this often (/readyz says it at every fence)
TWIN_LOG_S = 300.0


class EndOffsets(Protocol):
    """What the lag probe reads of the group consumer (kafka-python's ``KafkaConsumer``): the
    high watermark its latest fetch of a partition reported, and the broker's end offsets
    (a ListOffsets round trip, raising ``KafkaError`` when the broker does not answer)."""

    def highwater(self, tp: TopicPartition) -> int | None: ...

    def end_offsets(
        self, tps: list[TopicPartition], timeout_ms: int
    ) -> dict[TopicPartition, int]: ...


class Health:
    """Readiness of one daemon, fed by the session (broker, group, partitions) and the probe."""

    def __init__(
        self, stats: DaemonStats, clock: Callable[[], float], stall_timeout_s: float
    ) -> None:
        self._stats = stats
        self._clock = clock
        self._stall_timeout_s = stall_timeout_s
        #: last time records were fed or the lag was zero (the stall signal of /readyz)
        self.progress_at = clock()
        #: when the poll cycle last probed (kept across sessions)
        self.last_probe = 0.0
        self.broker_ok = False
        self.joined = False
        #: why the last session failed, shown on /readyz until a new session has joined
        self.retrying: str | None = None
        self.started_at = clock()
        self.ready_at: float | None = None
        #: the group has more members than input partitions: owning none is by design
        self.standby = False
        #: since when the joined session owns no partition (None: it owns some, or not joined)
        self._unassigned_since: float | None = None
        #: sessions ended in a row fenced by a producer with this instance's transactional id
        #: (or a member with its static instance id), and the commit count at the last one
        self._fences = 0
        self._commits_at_fence = 0
        #: when the sessions of the last TWIN_WINDOW_S were fenced so
        self._fence_times: deque[float] = deque()
        #: when the ERROR naming a twin was last logged
        self._twin_logged: float | None = None
        #: failed bootstraps in a row on which every address answered as another service
        self.misdirected = Misdirected()

    def ready(self, *, connected: bool, waiting: list[int], owned: int) -> tuple[bool, str]:
        """/readyz: joined with partitions (``owned``) or as a standby, every assigned
        partition restored (``waiting``: those that are not) and the broker answering."""
        if self.retrying is not None:
            return False, self.retrying
        if not self.broker_ok:
            return False, "broker not reachable (retrying)"
        if not connected:
            return False, "not connected"
        if not self.joined:
            return False, "joining the consumer group"
        if not owned and not self.standby:
            return False, "joined the group with no partition assigned"
        if waiting:
            return False, f"restoring partitions {waiting}"
        stalled = self.stalled()
        if stalled:
            return False, stalled
        return True, "ok"

    def stalled(self) -> str | None:
        """Why the loop counts as stalled: records are waiting (lag) but none was fed for
        ``daemon.stall_timeout_s``; None while it makes progress or has nothing to do."""
        lag = sum(self._stats.lag.values())
        idle = self._clock() - self.progress_at
        if lag > 0 and idle > self._stall_timeout_s:
            return f"stalled: {lag} records of lag and nothing consumed for {idle:.0f}s"
        return None

    def unassigned_for(self, owned: int) -> float:
        """Seconds the joined session has owned no partition (0 while it owns some or has not
        joined); owning a partition ends a standby."""
        if owned or not self.joined:
            self._unassigned_since = None
            if owned:
                self.standby = False
            return 0.0
        now = self._clock()
        if self._unassigned_since is None:
            self._unassigned_since = now
        return now - self._unassigned_since

    def judge_unassigned(self, idle_s: float, members: int, partitions: int) -> str | None:
        """After ``idle_s`` without a partition, the group (``members`` for ``partitions``):
        None if this session is a standby (more members than partitions: someone has to own
        none), else why it must rejoin. Either way the next judgement comes one more
        ``idle_s`` later."""
        self._unassigned_since = self._clock()
        if members > partitions:
            if not self.standby:
                log.info(
                    "standby: the group has %d members for %d partitions, none assigned here",
                    members,
                    partitions,
                )
            self.standby = True
            return None
        self.standby = False
        return (
            f"no partition assigned for {idle_s:.0f}s although the group has {members} "
            f"member(s) for {partitions} partition(s): rejoining"
        )

    def session_started(self, now: float) -> None:
        """A session is connected and about to poll: an outage before it is not a stall."""
        self.broker_ok = True
        self.progress_at = now

    def progressed(self, now: float) -> None:
        """Records were fed at ``now``."""
        self.progress_at = now

    def probe_due(self, now: float, interval_s: float) -> bool:
        """Whether the poll cycle probes now (every ``interval_s``)."""
        return now - self.last_probe >= interval_s

    def probed(self, now: float) -> None:
        """The poll cycle probed at ``now``."""
        self.last_probe = now

    def joined_group(self) -> None:
        """The session was assigned partitions (maybe none): it joined the group."""
        self.joined = True
        self.retrying = None

    def retry(self, why: str) -> None:
        """A session failed (``why``); the next one is tried after a backoff."""
        self.retrying = why

    def fenced(self, commits: int) -> int:
        """A session ended fenced by another holder of this instance's ids, ``commits``
        transactions committed so far: how many sessions were, in a row with no commit
        between them or within TWIN_WINDOW_S (the larger). A takeover or a zombie fences once,
        and the next session commits; two live processes with the same ids fence each other
        at every session (each one's new producer fences the other's)."""
        if commits != self._commits_at_fence:
            self._fences, self._commits_at_fence = 0, commits
        self._fences += 1
        now = self._clock()
        self._fence_times.append(now)
        while now - self._fence_times[0] > TWIN_WINDOW_S:
            self._fence_times.popleft()
        return max(self._fences, len(self._fence_times))

    def twin_due(self, now: float) -> bool:
        """Whether to log the ERROR naming a twin now: at most every TWIN_LOG_S."""
        if self._twin_logged is not None and now - self._twin_logged < TWIN_LOG_S:
            return False
        self._twin_logged = now
        return True

    def broker_lost(self) -> None:
        """The session's clients are being closed: the broker counts as away."""
        self.broker_ok = False

    def reset_session(self) -> None:
        """A session ended: the next one joins afresh."""
        self.joined = False
        self.standby = False
        self._unassigned_since = None

    def set_ready(self, ready: bool) -> None:
        """Publish readiness (``evald_ready``); the first time, log how long start-up took."""
        if ready and self.ready_at is None:
            self.ready_at = self._clock()
            log.info("ready %.2fs after start", self.ready_at - self.started_at)
        self._stats.ready = ready

    def probe(self, consumer: EndOffsets, inputs: Inputs) -> bool:
        """Refresh consumer lag; doubles as the broker reachability check behind /readyz.
        Returns whether the broker answered.

        While fetches keep returning records, the broker is evidently answering and every
        fetch response carries the partition's high watermark, so the lag is taken from those
        and the loop skips a blocking ListOffsets round trip (about 3% of the drain time in
        kafka_bench). When nothing was fetched since the last probe, the broker is asked.
        A partition with no fetch response since it was assigned has no lag series yet: some
        brokers (tansu) answer ListOffsets behind the last batch, so that answer alone could
        report a restored partition that has fetched nothing as caught up.
        """
        parts = inputs.parts
        tps = [inputs.tp(kind, p) for p, s in parts.items() if s.restored for kind in KINDS]
        fetched = inputs.fetched()
        highs = {tp: consumer.highwater(tp) for tp in tps}
        try:
            if fetched and None not in highs.values():
                ends = {tp: high for tp, high in highs.items() if high is not None}
            else:
                ends = consumer.end_offsets(tps, timeout_ms=2_000) if tps else {}
        except KafkaError as exc:
            self.broker_ok = False
            self.set_ready(False)
            log.warning("broker not answering: %s", exc)
            return False
        self.broker_ok = True
        lag = {}
        for tp, end in ends.items():
            part = parts.get(tp.partition)
            high = highs.get(tp)
            if part is not None and part.restored and high is not None:
                # the high watermark of the latest fetch is exact; ListOffsets may lag
                lag[(tp.topic, tp.partition)] = max(
                    0, max(end, high) - part.fed_next[inputs.kind(tp.topic)]
                )
        self._stats.set_lag(lag)
        if not any(lag.values()):
            self.progress_at = self._clock()  # nothing to consume is not a stall
        return True
