"""The size rules of docs/architecture.md ("Size rules"), checked over ``evald/`` with ``ast``:
no class sets more than ``MAX_ATTRIBUTES`` distinct attributes and no function has more than
``MAX_CODE_LINES`` lines of code, unless its docstring has a line starting with ``Long
because:`` that says why."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "evald"
MAX_ATTRIBUTES = 20
MAX_CODE_LINES = 60
MARKER = "Long because:"

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def justified(node: ast.ClassDef | FunctionNode) -> bool:
    """The docstring says why the rule does not apply (a line starting ``Long because:``)."""
    doc = ast.get_docstring(node) or ""
    return any(line.strip().startswith(MARKER) for line in doc.splitlines())


def code_lines(node: FunctionNode, source_lines: list[str]) -> int:
    """Non-blank, non-comment lines of the body of ``node`` (nested definitions included),
    without its docstring; the signature does not count."""
    body = node.body
    if (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
        if not body:
            return 0
    count = 0
    for number in range(body[0].lineno, (node.end_lineno or node.lineno) + 1):
        text = source_lines[number - 1].strip()
        if text and not text.startswith("#"):
            count += 1
    return count


def is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def attributes(node: ast.ClassDef) -> set[str]:
    """The distinct ``self.<name>`` a class's own methods assign, plus its dataclass fields."""
    names: set[str] = set()
    if is_dataclass(node):
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                annotation = ast.unparse(stmt.annotation)
                if "ClassVar" not in annotation:
                    names.add(stmt.target.id)
    for method in node.body:
        if not isinstance(method, FunctionNode) or not method.args.args:
            continue
        me = method.args.args[0].arg
        for sub in ast.walk(method):
            targets: list[ast.expr] = []
            if isinstance(sub, ast.Assign):
                targets = list(sub.targets)
            elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
                targets = [sub.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if (
                        isinstance(leaf, ast.Attribute)
                        and isinstance(leaf.value, ast.Name)
                        and leaf.value.id == me
                        and isinstance(leaf.ctx, ast.Store)
                    ):
                        names.add(leaf.attr)
    return names


def offenders(source: str, where: str) -> Iterator[str]:
    """One line per class or function of ``source`` that breaks a size rule unjustified."""
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and not justified(node):
            count = len(attributes(node))
            if count > MAX_ATTRIBUTES:
                yield f"{where}:{node.lineno} class {node.name}: {count} attributes"
        elif isinstance(node, FunctionNode) and not justified(node):
            count = code_lines(node, lines)
            if count > MAX_CODE_LINES:
                yield f"{where}:{node.lineno} def {node.name}: {count} code lines"


def all_offenders() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        found += offenders(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT.parent)))
    return found


def test_no_class_or_function_in_evald_is_over_the_size_rules() -> None:
    found = all_offenders()
    assert not found, "over the size rules (docs/architecture.md):\n" + "\n".join(found)


WIDE = "class Wide:\n    def __init__(self) -> None:\n" + "".join(
    f"        self.a{i} = {i}\n" for i in range(MAX_ATTRIBUTES + 1)
)
LONG = "def long() -> int:\n    '''Doc.'''\n    x = 0\n" + "    x += 1\n" * MAX_CODE_LINES


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (WIDE, ["t.py:1 class Wide: 21 attributes"]),
        (LONG, ["t.py:1 def long: 61 code lines"]),
        # a dataclass's fields count, and so do attributes only some methods set
        (
            "@dataclass\nclass D:\n"
            + "".join(f"    f{i}: int\n" for i in range(MAX_ATTRIBUTES))
            + "    def set(self) -> None:\n        self.extra = 1\n",
            ["t.py:2 class D: 21 attributes"],
        ),
        # exactly at the limits: blank lines, comments and the docstring do not count
        (WIDE.replace(f"        self.a{MAX_ATTRIBUTES} = {MAX_ATTRIBUTES}\n", ""), []),
        (LONG.replace("    x += 1\n", "    # note\n\n", 1), []),
        # the marker
        (LONG.replace("'''Doc.'''", "'''Doc.\n\n    Long because: a hot loop.\n    '''"), []),
        (
            WIDE.replace("class Wide:\n", "class Wide:\n    '''Long because: a record.'''\n"),
            [],
        ),
    ],
)
def test_the_checker_flags_what_is_over_and_only_that(source: str, expected: list[str]) -> None:
    assert list(offenders(textwrap.dedent(source), "t.py")) == expected


def test_the_rules_are_the_ones_docs_architecture_states() -> None:
    doc = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rules = doc[doc.index("## Size rules") :]
    rules = rules[: rules.index("\n## ")]
    assert f"more than {MAX_ATTRIBUTES} distinct attributes" in rules
    assert f"more than {MAX_CODE_LINES} lines of code" in rules
    assert f"`{MARKER}`" in rules


def test_no_two_test_modules_outside_packages_share_a_name() -> None:
    """pytest imports a test file of a folder without ``__init__.py`` by its bare name, so a
    second one of that name elsewhere fails to collect ("import file mismatch") in a run that
    collects both (``make test``), while each folder alone passes."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(tests.rglob("test_*.py")):
        if (path.parent / "__init__.py").exists():
            continue
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(tests)} and {path.relative_to(tests)}")
        seen.setdefault(path.name, path)
    assert not clashes, clashes
