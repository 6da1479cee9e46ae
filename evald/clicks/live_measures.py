"""DebiasedSums: the configured measures of ``evald run`` scored again on a click model's
relevance, summed per partition and segment (docs/click-models.md, "Debiased measures in
evald run").

Each list is scored, just before its partition's model observes it, with the relevance the
model gives its (query, item) pairs then: the attractiveness of the partition's last refit
for the pairs it keeps, the prior of that refit for the others (``debias.relevance_grades``'s
grade: relevance / ``relevant_at``), at most the model's depth. The lists of a segment no
refit of its partition has read yet are not counted (every pair still has the initial
relevance), the rule the IPS sums follow. So a list's values depend on the lists before it in
its partition, never on the clock.

Sums are kept as integers in units of 2^-32 (each list's value, and its square, rounded), so
they add up the same in any grouping and through any restart, to the last bit. A partition's
sums as of its model's last snapshot ride in its checkpointed click-model state; a restore
loads them and observes the logged lists again, which adds the rest. The counters export not
these histories but what the process scored beyond them (``scored``, evald/clicks/totals.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from evald.clicks.model import ClickModel
from evald.clicks.sessions import Sessions
from evald.clicks.totals import UNIT, DebiasedCells, add_debiased
from evald.metrics import Batch, evaluate, parse_measures

__all__ = ["UNIT", "DebiasedSums", "debiased_scores"]

#: per segment (label values): per measure, [Σ value, Σ value², lists], in units of 2^-32
Sums = DebiasedCells


def debiased_scores(
    model: ClickModel, piece: Sessions, measures: Sequence[Any], slots: np.ndarray | None = None
) -> np.ndarray:
    """float64 (lists, measures): each list scored on the model's relevance (the debiased
    grade; the ideal is the served grades sorted, as for the raw measures); ``slots``: the
    piece's pairs looked up in the model, when the caller has them."""
    shown = piece.shown()
    if slots is None:
        slots = model.pairs.lookup(piece.pairs)
    relevance = model.relevance(slots) / model.relevant_at
    grades = np.where(shown, relevance, 0.0)
    batch = Batch(grades, piece.lengths.astype(np.int64), -np.sort(-grades, axis=1), shown)
    scored = evaluate(list(measures), batch)
    out = np.empty((len(piece), len(measures)))
    for j, measure in enumerate(measures):
        out[:, j] = scored[measure]
    return out


