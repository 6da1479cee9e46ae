"""What `evald run` logs: a flood of one warning cut to a few lines and counted; from
kafka-python no ERROR for a member that has left already, no WARNING for a step of its I/O
thread that only waited for the CPU."""

from __future__ import annotations

import inspect
import io
import logging
import sys
from collections.abc import Iterator

import pytest
from kafka.coordinator.base import BaseCoordinator
from kafka.errors import CoordinatorNotAvailableError, UnknownMemberIdError
from settable_clock import SettableClock

from evald.daemon.kafka_compat import SLOW_TASK_S, net_client
from evald.daemon.logs import RepeatLimit, TextFormatter, setup_logging
from evald.daemon.settings import load_settings


def logger_with_limit(clock: SettableClock) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter())
    handler.addFilter(RepeatLimit(burst=3, window_s=60.0, clock=clock))
    logger = logging.getLogger(f"test-repeat-{id(out)}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.DEBUG)
    return logger, out


def test_a_flood_of_one_kind_is_cut_to_a_burst_per_window_and_counted() -> None:
    clock = SettableClock()
    log, out = logger_with_limit(clock)
    for i in range(500):  # kafka-python's metadata retries: one kind, many topics
        log.error("Topic %s is not authorized for this client", f"t{i % 7}")
        clock.now += 0.01
    log.warning("another kind")
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert [line.split(": ", 1)[1] for line in lines[:3]] == [
        "Topic t0 is not authorized for this client",
        "Topic t1 is not authorized for this client",
        "Topic t2 is not authorized for this client",
    ]
    clock.now += 60.0
    log.error("Topic %s is not authorized for this client", "t9")
    last = out.getvalue().splitlines()[-1]
    assert last.endswith(
        "Topic t9 is not authorized for this client (497 earlier lines like this not logged)"
    )
    log.error("Topic %s is not authorized for this client", "t10")  # a new window's burst
    assert out.getvalue().splitlines()[-1].endswith("Topic t10 is not authorized for this client")


def test_info_and_debug_lines_always_pass() -> None:
    """The status line repeats its format string every interval: never cut."""
    clock = SettableClock()
    log, out = logger_with_limit(clock)
    for i in range(50):
        log.info("status: consumed %d/s", i)
        log.debug("poll %d", i)
    assert len(out.getvalue().splitlines()) == 100


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    out = io.StringIO()
    setup_logging("INFO", "text", out)
    try:
        yield out
    finally:
        setup_logging("WARNING", "text", sys.stderr)


def test_leaving_as_a_member_the_coordinator_no_longer_knows_is_not_an_error(
    log: io.StringIO,
) -> None:
    # kafka-python's own call, as its coordinator makes it (checked below against its source)
    coordinator = logging.getLogger("kafka.coordinator")
    coordinator.error(
        "LeaveGroup request for member %s / group instance %s failed with error: %s",
        "evald-1",
        None,
        UnknownMemberIdError(),
    )
    coordinator.error("LeaveGroup request failed: %s", CoordinatorNotAvailableError())
    lines = log.getvalue().splitlines()
    assert " INFO kafka.coordinator: LeaveGroup request for member evald-1" in lines[0]
    assert "UnknownMemberIdError" in lines[0]
    assert " ERROR kafka.coordinator: LeaveGroup request failed" in lines[1]  # others stay
    source = inspect.getsource(BaseCoordinator._handle_leave_group_response)
    assert 'log.error("LeaveGroup request for member %s / group instance %s failed' in source


def test_a_first_assignment_before_the_topics_metadata_is_not_a_warning(
    log: io.StringIO,
) -> None:
    from kafka.coordinator.assignors import range as range_assignor

    logging.getLogger("kafka.coordinator.assignors.range").warning(
        "No partition metadata for topic %s", "evald.impressions"
    )
    logging.getLogger("kafka.coordinator.assignors.range").warning("something else")
    lines = log.getvalue().splitlines()
    assert " INFO kafka.coordinator.assignors.range: No partition metadata" in lines[0]
    assert " WARNING kafka.coordinator.assignors.range: something else" in lines[1]
    source = inspect.getsource(range_assignor)
    assert "log.warning('No partition metadata for topic %s', topic)" in source
    assert range_assignor.log.name == "kafka.coordinator.assignors.range"


def test_every_kafka_client_gets_a_one_second_slow_step_warning() -> None:
    config = load_settings(environ={}, validate_engine=False).kafka.client_config()
    assert config["kafka_client"] is net_client
    client = net_client(bootstrap_servers=["127.0.0.1:1"])
    try:
        assert client._net.config["slow_task_threshold_secs"] == SLOW_TASK_S == 1.0
    finally:
        client.close()
