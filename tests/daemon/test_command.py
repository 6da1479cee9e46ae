"""`evald run`'s start-up, short of a broker: what it sets up before the loop runs."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from evald import cli
from evald.daemon import command


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_start_up_objects_are_frozen_before_the_loop(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a full collection walked the ~100k objects of modules and settings each time: 0.2 s of
    # CPU in kafka_bench's quick drain (docs/performance.md); frozen, it skips them
    frozen_at_loop: list[int] = []

    def loop(self: object, main: object, timeout: float, beat: object) -> int:
        frozen_at_loop.append(gc.get_freeze_count())
        return 0

    monkeypatch.setattr(command._Stages, "run", loop)
    status = cli.main(
        ["run", "--bootstrap-servers", "127.0.0.1:9", "--metrics-address", "127.0.0.1:0"]
    )
    assert status == 0
    assert frozen_at_loop and frozen_at_loop[0] > 10_000
