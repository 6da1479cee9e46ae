"""Fixtures for the `evald score` command tests."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import evald.cli


@dataclass
class Outcome:
    """What one `evald ...` invocation returned and printed."""

    status: int
    out: str
    err: str

    def rows(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.out.splitlines()]


class FakeTty(io.StringIO):
    """A stdout that says it is a terminal, to exercise the table output."""

    def isatty(self) -> bool:
        return True


Evald = Callable[..., Outcome]
WriteJsonl = Callable[..., str]

#: The command table narrowed to `score`: the CLI builds every command's parser, and these
#: tests are about this command, not about whether the other commands import.
SCORE_ONLY = {"score": "evald.score.command"}


@pytest.fixture
def evald_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Evald:
    """Run ``evald.cli.main(argv)`` in process (command table: SCORE_ONLY), with optional stdin
    bytes and a stdout that claims to be a terminal."""
    monkeypatch.setattr(evald.cli, "COMMANDS", SCORE_ONLY)

    def invoke(*argv: str, stdin: bytes | None = None, tty: bool = False) -> Outcome:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        if tty:
            fake, previous = FakeTty(), sys.stdout
            sys.stdout = fake
            try:
                status = evald.cli.main(list(argv))
            finally:
                sys.stdout = previous
            return Outcome(status, fake.getvalue(), capsys.readouterr().err)
        status = evald.cli.main(list(argv))
        captured = capsys.readouterr()
        return Outcome(status, captured.out, captured.err)

    return invoke


@pytest.fixture
def jsonl_file(tmp_path: Path) -> Iterator[WriteJsonl]:
    """Write JSON Lines (dicts or raw strings) to a file in tmp_path; returns its path."""
    counter = iter(range(1_000_000))

    def write(*rows: object) -> str:
        path = tmp_path / f"in{next(counter)}.jsonl"
        text = "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)
        path.write_text(text, encoding="utf-8")
        return str(path)

    yield write
