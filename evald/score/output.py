"""Writing results: per-query JSON Lines, and the means as an aligned table or one JSON object.

Rows are assembled as strings rather than through ``json.dumps`` of a dict: the keys are fixed
for the whole run, so escaping them once keeps a million-row output cheap.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from evald.score.records import Qid


def json_number(value: float) -> str:
    """A float as JSON: shortest round-trip form, ``null`` for NaN/inf (JSON has neither)."""
    return repr(value) if math.isfinite(value) else "null"


class JsonlWriter:
    """Writes ``{"qid": ..., "<measure>": value, ...}`` lines with keys in measure order."""

    def __init__(self, stream: TextIO, names: Sequence[str]) -> None:
        self._stream = stream
        self._keys = [", " + json.dumps(name, ensure_ascii=False) + ": " for name in names]
        self.rows = 0

    def write(self, qids: Sequence[Qid], columns: Sequence[Sequence[float]]) -> None:
        """Write one row per qid; ``columns[j][i]`` is measure j's value for query i."""
        if len(columns) != len(self._keys):
            raise ValueError(f"expected {len(self._keys)} columns, got {len(columns)}")
        lists = [c.tolist() if hasattr(c, "tolist") else list(c) for c in columns]
        keys = self._keys
        parts: list[str] = []
        rows = zip(*lists, strict=True) if lists else [()] * len(qids)
        for qid, row in zip(qids, rows, strict=True):
            parts.append('{"qid": ')
            parts.append(json.dumps(qid, ensure_ascii=False))
            for key, value in zip(keys, row, strict=True):
                parts.append(key)
                parts.append(json_number(value))
            parts.append("}\n")
        self._stream.write("".join(parts))
        self.rows += len(qids)


@dataclass(frozen=True)
class MeanRow:
    """One measure's aggregate: ``mean`` is None when no query contributed (n == 0)."""

    name: str
    mean: float | None
    n: int


def format_table(rows: Sequence[MeanRow], *, digits: int = 4) -> str:
    """An aligned text table (measure, mean, n) for people; ``digits`` as trec_eval's 4."""
    header = ("measure", "mean", "n")
    cells = [
        (row.name, "-" if row.mean is None else f"{row.mean:.{digits}f}", str(row.n))
        for row in rows
    ]
    widths = [max(len(line[col]) for line in [header, *cells]) for col in range(3)]
    lines = [
        f"{name:<{widths[0]}}  {mean:>{widths[1]}}  {n:>{widths[2]}}"
        for name, mean, n in [header, *cells]
    ]
    return "\n".join(lines) + "\n"


def format_mean_json(rows: Sequence[MeanRow], queries: int) -> str:
    """One JSON object: ``{"n": queries scored, "<measure>": mean, ...}`` at full precision.

    A measure whose own count differs from ``queries`` (an aggregate such as GAUC only counts
    lists with both relevant and non-relevant items) also gets ``"n(<measure>)"``.
    """
    parts = [f'{{"n": {queries}']
    for row in rows:
        key = json.dumps(row.name, ensure_ascii=False)
        value = "null" if row.mean is None else json_number(row.mean)
        parts.append(f", {key}: {value}")
        if row.n != queries:
            parts.append(f", {json.dumps('n(' + row.name + ')', ensure_ascii=False)}: {row.n}")
    parts.append("}\n")
    return "".join(parts)
