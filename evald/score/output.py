"""Writing results: per-query JSON Lines, and the means as an aligned table or one JSON object.

Rows are assembled as strings rather than through ``json.dumps`` of a dict: the keys are fixed
for the whole run, so they are escaped once, and a batch's rows are one ``str.join`` over the
interleaved keys and values. Each column's values are formatted in bulk (see
:func:`float_texts`): the text is always exactly Python's ``repr``, the shortest string that
reads back as the same float.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from itertools import chain, repeat
from typing import TYPE_CHECKING, NamedTuple, TextIO, cast

import numpy as np

from evald.metrics import FAMILIES, make_measure
from evald.metrics.trec_names import trec_name

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from evald.score.records import Qid


def json_number(value: float) -> str:
    """A float as JSON: shortest round-trip form, ``null`` for NaN/inf (JSON has neither)."""
    return repr(value) if math.isfinite(value) else "null"


class JsonlWriter:
    """Writes ``{"qid": ..., "<measure>": value, ...}`` lines with keys in measure order."""

    def __init__(self, stream: TextIO, names: Sequence[str]) -> None:
        self._stream = stream
        keys = [_json_string(name) for name in names]
        self._width = len(names)
        # the text before each value of a row: '{"qid": ', ', "nDCG@10": ', ...
        self._keys = [f", {key}: " for key in keys]
        self.rows = 0

    def write(self, qids: Sequence[Qid], columns: Sequence[ArrayLike]) -> None:
        """Write one row per qid; ``columns[j][i]`` is measure j's value for query i."""
        if len(columns) != self._width:
            raise ValueError(f"expected {self._width} columns, got {len(columns)}")
        arrays = [np.asarray(c, dtype=np.float64) for c in columns]
        if set(map(type, qids)) <= _STR:
            ids = list(map(_string_encoder(), cast("Sequence[str]", qids)))
        else:
            ids = [encode_qid(qid) for qid in qids]
        if all(bool(np.isfinite(a).all()) for a in arrays):
            n = len(ids)
            parts: list[Iterable[str]] = [repeat('{"qid": ', n), ids]
            for key, array in zip(self._keys, arrays, strict=True):
                parts += [repeat(key, n), float_texts(array)]
            parts.append(repeat("}\n", n))
            text = "".join(chain.from_iterable(zip(*parts, strict=True)))
        else:
            text = self._with_nulls(ids, [a.tolist() for a in arrays])
        self._stream.write(text)
        self.rows += len(qids)

    def _with_nulls(self, ids: list[str], lists: list[list[float]]) -> str:
        """Slow path for a batch holding a NaN or infinity (JSON has neither): write null."""
        parts: list[str] = []
        rows = zip(*lists, strict=True) if lists else [()] * len(ids)
        for qid, row in zip(ids, rows, strict=True):
            parts.append('{"qid": ' + qid)
            for key, value in zip(self._keys, row, strict=True):
                parts.append(key + json_number(value))
            parts.append("}\n")
        return "".join(parts)


_STR = frozenset({str})


#: Where msgspec's float text equals ``repr``: both write the shortest round-trip digits, but
#: outside [1e-4, 1e16) ``repr`` switches to an exponent written ``1e-05`` / ``1e+16`` where
#: msgspec writes ``0.00001`` / ``1e16``. Zero is written ``0.0`` / ``-0.0`` by both.
_PLAIN_LOW, _PLAIN_HIGH = 1e-4, 1e16


@cache
def _encoder() -> Callable[[object], bytes]:
    """msgspec's JSON encoder, imported on first use: the trec format and the means never
    write a float column, and TREC start-up should not pay for msgspec (about 7 ms)."""
    import msgspec

    return msgspec.json.Encoder().encode


def float_texts(values: np.ndarray) -> list[str]:
    """``repr`` of each finite float64 of a 1-d array, formatted in bulk.

    One msgspec call writes the whole column, about 6x faster than ``repr`` per value; its text
    is ``repr``'s wherever the magnitude is 0 or in [1e-4, 1e16), and the few values outside
    (a measure's value below 1e-4) are then written again with ``repr``.
    """
    flat = np.ascontiguousarray(values, dtype=np.float64)
    if not flat.shape[0]:
        return []
    texts = _encoder()(flat.tolist()).decode("ascii")[1:-1].split(",")
    magnitude = np.abs(flat)
    outside = np.flatnonzero(
        ((magnitude < _PLAIN_LOW) & (magnitude != 0)) | (magnitude >= _PLAIN_HIGH)
    )
    for i in outside.tolist():
        texts[i] = repr(float(flat[i]))
    return texts


def float_reprs(values: np.ndarray) -> list[str]:
    """``repr`` of each float64 of a 1-d array, each distinct value formatted once.

    Distinct means distinct bits, so ``-0.0`` keeps its sign and every string reads back as
    exactly the value it came from.
    """
    flat = np.ascontiguousarray(values, dtype=np.float64)
    bits, inverse = np.unique(flat.view(np.int64), return_inverse=True)
    if bits.shape[0] * 2 > flat.shape[0]:  # mostly distinct: format them directly
        return list(map(repr, flat.tolist()))
    texts = list(map(repr, bits.view(np.float64).tolist()))
    return list(map(texts.__getitem__, inverse.tolist()))