class DebiasedSums:
    """Per partition, the debiased measure sums; the checkpoint's part of them; and what this
    process scored of them (``scored``: the counters' values, evald/clicks/totals.py)."""

    def __init__(self, measures: Sequence[str]) -> None:
        self._measures = parse_measures(list(measures)) if measures else []
        #: the measure names, in the configured order (the state's and the series' labels)
        self.names = [str(m) for m in self._measures]
        self._sums: dict[int, Sums] = {}
        #: as of each partition's last model snapshot
        self._base: dict[int, Sums] = {}
        #: as each partition was loaded (its earlier lives' share), and what this process
        #: scored of the partitions it no longer owns
        self._loaded: dict[int, Sums] = {}
        self._retired: Sums = {}

    def add(
        self, partition: int, model: ClickModel, piece: Sessions, slots: np.ndarray | None = None
    ) -> None:
        """Score ``piece``'s lists with ``model`` as it stands (before it observes them);
        ``slots``: ``model.pairs.lookup(piece.pairs)``, when the caller has it."""
        if not self.names or not len(piece):
            return
        counted = model.refit_read(piece.segments)
        if not counted.any():
            return
        part = piece if counted.all() else piece.take(counted)
        if slots is not None and not counted.all():
            slots = slots[counted]
        self.add_read(partition, model, part, slots)

    def add_read(
        self, partition: int, model: ClickModel, part: Sessions, slots: np.ndarray | None = None
    ) -> None:
        """``add`` of lists every one of which a refit of ``model`` has read."""
        if not self.names:
            return
        values = debiased_scores(model, part, self._measures, slots)
        finite = np.isfinite(values)
        clean = np.where(finite, values, 0.0)
        m = len(self.names)
        per = np.zeros((len(model.fitted_shown), 3, m), np.int64)  # integers: exact in any order
        cells = np.stack(
            [np.rint(clean * UNIT), np.rint(clean * clean * UNIT), finite], axis=1
        ).astype(np.int64)
        np.add.at(per, part.segments, cells)
        sums = self._sums.setdefault(partition, {})
        for s in np.flatnonzero(np.bincount(part.segments, minlength=len(per))).tolist():
            row = sums.setdefault(model.segments[s], [[0, 0, 0] for _ in range(m)])
            total, square, count = per[s].tolist()
            for j in range(m):
                row[j][0] += total[j]
                row[j][1] += square[j]
                row[j][2] += count[j]

    def mark(self, partition: int) -> None:
        """The partition's model was snapshotted: its sums now are what the state carries."""
        self._base[partition] = _copy(self._sums.get(partition, {}))

    def state(self, partition: int) -> dict[str, Any] | None:
        """The sums as of the last ``mark``: ``{"measures": [...], "rows": [[labels, [[Σ,
        Σ², n], ...]], ...]}``; None when there are none."""
        base = self._base.get(partition)
        if not base:
            return None
        rows = [[list(labels), sums] for labels, sums in sorted(base.items())]
        return {"measures": self.names, "rows": rows}

    def load(self, partition: int, doc: dict[str, Any] | None) -> bool:
        """Put back sums of ``state``; sums of other measures (engine.measures changed) are
        dropped: the series start again. Returns whether sums were put back. ValueError when
        unreadable."""
        self.drop(partition)
        if doc is not None and not isinstance(doc, dict):
            raise ValueError("the click model's debiased sums are not an object")
        if not doc or doc.get("measures") != self.names:
            return False
        m = len(self.names)
        try:
            sums: Sums = {}
            for labels, row in doc["rows"]:
                values = [[int(x) for x in cell] for cell in row]
                if len(values) != m or any(len(cell) != 3 for cell in values):
                    raise ValueError("one [sum, squares, lists] per measure expected")
                sums[tuple(map(str, labels))] = values
        except (TypeError, ValueError, KeyError, OverflowError) as exc:  # inf: OverflowError
            raise ValueError(f"the click model's debiased sums are unreadable: {exc}") from None
        self._base[partition] = sums
        self._sums[partition] = _copy(sums)
        return True

    def loaded(self, partition: int) -> None:
        """The partition's sums now are its earlier lives' (loaded, its log observed again):
        :meth:`scored` counts only what is added after."""
        self._loaded[partition] = _copy(self._sums.get(partition, {}))

    def retire(self, partition: int) -> None:
        """The partition leaves (dropped, or loaded again): what this process scored of it
        stays in :meth:`scored`."""
        m = len(self.names)
        add_debiased(self._retired, self._sums.get(partition, {}), m)
        add_debiased(self._retired, self._loaded.pop(partition, {}), m, -1)

    def drop(self, partition: int) -> None:
        self._sums.pop(partition, None)
        self._base.pop(partition, None)
        self._loaded.pop(partition, None)

    def scored(self) -> Sums:
        """What this process scored, per segment: the partitions' sums beyond those loaded,
        and the share of the partitions retired (a new value; a segment once in it stays)."""
        m = len(self.names)
        total = _copy(self._retired)
        for partition, sums in self._sums.items():
            add_debiased(total, sums, m)
            add_debiased(total, self._loaded.get(partition, {}), m, -1)
        return total

    def rows(self) -> list[tuple[tuple[str, ...], str, float, float, int]]:
        """Per segment (label values, sorted) and measure, over the partitions this process
        owns, their whole history (what their checkpoints carry): (labels, measure, Σ value,
        Σ value², lists with a finite value)."""
        total: Sums = {}
        for sums in self._sums.values():
            for labels, row in sums.items():
                into = total.setdefault(labels, [[0, 0, 0] for _ in self.names])
                for j, cell in enumerate(row):
                    for i in range(3):
                        into[j][i] += cell[i]
        return [
            (labels, name, cell[0] / UNIT, cell[1] / UNIT, cell[2])
            for labels, row in sorted(total.items())
            for name, cell in zip(self.names, row, strict=True)
        ]


def _copy(sums: Sums) -> Sums:
    return {labels: [list(cell) for cell in row] for labels, row in sums.items()}
