"""`evald run`: the Kafka consumer-group daemon (settings in docs/daemon.md, design in
docs/design.md)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from evald.cli import log_level
from evald.daemon.options import add_settings_flags, settings_from_args
from evald.daemon.settings import Settings, SettingsError
from evald.signals import StopSignals

if TYPE_CHECKING:
    from evald.engine import Engine
    from evald.webconfig import WebConfig

SUMMARY = "consume impressions and feedback from Kafka; write results exactly once; serve /metrics"
EXAMPLES = """\
  evald run --bootstrap-servers kafka:9092 --group-id evald
  evald run --config /etc/evald/evald.yaml --metrics-address :9464
  EVALD_KAFKA__SASL_PASSWORD=... evald run --config evald.yaml --sasl-username svc
exit status: 0 stopped by SIGTERM/SIGINT/SIGHUP, 2 invalid settings, the metrics address
taken, input topics missing, not co-partitioned or changed under the running daemon, a record
no retry can write, kafka.transaction_timeout_ms above the brokers' transaction.max.timeout.ms,
or bootstrap servers that answer as another service (HTTP, TLS); a broker not reachable (a
name that does not resolve yet, nothing listening) is retried, said in the log and on /readyz
"""

log = logging.getLogger("evald.daemon")

#: each one ends `evald run` the same way: stop fetching, commit, leave the group, exit 0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def configure(parser: argparse.ArgumentParser) -> None:
    """Settings flags plus logging."""
    add_settings_flags(parser)
    parser.add_argument(
        "--log-level",
        type=log_level,
        default=os.environ.get("EVALD_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR, any case (default: $EVALD_LOG_LEVEL or INFO)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or one JSON object per line for log pipelines (default: %(default)s)",
    )
    parser.add_argument(
        "--status-interval",
        default="1m",
        metavar="DURATION",
        help="log a status line (consumed/s, results/s, lag, watermark delay, pending, rejects) "
        "this often; 0 = never (default: %(default)s)",
    )


def _listen(server: Any) -> bool:
    """Start the metrics server; False, said on stderr, when it cannot listen (the port taken,
    say by a `make demo` still running, or a host name that does not resolve): no retry
    fixes that."""
    from evald.http import AddressError

    try:
        server.start()
    except AddressError as exc:  # a ValueError: it ended the run with a traceback
        print(
            f"evald run: daemon.metrics_address: {exc}; use an IP address or a host name this "
            "machine resolves (--metrics-address or daemon.metrics_address)",
            file=sys.stderr,
        )
        return False
    except OSError as exc:
        print(
            f"evald run: {exc.strerror or exc}; is another evald serving it? Choose another "
            "with --metrics-address or daemon.metrics_address (port 0: any free one)",
            file=sys.stderr,
        )
        return False
    return True


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT/SIGHUP; exit 0 after a clean stop, 2 on invalid
    settings/topics."""
    from evald.daemon.logs import setup_logging

    setup_logging(args.log_level, args.log_format)
    loaded = _load(args)
    if isinstance(loaded, int):
        return loaded
    settings, status_interval, web, factory = loaded

    from evald.daemon.main.runner import Daemon
    from evald.daemon.scrape import ScrapeLock
    from evald.daemon.stats import DaemonCollector, DaemonStats
    from evald.daemon.status import StatusReporter
    from evald.exposition import build_registry
    from evald.http import Heartbeat, MetricsServer

    stats = DaemonStats()
    # liveness: the loop beats every cycle and every retry, a restore whenever it reads
    # something (it fails after 60 s without); a poll (bounded by max_poll_interval) is the
    # longest it legitimately goes without one
    heartbeat = Heartbeat(
        max_age=max(180.0, 2 * settings.kafka.max_poll_interval_ms / 1000),
    )
    stages = _Stages(settings)
    daemon = Daemon(stages.main_settings, factory, stats=stats, heartbeat=heartbeat.beat)
    extra = [DaemonCollector(stats, include_ready=True), *stages.attach(daemon)]
    # evald_ready comes from the daemon's collector (it knows about partitions and the broker)
    # a scrape never waits out a commit stuck on the broker: /healthz and /readyz share its
    # worker threads (scrape.py)
    registry, collector = build_registry(None, lock=ScrapeLock(daemon.lock), extra=extra)
    # each session builds a fresh engine (restored from Kafka): point the collector at it
    daemon.on_engine = lambda engine: setattr(collector, "engine", engine)
    from evald.drilldown.page import QueriesPage

    queries = QueriesPage(lambda: collector.engine, ScrapeLock(daemon.lock))
    server = MetricsServer(
        settings.daemon.metrics_address,
        registry=registry,
        ready=daemon.ready,
        healthy=heartbeat,
        web=web,
        pages={"/queries": queries},
    )
    if not _listen(server):
        return 2
    timeout = settings.daemon.shutdown_timeout_s

    signals = _stop_on_signals(daemon, stages, timeout)
    log.info(
        "evald run: group %s, instance %s, metrics on %s",
        settings.daemon.group_id,
        settings.daemon.instance_id,
        server.url,
    )
    reporter = None
    if status_interval > 0:
        reporter = StatusReporter(
            lambda: collector.engine, stats, daemon.lock, status_interval, ready=daemon.ready
        )
        reporter.start()
    # what start-up allocated (modules, settings, the engine's tables) lives as long as the
    # process: out of the collector's reach, full collections no longer walk it every time
    gc.freeze()
    try:
        return stages.run(daemon.run, timeout, heartbeat.beat)
    finally:
        if reporter is not None:
            reporter.stop()
        heartbeat.stop()
        server.stop()
        signals.__exit__(None, None, None)


