"""Checkpoints written by the code of 2026-11-27 (``data/checkpoints-2026-11-27.jsonl``, from
the run in checkpoint_traffic.py) still read, and come out byte for byte: the codec's version
and fields are a contract with every checkpoint topic already written. The run itself, made
again with today's code, writes the bytes ``data/checkpoints-run.jsonl`` holds: the commit
cycle gathers the same state. That second file differs from the first only in the size and
CRC-32 of the snapshots four of its checkpoints name (the drill-down's query summaries joined
the snapshot, then on 2026-11-28 its label summaries' part, empty in this run) and in the
partition's counters each now carries (``counters``, added on 2026-11-28) and in the last
digits of the comparison's replicate sums (rewritten on 2026-11-28, when they stopped
depending on the machine's BLAS kernel); rewrite it only for a change that means to change what
a run writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from checkpoint_traffic import written

from evald.daemon.main.checkpoint import Checkpoint

FIXTURE = Path(__file__).parent / "data" / "checkpoints-2026-11-27.jsonl"
RUN = Path(__file__).parent / "data" / "checkpoints-run.jsonl"


def recorded(path: Path = FIXTURE) -> list[bytes]:
    return path.read_bytes().splitlines()


def test_the_fixture_holds_every_field_a_checkpoint_can_hold() -> None:
    """Without this the byte-for-byte checks below would prove little."""
    docs = [json.loads(raw) for raw in recorded()]
    assert len(docs) >= 10
    for name in ("evicted", "held_feedback", "snapshot", "statistics", "event_block"):
        assert any(name in doc for doc in docs), name
    assert any(doc["consumed"] != docs[i - 1]["consumed"] for i, doc in enumerate(docs) if i)


@pytest.mark.parametrize("raw", recorded(), ids=lambda raw: f"{len(raw)}b")
def test_a_recorded_checkpoint_decodes_and_encodes_to_the_same_bytes(raw: bytes) -> None:
    assert Checkpoint.decode(raw).encode() == raw


@pytest.fixture(scope="module")
def today() -> list[bytes]:
    return written()


def test_the_same_run_writes_the_same_checkpoints_today(today: list[bytes]) -> None:
    assert today == recorded(RUN)


def close(a: Any, b: Any) -> bool:
    """Equal JSON, floats to 1e-12 relative (the replicate sums' last digits)."""
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(close, a, b))
    return bool(a == b)


def test_the_run_s_checkpoints_differ_from_the_first_ones_only_in_snapshots_and_counters() -> None:
    """And in the last digits of the comparison's replicate sums: since 2026-11-28 they are
    added row by row (``replicate_sums``), the same on every machine, where a BLAS product's
    rounding depended on the CPU; so the statistics a record names by reference are compared
    by where they are, not by their CRC."""
    newer = ("snapshot", "counters", "statistics")
    for first, now in zip(recorded(), recorded(RUN), strict=True):
        a, b = json.loads(first), json.loads(now)
        assert {k: v for k, v in a.items() if k not in newer} == {
            k: v for k, v in b.items() if k not in newer
        }
        assert ("snapshot" in a) == ("snapshot" in b)
        assert "counters" not in a and b["counters"]["events/impression/accepted"] > 0
        old, new = a.get("statistics"), b.get("statistics")
        if old is not None and "records" in old:
            assert old["records"]["offsets"] == new["records"]["offsets"]
        else:
            assert close(old, new)


def test_the_statistics_comparison_sees_more_than_the_last_digits() -> None:
    """Negative control for ``close``: a replicate sum moved by 1e-9 is caught."""
    doc = next(
        json.loads(raw) for raw in recorded(RUN) if "open" in json.loads(raw).get("statistics", {})
    )
    moved = json.loads(json.dumps(doc))
    row = moved["statistics"]["open"][0][1][0][1][0]
    row[5] += 1e-9 * max(abs(row[5]), 1.0)
    assert close(doc, json.loads(json.dumps(doc)))
    assert not close(doc, moved)


def test_a_changed_field_is_caught(today: list[bytes]) -> None:
    """Negative control: one offset moved in one record makes the comparison fail."""
    raws = recorded(RUN)
    doc = json.loads(raws[3])
    doc["committed"]["feedback"] += 1
    changed = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    assert Checkpoint.decode(changed).encode() == changed
    assert [*raws[:3], changed, *raws[4:]] != today
