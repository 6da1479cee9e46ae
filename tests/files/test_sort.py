"""External merge sort by event time: the order, stability, spilling and merge passes."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from evald.files import sort as sort_module
from evald.files.exports import Record
from evald.files.sort import parse_size, sorted_by_time


def make(n: int, seed: int) -> list[Record]:
    rng = random.Random(seed)
    out = []
    for number in range(n):
        ts = rng.choice([None, *range(20)])
        raw = f'{{"t": {ts}, "n": {number}}}'.encode() + b"x" * rng.randint(0, 50)
        out.append(Record(f"file{number % 3}", number, raw, len(raw), rng.choice([None, "idx"])))
    return out


def key(record: Record) -> int | None:
    text = record.raw.split(b",")[0].split(b":")[1].strip()
    return None if text == b"None" else int(text)


def expected(records: list[Record]) -> list[Record]:
    return sorted(records, key=lambda r: (-1 if key(r) is None else key(r), r.number))  # stable


@pytest.mark.parametrize("budget", [1 << 30, 2_000, 300])
def test_records_come_in_time_order_equal_times_in_input_order(tmp_path: Path, budget: int) -> None:
    records = make(500, budget)
    got = list(sorted_by_time(iter(records), key, budget=budget, directory=str(tmp_path)))
    assert got == expected(records)
    assert os.listdir(tmp_path) == []  # the run files are gone


def test_more_runs_than_the_fan_in_are_merged_in_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sort_module, "FAN_IN", 3)
    records = make(400, 7)
    written: list[str] = []
    real = sort_module._write_run

    def counting(*args: object) -> str:
        path = real(*args)  # type: ignore[arg-type]
        written.append(path)
        return path

    monkeypatch.setattr(sort_module, "_write_run", counting)
    got = list(sorted_by_time(iter(records), key, budget=1_500, directory=str(tmp_path)))
    assert got == expected(records)
    assert len(written) > 9  # three levels of merging at a fan-in of 3


def test_the_run_files_are_removed_when_the_reader_stops_early(tmp_path: Path) -> None:
    records = sorted_by_time(iter(make(300, 1)), key, budget=500, directory=str(tmp_path))
    next(records)
    assert os.listdir(tmp_path) != []
    records.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("text", "size"),
    [("256M", 256 << 20), ("2G", 2 << 30), ("1MiB", 1 << 20), ("4194304", 4 << 20)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "512K", "-1G", "1.5G"])
def test_bad_sizes_say_what_is_wanted(text: str) -> None:
    with pytest.raises(ValueError, match="at least 1M"):
        parse_size(text)
