"""The drained engine most exposition tests read."""

from __future__ import annotations

import pytest

from evald.engine import Engine

from .support import (
    COMPARED,
    INTERLEAVED,
    MINUTE,
    Served,
    feed_all,
    make_engine,
    traffic,
)


@pytest.fixture(scope="module")
def drained() -> tuple[Engine, list[Served]]:
    """300 impressions over two 5-minute windows, two partitions, fed in order and drained."""
    served, events = traffic(seed=11, n=300, span_ms=10 * MINUTE)
    engine = make_engine(
        statistics=COMPARED,
        interleaving=INTERLEAVED,
        zero_feedback={"depth": 5},
        global_statistics=True,
        click_model={"model": "pbm", "refit_every": 100},  # a refit per 100 lists
    )
    feed_all(engine, events)
    engine.drain()
    return engine, served
