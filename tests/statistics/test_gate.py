"""ShareGate: a window is handed out once every partition's mark passed it, in window order,
each (window, partition, chunk) once."""

from __future__ import annotations

from dataclasses import dataclass

from evald.statistics.gate import ShareGate

WIDTH = 10


@dataclass(frozen=True)
class Piece:
    start: int
    partition: int
    chunk: int = 0
    width: int = WIDTH


def test_a_window_waits_for_every_partition_then_comes_in_window_order() -> None:
    gate: ShareGate[Piece] = ShareGate(WIDTH)
    for piece in (Piece(10, 1), Piece(0, 1), Piece(0, 0, 1), Piece(0, 0)):
        gate.add(piece)
    gate.mark(0, 20)
    assert gate.unmarked([0, 1]) == [1]
    assert gate.complete([0, 1]) == []  # partition 1 has no mark yet
    gate.mark(1, 10)
    assert gate.complete([0, 1]) == [(0, [Piece(0, 0), Piece(0, 0, 1), Piece(0, 1)])]
    gate.mark(1, 5)  # a mark never moves back
    assert gate.final_until([0, 1]) == 10
    gate.mark(1, 20)
    assert gate.complete() == [(10, [Piece(10, 1)])]


def test_copies_late_shares_other_widths_and_refused_ones_are_ignored_and_counted() -> None:
    gate: ShareGate[Piece] = ShareGate(WIDTH)
    gate.add(Piece(0, 0))
    gate.add(Piece(0, 0))  # a copy
    gate.add(Piece(0, 1, width=20))  # another window width
    gate.add(Piece(0, 2), accepted=False)  # refused by its owner
    gate.mark(0, 10)
    assert gate.complete([0]) == [(0, [Piece(0, 0)])]
    gate.add(Piece(0, 3))  # its window was handed out
    assert gate.ignored == 4
    assert gate.complete([0]) == []
