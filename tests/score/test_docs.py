"""docs/score.md as executable documentation: every command of its ``sh`` blocks runs as
written from the repository's root (evald in this process, the few shell tools it names as
processes), and the outputs it shows are what evald prints."""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import evald.cli

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "score.md").read_text(encoding="utf-8")
#: what the page may run besides evald: a new tool needs a reason to be here
TOOLS = {"mkdir", "awk", "sed"}


def sh_lines() -> list[str]:
    """The command lines of every ``sh`` block, in order."""
    blocks = re.findall(r"```sh\n(.*?)```", DOC, re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def block_after(command: str) -> str:
    """The fenced block after the page names ``command`` in backticks (its words may wrap)."""
    named = re.search("`" + r"\s+".join(map(re.escape, command.split())) + "`", DOC)
    assert named is not None, f"docs/score.md no longer shows `{command}`"
    block = re.search(r"```\w*\n(.*?)```", DOC[named.end() :], re.S)
    assert block is not None
    return block.group(1)


class Page:
    """Runs the page's commands in ``cwd``, a directory holding the checkout's ``evald/``."""

    def __init__(self, cwd: Path, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch):
        self.cwd, self.capsys, self.mp = cwd, capsys, mp
        mp.chdir(cwd)

    def evald(self, argv: list[str], stdin: bytes | None = None) -> str:
        """``evald ARGV``'s stdout; a non-zero status fails with its stderr."""
        if stdin is not None:
            self.mp.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        self.capsys.readouterr()
        status = evald.cli.main(argv)
        out, err = self.capsys.readouterr()
        assert status == 0, f"evald {shlex.join(argv)} exited {status}: {err}"
        return out

    def line(self, line: str) -> list[str]:
        """Run one command line (commands joined by ``&&``, ``cat FILE |`` into evald, ``>``
        into a file); the stdout of each evald in it."""
        words = shlex.split(line, comments=True)
        commands: list[list[str]] = [[]]
        for word in words:
            if word == "&&":
                commands.append([])
            else:
                commands[-1].append(word)
        outputs = []
        for argv in commands:
            stdin = None
            if "|" in argv:
                at = argv.index("|")
                assert argv[:1] == ["cat"] and at == 2, f"a pipe the runner does not know: {line}"
                stdin, argv = (self.cwd / argv[1]).read_bytes(), argv[at + 1 :]
            target = None
            if ">" in argv:
                argv, target = argv[: argv.index(">")], argv[argv.index(">") + 1]
            if argv[0] == "evald":
                outputs.append(self.evald(argv[1:], stdin))
                if target is not None:
                    (self.cwd / target).write_text(outputs[-1])
                continue
            assert argv[0] in TOOLS, f"a command the runner does not know: {line}"
            done = subprocess.run(argv, cwd=self.cwd, capture_output=True, check=True, timeout=30)
            if target is not None:
                (self.cwd / target).write_bytes(done.stdout)
        return outputs


@pytest.fixture
def page(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    # the checkout's example data where the page expects it, and out/ made in a directory of
    # the test's own rather than in the checkout
    (tmp_path / "evald").symlink_to(ROOT / "evald")
    return Page(tmp_path, capsys, monkeypatch)


class Decimalish(str):
    """A number as the page writes it (json's ``parse_float``)."""


def _rounded_as_shown(shown: Any, printed: Any, where: str) -> None:
    """``printed`` equals ``shown``, numbers rounded to the decimals the page shows."""
    if isinstance(shown, dict):
        assert isinstance(printed, dict) and shown.keys() == printed.keys(), where
        for key in shown:
            _rounded_as_shown(shown[key], printed[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(printed, list) and len(shown) == len(printed), where
        for i, (a, b) in enumerate(zip(shown, printed, strict=True)):
            _rounded_as_shown(a, b, f"{where}[{i}]")
    elif isinstance(shown, Decimalish):
        decimals = len(shown.split(".")[1])
        assert round(printed, decimals) == float(shown), f"{where}: shown {shown}, is {printed}"
    else:
        assert shown == printed, where


def test_every_command_of_the_page_runs_as_written(page: Page) -> None:
    outputs = [out for line in sh_lines() for out in page.line(line)]
    assert len(outputs) == 9 and all(outputs)
    assert len((page.cwd / "out/rows.jsonl").read_text().splitlines()) == 30
    # the two swaps the page describes are one swap: the run and the JSON Lines score alike
    run = page.evald(["score", "--run", "out/swap.run", "--qrels", "evald/data/example.qrels"])
    assert run == page.evald(["score", "out/swap.jsonl"])
    assert run != page.evald(["score", "evald/data/example.jsonl"])


def test_every_example_of_the_help_runs_as_written(page: Page) -> None:
    """`evald score --help`'s examples use the example data set's files, so that they can be
    pasted into a shell at the checkout's root (they named files nobody had)."""
    from evald.score.command import EXAMPLES

    lines = [line.strip() for line in EXAMPLES.split("\n\n")[0].splitlines()]
    commands = [line for line in lines if not line.startswith("#")]
    outputs = [out for line in commands for out in page.line(line)]
    assert len(commands) == 9 and len(outputs) == 8 and all(outputs)
    assert len((page.cwd / "out/per_query.jsonl").read_text().splitlines()) == 30
    assert '"run": "out/last.run"' in outputs[-1]  # the comparison, JSON (no terminal)


def test_the_outputs_shown_are_what_evald_prints(page: Page) -> None:
    rows = page.evald(["score", "evald/data/example.jsonl"]).splitlines()
    assert block_after("evald score evald/data/example.jsonl") == rows[1] + "\n"
    for command in (
        "evald score --example --mean -m nDCG@10,RR,GAUC",
        "evald score --example --mean -m nDCG@10,GAUC --format json",
    ):
        table = ["--format", "table"] if "--format" not in command else []
        assert block_after(command) == page.evald([*command.split()[1:], *table])
    setup = [line for line in sh_lines() if "out/last.run" in line and "--compare" not in line]
    for line in ["mkdir -p out", *setup]:
        page.line(line)
    command = (
        "evald score --compare evald/data/example.run out/last.run --qrels "
        "evald/data/example.qrels -m map --format json"
    )
    shown = json.loads(block_after(command), parse_float=Decimalish)
    _rounded_as_shown(shown, json.loads(page.evald(command.split()[1:])), "compare")
