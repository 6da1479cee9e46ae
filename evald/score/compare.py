"""``evald score --compare A B [C ...]``: each run against the first, with paired tests.

Every run is scored like ``evald score`` scores it; queries are paired by qid (those in every
run), and for each measure and each run after the first this reports the two means, their
difference, a paired t-test and a randomization test (:mod:`evald.score.significance`), with
the p-values of each test corrected for the number of runs compared against the baseline
(Holm by default). See docs/score.md.

Memory: a run is kept as its values (8 bytes per query and measure) and its qids as one Arrow
string column, never as Python objects per query; queries are paired by Arrow's hash lookup,
and the randomization test draws its signs in bounded blocks (:mod:`evald.score.significance`).
So memory grows by tens of bytes a query and run, not with the sign patterns: 10 million
queries per run peaked at 1.6 GB (docs/score.md, "What --compare holds", has the figures).
"""

from __future__ import annotations

import json
import math
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evald.metrics import Measure
from evald.score.inputs import Input
from evald.score.records import Qid
from evald.score.scoring import BatchScorer
from evald.score.significance import CORRECTIONS, paired_t, randomization


class DuplicateQid(Exception):
    """A run holds a qid twice: pairing by qid would be ambiguous."""


@dataclass
class RunValues:
    """One run's per-query values: qid keys in input order, one row of measure values each."""

    name: str
    keys: pa.LargeStringArray
    """Each query's qid as a pairing key (:func:`qid_key`), in input order."""
    values: np.ndarray  # (queries, measures)
    rejected: int
    notes: list[str]

    @property
    def qids(self) -> list[Qid]:
        """The qids in input order (a list: for small runs and tests)."""
        return [qid_of(key) for key in self.keys.to_pylist()]


def qid_key(qid: Qid) -> str:
    """The text a qid is paired by: its type, then its text, so 7 and "7" stay different
    queries, as when rows are echoed (docs/score.md)."""
    return f"s{qid}" if isinstance(qid, str) else f"i{qid}"


def qid_of(key: str) -> Qid:
    """The qid :func:`qid_key` was given."""
    return key[1:] if key[0] == "s" else int(key[1:])


def score_run(
    name: str,
    source: Input,
    measures: Sequence[Measure],
    *,
    batch_size: int,
    max_docs: int | None = None,
    judged_only: bool = False,
    report: Callable[[str], None] = print,
) -> RunValues:
    """Score one run; rejected lines are handed to ``report`` as they are read."""
    kept = _Kept()
    scorer = BatchScorer(measures, kept.add, batch_size=batch_size)
    rejected = 0
    for chunk in source.chunks(256):
        for rejection in chunk.rejections:
            report(str(rejection))
        rejected += len(chunk.rejections)
        scorer.add_chunk(chunk, max_docs, judged_only)
    scorer.flush()
    run_keys, values = kept.keys(), kept.values(len(scorer.row_measures))
    repeated = _first_repeated(run_keys)
    if repeated is not None:
        raise DuplicateQid(
            f"{name}: qid {qid_of(repeated)!r} is scored twice; --compare pairs queries by qid"
        )
    return RunValues(name, run_keys, values, rejected, source.notes())


class _Kept:
    """A run's qid keys and values, appended batch by batch to a few buffers that grow in place.

    Why not an Arrow array per batch: each holds pages of Arrow's allocator beyond its data;
    these buffers cost their data (about 17 bytes a key, 8 a value) and a little slack.
    """

    def __init__(self) -> None:
        self._text = bytearray()  # the keys' UTF-8, one after the other
        self._ends = array("q", [0])  # where each key starts, then where the last one ends
        self._values = array("d")  # row after row

    def add(self, qids: Sequence[Qid], columns: Sequence[np.ndarray]) -> None:
        """The row sink of :class:`BatchScorer`."""
        encoded = [qid_key(q).encode() for q in qids]
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        self._ends.frombytes((np.cumsum(lengths) + len(self._text)).tobytes())
        self._text += b"".join(encoded)
        rows = np.column_stack([np.asarray(c, dtype=np.float64) for c in columns])
        self._values.frombytes(rows.tobytes())

    def keys(self) -> pa.LargeStringArray:
        offsets = pa.py_buffer(self._ends)
        return pa.LargeStringArray.from_buffers(
            len(self._ends) - 1, offsets, pa.py_buffer(self._text)
        )

    def values(self, width: int) -> np.ndarray:
        return np.frombuffer(self._values, dtype=np.float64).reshape(-1, width)


def _sorted(keys: pa.LargeStringArray) -> tuple[pa.Array, np.ndarray]:
    """The positions of ``keys`` in sorted order (stable) and where a key equals the next one.

    Sorting, not hashing: Arrow's hash kernels peaked at 50-100 bytes a key, a sort at 17."""
    order = pc.sort_indices(keys)
    ordered = keys.take(order)
    same = pc.equal(ordered[1:], ordered[:-1]).to_numpy(zero_copy_only=False)
    return order, same


def _first_repeated(keys: pa.LargeStringArray) -> str | None:
    """The first key (in input order) that occurs more than once, or None."""
    order, same = _sorted(keys)
    if not same.any():
        return None
    # the sort is stable: the first of a run of equal keys is the earliest, and is followed
    # by an equal one
    first = int(order.to_numpy()[:-1][same].min())
    return str(keys[first].as_py())


def _distinct(keys: pa.LargeStringArray) -> int:
    return 0 if len(keys) == 0 else len(keys) - int(_sorted(keys)[1].sum())


