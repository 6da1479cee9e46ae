"""`evald produce`: write the demo simulator's traffic into the impressions and feedback topics.

Records are keyed by request_id (so the default partitioner co-partitions the two topics) and
carry the simulated arrival time as their Kafka timestamp, which is the order `evald run` merges
the two topics in.

Every run is fresh by default: event time starts now (dashboards and the watermark panel show
the present, not a fixed date), or right after the newest record on the topics when an earlier
run left them ahead of the wall clock (else `evald run` would take this run's records for late
ones), and request ids carry a new run id, so a second run never collides with the first (same
ids with different results, orphaned feedback). ``--start`` and ``--run-id`` reproduce a stream
exactly. ``--output FILE`` writes the same records as JSON Lines for `evald replay` instead of
Kafka. SIGTERM stops like Ctrl-C: what was sent is flushed and counted, exit 0 (as PID 1 in a
container, `docker compose stop` returns at once).

Nothing is lost silently: every send's answer is counted (the summary says how many records
the broker acknowledged), and the first record the broker refuses stops the run with what the
broker said and what to do. Event time never runs further ahead of the wall clock than the
topics' ``message.timestamp.after.max.ms`` allows (Kafka refuses such records): past it, records
wait for the wall clock (evald.daemon.topic_time).
"""

from __future__ import annotations

import argparse
import re
import secrets
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

from evald.daemon.settings import INT32_MAX, Settings, SettingsError
from evald.daemon.topic_time import SENT_HEADER, TimestampLimit, TopicsEnd
from evald.demo.command import positive, regress_seconds, seed, share
from evald.durations import readable
from evald.events import MAX_TS_MS
from evald.signals import StopSignals

if TYPE_CHECKING:
    from evald.demo.simulator import SimEvent

SUMMARY = "write simulated search traffic (impressions + feedback) into Kafka for `evald run`"
EXAMPLES = """\
  evald produce --bootstrap-servers localhost:9092 --events 100000
  evald produce --config evald.yaml --partitions 6 --realtime --rate 2000
  evald produce --events 50000 --output traffic.jsonl && evald replay traffic.jsonl
  evald produce --start 2026-01-01T00:00:00Z --run-id base --seed 7   # the same stream every time
"""

_RUN_ID = re.compile(r"[A-Za-z0-9_.]{1,32}")


