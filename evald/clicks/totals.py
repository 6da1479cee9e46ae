"""ClickTotals: the IPS and debiased sums a process scored itself, the click counters' values.

A partition's checkpointed sums are its whole history and move with it, so a process that
exported the sums of the partitions it owns lost a moved partition's history (a counter that
goes down) while its next owner gained it (counted again by ``increase`` over the instances).
The counters export instead what the process's own scoring added: per partition its sums minus
those it loaded, and a dropped partition's share kept. Summed over instances, each list is so
counted once, by the process that scored it (docs/metrics-reference.md, "Click model").

Sums are integers in units of 2^-32 (evald/clicks/stream.py, live_measures.py): they add and
subtract in any order to the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["UNIT", "ClickTotals", "DebiasedCells", "IpsSums", "add_debiased", "add_ips"]

#: the sums' unit: 2^-32
UNIT = float(1 << 32)

#: per segment (label values): [Σ w·c, Σ w·θ, ranks shown]
IpsSums = dict[tuple[str, ...], list[int]]
#: per segment (label values): per measure, [Σ value, Σ value², lists]
DebiasedCells = dict[tuple[str, ...], list[list[int]]]


def add_ips(into: IpsSums, sums: IpsSums, sign: int = 1) -> None:
    """``into += sign · sums``, segment by segment (a segment once in ``into`` stays)."""
    for labels, row in sums.items():
        held = into.setdefault(labels, [0, 0, 0])
        for i, x in enumerate(row):
            held[i] += sign * x


def add_debiased(into: DebiasedCells, sums: DebiasedCells, m: int, sign: int = 1) -> None:
    """``into += sign · sums`` for ``m`` measures, segment by segment."""
    for labels, row in sums.items():
        held = into.setdefault(labels, [[0, 0, 0] for _ in range(m)])
        for cell, add in zip(held, row, strict=True):
            for i, x in enumerate(add):
                cell[i] += sign * x


@dataclass(frozen=True)
class ClickTotals:
    """The IPS sums and the debiased sums (of the measures ``names``) a process scored."""

    names: tuple[str, ...] = ()
    ips: IpsSums = field(default_factory=dict)
    debiased: DebiasedCells = field(default_factory=dict)

    def plus(self, other: ClickTotals) -> ClickTotals:
        """The sum, segment by segment (a new value)."""
        out = self.copy()
        add_ips(out.ips, other.ips)
        add_debiased(out.debiased, other.debiased, len(self.names))
        return out

    def copy(self) -> ClickTotals:
        return ClickTotals(
            self.names,
            {labels: list(row) for labels, row in self.ips.items()},
            {labels: [list(cell) for cell in row] for labels, row in self.debiased.items()},
        )

    def ips_rows(self) -> list[tuple[tuple[str, ...], float, float, float]]:
        """Per segment (label values, sorted): the IPS-weighted clicks, their expected weight
        and the ranks shown."""
        return [
            (labels, row[0] / UNIT, row[1] / UNIT, float(row[2]))
            for labels, row in sorted(self.ips.items())
        ]

    def debiased_rows(self) -> list[tuple[tuple[str, ...], str, float, float, int]]:
        """Per segment (label values, sorted) and measure: (labels, measure, Σ value,
        Σ value², lists with a finite value)."""
        return [
            (labels, name, cell[0] / UNIT, cell[1] / UNIT, cell[2])
            for labels, row in sorted(self.debiased.items())
            for name, cell in zip(self.names, row, strict=True)
        ]
