"""`evald demo`: simulated A/B search traffic through the real engine, live.

The simulator's records are fed to an :class:`~evald.engine.Engine` paced in wall time (event
time runs ``--speed`` times faster), ``/metrics`` is served on ``--metrics-address`` and a live
view shows per-segment quality. Half-way (``--regress-at``) the treatment arm's ranker degrades
so the drop shows in the view and in Prometheus. Ctrl-C or SIGTERM stops it cleanly: the
engine is drained, a final before/after summary printed, exit status 0.

Heavy imports (numpy, the engine) happen inside :func:`run` so ``evald --help`` stays fast.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # typing only: run() imports these, so `evald --help` stays light
    from evald.config import EngineConfig
    from evald.decode import Rejection
    from evald.demo.live import Health, LiveView, SegmentSummary, Snapshot, Versus
    from evald.demo.simulator import SimEvent, Simulator
    from evald.engine import Engine
    from evald.http import MetricsServer
    from evald.webconfig import WebConfig

SUMMARY = "simulated A/B search traffic through the full engine: live view and /metrics"

EXAMPLES = """\
  evald demo                              # until Ctrl-C; /metrics on http://127.0.0.1:9464/metrics
  evald demo --duration 120               # two minutes; the treatment regresses after one
  evald demo --regress-at 20 --speed 120  # faster event time, an early regression
  evald demo --no-live --duration 30      # plain summary lines, e.g. into a log file
  evald demo --metrics-address 127.0.0.1:0 --duration 10   # any free port (printed)
"""

#: wall seconds before the regression when the run has no --duration
DEFAULT_REGRESS_AT = 40.0

#: share of the requests served as a team-draft interleaved list of the two rankers (their own
#: segments, arm "interleaved"): at the default rate and speed its verdict comes within the
#: first half minute on both surfaces (docs/statistics.md, "Interleaving", "In the demo")
DEFAULT_INTERLEAVE = 0.2


#: the largest --duration, --speed, --rate or --regress-at (and `evald produce`'s): 31 years
#: of seconds, a billion-fold speed; past it event times overflow (1e308 was a traceback)
MAX_NUMBER = 1e9


def positive(kind: type, most: float = MAX_NUMBER) -> Callable[[str], Any]:
    """A flag's parser: a positive ``kind`` up to ``most``. Times and rates stop at
    ``MAX_NUMBER`` (event times must stay within what a timestamp can spell); counts at what
    they are counted in."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 0 < value <= most:
            raise argparse.ArgumentTypeError(
                f"must be a positive number up to {most:g}, got {text!r}"
            )
        return value

    return parse


