"""The log's repeat limit (logs.py): a flood of one warning is cut to a few lines and counted."""

from __future__ import annotations

import io
import logging

from settable_clock import SettableClock

from evald.daemon.logs import RepeatLimit, TextFormatter


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
