"""Input lines: plain or gzip-compressed (told by the content, not the name), each bounded."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from evald.files.lines import InputError, read_lines


def test_a_gzip_file_is_read_as_its_lines_whatever_its_name(tmp_path: Path) -> None:
    body = b'{"a": 1}\n\n{"b": 2}\r\n'
    (tmp_path / "plain.jsonl").write_bytes(body)
    (tmp_path / "packed.jsonl.gz").write_bytes(gzip.compress(body))
    (tmp_path / "packed.jsonl").write_bytes(gzip.compress(body))  # no .gz: still gzip
    names = ["plain.jsonl", "packed.jsonl.gz", "packed.jsonl"]
    got = list(read_lines([str(tmp_path / n) for n in names], 64))
    per_file = [
        [(line, number) for name, number, line, _, _ in got if name.endswith(n)] for n in names
    ]
    assert (
        per_file[0] == per_file[1] == per_file[2] == [(b'{"a": 1}', 1), (b"", 2), (b'{"b": 2}', 3)]
    )


def test_a_long_line_in_a_compressed_file_is_cut_with_its_length(tmp_path: Path) -> None:
    path = tmp_path / "long.gz"
    path.write_bytes(gzip.compress(b"x" * 5000 + b"\nok\n"))
    got = [(line, length) for _, _, line, _, length in read_lines([str(path)], 100)]
    assert got == [(b"x" * 100, 5000), (b"ok", 2)]


def test_a_broken_gzip_file_is_an_input_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "broken.gz"
    path.write_bytes(gzip.compress(b'{"a": 1}\n' * 1000)[:60])
    with pytest.raises(InputError, match=r"broken\.gz"):
        list(read_lines([str(path)], 100))
    with pytest.raises(InputError, match="cannot read"):
        list(read_lines([str(tmp_path / "missing")], 100))