def regress_seconds(text: str) -> float | None:
    """``--regress-at``: seconds from 0 to :data:`MAX_NUMBER`, or ``off`` (None)."""
    if text.strip().lower() in ("off", "never", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'off', got {text!r}") from None
    if not 0 <= value <= MAX_NUMBER:
        raise argparse.ArgumentTypeError(
            f"must be from 0 to {MAX_NUMBER:g} seconds, or 'off', got {text!r}"
        )
    return value


def seed(text: str) -> int:
    """``--seed``: a non-negative integer (numpy's generators refuse a negative one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


#: The demo's comparison: treatment against control per surface, folded every 5 minutes of
#: event time (5 wall seconds at the default speed) from the first window on, alerting on
#: nDCG@10 and RR with a minimum effect of 0.01 (docs/statistics.md, "How it is wired").
STATISTICS: dict[str, object] = {
    "window": "5m",
    "comparisons": [
        {
            "name": "demo",
            "label": "arm",
            "control": "control",
            "treatments": ["treatment"],
            "start": 0,
            "arm_scoped_labels": ["model"],
            "min_effect": {"nDCG@10": 0.01, "RR": 0.01},
        }
    ],
}


#: The catalogue queries the demo's regression degrades: ``q0`` to ``q4``, the five most frequent,
#: about a third of the traffic (with fewer, the treatment's lead on the other queries hides the
#: drop for longer than a short run). The screen names what the attribution finds, not these.
REGRESSED_QUERIES: tuple[int, ...] = (0, 1, 2, 3, 4)


#: The demo's interleaving test: the simulator's two rankers (``simulator.TEAMS``, the models of
#: control and treatment) as teams, a look every 5 minutes of event time.
INTERLEAVING: dict[str, object] = {"window": "5m", "teams": ["ranker-v1", "ranker-v2"]}


def share(text: str) -> float:
    """A share of the traffic in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a share in [0, 1], got {text!r}")
    return value


def _interleave_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interleave",
        type=share,
        default=DEFAULT_INTERLEAVE,
        metavar="SHARE",
        help="share of the requests served as one team-draft list of both rankers, credited "
        "per team (0: none; default: %(default)s)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=positive(float),
        metavar="SECONDS",
        help="stop after this many wall seconds (default: run until Ctrl-C)",
    )
    parser.add_argument(
        "--metrics-address",
        default="127.0.0.1:9464",
        metavar="HOST:PORT",
        help="serve /metrics /healthz /readyz here (default: %(default)s; port 0 = any free)",
    )
    parser.add_argument(
        "--web-config-file",
        metavar="FILE",
        help="TLS and basic auth for the endpoint, in the Prometheus exporter web config "
        "format (docs/security.md)",
    )
    parser.add_argument(
        "--speed",
        type=positive(float),
        default=60.0,
        help="event time runs this many times faster than wall time (default: %(default)s)",
    )
    parser.add_argument(
        "--rate",
        type=positive(float),
        default=3000.0,
        metavar="EVENTS_PER_S",
        help="records fed per wall second, approximately (default: %(default)s)",
    )
    parser.add_argument("--seed", type=seed, default=0, help="simulation seed (default: 0)")
    parser.add_argument(
        "--regress-at",
        type=regress_seconds,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="wall seconds after start when the treatment ranker degrades, or 'off' "
        f"(default: half of --duration, else {DEFAULT_REGRESS_AT:g})",
    )
    _interleave_flag(parser)
    parser.add_argument(
        "--window",
        default="5m",
        metavar="DURATION",
        help="attribution window of the join, in event time (default: %(default)s)",
    )
    parser.add_argument(
        "--lateness",
        default="2m",
        metavar="DURATION",
        help="allowed lateness: watermark = newest event time - lateness (default: %(default)s)",
    )
    parser.add_argument(
        "--no-live",
        action="store_true",
        help="print plain summary lines every few seconds instead of the live table",
    )


def regress_at(args: argparse.Namespace) -> float | None:
    """The wall second of the regression: explicit, else mid-run, else a fixed default."""
    if hasattr(args, "regress_at"):
        return args.regress_at
    if args.duration is not None:
        return args.duration / 2
    return DEFAULT_REGRESS_AT


def run(args: argparse.Namespace) -> int:
    from evald.config import ConfigError, load_config
    from evald.exposition.budget import check_series_budget
    from evald.http import AddressError
    from evald.webconfig import WebConfigError, load_web_config

    try:
        config = load_config(
            window=args.window,
            lateness=args.lateness,
            statistics=STATISTICS,
            interleaving=INTERLEAVING,
            zero_feedback={"depth": 10},  # RBO with control the moment the treatment regresses
            click_model="pbm",  # the position-bias curve live (docs/click-models.md)
        )
        check_series_budget(config)
    except ConfigError as exc:
        print(f"evald demo: --{_first_line(exc)}", file=sys.stderr)
        return 2
    try:
        web = load_web_config(args.web_config_file) if args.web_config_file else None
    except WebConfigError as exc:
        print(f"evald demo: --web-config-file {exc}", file=sys.stderr)
        return 2
    for warning in web.warnings if web is not None else ():
        print(f"evald demo: warning: --web-config-file {warning}", file=sys.stderr)
    try:
        demo = build_demo(
            config,
            seed=args.seed,
            rate=args.rate,
            speed=args.speed,
            regress_at_s=regress_at(args),
            interleave=args.interleave,
            metrics_address=args.metrics_address,
            web=web,
            live=not args.no_live and sys.stdout.isatty(),
            stream=sys.stdout,
        )
    except AddressError as exc:
        print(f"evald demo: --metrics-address: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            hint = (
                f"; is another evald already serving {args.metrics_address}? "
                f"{_free_port_command()} picks any free port (the URL is printed)"
            )
        print(f"evald demo: {exc}{hint}", file=sys.stderr)
        return 1
    return _run_with_signals(demo, args.duration)