def _start(text: str) -> int | None:
    """``now`` (None), epoch milliseconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    if text.strip().lower() == "now":
        return None
    if text.strip().isdecimal():
        ms = int(text) if len(text.strip()) <= 15 else MAX_TS_MS + 1
    else:
        ms = _iso_ms(text)
    if not 0 <= ms <= MAX_TS_MS:  # no event time is past 9999 (10**400 was a traceback)
        raise argparse.ArgumentTypeError(
            f"must be from 1970-01-01 to 9999-12-31 (epoch ms 0 to {MAX_TS_MS}), got {text!r}"
        )
    return ms


def _iso_ms(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'now', epoch milliseconds or a time like 2026-01-01T00:00:00Z, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def _run_id(text: str) -> str:
    if not _RUN_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"up to 32 letters, digits, '_' or '.', got {text!r}")
    return text


def configure(parser: argparse.ArgumentParser) -> None:
    """Connection and input-topic flags (the ones produce uses), plus the traffic shape."""
    parser.add_argument(
        "--config", metavar="FILE", help="YAML settings file (default: $EVALD_CONFIG)"
    )
    kafka = parser.add_argument_group("kafka")
    kafka.add_argument("--bootstrap-servers", metavar="HOST:PORT[,...]")
    kafka.add_argument(
        "--security-protocol", choices=["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
    )
    kafka.add_argument("--sasl-mechanism", choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
    kafka.add_argument(
        "--sasl-username",
        metavar="NAME",
        help="the password comes from EVALD_KAFKA__SASL_PASSWORD or the file",
    )
    kafka.add_argument("--impressions-topic", metavar="TOPIC")
    kafka.add_argument("--feedback-topic", metavar="TOPIC")
    kafka.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="any other kafka.* or topics.* setting, e.g. --set kafka.client_id=loadgen",
    )
    kafka.add_argument(
        "--partitions",
        type=positive(int, INT32_MAX),
        default=3,
        help="partition count when the input topics have to be created (default: %(default)s)",
    )
    _traffic_flags(parser.add_argument_group("traffic"))
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="write the records as JSON Lines to FILE ('-': stdout) for `evald replay`, "
        "instead of Kafka",
    )
    parser.add_argument(
        "--progress-interval",
        type=positive(float),
        default=10.0,
        metavar="SECONDS",
        help="a progress line on stderr this often (default: %(default)s)",
    )


def _traffic_flags(traffic: argparse._ArgumentGroup) -> None:
    """The shape of the simulated traffic."""
    traffic.add_argument(
        "--events",
        type=positive(int, sys.maxsize),
        default=None,
        help="stop after this many records (default: endless with --realtime, else 100000)",
    )
    traffic.add_argument("--seed", type=seed, default=0, help="simulation seed (default: 0)")
    traffic.add_argument(
        "--rate",
        type=positive(float),
        default=3_000.0,
        help="records per wall second; with --speed it sets the traffic density in event time "
        "(default: %(default)s)",
    )
    traffic.add_argument(
        "--speed",
        type=positive(float),
        default=60.0,
        help="event-time seconds per wall second (default: %(default)s)",
    )
    traffic.add_argument(
        "--start",
        type=_start,
        default=None,
        metavar="TIME",
        help="event time of the first record: 'now' (default), epoch ms or 2026-01-01T00:00:00Z",
    )
    traffic.add_argument(
        "--run-id",
        type=_run_id,
        default=None,
        metavar="ID",
        help="prefix of every request id (default: a fresh random id per run, so runs never "
        "collide); give the same id, --start and --seed to reproduce a stream",
    )
    traffic.add_argument(
        "--clean", action="store_true", help="no duplicates, losses or malformed records"
    )
    traffic.add_argument(
        "--realtime", action="store_true", help="pace records by their simulated arrival time"
    )
    traffic.add_argument(
        "--regress-at",
        type=regress_seconds,
        default=None,
        metavar="SECONDS",
        help="wall seconds (at --speed) after which the treatment arm's ranker degrades, so "
        "dashboards and alerts have a drop to show (default: never)",
    )
    traffic.add_argument(
        "--interleave",
        type=share,
        default=0.0,
        metavar="SHARE",
        help="share of the requests served as one team-draft list of both rankers (arm "
        "'interleaved', teams ranker-v1 and ranker-v2: set interleaving.teams to credit them; "
        "default: none)",
    )


class Progress:
    """Counts what was written and says so every ``interval`` seconds on ``stream``."""

    def __init__(
        self,
        stream: TextIO,
        interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.interval = interval
        self.clock = clock
        self.started = self._last = clock()
        self.impressions = 0
        self.feedback = 0
        self.event_time_ms: int | None = None

    @property
    def written(self) -> int:
        return self.impressions + self.feedback

    def count(self, event: SimEvent, *, impression: bool) -> None:
        if impression:
            self.impressions += 1
        else:
            self.feedback += 1
        self.event_time_ms = event.at_ms
        if self.clock() - self._last >= self.interval:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self._last = self.clock()

    def line(self) -> str:
        elapsed = max(self.clock() - self.started, 1e-9)
        when = "-"
        if self.event_time_ms is not None:
            moment = datetime.fromtimestamp(self.event_time_ms / 1000, tz=timezone.utc)
            when = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        return (
            f"evald produce: {self.written:,} records ({self.impressions:,} impressions,"
            f" {self.feedback:,} feedback) in {elapsed:,.0f}s, {self.written / elapsed:,.0f}/s"
            f" · event time {when}"
        )


def simulate(args: argparse.Namespace, run_id: str, start_ms: int) -> Iterable[SimEvent]:
    """The records this run writes, in arrival order (endless without a limit)."""
    from itertools import islice

    from evald.demo.simulator import Faults, Simulator

    regress_at_ms = (
        None if args.regress_at is None else start_ms + int(args.regress_at * 1000 * args.speed)
    )
    sim = Simulator(
        args.seed,
        rate=args.rate,
        speed=args.speed,
        start_ms=start_ms,
        regress_at_ms=regress_at_ms,
        faults=Faults.none() if args.clean else None,
        run_id=run_id,
        interleave=args.interleave,
    )
    limit = args.events if args.events is not None else (None if args.realtime else 100_000)
    return islice(sim.events(), limit)


def write(
    events: Iterable[SimEvent],
    send: Callable[[SimEvent], None],
    progress: Progress,
    stop: StopSignals,
    *,
    pace: float | None,
    start_ms: int,
    hold: Callable[[int], float] | None = None,
) -> None:
    """Send each event (paced at ``pace`` event-time seconds per wall second if given) until
    the events end or ``stop`` is set. ``hold(at_ms)``: seconds to wait before a record
    stamped ``at_ms`` may be sent (the broker's timestamp limit), 0 when it may go now."""
    from evald.demo.simulator import IMPRESSION

    started = time.monotonic()
    for event in events:
        delay = 0.0
        if pace is not None:
            due = (event.at_ms - start_ms) / 1000.0 / pace
            delay = due - (time.monotonic() - started)
        if hold is not None:
            delay = max(delay, hold(event.at_ms))
        if delay > 0 and stop.wait(delay):
            break
        if stop.is_set():
            break
        send(event)
        progress.count(event, impression=event.kind == IMPRESSION)


def run(args: argparse.Namespace) -> int:
    """Produce until ``--events`` records were written, forever with --realtime, or a signal."""
    unused = [item for item in args.set if not item.startswith(("kafka.", "topics."))]
    if unused:
        print(
            f"evald produce: --set {unused[0]}: produce uses only kafka.* and topics.* settings",
            file=sys.stderr,
        )
        return 2
    run_id = args.run_id or secrets.token_hex(3)
    with StopSignals() as stop:
        if args.output is not None:
            start_ms = args.start if args.start is not None else int(time.time() * 1000)
            return _to_file(args, run_id, start_ms, stop)
        return _to_kafka(args, run_id, stop)


def _describe(run_id: str, start_ms: int) -> str:
    moment = datetime.fromtimestamp(start_ms / 1000, tz=timezone.utc)
    return f"run id {run_id}, event time from {moment.strftime('%Y-%m-%dT%H:%M:%SZ')}"


def _finish(progress: Progress, stop: StopSignals, where: str) -> int:
    why = f" (stopped by {stop.reason})" if stop.reason else ""
    print(f"{progress.line()}{why}; written to {where}", file=sys.stderr)
    return 0


def _stream(
    args: argparse.Namespace,
    run_id: str,
    start_ms: int,
    stop: StopSignals,
    send: Callable[[SimEvent], None],
    progress: Progress,
    hold: Callable[[int], float] | None = None,
) -> None:
    """The run's simulated traffic into ``send``, paced with ``--realtime``, until done or
    stopped; the file and the Kafka output differ only in ``send`` (and Kafka's ``hold``)."""
    pace = args.speed if args.realtime else None
    events = simulate(args, run_id, start_ms)
    write(events, send, progress, stop, pace=pace, start_ms=start_ms, hold=hold)


def _to_file(args: argparse.Namespace, run_id: str, start_ms: int, stop: StopSignals) -> int:
    try:
        out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        print(f"evald produce: --output: {exc}", file=sys.stderr)
        return 2
    print(f"evald produce: {_describe(run_id, start_ms)}", file=sys.stderr)
    progress = Progress(sys.stderr, args.progress_interval)
    try:

        def send(event: SimEvent) -> None:
            out.write(event.value.decode("utf-8", "replace") + "\n")

        _stream(args, run_id, start_ms, stop, send, progress)
    finally:
        if out is sys.stdout:
            out.flush()
        else:
            out.close()
    return _finish(progress, stop, args.output)


def _to_kafka(args: argparse.Namespace, run_id: str, stop: StopSignals) -> int:
    from evald.daemon.options import flag_overrides
    from evald.daemon.settings import load_settings

    try:
        settings = load_settings(file=args.config, flags=flag_overrides(args))
    except SettingsError as exc:
        print(f"evald produce: invalid settings\n{exc}", file=sys.stderr)
        return 2
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    topics = settings.topics
    found = _input_topics(settings, args.partitions)
    if found is None:
        return 1
    limit, end = found
    start_ms = _start_time(args.start, end, limit)
    if start_ms is None:
        return 2
    print(f"evald produce: {_describe(run_id, start_ms)}", file=sys.stderr)
    try:
        producer = KafkaProducer(linger_ms=20, **settings.kafka.client_config())
    except KafkaError as exc:
        print(f"evald produce: cannot start a Kafka producer: {exc}", file=sys.stderr)
        return 1
    progress = Progress(sys.stderr, args.progress_interval)
    acks = Acks()
    horizon = Horizon(limit, args)
    from evald.demo.simulator import IMPRESSION

    def send(event: SimEvent) -> None:
        if acks.refusal is not None:
            raise acks.refusal
        topic = topics.impressions if event.kind == IMPRESSION else topics.feedback
        sent = [(SENT_HEADER, b"%d" % (time.time() * 1000))]  # where the next run goes on from
        future = producer.send(
            topic, key=event.key, value=event.value, timestamp_ms=event.at_ms, headers=sent
        )
        acks.watch(future, topic, event.at_ms)

    where = f"{topics.impressions} / {topics.feedback}"
    try:
        try:
            _stream(args, run_id, start_ms, stop, send, progress, horizon.hold)
        finally:
            producer.flush()  # every answer is in before the summary counts them
            acks.settle()
        if acks.refusal is not None:
            raise acks.refusal
    except Refused as refused:
        print(f"{progress.line()}; {acks.acknowledged:,} acknowledged", file=sys.stderr)
        print(f"evald produce: {refused.explain(limit)}", file=sys.stderr)
        return 1
    except KafkaError as exc:
        print(
            f"{progress.line()}; {acks.acknowledged:,} acknowledged; then Kafka failed: {exc}. "
            "Check the broker and run again (a new run gets new request ids, so the records "
            "already written do not collide)",
            file=sys.stderr,
        )
        return 1
    finally:
        producer.close(timeout=5)
    return _finish(progress, stop, f"{where}, {acks.acknowledged:,} acknowledged by the broker")


def _start_time(
    start: int | None, end: TopicsEnd | None, limit: TimestampLimit, now_ms: int | None = None
) -> int | None:
    """The event time of the run's first record: ``--start``, or now, or (when the topics
    already hold records stamped later than now, or `evald run`'s watermark has moved on past
    now since they were sent) right after them; None (after saying why) when ``--start`` is
    further ahead than the broker accepts."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    latest = limit.latest_ms(now)
    last_ms = None if end is None else end.time_ms
    if start is None:
        if end is None:
            return now
        # while no record comes, evald run's idle fallback moves its watermark on with the wall
        # clock from the newest one: this run starts no earlier than that watermark can be
        quiet = 0 if end.sent_ms is None else max(0, now - end.sent_ms)
        resume = end.time_ms + quiet
        if resume < now:
            return now
        since = (
            f", sent {readable(quiet / 1000)} ago (evald run's watermark moves on with the wall "
            f"clock while its inputs are quiet)"
            if quiet
            else ""
        )
        print(
            f"evald produce: the topics hold records up to {_utc(end.time_ms)} (an earlier "
            f"run's event time){since}: going on from there, at {_utc(resume)}, so that evald "
            "run does not take this run's records for late ones (--start now starts at the wall "
            "clock)",
            file=sys.stderr,
        )
        return resume + 1 if latest is None else min(resume + 1, latest)
    if latest is not None and start > latest:
        print(
            f"evald produce: --start {_utc(start)} is {readable((start - now) / 1000)} ahead of "
            f"the wall clock; the broker refuses timestamps that far ahead "
            f"({limit.describe()}). Give an earlier --start",
            file=sys.stderr,
        )
        return None
    if last_ms is not None and start <= last_ms:
        print(
            f"evald produce: --start {_utc(start)} is before the newest record on the topics "
            f"({_utc(last_ms)}): evald run's watermark may already be past this run's first "
            "records, which then count as late (scored at once, without their feedback)",
            file=sys.stderr,
        )
    return start


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Refused(Exception):
    """The broker refused a record: no retry of the same record can succeed."""

    def __init__(self, topic: str, at_ms: int, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.topic = topic
        self.at_ms = at_ms
        self.error = error

    def explain(self, limit: TimestampLimit) -> str:
        """What the broker said and what to do."""
        said = (
            f"the broker refused a record for {self.topic} stamped {_utc(self.at_ms)} "
            f"({type(self.error).__name__}: {self.error}); stopped, since it would refuse "
            "the records after it too."
        )
        from kafka.errors import InvalidRecordError, InvalidTimestampError

        # Kafka 4 answers INVALID_RECORD, with "Timestamp ... is out of range" in its message
        if isinstance(self.error, InvalidTimestampError) or (
            isinstance(self.error, InvalidRecordError) and "timestamp" in str(self.error).lower()
        ):
            return (
                f"{said} Kafka accepts a timestamp only within the topic's limits of its own "
                f"clock ({limit.describe()}): check the broker's clock, give a --start within "
                "them, or keep event time at the wall clock's pace with --realtime --speed 1"
            )
        return f"{said} Check the topic's settings and evald's permissions on it, then run again"


class Acks:
    """The broker's answer to every send: the futures are kept in send order and counted as
    they complete (cheaper per record than a callback and an errback on each)."""

    def __init__(self) -> None:
        self.acknowledged = 0
        #: the first refused record; every send after it stops the run
        self.refusal: Refused | None = None
        self._waiting: deque[tuple[Any, str, int]] = deque()

    def watch(self, future: Any, topic: str, at_ms: int) -> None:
        self._waiting.append((future, topic, at_ms))
        self.settle()

    def settle(self) -> None:
        """Count the answers in so far (the futures complete about in send order)."""
        waiting = self._waiting
        while waiting and waiting[0][0].is_done:
            future, topic, at_ms = waiting.popleft()
            if future.exception is None:
                self.acknowledged += 1
            elif self.refusal is None:
                self.refusal = Refused(topic, at_ms, future.exception)


class Horizon:
    """Keeps event time within what the broker accepts: a record stamped further ahead of the
    wall clock than the topics' ``message.timestamp.after.max.ms`` (less a margin) waits until
    the wall clock catches up, so event time then advances at the wall clock's pace. Says so
    once, with why and what else to do."""

    def __init__(
        self,
        limit: TimestampLimit,
        args: argparse.Namespace,
        *,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        stream: TextIO = sys.stderr,
    ) -> None:
        self.limit = limit
        self.realtime = bool(args.realtime)
        self.wall_ms = wall_ms
        self.stream = stream
        self.reached = False

    def hold(self, at_ms: int) -> float:
        """Seconds until a record stamped ``at_ms`` is within the limit (0: send it now)."""
        latest = self.limit.latest_ms(self.wall_ms())
        if latest is None or at_ms <= latest:
            return 0.0
        if not self.reached:
            self.reached = True
            ahead = readable((at_ms - self.wall_ms()) / 1000)
            advice = (
                "--speed 1 keeps event time at the wall clock"
                if self.realtime
                else "fewer --events, an earlier --start or --realtime keep a burst within it"
            )
            self.stream.write(
                f"evald produce: event time {_utc(at_ms)} is {ahead} ahead of the wall clock, "
                f"as far as the broker accepts ({self.limit.describe()}); from here on it "
                f"advances with the wall clock ({advice})\n"
            )
            self.stream.flush()
        return (at_ms - latest) / 1000.0


def _input_topics(
    settings: Settings, partitions: int
) -> tuple[TimestampLimit, TopicsEnd | None] | None:
    """Create the input topics that do not exist (``partitions`` each) and say which exist;
    return their timestamp limit and newest record time. None (after saying why) when Kafka
    cannot be reached."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    from evald.daemon.topic_time import last_event_time, timestamp_limit

    client = settings.kafka.client_config()
    wanted = [settings.topics.impressions, settings.topics.feedback]
    try:
        admin = KafkaAdminClient(bootstrap_timeout_ms=client["request_timeout_ms"], **client)
    except KafkaError as exc:
        servers = ",".join(settings.kafka.bootstrap_servers)
        print(
            f"evald produce: cannot reach Kafka at {servers} ({exc}); "
            "check --bootstrap-servers and that the broker is up",
            file=sys.stderr,
        )
        return None
    try:
        existing = set(admin.list_topics())
        create = [t for t in wanted if t not in existing]
        if create:
            try:
                admin.create_topics([NewTopic(t, partitions, -1) for t in create])
                print(
                    f"evald produce: created topics {', '.join(create)} with "
                    f"{partitions} partitions each",
                    file=sys.stderr,
                )
            except TopicAlreadyExistsError:
                print(
                    f"evald produce: topics {', '.join(create)} appeared meanwhile", file=sys.stderr
                )
        kept = [t for t in wanted if t in existing]
        if kept:
            print(f"evald produce: writing to existing topics {', '.join(kept)}", file=sys.stderr)
        limit = timestamp_limit(admin, wanted)
    finally:
        admin.close()
    return limit, (last_event_time(client, kept) if kept else None)