def encode_qid(qid: Qid) -> str:
    """A qid as a JSON value: strings escaped (non-ASCII kept), integers as digits."""
    return _json_string(qid) if isinstance(qid, str) else str(int(qid))


@cache
def _string_encoder() -> Callable[[str], str]:
    """``json.dumps(text, ensure_ascii=False)`` for a string (non-ASCII kept); the json module
    is imported on first use, for the same reason as msgspec above."""
    from json.encoder import encode_basestring

    return encode_basestring


def _json_string(text: str) -> str:
    return _string_encoder()(text)


class MeanRow(NamedTuple):
    """One measure's aggregate: ``mean`` is None when no query contributed (n == 0). A named
    tuple: about 0.35 ms cheaper to build at start-up than a frozen dataclass."""

    name: str
    mean: float | None
    n: int
    interval: tuple[float, float] | None = None  # 95% over queries (evald.score.intervals)


def format_table(rows: Sequence[MeanRow], *, digits: int = 4) -> str:
    """An aligned text table (measure, mean, 95% interval, n) for people; ``digits`` as
    trec_eval's 4."""
    header = ("measure", "mean", "95% CI", "n")
    cells = [
        (
            row.name,
            "-" if row.mean is None else f"{row.mean:.{digits}f}",
            "-" if row.interval is None else _interval_text(row.interval, digits),
            str(row.n),
        )
        for row in rows
    ]
    widths = [max(len(line[col]) for line in [header, *cells]) for col in range(4)]
    lines = [
        f"{name:<{widths[0]}}  {mean:>{widths[1]}}  {ci:>{widths[2]}}  {n:>{widths[3]}}"
        for name, mean, ci, n in [header, *cells]
    ]
    return "\n".join(lines) + "\n"


def _interval_text(interval: tuple[float, float], digits: int) -> str:
    low, high = interval
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def format_mean_json(rows: Sequence[MeanRow], queries: int) -> str:
    """One JSON object: ``{"n": queries scored, "<measure>": mean, ...}`` at full precision.

    A measure whose own count differs from ``queries`` (an aggregate such as GAUC only counts
    lists with both relevant and non-relevant items) also gets ``"n(<measure>)"``, and every
    measure with a 95% interval ``"ci95(<measure>)": [low, high]``.
    """
    parts = [f'{{"n": {queries}']
    for row in rows:
        key = _json_string(row.name)
        value = "null" if row.mean is None else json_number(row.mean)
        parts.append(f", {key}: {value}")
        if row.n != queries:
            parts.append(f", {_json_string('n(' + row.name + ')')}: {row.n}")
        if row.interval is not None:
            low, high = map(json_number, row.interval)
            key = _json_string("ci95(" + row.name + ")")
            parts.append(f", {key}: [{low}, {high}]")
    parts.append("}\n")
    return "".join(parts)


#: Measures that are counts, by family and trec_eval name: trec_eval prints them as integers,
#: and their ``all`` value is the sum over queries rather than the mean.
COUNTS = frozenset(
    name
    for family in FAMILIES.values()
    if family.is_count
    for name in (family.name, trec_name(make_measure(family.name)))
    if name is not None
)


def _count(name: str) -> bool:
    return name in COUNTS or name.split("(", 1)[0] in COUNTS


class TrecWriter:
    """trec_eval ``-q`` rows: ``measure<TAB>qid<TAB>value``, the measure left-aligned in 22
    columns, values with ``digits`` decimals (trec_eval's ``%6.4f``), counts as integers."""

    def __init__(self, stream: TextIO, names: Sequence[str], *, digits: int = 4) -> None:
        self._stream = stream
        self._names = [f"{name:<22}\t" for name in names]
        self._counts = [_count(name) for name in names]
        self._digits = digits
        self.rows = 0

    def write(self, qids: Sequence[Qid], columns: Sequence[ArrayLike]) -> None:
        """Write each query's measures, one line each, queries in order."""
        if len(columns) != len(self._names):
            raise ValueError(f"expected {len(self._names)} columns, got {len(columns)}")
        texts = [
            _trec_values(np.asarray(c, dtype=np.float64), count, self._digits)
            for c, count in zip(columns, self._counts, strict=True)
        ]
        lines = []
        for i, qid in enumerate(qids):
            for name, values in zip(self._names, texts, strict=True):
                lines.append(f"{name}{qid}\t{values[i]}\n")
        self._stream.write("".join(lines))
        self.rows += len(qids)


def _trec_values(values: np.ndarray, count: bool, digits: int) -> list[str]:
    if count:
        return [str(round(v)) if math.isfinite(v) else "nan" for v in values.tolist()]
    return [f"{v:6.{digits}f}" for v in values.tolist()]


def format_trec_all(rows: Sequence[MeanRow], names: Sequence[str], *, digits: int = 4) -> str:
    """trec_eval's summary lines, ``measure<TAB>all<TAB>value``: the mean over the scored
    queries, the sum for counts. With no query scored there is no line (trec_eval stops with
    "No queries with both results and relevance info" then)."""
    lines = []
    for row, name in zip(rows, names, strict=True):
        if row.mean is None:
            continue
        text = str(round(row.mean * row.n)) if _count(name) else f"{row.mean:6.{digits}f}"
        lines.append(f"{name:<22}\tall\t{text}\n")
    return "".join(lines)
