"""No import cycle of more than two modules in ``evald/`` (docs/architecture.md, "Size rules"):
data flows one way, so a module never imports, even inside a function or for type checking
only, something that leads back to it through a third module. Two modules importing each
other (a package and its submodule) are allowed."""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "evald"


def sources(root: Path = ROOT) -> dict[str, str]:
    """Dotted module name (a package by its ``__init__``) -> source, for every module."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path.read_text()
    return out


def imported(module: str, source: str, modules: Mapping[str, object], package: bool) -> set[str]:
    """The modules of ``modules`` that ``module`` imports anywhere in its source (top level,
    functions, ``if TYPE_CHECKING:``); ``from a import b`` is ``a.b`` when that is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: len(module.split(".")) - node.level + package]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {name for name in found if name in modules and name != module}


def import_graph(modules: Mapping[str, str], packages: frozenset[str] = frozenset()) -> dict:
    """Module -> the modules it imports. ``packages``: the names that are ``__init__`` modules
    (relative imports resolve from the package itself there)."""
    return {
        name: imported(name, source, modules, name in packages) for name, source in modules.items()
    }


def _path(graph: Mapping[str, set[str]], start: str, goal: str, avoid: str) -> list[str] | None:
    """A shortest path ``start`` -> ``goal`` that does not pass through ``avoid``."""
    before: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            path = []
            step: str | None = node
            while step is not None:
                path.append(step)
                step = before[step]
            return path[::-1]
        for nxt in sorted(graph[node]):
            if nxt not in before and nxt != avoid:
                before[nxt] = node
                queue.append(nxt)
    return None


def long_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle of three or more distinct modules per set of modules that forms one, each
    listed from its first module (which it returns to, not listed again).

    Every such cycle is ``a -> b -> c -> ... -> a`` with ``c != a``: for each pair of edges
    ``a -> b -> c``, a path from ``c`` back to ``a`` avoiding ``b`` closes one (and is simple,
    being a shortest path)."""
    cycles: dict[frozenset[str], list[str]] = {}
    for a in sorted(graph):
        for b in sorted(graph[a]):
            for c in sorted(graph[b] - {a}):
                back = _path(graph, c, a, avoid=b)
                if back is not None:
                    cycle = [a, b, *back[:-1]]
                    cycles.setdefault(frozenset(cycle), cycle)
    return sorted(cycles.values())


def evald_graph(root: Path = ROOT) -> dict:
    modules = sources(root)
    packages = frozenset(
        name for name in modules if (root.parent / name.replace(".", "/") / "__init__.py").exists()
    )
    return import_graph(modules, packages)


def test_evald_has_no_import_cycle_of_more_than_two_modules() -> None:
    graph = evald_graph()
    assert "evald.config" in graph and "evald.exposition.budget" in graph["evald.exposition"]
    found = [" -> ".join([*cycle, cycle[0]]) for cycle in long_cycles(graph)]
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_the_checker_flags_a_cycle_through_a_function_level_or_type_only_import() -> None:
    """The cycle config.py closed: a validator importing the exposition, whose budget imports
    the settings only for type checking. Two modules importing each other are not flagged."""
    modules = {
        "pkg.config": "def check():\n    from pkg.exposition import Shape\n",
        "pkg.exposition": "from .budget import Shape\n",
        "pkg.exposition.budget": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..config import X\n"
        ),
        "pkg.a": "import pkg.b\n",
        "pkg.b": "from pkg import a\n",
    }
    graph = import_graph(modules, frozenset({"pkg.exposition"}))
    assert graph["pkg.exposition"] == {"pkg.exposition.budget"}
    assert graph["pkg.exposition.budget"] == {"pkg.config"}
    assert graph["pkg.b"] == {"pkg.a"}  # `from pkg import a`: the submodule
    assert long_cycles(graph) == [["pkg.config", "pkg.exposition", "pkg.exposition.budget"]]
    # the negative control: without the validator's import nothing is flagged
    graph = import_graph({**modules, "pkg.config": "X = 1\n"}, frozenset({"pkg.exposition"}))
    assert long_cycles(graph) == []
