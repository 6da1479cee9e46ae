"""Output formats: per-query JSON Lines, the means table and the means JSON object."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.score.output import (
    JsonlWriter,
    MeanRow,
    float_reprs,
    float_texts,
    format_mean_json,
    format_table,
    json_number,
)


def test_rows_are_valid_json_with_keys_in_measure_order_and_exact_floats() -> None:
    out = io.StringIO()
    writer = JsonlWriter(out, ["nDCG@10", "RBP(p=0.8)", "nDCG(dcg='exp-log2')@5"])
    third = 1 / 3
    writer.write(["q1", 7], [np.array([0.5, third]), np.array([1.0, 0.0]), [0.25, 1e-300]])
    rows = [json.loads(text, object_pairs_hook=list) for text in out.getvalue().splitlines()]
    assert rows == [
        [("qid", "q1"), ("nDCG@10", 0.5), ("RBP(p=0.8)", 1.0), ("nDCG(dcg='exp-log2')@5", 0.25)],
        [("qid", 7), ("nDCG@10", third), ("RBP(p=0.8)", 0.0), ("nDCG(dcg='exp-log2')@5", 1e-300)],
    ]
    assert writer.rows == 2


def test_non_ascii_qids_and_quotes_are_escaped_properly() -> None:
    out = io.StringIO()
    JsonlWriter(out, ["RR"]).write(['q"1\\ é\n'], [[1.0]])
    assert json.loads(out.getvalue()) == {"qid": 'q"1\\ é\n', "RR": 1.0}
    assert out.getvalue().count("\n") == 1


def test_rows_without_measures_still_carry_the_qid() -> None:
    out = io.StringIO()
    JsonlWriter(out, []).write(["a", "b"], [])
    assert [json.loads(x) for x in out.getvalue().splitlines()] == [{"qid": "a"}, {"qid": "b"}]


def test_column_count_mismatch_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="expected 2 columns"):
        JsonlWriter(io.StringIO(), ["a", "b"]).write(["q"], [[1.0]])


def test_a_batch_with_a_non_finite_value_writes_null_there_and_numbers_elsewhere() -> None:
    out = io.StringIO()
    JsonlWriter(out, ["a%s", "b"]).write(["q1", "q2"], [[0.5, math.nan], [math.inf, 0.25]])
    assert [json.loads(x) for x in out.getvalue().splitlines()] == [
        {"qid": "q1", "a%s": 0.5, "b": None},
        {"qid": "q2", "a%s": None, "b": 0.25},
    ]
    finite = io.StringIO()
    JsonlWriter(finite, ["a%s"]).write(["q"], [[1.0]])
    assert json.loads(finite.getvalue()) == {"qid": "q", "a%s": 1.0}


def test_non_finite_values_become_null() -> None:
    assert json_number(math.nan) == "null"
    assert json_number(math.inf) == "null"
    assert json_number(0.1) == "0.1"


def test_table_aligns_columns_and_rounds_to_four_digits() -> None:
    rows = [
        MeanRow("nDCG@10", 0.123456, 1200, (0.1, 0.15)),
        MeanRow("GAUC", 2 / 3, 7),
        MeanRow("RR", None, 0),
    ]
    assert format_table(rows).splitlines() == [
        "measure    mean            95% CI     n",
        "nDCG@10  0.1235  [0.1000, 0.1500]  1200",
        "GAUC     0.6667                 -     7",
        "RR            -                 -     0",
    ]


def test_mean_json_is_one_object_with_counts_only_where_they_differ() -> None:
    rows = [MeanRow("nDCG@10", 0.5, 3), MeanRow("GAUC", 0.25, 2), MeanRow("RR", None, 0)]
    text = format_mean_json(rows, 3)
    assert text.endswith("}\n") and text.count("\n") == 1
    assert json.loads(text, object_pairs_hook=list) == [
        ("n", 3),
        ("nDCG@10", 0.5),
        ("GAUC", 0.25),
        ("n(GAUC)", 2),
        ("RR", None),
        ("n(RR)", 0),
    ]


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=40),
    repeats=st.integers(1, 6),
)
def test_float_reprs_read_back_bit_for_bit_few_distinct_values_or_many(
    values: list[float], repeats: int
) -> None:
    column = np.array(values * repeats, dtype=np.float64)  # repeats: the format-once path
    texts = float_reprs(column)
    assert len(texts) == column.shape[0]
    back = np.array([float(t) for t in texts], dtype=np.float64)
    assert back.view(np.int64).tolist() == column.view(np.int64).tolist()


def test_negative_zero_keeps_its_sign_among_many_zeros() -> None:
    column = np.array([0.0] * 10 + [-0.0] + [0.5] * 10)
    assert float_reprs(column) == ["0.0"] * 10 + ["-0.0"] + ["0.5"] * 10


def test_rows_of_a_large_batch_are_exact_whatever_the_column_cardinality() -> None:
    rng = np.random.default_rng(5)
    n = 3000
    columns = [rng.random(n), rng.integers(0, 11, n) / 10, 1 / rng.integers(1, 21, n)]
    qids: list[str | int] = [f"q{i}" if i % 3 else i for i in range(n)]
    out = io.StringIO()
    JsonlWriter(out, ["a", "b", "c"]).write(qids, columns)
    rows = [json.loads(text) for text in out.getvalue().splitlines()]
    assert [r["qid"] for r in rows] == qids
    for key, column in zip("abc", columns, strict=True):
        assert [r[key] for r in rows] == column.tolist()  # == on floats: exact round trip


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    values=st.one_of(
        st.lists(finite, max_size=30),
        st.lists(st.floats(min_value=0, max_value=1), max_size=30),  # what measures produce
        st.lists(st.floats(min_value=1e-4, max_value=1e16, exclude_max=True), max_size=30),
    ),
    signs=st.booleans(),
)
def test_float_texts_are_exactly_repr_in_and_out_of_the_bulk_range(
    values: list[float], signs: bool
) -> None:
    """The bulk formatter must write Python's repr, character for character, for any float."""
    column = np.array([-v if signs else v for v in values], dtype=np.float64)
    assert float_texts(column) == [repr(v) for v in column.tolist()]


@pytest.mark.parametrize(
    "value",
    [0.0, -0.0, 1.0, 1e-4, 9.999999999999999e-05, 1e-05, 1e16, 9999999999999998.0, 5e-324, 0.1],
)
def test_float_texts_at_the_edges_of_the_bulk_range(value: float) -> None:
    column = np.array([0.5, value, 0.25])
    assert float_texts(column) == ["0.5", repr(value), "0.25"]


def test_rows_are_one_line_each_even_with_many_columns_and_integer_qids() -> None:
    out = io.StringIO()
    names = [f"m{j}" for j in range(12)]
    columns = [np.full(3, j / 8) for j in range(12)]
    JsonlWriter(out, names).write([1, "b", -2], columns)
    lines = out.getvalue().split("\n")
    assert lines[-1] == "" and len(lines) == 4
    assert lines[0] == '{"qid": 1, ' + ", ".join(f'"m{j}": {j / 8!r}' for j in range(12)) + "}"
