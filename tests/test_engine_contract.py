"""docs/architecture.md's "Engine contract" lists ``Engine``'s whole public API: every public
method and attribute of the class is in the block, and the block names nothing the class lacks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMBER = re.compile(r"^    (?:def (?P<method>\w+)\(|(?P<attr>\w+):)", re.M)


def listed(doc: str) -> set[str]:
    """The names the contract's code block gives, methods and attributes alike."""
    block = doc.split("## Engine contract\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    return {m["method"] or m["attr"] for m in MEMBER.finditer(block)} - {"__init__"}


def public_api(source: str, name: str = "Engine") -> set[str]:
    """Public methods, class attributes and ``self.x`` attributes any method assigns."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(cls):
        stored = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        if stored and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return {n for n in names if not n.startswith("_")}


def test_the_engine_contract_lists_every_public_member_and_only_those() -> None:
    api = public_api((ROOT / "evald" / "engine.py").read_text())
    docs = listed((ROOT / "docs" / "architecture.md").read_text())
    assert not api - docs, f"Engine members missing from docs/architecture.md: {sorted(api - docs)}"
    assert not docs - api, f"docs/architecture.md names what Engine lacks: {sorted(docs - api)}"


def test_the_readers_see_methods_attributes_and_only_public_ones() -> None:
    source = (
        "class Engine:\n"
        "    hook: int | None = None\n"
        "    def __init__(self):\n"
        "        self.stats = 1\n"
        "        self._private = 2\n"
        "    def tick(self): ...\n"
        "    def _helper(self): ...\n"
    )
    assert public_api(source) == {"hook", "stats", "tick"}
    doc = "## Engine contract\n\n```python\nclass Engine:\n    def __init__(self)\n"
    doc += "    def tick(self) -> int   # x\n    stats: Stats\n        nested: no\n```\n"
    assert listed(doc) == {"tick", "stats"}
