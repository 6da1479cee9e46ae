"""Work-arounds for kafka-python 3.0.x behaviour the daemon depends on.

``unpark_resumed``: in kafka-python 3.0.12, records parked for a paused partition are handed back
after ``resume()`` only when the fetcher's in-line slot is ``None``; once a partition's records
have been drained, the slot keeps the drained (falsy) object instead, so a resumed partition
stays parked for good and is never fetched again (reproduced against tansu: pause, poll,
resume, and the partition's position never moves). The daemon pauses partitions for
backpressure, so it clears a drained slot before each poll. Remove once fixed upstream.

``RecordAppender``: a cheaper ``producer.send`` for the results stream (see its docstring).

``FetchWatch``: when did a fetch last confirm a partition's high watermark? kafka-python keeps
only the latest watermark (``consumer.highwater``), not when it was learnt; the merge needs to
know that the other topic was at its end *after* a record arrived (see merge.py and its
docstring), and the repartition stage the same of its other source partitions (interleave.py).
It stamps each fetch request with the daemon's clock as it is built and, when the answer comes
back, records per partition the request's stamp and the watermark it reported.

``committed_offsets``: kafka-python 3.0.x's ``KafkaConsumer.committed()`` takes one partition, so
restoring 64 partitions asked the coordinator 64 times in a row; this asks once for all of them
(as Java's ``committed(Set)`` does), through the consumer's coordinator.

``net_client``: kafka-python's network client with a slow-step warning that means something
in evald (see ``SLOW_TASK_S``) and that honours ``allow_auto_create_topics`` (see
``without_auto_create``), the ``kafka_client`` of every client evald builds.

``close_quietly``: closing a client of a session that just failed (broker gone, coordinator
moved) can raise too; the session's teardown must go on, so every client is closed the same way.
A producer with records no broker takes (their topic deleted) is a case of its own:
``KafkaProducer.close(timeout)`` flushes first and raises ``KafkaTimeoutError`` before it stops
its sender, so the producer stayed open with its I/O thread running and closed again from
``__del__`` at exit, printing a traceback; the pending records are aborted (as Java's
``close(Duration.ZERO)`` does) and the close repeated.

``flush_within``: ``producer.flush(timeout)`` of kafka-python 3.0.x applies the timeout to each
incomplete batch in turn, so a flush of many batches the broker does not take (their topic
deleted) waits that many times as long; and a caller that must notice why meanwhile has no
moment to look. This one gives up after one deadline and calls back every second while it waits.

``commit_within`` / ``send_offsets_within`` / ``abort_within``: ``commit_transaction()``,
``send_offsets_to_transaction()`` and ``abort_transaction()`` of kafka-python 3.0.x wait for the
coordinator's answer with no time limit. After a broker restart the producer's sender was seen
retrying "Node 1 not ready" for minutes while the consumer had long reconnected, and the commit
never returned: evald stalled instead of starting a new session. These give up after a
deadline and raise ``KafkaTimeoutError``; the session then ends like any transient error, and
the next one's ``init_transactions()`` settles the transaction (a commit the coordinator decided
completes, an undecided one is aborted), which is the "commit in flight" case of the crash
tests.

``StopEvent``: kafka-python 3.0.12's clients bootstrap in their constructor and, against a broker
that is away, wait there up to ``request_timeout_ms`` (30 s; its backoff sleeps up to ~22 s at
once), deaf to the daemon's stop: a SIGTERM at start-up took 20-30 s, until the bootstrap gave
up or the shutdown watchdog fired. The daemon's stop is this event. Setting it closes the
connection manager of every client its ``client`` made while the session was connecting whose
bootstrap has not finished (under way, or not yet begun: a client made after the stop is closed
at once); the bootstrap loop runs while the manager is not closed, and the close wakes its wait
and closes a connection attempt under way, so the constructor raises at once, with the "Unable
to bootstrap" of any failed bootstrap. A host name lookup is not interrupted (kafka-python
resolves on its I/O thread with a blocking ``getaddrinfo``): a stop then waits for the lookup.
Once the session runs (``running``), clients made later (a restore's readers, mid-session) are
not ended: the session is stopping cleanly, and its final commit needs its restore finished.
Clients that finished bootstrapping are left alone either way. It also holds every client it
made until ``close_clients`` at the session's end: the admin client and the consumer start
their client's I/O thread before they bootstrap, and one whose constructor raised (the broker
away) is closed by nobody, so each failed session left a thread running (one per retry, for as
long as an outage lasts). Nothing else refers to that client, so it is held strongly, not weakly.
A client's ``close`` joins its I/O thread with no time limit, and a thread stuck in a host name
lookup held the session's teardown (and every retry after it) for as long as the lookup took;
``close_clients`` waits ``CLOSE_WAIT_S`` for them all, warns of each one still closing, and goes
on (the thread is a daemon thread and ends with its lookup).

``without_auto_create``: kafka-python 3.0.12 drops ``allow_auto_create_topics``. The consumer and
the producer hand their whole config to ``KafkaNetClient``, whose ``KafkaConnectionManager``
copies only the keys of its own ``DEFAULT_CONFIG`` (which lacks that one) and builds the
``ClusterMetadata`` that writes every metadata request from three of them
(``kafka/net/manager.py``, lines 81-85); ``ClusterMetadata`` then asks with its default
``allow_auto_create_topics=True``. On a broker with ``auto.create.topics.enable=true`` (Kafka's
default) a deleted input topic came back at once with ``num.partitions`` (1) partitions, made by
evald's own group consumer, and evald reported a repartitioned topic instead of a deleted one.
The client factory here builds the same ``KafkaNetClient`` and sets the flag where it is read.
Remove once fixed upstream.
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError
from kafka.net.compat import KafkaNetClient

__all__ = [
    "FetchWatch",
    "RecordAppender",
    "StopEvent",
    "abort_within",
    "close_quietly",
    "commit_within",
    "committed_offsets",
    "flush_within",
    "net_client",
    "send_offsets_within",
    "unpark_resumed",
    "without_auto_create",
]

log = logging.getLogger("evald.daemon")


#: kafka-python's I/O thread times each step of its tasks in wall time and logs a WARNING past
#: 0.1 s ("Task ... ran for 0.248s ... It is blocking the event loop -- likely a tight sync
#: loop"). Its steps read and decode whole fetch responses, on the GIL and the two cores that
#: evald's main thread scores and restores on: on a busy machine they took 0.12-0.39 s, several
#: times a run, each one in KafkaTCPTransport._read_from_sock, nothing looping. Nothing waits
#: on them but the next network step (the session timeout is 10 s); past a second a step is a
#: stall worth a warning.
SLOW_TASK_S = 1.0

#: How long ``StopEvent.close_clients`` waits for a session's clients to close. A close stops
#: the client's I/O thread, which takes milliseconds unless the thread is stuck in a call that
#: nothing interrupts (a blocking host name lookup); no setting bounds that (the request timeout,
#: 30 s by default, bounds a broker's answer, and the shutdown timeout only a stop), and a
#: teardown that waits longer only delays the next session's retry.
CLOSE_WAIT_S = 5.0


def net_client(**configs: Any) -> KafkaNetClient:
    """kafka-python's ``KafkaNetClient`` with ``SLOW_TASK_S`` as its slow-step threshold (a
    setting only the client reads, which KafkaConsumer, KafkaProducer and KafkaAdminClient
    refuse as their own, so it is given as their ``kafka_client``) whose metadata requests
    carry the caller's ``allow_auto_create_topics`` (see the module doc)."""
    client = KafkaNetClient(**{**configs, "slow_task_threshold_secs": SLOW_TASK_S})
    config = getattr(client.cluster, "config", None)
    if isinstance(config, dict) and "allow_auto_create_topics" in config:
        config["allow_auto_create_topics"] = bool(configs.get("allow_auto_create_topics", True))
    else:
        log.warning("cannot turn off topic auto-creation in this kafka-python's metadata client")
    return client