@dataclass(frozen=True)
class Comparison:
    """One measure, one run against the baseline."""

    measure: str
    run: str
    n: int
    baseline_mean: float
    mean: float
    diff: float
    t: float
    p_t: float
    p_randomization: float
    permutations: int
    exact: bool
    p_t_corrected: float = math.nan
    p_randomization_corrected: float = math.nan


@dataclass
class Pairing:
    """The queries in every run, in the baseline's order: each run's rows for them."""

    rows: list[np.ndarray]
    unpaired: int
    """Distinct qids scored in some run but not in every one (left out)."""

    @property
    def queries(self) -> int:
        return self.rows[0].shape[0]


def paired(runs: Sequence[RunValues]) -> Pairing:
    """Pair every run's queries with the baseline's by qid (each run's qids are distinct)."""
    base = runs[0].keys
    n = len(base)
    common = np.ones(n, dtype=bool)
    where = []  # per later run, the row of each baseline query in it (-1: absent)
    unknown = []  # qids of later runs the baseline does not have
    for run in runs[1:]:
        found = pc.fill_null(pc.index_in(run.keys, value_set=base), -1).to_numpy()
        present = found >= 0
        rows = np.full(n, -1, dtype=np.int64)
        rows[found[present]] = np.flatnonzero(present)
        common &= rows >= 0
        where.append(rows)
        unknown.append(run.keys.filter(pa.array(~present)))
    kept = np.flatnonzero(common)
    others = _distinct(pa.concat_arrays(unknown) if unknown else base[:0])
    aligned = [runs[0].values[kept]]
    aligned += [run.values[r[kept]] for run, r in zip(runs[1:], where, strict=True)]
    return Pairing(aligned, unpaired=n - kept.shape[0] + others)


def compare(
    runs: Sequence[RunValues],
    names: Sequence[str],
    *,
    permutations: int,
    seed: int,
    correction: str,
    pairing: Pairing | None = None,
) -> list[Comparison]:
    """Every measure, every run after the first against the first (``pairing``, if given, is
    ``paired(runs)``), corrected per measure."""
    rows = (pairing or paired(runs)).rows
    base = rows[0]
    out: list[Comparison] = []
    adjust = CORRECTIONS[correction]
    for j, name in enumerate(names):
        found = []
        for run, values in zip(runs[1:], rows[1:], strict=True):
            a, b = base[:, j], values[:, j]
            t, p_t = paired_t(a, b)
            test = randomization(a, b, permutations=permutations, seed=seed)
            n = a.shape[0]
            mean_a = float(a.mean()) if n else math.nan
            mean_b = float(b.mean()) if n else math.nan
            found.append(
                Comparison(
                    name,
                    run.name,
                    n,
                    mean_a,
                    mean_b,
                    mean_b - mean_a,
                    t,
                    p_t,
                    test.p,
                    test.permutations,
                    test.exact,
                )
            )
        p_ts = adjust([c.p_t for c in found])
        p_rs = adjust([c.p_randomization for c in found])
        for c, pt, pr in zip(found, p_ts, p_rs, strict=True):
            out.append(
                Comparison(**{**c.__dict__, "p_t_corrected": pt, "p_randomization_corrected": pr})
            )
    return out


def format_json(
    comparisons: Sequence[Comparison],
    baseline: str,
    queries: int,
    *,
    permutations: int,
    seed: int,
    correction: str,
) -> str:
    """One JSON object; NaN (a test with too few queries) is written as null."""
    results = [
        {
            "measure": c.measure,
            "run": c.run,
            "n": c.n,
            "baseline_mean": _number(c.baseline_mean),
            "mean": _number(c.mean),
            "diff": _number(c.diff),
            "t": _number(c.t),
            "p_t": _number(c.p_t),
            "p_t_corrected": _number(c.p_t_corrected),
            "p_randomization": _number(c.p_randomization),
            "p_randomization_corrected": _number(c.p_randomization_corrected),
            "randomization": "exact" if c.exact else f"{c.permutations} sampled",
        }
        for c in comparisons
    ]
    head = {
        "baseline": baseline,
        "queries": queries,
        "permutations": permutations,
        "seed": seed,
        "correction": correction,
    }
    return json.dumps({**head, "results": results}, ensure_ascii=False) + "\n"


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def format_table(comparisons: Sequence[Comparison], correction: str, *, digits: int = 4) -> str:
    """An aligned table for people; p-values in scientific form below 10^-digits."""
    corrected = "" if correction == "none" else f" {correction}"
    header = (
        "measure",
        "run",
        "baseline",
        "mean",
        "diff",
        "t",
        "p(t)",
        f"p(t){corrected}",
        "p(rand)",
        f"p(rand){corrected}",
    )
    lines: list[tuple[str, ...]] = [header]
    for c in comparisons:
        lines.append(
            (
                c.measure,
                c.run,
                _fixed(c.baseline_mean, digits),
                _fixed(c.mean, digits),
                _fixed(c.diff, digits, sign=True),
                _fixed(c.t, 3, sign=True),
                _p(c.p_t, digits),
                _p(c.p_t_corrected, digits),
                _p(c.p_randomization, digits),
                _p(c.p_randomization_corrected, digits),
            )
        )
    if correction == "none":
        lines = [(*row[:7], row[8]) for row in lines]
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    text = [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in lines
    ]
    return "\n".join(text) + "\n"


def _fixed(value: float, digits: int, *, sign: bool = False) -> str:
    if not math.isfinite(value):
        return "-" if math.isnan(value) else ("+inf" if value > 0 else "-inf")
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _p(value: float, digits: int) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.{digits}f}" if value >= 10**-digits or value == 0 else f"{value:.1e}"


def report_notes(run: RunValues) -> None:
    for note in run.notes:
        print(f"evald score: {run.name}: {note}", file=sys.stderr)
