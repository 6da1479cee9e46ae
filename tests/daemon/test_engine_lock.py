"""The engine lock: re-entrant for its owner, let go of only when held exactly once."""

from __future__ import annotations

import threading

import pytest

from evald.daemon.main.engine_lock import EngineLock


def taken_elsewhere(lock: EngineLock) -> bool:
    """Whether another thread can take the lock now (and gives it back)."""
    got: list[bool] = []

    def other() -> None:
        if lock.acquire(timeout=0.05):
            got.append(True)
            lock.release()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    return bool(got)


def test_reentrant_for_its_owner_and_counted() -> None:
    lock = EngineLock()
    with lock:
        with lock:
            assert lock.held() == 2
            assert not taken_elsewhere(lock)
        assert lock.held() == 1
    assert lock.held() == 0
    assert taken_elsewhere(lock)


def test_released_lets_readers_in_and_takes_it_back() -> None:
    lock = EngineLock()
    with lock:
        with lock.released():
            assert lock.held() == 0
            assert taken_elsewhere(lock)
        assert lock.held() == 1
        assert not taken_elsewhere(lock)


def test_released_takes_it_back_when_the_wait_fails() -> None:
    lock = EngineLock()
    with lock:
        with pytest.raises(TimeoutError), lock.released():
            raise TimeoutError("the broker did not answer")
        assert lock.held() == 1


@pytest.mark.parametrize("depth", [0, 2])
def test_released_refuses_unless_held_exactly_once(depth: int) -> None:
    """Held twice, an outer block would run on with the engine unlocked without knowing it."""
    lock = EngineLock()
    for _ in range(depth):
        lock.acquire()
    with pytest.raises(RuntimeError, match=f"not {depth} times"), lock.released():
        pass
    assert lock.held() == depth


def test_only_the_owner_releases() -> None:
    lock = EngineLock()
    with pytest.raises(RuntimeError):
        lock.release()
