"""DaemonStats: each field has one writer (the module named beside it), so a count is never
the sum of two modules' ideas of what happened."""

from __future__ import annotations

import ast
import dataclasses
from collections import defaultdict
from pathlib import Path

from evald.daemon.stats import DaemonStats

DAEMON = Path(__file__).resolve().parents[2] / "evald" / "daemon"
FIELDS = {f.name for f in dataclasses.fields(DaemonStats)} - {"lock"}
#: calls that change a map or a counter in place
MUTATORS = {"update", "clear", "pop", "setdefault", "subtract", "__setitem__"}


def _stats_field(node: ast.expr) -> str | None:
    """``<...>.stats.<field>`` or ``<...>._stats.<field>`` -> the field."""
    if not isinstance(node, ast.Attribute) or node.attr not in FIELDS:
        return None
    owner = node.value
    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    return node.attr if name in {"stats", "_stats"} else None


def writers(source: str) -> set[str]:
    """The DaemonStats fields a module's code assigns, augments or mutates in place."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        for target in targets:
            if isinstance(target, ast.Subscript):
                target = target.value
            field = _stats_field(target)
            if field is not None:
                found.add(field)
    return found


def test_each_field_of_the_daemon_stats_has_one_writer() -> None:
    by_field: dict[str, set[str]] = defaultdict(set)
    for path in sorted(DAEMON.rglob("*.py")):
        if path.name == "stats.py":
            continue
        for field in writers(path.read_text()):
            by_field[field].add(path.relative_to(DAEMON).as_posix())
    shared = {field: sorted(mods) for field, mods in by_field.items() if len(mods) > 1}
    assert not shared, f"DaemonStats fields with more than one writing module: {shared}"
    assert by_field["fenced_sessions"] == {"main/runner.py"}  # the reader sees the known writers
    assert by_field["results_produced"] == {"main/transaction.py"}


def test_the_reader_finds_assignments_augments_and_in_place_updates() -> None:
    source = (
        "self.stats.pauses += 1\n"
        "self._stats.ready = True\n"
        "self._stats.dlq.update(r)\n"
        "stats.lag[k] = 1\n"
        "self.other.pauses += 1\n"
    )
    assert writers(source) == {"pauses", "ready", "dlq", "lag"}


def test_fenced_is_the_sum_of_its_two_causes() -> None:
    stats = DaemonStats(fenced_sessions=2, fenced_revocations=3)
    assert stats.fenced == 5