def _stop_on_signals(daemon: Any, stages: _Stages, timeout: float) -> StopSignals:
    """SIGTERM, SIGINT and SIGHUP stop the daemon cleanly. The handlers only note the signal
    (evald.signals: an Event.set in a handler can deadlock on the lock its own thread holds);
    the stop itself runs on the watcher's thread. SIGHUP (a closed terminal, a supervisor's
    "reload") would otherwise kill the process without a commit: there is nothing to reload."""

    def on_stop(reason: str) -> None:
        log.info("received %s: finishing (at most %.0fs)", reason, timeout)
        daemon.stop()
        stages.stop()
        # a broker that is gone must not keep us past the deadline: state is safe in Kafka
        watchdog = threading.Timer(timeout, _hard_exit, args=(timeout,))
        watchdog.daemon = True
        watchdog.start()

    signals = StopSignals(STOP_SIGNALS).__enter__()
    signals.watch(on_stop)
    return signals


class _Stages:
    """The main stage alone, or with the repartition stage (``input.repartition``) beside it:
    started first, since the main stage reads the internal topics it creates; a fatal error of
    either stops both (exit 2)."""

    def __init__(self, settings: Settings) -> None:
        from evald.daemon.repartition.stage import Repartitioner, main_stage_settings

        self.repartitioner = Repartitioner(settings) if settings.input.repartition else None
        #: what the main stage reads: the internal topics, re-keyed by request id, if any
        self.main_settings = main_stage_settings(settings) if self.repartitioner else settings

    def attach(self, daemon: Any) -> list[Any]:
        """Stop ``daemon`` on a fatal error of the stage; the collectors of the threads beside
        the main loop (the statistics topic reader, the stage)."""
        from evald.daemon.main.comparisons import StatisticsReaderCollector
        from evald.daemon.repartition.stage import RepartitionCollector

        collectors: list[Any] = [StatisticsReaderCollector(lambda: daemon.comparisons)]
        if self.repartitioner is None:
            return collectors
        self.repartitioner.on_fatal = daemon.stop
        return [*collectors, RepartitionCollector(self.repartitioner.stats)]

    def stop(self) -> None:
        if self.repartitioner is not None:
            self.repartitioner.stop()

    def run(self, main: Callable[[], int], timeout: float, beat: Callable[[], None]) -> int:
        """Run ``main`` (once the internal topics exist), then stop the repartition stage."""
        stage = self.repartitioner
        if stage is None:
            return main()
        stage.start()
        try:
            status = main() if stage.wait_ready(beat) else 0
        finally:
            stage.stop(timeout)
        return stage.status or status


def _load(
    args: argparse.Namespace,
) -> tuple[Settings, float, WebConfig | None, Callable[[Any], Engine]] | int:
    """The settings, the status interval, the web configuration and the engine factory; or
    the exit status (2) after saying which setting is invalid."""
    from evald.durations import DurationError, parse_duration
    from evald.engine import Engine
    from evald.mapping import MappingError, decoder_factory
    from evald.webconfig import WebConfigError, load_web_config

    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"evald run: invalid settings\n{exc}", file=sys.stderr)
        return 2
    try:
        status_interval = parse_duration(args.status_interval) / 1000
    except DurationError as exc:
        print(f"evald run: --status-interval: {exc}", file=sys.stderr)
        return 2
    try:
        web_file = settings.daemon.web_config_file
        web = load_web_config(web_file) if web_file else None
    except WebConfigError as exc:  # changed since the settings were checked
        print(f"evald run: invalid settings\ndaemon.web_config_file: {exc}", file=sys.stderr)
        return 2
    for warning in web.warnings if web is not None else ():
        log.warning("daemon.web_config_file: %s", warning)
    config = settings.engine_config()
    try:
        decoder = decoder_factory(settings.input.mapping, config)
    except MappingError as exc:  # changed since the settings were checked
        print(f"evald run: invalid settings\ninput.mapping: {exc}", file=sys.stderr)
        return 2

    def factory(on_result: Any) -> Engine:
        return Engine(config, on_result=on_result, decoder=decoder())

    return settings, status_interval, web, factory


def _hard_exit(timeout: float) -> None:
    log.warning(
        "clean shutdown did not finish within %.0fs; exiting (uncommitted work is "
        "replayed by the next owner)",
        timeout,
    )
    logging.shutdown()
    os._exit(0)