class StopEvent(threading.Event):
    """The daemon's stop, which also ends the bootstraps not finished of the clients made by
    :meth:`client` while connecting; :meth:`close_clients` closes them all when their session
    ends (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self._clients: dict[KafkaNetClient, str] = {}  # -> its name for a log
        self._connecting: list[KafkaNetClient] | None = []  # None: the session runs
        self._guard = threading.Lock()

    def client(self, **configs: Any) -> KafkaNetClient:
        """``net_client``, remembered so that :meth:`set` can end its bootstrap (one made after
        the stop, at once) and :meth:`close_clients` close it."""
        client = net_client(**configs)
        name = "{} client {!r} of {}".format(
            configs.get("metric_group_prefix", "kafka"),
            configs.get("client_id"),
            ",".join(map(str, configs.get("bootstrap_servers") or ())),
        )
        with self._guard:
            self._clients[client] = name
            connecting = self._connecting
            if connecting is not None:
                connecting.append(client)
        if connecting is not None and self.is_set():
            _end_bootstrap(client)
        return client

    def running(self) -> None:
        """The session's clients are up: a stop from now on leaves the bootstraps of clients
        made later to finish (the session stops cleanly and commits)."""
        with self._guard:
            self._connecting = None

    def close_clients(self) -> None:
        """Close (and forget) every client made since the last call, stopping its I/O thread:
        those of a constructor that raised, which nobody else can close, and those their owner
        closed already (a second close does nothing). Call it after the owners' own closes,
        which still need their client (a producer's close aborts its pending records). The
        closes run side by side, waited for ``CLOSE_WAIT_S`` in all; a client still closing
        then is logged and left to finish on its own. The next session connects anew."""
        with self._guard:
            clients, self._clients, self._connecting = self._clients, {}, []
        closing = []
        for client, name in clients.items():
            closer = threading.Thread(
                target=_close_client, args=(client,), name=f"evald-close {name}", daemon=True
            )
            closer.start()
            closing.append((closer, name))
        deadline = time.monotonic() + CLOSE_WAIT_S
        for closer, name in closing:
            closer.join(max(0.0, deadline - time.monotonic()))
            if closer.is_alive():
                log.warning(
                    "the %s did not close within %.0fs (its I/O thread is stuck, e.g. in a host"
                    " name lookup); going on without waiting for it",
                    name,
                    CLOSE_WAIT_S,
                )

    def set(self) -> None:
        super().set()
        with self._guard:
            clients = list(self._connecting or ())
        for client in clients:
            _end_bootstrap(client)


def _close_client(client: KafkaNetClient) -> None:
    try:
        client.close()
    except Exception:
        log.debug("closing a session's network client failed", exc_info=True)


def _end_bootstrap(client: KafkaNetClient) -> None:
    """Close ``client``'s connection manager unless its bootstrap finished: the bootstrap loop
    runs while the manager is not ``closed`` (one closed before it begins does not run), and
    ``close`` wakes its wait, so the constructor raises ``KafkaTimeoutError`` at once."""
    manager = getattr(client, "_manager", None)
    future = getattr(manager, "_bootstrap_future", None)
    close = getattr(manager, "close", None)
    if close is None or (future is not None and getattr(future, "is_done", True)):
        return
    try:
        close()
    except Exception:
        log.debug("closing a bootstrapping client's connections failed", exc_info=True)


def without_auto_create() -> dict[str, Any]:
    """Keyword arguments that keep a ``KafkaConsumer`` or ``KafkaProducer`` built with
    ``net_client`` (every evald client: ``client_config()``) from creating a topic by asking
    for its metadata, whatever the broker's ``auto.create.topics.enable``."""
    return {"allow_auto_create_topics": False}


def unpark_resumed(consumer: Any) -> bool:
    """Let records parked for resumed partitions flow again; True if a slot was cleared."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not getattr(fetcher, "_paused_partition_records", None):
        return False
    current = getattr(fetcher, "_next_partition_records", None)
    if current is not None and not current:
        # drained: holds no records, only blocks the hand-back of parked ones
        fetcher._next_partition_records = None
        return True
    return False


class _StampedOffsets(dict):
    """A fetch request's ``{partition: fetch offset}`` that remembers when it was built."""

    sent_at: float = -math.inf


class FetchWatch:
    """Per partition, the latest fetch request answered without error: when it was built (on
    the daemon's clock) and the high watermark the answer reported.

    Why: ``consumer.highwater(tp)`` is the watermark of the last successful fetch response,
    however old. While a partition's leader moves, fetches to it fail and that value goes
    stale, and "position ≥ high watermark" then reads as caught up when the topic may hold
    records written since. A watermark from a request built after time t covers every record
    written before t.

    How: kafka-python 3.0.x builds requests in ``Fetcher._create_fetch_requests`` (at most one
    in flight per node; a partition with fetched records still to hand out is not asked for)
    and hands each answer to ``Fetcher._handle_fetch_response(node_id, fetch_offsets,
    send_time, response)`` with the same ``fetch_offsets`` mapping, so the stamp travels in
    that mapping. A partition the answer leaves out (an incremental fetch session omits what
    did not change) keeps its previous watermark with the new stamp; a partition answered with
    an error, or a whole answer refused (session error, throttling), is not stamped. A
    consumer without those internals is not watched: :meth:`answered` then falls back to
    ``consumer.highwater`` stamped ``inf``, the behaviour before this existed.
    """

    def __init__(self, consumer: Any, clock: Callable[[], float]) -> None:
        self._consumer = consumer
        self._clock = clock
        #: written on the client's I/O thread, read on the main thread
        self._lock = threading.Lock()
        self._answered: dict[TopicPartition, tuple[float, int]] = {}
        fetcher = getattr(consumer, "_fetcher", None)
        create = getattr(fetcher, "_create_fetch_requests", None)
        handle = getattr(fetcher, "_handle_fetch_response", None)
        self.watching = (
            callable(create)
            and callable(handle)
            and _takes(handle, ("node_id", "fetch_offsets", "send_time", "response"))
        )
        if not self.watching:
            log.warning("cannot watch kafka-python's fetches; caught up means the last watermark")
            return

        def create_stamped() -> dict[Any, Any]:
            requests = create()  # type: ignore[misc]
            now = self._clock()
            stamped = {}
            for node_id, (request, offsets) in requests.items():
                offsets = _StampedOffsets(offsets)
                offsets.sent_at = now
                stamped[node_id] = (request, offsets)
            return stamped

        def handle_noted(node_id: Any, fetch_offsets: Any, send_time: Any, response: Any) -> Any:
            result = handle(node_id, fetch_offsets, send_time, response)  # type: ignore[misc]
            self._note(fetch_offsets, response)
            return result

        fetcher._create_fetch_requests = create_stamped  # type: ignore[union-attr]
        fetcher._handle_fetch_response = handle_noted  # type: ignore[union-attr]

    def _note(self, fetch_offsets: Any, response: Any) -> None:
        sent_at = getattr(fetch_offsets, "sent_at", None)
        if sent_at is None or getattr(response, "error_code", 0) != 0:
            return
        if getattr(response, "throttle_time_ms", 0):
            return  # a throttled answer leaves partitions out that may well have changed
        highs: dict[TopicPartition, int] = {}
        failed: set[TopicPartition] = set()
        for topic in response.responses:
            for data in topic.partitions:
                tp = TopicPartition(topic.topic, data.partition_index)
                if data.error_code == 0 and data.high_watermark >= 0:
                    highs[tp] = data.high_watermark
                else:
                    failed.add(tp)
        with self._lock:
            for tp in fetch_offsets:
                if tp in failed:
                    continue
                high = highs.get(tp)
                if high is None:  # left out of an incremental answer: unchanged
                    previous = self._answered.get(tp)
                    if previous is None:
                        continue
                    high = previous[1]
                self._answered[tp] = (sent_at, high)

    def answered(self, tp: TopicPartition) -> tuple[float, int] | None:
        """(when the latest request answered for ``tp`` was built, its high watermark), or
        None if no answer came yet."""
        if not self.watching:
            high = self._consumer.highwater(tp)
            return None if high is None else (math.inf, high)
        with self._lock:
            return self._answered.get(tp)


class RecordAppender:
    """``producer.send`` for a run of records to one partition, without its per-call toll.

    Why this exists: in kafka-python 3.0.x each ``send`` re-validates headers, re-checks
    metadata and the transaction state (several lock round trips), formats a debug message and
    wakes the sender thread whenever more than one batch is queued for the partition. The
    daemon writes one small record per result, so that toll, and the wake-ups contending with
    the sender thread, cost more than building the record. Here the first record a partition
    gets in a transaction goes through the public ``send`` (metadata wait, adding the
    partition to the transaction, every check); the following ones are appended straight to
    the producer's record accumulator, which is what ``send`` does last, and the sender is
    woken only when a new batch starts. A record too large for ``max_request_size``, or a
    producer without the expected internals, always takes the public path, so the worst case
    is the old speed, never a different result.
    """

    #: bytes a record may add to its key and value inside a batch (varints, attributes, deltas)
    RECORD_OVERHEAD = 64
    #: the leading parameters of ``RecordAccumulator.append`` this was written against (3.0.x);
    #: another signature means other internals, so every record takes ``send``
    APPEND_PARAMETERS = ("tp", "timestamp_ms", "key", "value", "headers")

    def __init__(self, producer: Any) -> None:
        self._send = producer.send
        accumulator = getattr(producer, "_accumulator", None)
        sender = getattr(producer, "_sender", None)
        self.fast = (
            callable(getattr(accumulator, "append", None))
            and callable(getattr(sender, "wakeup", None))
            and _takes(accumulator.append, self.APPEND_PARAMETERS)  # type: ignore[union-attr]
        )
        if self.fast:
            self._append = accumulator.append  # type: ignore[union-attr]
            self._wakeup = sender.wakeup  # type: ignore[union-attr]
        self._max_record = int(producer.config["max_request_size"]) - self.RECORD_OVERHEAD

    def send(
        self,
        tp: TopicPartition,
        key: bytes,
        value: bytes,
        *,
        first_in_transaction: bool,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Any:
        """Queue one record for ``tp``; returns its future (``.get()`` gives the offset).

        ``first_in_transaction`` must be true for the first record sent to ``tp`` since the
        transaction began: only ``send`` adds a partition to the transaction. ``headers``
        bytes count against the size check too (the repartition stage copies them).
        """
        headers = headers or []
        size = len(key) + len(value) + sum(len(k) + len(v) for k, v in headers)
        if first_in_transaction or not self.fast or size > self._max_record:
            extra: dict[str, Any] = {}  # only what was given: the results path sends neither
            if timestamp_ms is not None:
                extra["timestamp_ms"] = timestamp_ms
            if headers:
                extra["headers"] = headers
            future = self._send(tp.topic, key=key, value=value, partition=tp.partition, **extra)
            if getattr(future, "is_done", False) and future.failed():
                # kafka-python returns a send whose metadata wait the broker refused (e.g.
                # TopicAuthorizationFailedError) as a failed future; the records appended after
                # it would wait for metadata that never comes until a flush times out
                raise future.exception
            return future
        future, _full, new_batch, _ = self._append(tp, timestamp_ms, key, value, headers)
        if new_batch:
            self._wakeup()
        return future


def _takes(function: Callable[..., Any], names: tuple[str, ...]) -> bool:
    """Whether ``function``'s leading parameters are ``names``, in that order."""
    try:
        parameters = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return False
    return tuple(parameters[: len(names)]) == names


def _wait(producer: Any, start: Callable[[Any], Any], what: str, timeout_s: float) -> None:
    """Start a transactional request with ``start(manager)``, wake the sender, wait at most
    ``timeout_s`` for the answer; raises the request's error, or KafkaTimeoutError."""
    result = start(producer._transaction_manager)
    producer._sender.wakeup()
    if not result.wait(timeout_ms=timeout_s * 1000):
        raise KafkaTimeoutError(f"{what} not answered within {timeout_s:g}s")


def flush_within(
    producer: Any,
    timeout_s: float,
    waiting: Callable[[], None] = lambda: None,
    *,
    step_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """``producer.flush()`` within ``timeout_s`` in all (KafkaTimeoutError after it), calling
    ``waiting()`` about every ``step_s`` while records are still unanswered (see the module
    doc); ``waiting`` may raise to give up at once."""
    deadline = clock() + timeout_s
    while True:
        try:
            producer.flush(timeout=max(0.0, min(step_s, deadline - clock())))
            return
        except KafkaTimeoutError:
            if clock() >= deadline:
                raise
        waiting()


def commit_within(producer: Any, timeout_s: float) -> None:
    """``producer.commit_transaction()``, giving up after ``timeout_s`` (see the module doc)."""
    if getattr(producer, "_transaction_manager", None) is None:
        producer.commit_transaction()  # raises kafka-python's own error
        return
    _wait(producer, lambda manager: manager.begin_commit(), "the transaction commit", timeout_s)


def abort_within(producer: Any, timeout_s: float) -> None:
    """``producer.abort_transaction()``, giving up after ``timeout_s``."""
    if getattr(producer, "_transaction_manager", None) is None:
        producer.abort_transaction()
        return
    _wait(producer, lambda manager: manager.begin_abort(), "the transaction abort", timeout_s)


def send_offsets_within(
    producer: Any, offsets: dict[Any, Any], group_metadata: Any, timeout_s: float
) -> None:
    """``producer.send_offsets_to_transaction(...)``, giving up after ``timeout_s``."""
    if getattr(producer, "_transaction_manager", None) is None:
        producer.send_offsets_to_transaction(offsets, group_metadata)
        return
    _wait(
        producer,
        lambda manager: manager.send_offsets_to_transaction(offsets, group_metadata),
        "the transaction's offsets",
        timeout_s,
    )


def close_quietly(client: Any) -> None:
    """Close a consumer (no auto-commit, 1 s), producer (1 s) or admin client; log, never raise."""
    try:
        if isinstance(client, KafkaConsumer):
            client.close(autocommit=False, timeout_ms=1_000)
        elif isinstance(client, KafkaProducer):
            try:
                client.close(timeout=1)
            except KafkaTimeoutError:
                sender = getattr(client, "_sender", None)
                if sender is None:
                    raise
                sender.force_close()  # its thread aborts the batches still pending
                client.close(timeout=1)
        else:
            client.close()
    except Exception:
        log.debug("closing %s failed", type(client).__name__, exc_info=True)


def committed_offsets(consumer: Any, tps: list[TopicPartition], timeout_ms: int) -> dict[Any, Any]:
    """The group's committed offsets of ``tps`` in one OffsetFetch (with ``require_stable`` on a
    ``read_committed`` consumer, as ``committed()`` asks): partition -> ``OffsetAndMetadata``,
    partitions without an offset left out; ``KafkaTimeoutError`` after ``timeout_ms``."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None:  # not kafka-python's consumer: one partition at a time
        out = {}
        for tp in tps:
            offset = consumer.committed(tp, metadata=True, timeout_ms=timeout_ms)
            if offset is not None:
                out[tp] = offset
        return out
    return dict(coordinator.fetch_committed_offsets(list(tps), timeout_ms=timeout_ms))
