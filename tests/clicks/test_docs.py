"""docs/click-models.md's `evald replay --click-model pbm --format json` example, run as the
page says it was made, against every value the page shows (to the digits shown)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from evald.cli import main

DOC = (Path(__file__).resolve().parents[2] / "docs" / "click-models.md").read_text()


def shown_example() -> tuple[list[str], Any]:
    """The command the page names for its example, and the example's JSON with its elisions
    (``...``) dropped: lists keep the items shown first, objects the keys shown."""
    made = re.search(r"The example above is `(evald produce [^`]*)` replayed", DOC)
    assert made is not None, "docs/click-models.md no longer says how its example was made"
    block = re.search(r'```json\n("click_model": \{.*?)```', DOC, re.S)
    assert block is not None
    text = block.group(1).replace("{...}", "{}")
    text = re.sub(r",\s*\.\.\.\s*([\]}])", r"\1", text)
    return made.group(1).split()[1:], json.loads("{" + text + "}")["click_model"]


def agrees(shown: Any, actual: Any, where: str = "click_model") -> None:
    """``actual`` has every value ``shown`` has: numbers to the decimals shown."""
    if isinstance(shown, dict):
        assert isinstance(actual, dict), where
        for key, value in shown.items():
            assert key in actual, f"{where}: no {key!r}"
            agrees(value, actual[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(actual, list) and len(actual) >= len(shown), where
        for i, value in enumerate(shown):
            agrees(value, actual[i], f"{where}[{i}]")
    elif isinstance(shown, float):
        decimals = len(repr(shown).split(".")[1])
        assert abs(actual - shown) <= 0.5 * 10**-decimals + 1e-12, f"{where}: {actual} != {shown}"
    else:
        assert actual == shown, where


def test_the_replay_example_is_what_replay_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    produce, shown = shown_example()
    monkeypatch.chdir(tmp_path)
    assert main(produce) == 0
    output = produce[produce.index("--output") + 1]
    capsys.readouterr()
    assert main(["replay", output, "--click-model", "pbm", "--format", "json"]) == 0
    agrees(shown, json.loads(capsys.readouterr().out)["click_model"])
