"""The int FIFO and the deadline queue against plain-Python references."""

from __future__ import annotations

import numpy as np

from evald.join.queues import DeadlineQueue, IntFifo, ObjectFifo


def test_int_fifo_keeps_order_across_compactions() -> None:
    fifo = IntFifo()
    expected: list[int] = []
    rng = np.random.default_rng(5)
    for step in range(30_000):  # long enough to compact the drained front several times
        if expected and rng.random() < 0.45:
            assert fifo.popleft() == expected.pop(0)
        else:
            fifo.append(step)
            expected.append(step)
        assert len(fifo) == len(expected)
        if expected:
            assert fifo[0] == expected[0]
    assert fifo.take_all() == expected
    assert len(fifo) == 0


def _reference_order(pushes: list[tuple[int, int]]) -> list[int]:
    """Values by deadline; ties go in push order (what a FIFO-then-heap merge yields when the
    pushes that join the FIFO are the ones at or after the running maximum)."""
    fifo, heap, tail = [], [], None
    for seq, (due, value) in enumerate(pushes):
        if tail is None or due >= tail:
            fifo.append((due, 0, len(fifo), value))
            tail = due
        else:
            heap.append((due, 1, seq, value))
    return [value for *_, value in sorted(fifo + heap)]


def test_deadline_queue_pops_in_deadline_order_fifo_first_on_ties() -> None:
    rng = np.random.default_rng(9)
    deadlines = {v: int(rng.integers(0, 50)) for v in range(2_000)}
    pushes = [(deadlines[v], v) for v in range(2_000)]
    queue: DeadlineQueue[int] = DeadlineQueue(deadlines.__getitem__, IntFifo())
    for due, value in pushes:
        queue.push(due, value)
    popped = [queue.pop() for _ in range(len(queue))]
    assert popped == _reference_order(pushes)


def test_pop_due_stops_at_the_watermark_and_reports_the_next_deadline() -> None:
    deadlines = {"a": 10, "b": 20, "c": 5, "d": 30}
    queue: DeadlineQueue[str] = DeadlineQueue(deadlines.__getitem__, ObjectFifo())
    for value in "abcd":
        queue.push(deadlines[value], value)
    assert queue.pop_due(4) == ([], 5)
    assert queue.pop_due(20) == (["c", "a", "b"], 30)  # the boundary closes
    assert queue.min_deadline() == 30
    assert queue.pop_due(100)[0] == ["d"]
    assert queue.min_deadline() is None


def test_take_all_slots_matches_repeated_pops() -> None:
    rng = np.random.default_rng(2)
    ts = rng.integers(0, 1_000, size=500).astype(np.int64)
    window = 100

    def filled() -> DeadlineQueue[int]:
        queue: DeadlineQueue[int] = DeadlineQueue(lambda s: int(ts[s]) + window, IntFifo())
        for slot in range(len(ts)):
            queue.push(int(ts[slot]) + window, slot)
        return queue

    one = filled()
    assert filled().take_all_slots(ts, window) == [one.pop() for _ in range(len(one))]
