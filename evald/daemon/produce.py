"""`evald produce`: write the demo simulator's traffic into the impressions and feedback topics.

Records are keyed by request_id (so the default partitioner co-partitions the two topics) and
carry the simulated arrival time as their Kafka timestamp, which is the order `evald run` merges
the two topics in.

Every run is fresh by default: event time starts now (dashboards and the watermark panel show
the present, not a fixed date) and request ids carry a new run id, so a second run never
collides with the first (same ids with different results, orphaned feedback). ``--start`` and
``--run-id`` reproduce a stream exactly. ``--output FILE`` writes the same records as JSON Lines
for `evald replay` instead of Kafka. SIGTERM stops like Ctrl-C: what was sent is flushed and
counted, exit 0 (as PID 1 in a container, `docker compose stop` returns at once).
"""

from __future__ import annotations

import argparse
import re
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

from evald.daemon.settings import Settings, SettingsError

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
    if text.strip().isdigit():
        return int(text)
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


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


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
        type=_positive(int),
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
        type=_positive(float),
        default=10.0,
        metavar="SECONDS",
        help="a progress line on stderr this often (default: %(default)s)",
    )


def _traffic_flags(traffic: argparse._ArgumentGroup) -> None:
    """The shape of the simulated traffic."""
    traffic.add_argument(
        "--events",
        type=_positive(int),
        default=None,
        help="stop after this many records (default: endless with --realtime, else 100000)",
    )
    traffic.add_argument("--seed", type=int, default=0, help="simulation seed (default: 0)")
    traffic.add_argument(
        "--rate",
        type=_positive(float),
        default=3_000.0,
        help="records per wall second; with --speed it sets the traffic density in event time "
        "(default: %(default)s)",
    )
    traffic.add_argument(
        "--speed",
        type=_positive(float),
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
        type=float,
        default=None,
        metavar="SECONDS",
        help="wall seconds (at --speed) after which the treatment arm's ranker degrades, so "
        "dashboards and alerts have a drop to show (default: never)",
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


class _Stop:
    """Set by SIGTERM/SIGINT; the produce loop checks it between records."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""

    def __call__(self, signum: int, _frame: object) -> None:
        self.reason = signal.Signals(signum).name
        self.event.set()


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
    )
    limit = args.events if args.events is not None else (None if args.realtime else 100_000)
    return islice(sim.events(), limit)


def write(
    events: Iterable[SimEvent],
    send: Callable[[SimEvent], None],
    progress: Progress,
    stop: threading.Event,
    *,
    pace: float | None,
    start_ms: int,
) -> None:
    """Send each event (paced at ``pace`` event-time seconds per wall second if given) until
    the events end or ``stop`` is set."""
    from evald.demo.simulator import IMPRESSION

    started = time.monotonic()
    for event in events:
        if pace is not None:
            due = (event.at_ms - start_ms) / 1000.0 / pace
            delay = due - (time.monotonic() - started)
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
    start_ms = args.start if args.start is not None else int(time.time() * 1000)
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if args.output is not None:
            return _to_file(args, run_id, start_ms, stop)
        return _to_kafka(args, run_id, start_ms, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _describe(run_id: str, start_ms: int) -> str:
    moment = datetime.fromtimestamp(start_ms / 1000, tz=timezone.utc)
    return f"run id {run_id}, event time from {moment.strftime('%Y-%m-%dT%H:%M:%SZ')}"


def _finish(progress: Progress, stop: _Stop, where: str) -> int:
    why = f" (stopped by {stop.reason})" if stop.reason else ""
    print(f"{progress.line()}{why}; written to {where}", file=sys.stderr)
    return 0


def _stream(
    args: argparse.Namespace,
    run_id: str,
    start_ms: int,
    stop: _Stop,
    send: Callable[[SimEvent], None],
    progress: Progress,
) -> None:
    """The run's simulated traffic into ``send``, paced with ``--realtime``, until done or
    stopped; the file and the Kafka output differ only in ``send``."""
    pace = args.speed if args.realtime else None
    write(
        simulate(args, run_id, start_ms), send, progress, stop.event, pace=pace, start_ms=start_ms
    )


def _to_file(args: argparse.Namespace, run_id: str, start_ms: int, stop: _Stop) -> int:
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


def _to_kafka(args: argparse.Namespace, run_id: str, start_ms: int, stop: _Stop) -> int:
    from evald.daemon.options import flag_overrides
    from evald.daemon.settings import load_settings

    try:
        settings = load_settings(file=args.config, flags=flag_overrides(args))
    except SettingsError as exc:
        print(f"evald produce: invalid settings\n{exc}", file=sys.stderr)
        return 2
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    if not _input_topics(settings, args.partitions):
        return 1
    client = settings.kafka.client_config()
    topics = settings.topics
    print(f"evald produce: {_describe(run_id, start_ms)}", file=sys.stderr)
    try:
        producer = KafkaProducer(linger_ms=20, **client)
    except KafkaError as exc:
        print(f"evald produce: cannot start a Kafka producer: {exc}", file=sys.stderr)
        return 1
    progress = Progress(sys.stderr, args.progress_interval)
    from evald.demo.simulator import IMPRESSION

    def send(event: SimEvent) -> None:
        topic = topics.impressions if event.kind == IMPRESSION else topics.feedback
        producer.send(topic, key=event.key, value=event.value, timestamp_ms=event.at_ms)

    try:
        _stream(args, run_id, start_ms, stop, send, progress)
        producer.flush()
    except KafkaError as exc:
        print(
            f"{progress.line()}; then Kafka failed: {exc}. Check the broker and run again "
            "(a new run gets new request ids, so the records already written do not collide)",
            file=sys.stderr,
        )
        return 1
    finally:
        producer.close(timeout=5)
    return _finish(progress, stop, f"{topics.impressions} / {topics.feedback}")


def _input_topics(settings: Settings, partitions: int) -> bool:
    """Create the input topics that do not exist (``partitions`` each) and say which exist;
    False (after saying why) when Kafka cannot be reached."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    client = settings.kafka.client_config()
    wanted = (settings.topics.impressions, settings.topics.feedback)
    try:
        admin = KafkaAdminClient(bootstrap_timeout_ms=client["request_timeout_ms"], **client)
    except KafkaError as exc:
        servers = ",".join(settings.kafka.bootstrap_servers)
        print(
            f"evald produce: cannot reach Kafka at {servers} ({exc}); "
            "check --bootstrap-servers and that the broker is up",
            file=sys.stderr,
        )
        return False
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
    finally:
        admin.close()
    return True
