"""The chaos tier on Apache Kafka (`make test-chaos`): evald killed -9 at each step of the commit
cycle and recovered by a restart or by a live instance taking over, twenty seeded random kills,
scale 1 -> 3 -> 1 while traffic flows, the broker killed -9 and restarted on its data, the broker
paused past the request timeout.

The oracle (kafka_oracle.py) in every case: the results topic read with ``read_committed`` and
no de-duplication equals one uninterrupted engine fed the same records, and the window
aggregates equal that engine's, the committed checkpoints reach the inputs' ends, no
transaction is left open, and (all but the paused broker) what a read_committed reader saw
during the faults still stands. The tests print their recovery times
(docs/performance.md §8).
"""

from __future__ import annotations

import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka_harness import Broker, CommittedReader, KafkaTools, wait_until
from kafka_instances import Instance, make_settings, names, running, settled
from kafka_oracle import (
    assert_consumed_to_the_end,
    assert_exactly_once,
    assert_matches_an_uninterrupted_run,
    assert_no_transaction_left_open,
    assert_seen_during_chaos_stands,
    assert_windows_equal,
    expected_results,
    read_windows,
    results_by_id,
    wait_killed_transactions_aborted,
)

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]


@pytest.mark.timeout(900)  # three broker restarts of 10-45 s each, more on a loaded machine
def test_broker_killed_and_restarted_on_its_data_mid_stream_is_exact(
    private_broker: Broker, unique: str, tmp_path: Path
) -> None:
    """kill -9 of the broker three times while evald works (transactions open, results in
    flight), each time restarted on the same log directories."""
    tools = KafkaTools(private_broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    chunk = 3000
    tools.produce_sim(topics["impressions"], topics["feedback"], events=chunk, seed=16)
    windows = tmp_path / "windows.jsonl"
    # small polls and commits keep a transaction open most of the time
    settings = make_settings(
        private_broker.bootstrap,
        unique,
        windows_file=str(windows),
        max_poll_records=100,
        commit_interval_ms=500,
    )
    downtimes: list[float] = []
    with running(settings) as daemon:
        reader = CommittedReader(private_broker.bootstrap, topics["results"])
        # counted before each chunk is produced: the daemon consumes a chunk while it is being
        # written, so counted after, it may already have scored all the chunk lets it close
        before = 0
        for i in range(1, 4):
            wait_until(
                lambda before=before: daemon.stats.results_produced > before,
                120,
                "results of the latest chunk of traffic",
            )
            killed_at = time.monotonic()
            private_broker.kill()
            private_broker.restart()
            wait_until(lambda: daemon.ready()[0], 120, "evald ready after the broker restart")
            downtimes.append(time.monotonic() - killed_at)
            before = daemon.stats.results_produced
            # more traffic, so the next kill lands while results flow
            tools.produce_sim(
                topics["impressions"], topics["feedback"], events=chunk, seed=16, skip=i * chunk
            )
        wait_until(lambda: settled(daemon, tools, unique), 180, "the daemon to settle")
        seen = reader.stop()
    stored = len(tools.read(topics["impressions"])) + len(tools.read(topics["feedback"]))
    assert stored == 4 * chunk, "the broker lost input records"
    expected, reference = tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(tools, topics["results"]), expected)
    assert_windows_equal(read_windows(windows), reference)
    assert_consumed_to_the_end(tools, unique)
    assert_no_transaction_left_open(tools, unique)
    during = assert_seen_during_chaos_stands(seen, expected, tools, topics["results"])
    print(
        f"broker kill -9: kill -> evald ready {', '.join(f'{d:.1f}s' for d in downtimes)}; "
        f"{during} results seen read_committed during the kills, all standing"
    )


# -- kill -9 at each step of the commit cycle (runner's test-only crash points) --------------


def crashed(inst: Instance) -> bool:
    return inst.proc.poll() is not None


def reader_on(tools: KafkaTools, topic: str, victim: Instance) -> CommittedReader:
    """A read_committed reader of ``topic`` once evald has created it (or the victim died)."""
    wait_until(lambda: tools.partitions(topic) or crashed(victim), 90, f"{topic} to be created")
    return CommittedReader(tools.bootstrap, topic)


def covered(live: list[Instance], partitions: set[int]) -> bool:
    """Every live instance ready and ``partitions`` owned among them."""
    owned: set[int] = set()
    for inst in live:
        mine = inst.owned()
        if mine is None:
            return False
        owned |= mine
    return partitions <= owned