def _free_port_command() -> str:
    """The command that runs the demo again on a free port, as the user can type it: make
    passes flags only through ARGS (make sets MAKELEVEL in the environment of its recipes)."""
    if os.environ.get("MAKELEVEL"):
        return 'make demo ARGS="--metrics-address 127.0.0.1:0"'
    return "evald demo --metrics-address 127.0.0.1:0"


def _run_with_signals(demo: DemoLoop, duration: float | None) -> int:
    """Run until the duration ends or SIGINT/SIGTERM asks to stop; always drain and report."""
    import signal

    previous: dict[signal.Signals, Any] = {}  # whatever signal.signal() handed back

    def ask_stop(signum: int, _frame: object) -> None:
        demo.stop(signal.Signals(signum).name)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, ask_stop)
    try:
        demo.run(duration)
    finally:
        demo.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class DemoLoop:
    """Feeds simulated records to the engine in (sped-up) real time and keeps the view fresh.

    Single-threaded: the loop owns the engine; the HTTP thread only scrapes, under ``lock``.
    ``clock`` and ``sleep`` are injected so tests can drive time.
    """

    def __init__(
        self,
        engine: Engine,
        simulator: Simulator,
        view: LiveView,
        *,
        lock: threading.Lock,
        server: MetricsServer | None = None,
        regress_at_ms: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        tick_interval: float = 0.1,
        max_batch: int = 20_000,
        on_beat: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.simulator = simulator
        self.view = view
        self.lock = lock
        self.server = server
        self.regress_at_ms = regress_at_ms
        self.clock = clock
        self.sleep = sleep
        self.tick_interval = tick_interval
        self.max_batch = max_batch
        self.on_beat = on_beat
        self.fed = 0
        self.event_time_ms = simulator.start_ms
        self.stop_reason: str | None = None
        self.running = False
        #: the last rejected records, kept for the view (the counters are in engine.stats)
        self.rejections: deque[Rejection] = deque(maxlen=20)
        #: event time between the simulated clock and the oldest record not fed yet
        self.behind_ms = 0
        #: records the engine raised on instead of rejecting (should stay 0)
        self.engine_errors = 0
        self._rate = (0.0, 0)  # (wall time, fed) at the previous frame
        self._events_per_s = 0.0

    def _engine_error(self, event: SimEvent) -> None:
        """Count a record the engine raised on (it should have returned a Rejection)."""
        self.engine_errors += 1
        if self.engine_errors == 1:
            import traceback

            print(
                f"evald demo: the engine raised on the {event.kind} record {event.value[:120]!r};"
                " skipping such records (a bug: bad data must be rejected, not raise)",
                file=sys.stderr,
            )
            traceback.print_exc(file=sys.stderr)

    def stop(self, reason: str = "stop") -> None:
        """Ask the loop to finish (signal-handler safe: only sets a flag)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def run(self, duration: float | None = None) -> None:
        """Feed until ``duration`` wall seconds pass or :meth:`stop`; then drain and report."""
        from evald.decode import Rejection

        events: Iterator[SimEvent] = iter(self.simulator)
        speed_ms = self.simulator.speed * 1000.0
        start = self.clock()
        self._rate = (start, 0)
        last_tick = start
        head = next(events, None)
        self.running = True
        while self.stop_reason is None and head is not None:
            now = self.clock()
            if duration is not None and now - start >= duration:
                self.stop("duration")
                break
            due_ms = self.simulator.start_ms + (now - start) * speed_ms
            batch = 0
            with self.lock:
                while head is not None and head.at_ms <= due_ms and batch < self.max_batch:
                    try:
                        # the simulated arrival time is the reference time, as the record
                        # timestamp `evald produce` writes is for `evald run`
                        out = self.engine.feed(head.value, kind=head.kind, timestamp=head.at_ms)
                    except Exception:  # an engine bug must not end the demo; say so loudly
                        self._engine_error(head)
                        out = None
                    if isinstance(out, Rejection):
                        self.rejections.append(out)
                    head = next(events, None)
                    batch += 1
                self.fed += batch
                # records due but not fed yet: the engine cannot keep up with --rate
                self.behind_ms = 0 if head is None else max(0, int(due_ms) - head.at_ms)
                #: event time the feed has reached (the simulated clock, unless behind)
                self.event_time_ms = int(due_ms) - self.behind_ms
                if now - last_tick >= self.tick_interval:
                    self.engine.tick()
                    last_tick = now
            if self.on_beat is not None:
                self.on_beat()
            if self.view.due():
                self.view.show(self.snapshot())
            if batch < self.max_batch:  # caught up: wait for the next records to fall due
                self.sleep(0.02)
        self.running = False
        with self.lock:
            self.engine.drain()
        self.view.final(self.final_snapshot())

    def close(self) -> None:
        """Release the port (idempotent)."""
        if self.server is not None:
            self.server.stop()

    # ---------------------------------------------------------------- snapshots

    def _notes(self) -> list[str]:
        from evald.demo.live import hms

        notes: list[str] = []
        if self.regress_at_ms is not None:
            when = hms(self.regress_at_ms)
            picked = self.simulator.regressed_queries
            which = "every query" if picked is None else f"{len(picked)} of its queries"
            if self.event_time_ms < self.regress_at_ms:
                wall = (self.regress_at_ms - self.event_time_ms) / 1000 / self.simulator.speed
                notes.append(
                    f"treatment ranker degrades for {which} at {when} event time (in {wall:.0f}s)"
                )
            else:
                notes.append(f"treatment ranker degraded for {which} since {when} event time")
        if self.behind_ms > self.simulator.speed * 1000:
            behind = self.behind_ms / 1000 / self.simulator.speed
            notes.append(f"feeding {behind:.1f}s (wall) behind the simulated clock: lower --rate")
        if self.engine_errors:
            notes.append(f"engine errors (records skipped): {self.engine_errors:,}")
        if self.rejections:
            last = self.rejections[-1]
            notes.append(f"last rejected record: {last.reason}: {last.detail}"[:160])
        if self.server is not None:
            notes.append(f"metrics: {self.server.url}/metrics · Ctrl-C to stop")
        return notes

    def _health_now(self) -> Health:
        from evald.demo.live import health

        now = self.clock()
        then, fed = self._rate
        if now - then >= 0.5:
            self._events_per_s = (self.fed - fed) / (now - then)
            self._rate = (now, self.fed)
        marks = [m for m in self.engine.watermarks().values() if m is not None]
        return health(
            self.engine.stats,
            pending=self.engine.pending(),
            newest_ms=self.event_time_ms,
            watermark_ms=min(marks) if marks else None,
            events_per_s=self._events_per_s,
        )

    def snapshot(self) -> Snapshot:
        """The current frame: the last complete aggregate window against the one before."""
        from evald.demo.live import Snapshot, last_windows, summarize

        width = self.engine.aggregates.windows_ms[0]
        with self.lock:
            windows = last_windows(self.engine.complete_before(), width)
            current, previous = windows if windows else (None, None)
            rows = ab_rows(summarize(self.engine.aggregates, current, previous))
            versus = self._versus(current)
            health = self._health_now()
            comparison = self._comparison()
        notes = self._notes()
        return Snapshot(self.event_time_ms, current, rows, health, notes, comparison, versus)

    def _versus(self, span: tuple[int, int] | None) -> list[Versus]:
        """The table's treatment − control columns: each configured comparison's arms, merged
        over surfaces and models, in ``span`` (the caller holds the lock)."""
        from evald.demo.live import summarize, versus_control

        out: list[Versus] = []
        for comparison in self.engine.config.statistics.comparisons:
            arms = summarize(self.engine.aggregates, span, None, group_by=(comparison.label,))
            out += versus_control(arms, comparison.control, comparison.treatments)
        return out

    def _comparison(self) -> list[str]:
        """The persistent treatment-vs-control block of the view, then the interleaving test's
        lines."""
        from evald.demo.live import attribution_lines, comparison_lines, interleaving_lines
        from evald.drilldown.outputs import served_attribution

        live = self.engine.statistics
        lines = [] if live is None else comparison_lines(live.views(), self.regress_at_ms)
        lines += attribution_lines(served_attribution(self.engine))
        return lines + interleaving_lines(self.engine.interleaving.records())

    def final_snapshot(self) -> Snapshot:
        """After the drain: the run after the regression against the run before it.

        Without a regression inside the run (or when the buckets before it aged out of
        retention) it shows the whole run still in retention, without a trend.
        """
        from evald.demo.live import Snapshot, summarize

        agg = self.engine.aggregates
        bucket = agg.bucket_ms
        first = self.simulator.start_ms // bucket * bucket
        end = -(-self.event_time_ms // bucket) * bucket
        span = agg.bucket_range()
        kept_from = max(first, span[0] * bucket) if span else first
        before: tuple[int, int] | None = None
        after: tuple[int, int] = (kept_from, end)
        note = "whole run (no trend)"
        regress = self.regress_at_ms
        if regress is not None and kept_from == first:
            split_before, split_after = regress // bucket * bucket, -(-regress // bucket) * bucket
            if first < split_before and split_after < end:
                before, after = (first, split_before), (split_after, end)
                note = "after the regression (arrow: against before it)"
        with self.lock:
            rows = ab_rows(summarize(agg, after, before))
            versus = self._versus(after)
            health = self._health_now()
            comparison = self._comparison()
        reason = self.stop_reason or "end of traffic"
        notes = [note, f"stopped ({reason}) after feeding {self.fed:,} records; engine drained"]
        return Snapshot(self.event_time_ms, after, rows, health, notes, comparison, versus)


def ab_rows(rows: list[SegmentSummary]) -> list[SegmentSummary]:
    """The table's columns: the A/B arms. The interleaved lists (arm ``simulator.INTERLEAVED``)
    have their own lines, the interleaving test's; their mixed lists' measures would only
    crowd the table."""
    from evald.demo.simulator import INTERLEAVED

    mixed = f"{INTERLEAVED[0]} · "
    return [row for row in rows if not row.name.startswith(mixed)]


def demo_simulator(
    seed: int,
    rate: float,
    speed: float,
    start_ms: int,
    regress_at_ms: int | None,
    *,
    interleave: float = 0.0,
    regressed_queries: tuple[int, ...] | None = REGRESSED_QUERIES,
) -> Simulator:
    """The demo's traffic: its regression degrades the treatment for ``regressed_queries``
    only (None: every query, a drop spread evenly)."""
    from evald.demo.simulator import Simulator

    return Simulator(
        seed,
        rate=rate,
        speed=speed,
        start_ms=start_ms,
        regress_at_ms=regress_at_ms,
        regressed_queries=regressed_queries,
        interleave=interleave,
    )


def build_demo(
    config: EngineConfig,
    *,
    seed: int,
    rate: float,
    speed: float,
    regress_at_s: float | None,
    metrics_address: str,
    interleave: float = 0.0,
    live: bool,
    stream: TextIO,
    web: WebConfig | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> DemoLoop:
    """Wire simulator, engine, metrics server and view; the server is already listening."""
    from evald.demo.live import LiveView
    from evald.engine import Engine
    from evald.exposition import build_registry
    from evald.http import Heartbeat, MetricsServer

    start_ms = int(time.time() * 1000)
    regress_ms = None if regress_at_s is None else start_ms + int(regress_at_s * speed * 1000)
    simulator = demo_simulator(seed, rate, speed, start_ms, regress_ms, interleave=interleave)
    engine = Engine(config, global_statistics=True)  # one process sees every partition
    lock = threading.Lock()
    heartbeat = Heartbeat(max_age=30.0)
    holder: list[DemoLoop] = []

    def ready() -> tuple[bool, str]:
        """Ready while the loop feeds records; before the first record and after it stops the
        traffic is not flowing, and /readyz says so with a 503."""
        if holder and holder[0].running and holder[0].fed > 0:
            return True, "ok"
        return False, "simulated traffic is not flowing"

    registry, _ = build_registry(engine, lock=lock, ready=ready)
    from evald.drilldown.page import QueriesPage

    pages = {"/queries": QueriesPage(lambda: engine, lock)}
    server = MetricsServer(
        metrics_address, registry, ready=ready, healthy=heartbeat, web=web, pages=pages
    )
    server.start()
    view = LiveView(stream, tty=live, clock=clock)
    demo = DemoLoop(
        engine,
        simulator,
        view,
        lock=lock,
        server=server,
        regress_at_ms=regress_ms,
        clock=clock,
        on_beat=heartbeat.beat,
    )
    holder.append(demo)
    print(f"evald demo: serving {server.url}/metrics", file=sys.stderr, flush=True)
    return demo
