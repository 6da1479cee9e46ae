"""The result record: what its writer puts in, its reader takes back out, field by field."""

from __future__ import annotations

import math

import pytest

from evald.events import format_timestamp
from evald.result import Result, document, format_cluster, parse_cluster, read_result


def test_every_field_the_writer_puts_in_the_reader_takes_back() -> None:
    result = Result(
        "r-1",
        1_714_564_800_123,
        {"arm": "a"},
        {"nDCG@10": 0.5},
        cluster=0x00FF_0000_0000_00AB,
        query="shoes",
    )
    read = read_result(result.to_json(), ["nDCG@10", "RR"])
    assert read is not None
    assert (read.ts, read.labels, read.cluster, read.request_id, read.query) == (
        result.ts,
        result.labels,
        result.cluster,
        "r-1",
        "shoes",
    )
    assert read.row[0] == 0.5 and math.isnan(read.row[1])  # a measure not written: NaN


def test_the_document_is_built_once_for_the_writer_and_the_fast_encoder() -> None:
    result = Result("r", 0, {}, {"RR": 1.0})
    assert result.to_json() == document(result, format_timestamp(0))
    assert document(result, "given") == {"request_id": "r", "ts": "given", "labels": {},
                                          "measures": {"RR": 1.0}}  # fmt: skip


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"measures": {}},
        {"ts": "yesterday"},
        {"ts": "2024-05-01T12:00:00Z", "labels": {"arm": 1}},
        {"ts": "2024-05-01T12:00:00Z", "measures": {"RR": "x"}},
        {"ts": "2024-05-01T12:00:00Z", "cluster": "0000000000000000"},
        {"ts": "2024-05-01T12:00:00Z", "cluster": "ABCDEF0123456789"},
        {"ts": "2024-05-01T12:00:00Z", "query": 3},
    ],
)
def test_a_record_that_is_not_a_result_reads_as_none(doc: object) -> None:
    assert read_result(doc, ["RR"]) is None


def test_the_cluster_codec_round_trips_and_keeps_leading_zeros() -> None:
    for key in (1, 0x00FF_0000_0000_00AB, (1 << 64) - 1):
        assert parse_cluster(format_cluster(key)) == key and len(format_cluster(key)) == 16