class Recovery:
    """Kill -> ready and kill -> results flowing of one crash, measured from the moment the
    crash was seen (polled every 0.2 s): *ready* is every live instance ready with the dead
    one's partitions assigned among them; *flowing* is the concurrent read_committed reader
    seeing a result written after the crash on one of those partitions."""

    def __init__(self, tools: KafkaTools, results: str, victim: Instance) -> None:
        self.killed_at = time.monotonic()
        self.partitions = victim.assigned()
        assert self.partitions, "the victim never logged an assignment"
        # results at or past these offsets were written after the crash: the dead process
        # wrote nothing more, and its last transaction's records all lie below them
        ends = tools.high_watermarks(results)
        self.ends = {p: ends[p] for p in self.partitions}

    def ready(self, live: list[Instance], timeout: float = 150) -> float:
        wait_until(lambda: covered(live, self.partitions), timeout, "the partitions ready again")
        return time.monotonic() - self.killed_at

    def flowing(self, reader: CommittedReader, timeout: float = 150) -> float:
        seen = wait_until(
            lambda: reader.first_new(self.killed_at, self.ends),
            timeout,
            "results of the dead instance's partitions committed again",
        )
        return float(seen) - self.killed_at


#: the kill points of the commit cycle (the runner's TESTING_EVALD_CRASH_AT steps)
STEPS = ["results_sent", "offsets_sent", "commit_in_flight", "committed", "revoking", "restore"]


@pytest.mark.parametrize("recovery", ["restart", "takeover"])
@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_each_step_of_the_commit_cycle_is_exact(
    step: str,
    recovery: str,
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
) -> None:
    """The process kills itself (SIGKILL) at ``step``; the same instance id restarts, or a
    second live instance takes the partitions over. Oracle: read_committed, no dedup, equal
    to the uninterrupted run, window aggregates equal, checkpoints at the inputs' ends, no
    transaction open, and nothing a concurrent read_committed reader saw is later retracted
    or doubled."""
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 4, topics["feedback"]: 4})
    half = 4000
    kafka_tools.produce_sim(topics["impressions"], topics["feedback"], events=half, seed=20)
    heir: Instance | None = None
    if step == "restore":  # commit some, die plainly, then die while restoring
        first = instances("a")
        wait_until(lambda: first.metric("evald_results_produced_total") > 0, 90, "results")
        first.kill()
        victim = instances("a", crash_at=step)
    elif step == "revoking":  # a second member joining makes the first commit on revocation
        victim = instances("a", crash_at=step)
        wait_until(lambda: victim.metric("evald_results_produced_total") > 0, 90, "results")
        heir = instances("b")
    else:
        victim = instances("a", crash_at=step)
    reader = reader_on(kafka_tools, topics["results"], victim)
    if recovery == "takeover" and heir is None:
        heir = instances("b")
    if heir is not None:  # both members in the group before the rest of the traffic arrives
        wait_until(
            lambda: crashed(victim) or (victim.lag_zero(2) and heir.lag_zero(2)),
            120,
            "two members sharing the partitions",
        )
    kafka_tools.produce_sim(
        topics["impressions"], topics["feedback"], events=half, seed=20, skip=half
    )
    wait_until(lambda: crashed(victim), 120, f"the crash at {step}")
    assert victim.proc.returncode == -signal.SIGKILL
    assert "killing this process" in victim.log_path.read_text(errors="replace"), "not the hook"
    recovered = Recovery(kafka_tools, topics["results"], victim)
    if recovery == "restart":
        again = instances("a")
        ready = recovered.ready([again, *([heir] if heir else [])])
        flowing = recovered.flowing(reader)
        if heir is not None:  # let the restarted one in, then leave everything to the heir
            assert again.terminate() == 0
        survivor = heir or again
    else:
        assert heir is not None
        survivor = heir
        ready = recovered.ready([heir])
        flowing = recovered.flowing(reader)
    wait_until(lambda: survivor.alone(4), 180, "one instance owning everything, caught up")
    caught_up = time.monotonic() - recovered.killed_at
    assert survivor.terminate() == 0
    seen = reader.stop()
    assert_matches_an_uninterrupted_run(kafka_tools, unique, survivor.windows)
    assert_seen_during_chaos_stands(
        seen, expected_results(kafka_tools, unique), kafka_tools, topics["results"]
    )
    print(
        f"kill -9 at {step}, {recovery} (partitions {sorted(recovered.partitions)}): "
        f"kill -> ready {ready:.1f}s, -> results flowing {flowing:.1f}s, "
        f"-> caught up {caught_up:.1f}s"
    )


def test_broker_paused_past_the_request_timeout_is_exact(
    private_broker: Broker, unique: str, tmp_path: Path
) -> None:
    """SIGSTOP of the broker: connections stay open but nothing answers, until evald's requests
    time out and its session fails; SIGCONT, more traffic, and the output is exact."""
    tools = KafkaTools(private_broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=3000, seed=17)
    windows = tmp_path / "windows.jsonl"
    settings = make_settings(private_broker.bootstrap, unique, windows_file=str(windows))
    settings = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"request_timeout_ms": 7000})}
    )
    with running(settings) as daemon:
        wait_until(lambda: daemon.stats.results_produced > 0, 90, "the first results")
        private_broker.pause()
        try:
            wait_until(
                lambda: daemon.ready()[1].startswith("retrying after"),
                120,
                "the session to fail on the hung broker",
            )
        finally:
            private_broker.resume()
        tools.produce_sim(
            topics["impressions"], topics["feedback"], events=3000, seed=17, skip=3000
        )
        wait_until(lambda: settled(daemon, tools, unique), 180, "the daemon to settle")
    expected, reference = tools.expected(
        settings.engine_config(), topics["impressions"], topics["feedback"]
    )
    assert_exactly_once(results_by_id(tools, topics["results"]), expected)
    assert_windows_equal(read_windows(windows), reference)
    assert_consumed_to_the_end(tools, unique)
    assert_no_transaction_left_open(tools, unique)


#: the seeded random kills: how many, and the seed that fixes victims and moments
KILLS, SEED = 20, 20261124


class Stream:
    """Simulator traffic produced on a thread, a small chunk every ``pause`` seconds, until
    stopped: the kills then land while records are fed and results are in open transactions."""

    def __init__(
        self,
        tools: KafkaTools,
        topics: dict[str, str],
        seed: int,
        chunk: int = 150,
        start: int = 0,
        **sim: Any,
    ) -> None:
        """From event ``start`` of the seed's stream; ``sim``: more arguments of
        ``KafkaTools.produce_sim`` (rate, speed, late)."""
        self.sent = start
        self._args = (tools, topics, seed)
        self._chunk = chunk
        self._sim = sim
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="stream", daemon=True)
        self._thread.start()

    def _run(self, pause: float = 0.3) -> None:
        tools, topics, seed = self._args
        imp, fb = topics["impressions"], topics["feedback"]
        try:
            while not self._stop.is_set():
                self.sent += tools.produce_sim(
                    imp, fb, events=self._chunk, seed=seed, skip=self.sent, **self._sim
                )
                self._stop.wait(pause)
        except BaseException as exc:  # reported by stop(), in the test's thread
            self._error = exc

    def stop(self) -> int:
        """Stop producing; how many events were sent."""
        self._stop.set()
        self._thread.join(timeout=60)
        if self._error is not None:
            raise self._error
        return self.sent


@pytest.mark.timeout(900)  # ten takeovers of about 10 s each, more on a loaded machine
def test_twenty_seeded_random_kill_9s_alternating_restart_and_takeover_are_exact(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """Two instances share four partitions while traffic streams in. Twenty times, from a
    fixed seed: a random 0.2-3 s, then kill -9 of a random one of the two. Even kills restart
    the same instance id at once and go on without waiting for it, so a later kill can land
    while it starts, joins or restores; odd kills come once both share the partitions, and the
    other one takes all four over before the dead id starts again. The oracle runs once, at
    the end (the same one the planted duplicate makes fail); the read_committed reader runs
    across all twenty kills. Static members, so that a restart takes its partitions back
    without waiting out the session (the commit-cycle matrix covers the dynamic restart)."""
    rng = random.Random(SEED)
    topics = names(unique)
    partitions = {0, 1, 2, 3}
    kafka_tools.create({topics["impressions"]: 4, topics["feedback"]: 4})
    live = {name: instances(name, static=True) for name in ("a", "b")}
    wait_until(lambda: covered(list(live.values()), partitions), 120, "two members sharing")
    reader = CommittedReader(kafka_tools.bootstrap, topics["results"])
    stream = Stream(kafka_tools, topics, seed=21)
    takeovers: list[float] = []
    for kill in range(KILLS):
        if kill % 2 == 1:
            wait_until(lambda: covered(list(live.values()), partitions), 150, "both sharing")
        time.sleep(rng.uniform(0.2, 3.0))
        name = rng.choice(sorted(live))
        held = live[name].owned() or set()  # none while it starts, joins or restores
        live.pop(name).kill()
        killed_at = time.monotonic()
        if kill % 2 == 1:
            (heir,) = live.values()
            wait_until(lambda heir=heir: covered([heir], partitions), 150, "the takeover")
            took = time.monotonic() - killed_at
            if held:  # the heir had to take something over
                takeovers.append(took)
            print(f"kill {kill + 1}: {name} holding {sorted(held)}, takeover: ready {took:.1f}s")
        live[name] = instances(name, static=True)
    sent = stream.stop()
    last, other = live["a"], live["b"]
    wait_until(lambda: covered([last, other], partitions), 150, "both members back")
    assert other.terminate() == 0
    wait_until(lambda: last.alone(4), 180, "one instance owning everything, caught up")
    assert last.terminate() == 0
    seen = reader.stop()
    assert_matches_an_uninterrupted_run(kafka_tools, unique, last.windows)
    expected = expected_results(kafka_tools, unique)
    during = assert_seen_during_chaos_stands(seen, expected, kafka_tools, topics["results"])
    aborted = len(kafka_tools.read(topics["results"])) - len(expected)
    assert aborted > 0, "no kill landed inside a transaction holding results: not effective"
    assert takeovers, "no takeover had partitions to take over: not effective"
    print(
        f"{KILLS} seeded kill -9s over {sent} streamed events: takeover of a holder -> all "
        f"partitions ready median {statistics.median(takeovers):.1f}s, max "
        f"{max(takeovers):.1f}s ({len(takeovers)} of {KILLS // 2}); {during} results seen "
        f"read_committed during the kills, all standing; {aborted} results of aborted "
        "transactions on the log"
    )


def test_scale_out_1_to_3_and_back_to_1_during_the_stream_is_exact(
    kafka_tools: KafkaTools, unique: str, instances: Callable[..., Instance]
) -> None:
    """One instance, then three (two join mid-stream), then one again: the second leaves with
    SIGTERM (its revocation commits), the third is killed -9 (its transaction is aborted by
    the coordinator). Six partitions, so three instances get two each."""
    topics = names(unique)
    partitions = set(range(6))
    kafka_tools.create({topics["impressions"]: 6, topics["feedback"]: 6})
    chunk = 3000

    def traffic(n: int) -> None:
        kafka_tools.produce_sim(
            topics["impressions"], topics["feedback"], events=chunk, seed=22, skip=n * chunk
        )

    traffic(0)
    a = instances("a")
    wait_until(lambda: a.metric("evald_results_produced_total") > 0, 90, "results of one")
    reader = CommittedReader(kafka_tools.bootstrap, topics["results"])
    b, c = instances("b"), instances("c")
    traffic(1)
    wait_until(
        lambda: covered([a, b, c], partitions) and all(i.owned() for i in (a, b, c)),
        150,
        "three instances sharing the partitions",
    )
    three = {name: sorted(i.owned() or ()) for name, i in zip("abc", (a, b, c), strict=True)}
    traffic(2)
    wait_until(
        lambda: all(i.metric("evald_results_produced_total") > 0 for i in (b, c)),
        90,
        "results of all three",
    )
    assert b.terminate() == 0
    c.kill()
    killed_at = time.monotonic()
    wait_until(lambda: covered([a], partitions), 150, "one instance owning everything again")
    back_to_one = time.monotonic() - killed_at
    traffic(3)
    wait_until(lambda: a.alone(6), 180, "one instance caught up")
    assert a.terminate() == 0
    seen = reader.stop()
    wait_killed_transactions_aborted(kafka_tools, unique, "c")
    assert_matches_an_uninterrupted_run(kafka_tools, unique, a.windows)
    expected = expected_results(kafka_tools, unique)
    during = assert_seen_during_chaos_stands(seen, expected, kafka_tools, topics["results"])
    print(
        f"scale 1 -> 3 -> 1: three shared {three}; SIGTERM + kill -9 -> one owner ready "
        f"{back_to_one:.1f}s; {during} results seen read_committed, all standing"
    )
