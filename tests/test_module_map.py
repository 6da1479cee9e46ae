"""docs/architecture.md's module map stays true: every module it names exists, every module of
``evald/`` is in it (itself or its folder), and each line count, the total's too, is within 5% of
``wc -l`` (10 lines for small modules)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"^(?P<indent> +)(?P<name>\S+?(?:\.py|/))\s+(?P<lines>\d+)(?:  |$)")


def _lines(path: Path) -> int:
    files = path.rglob("*.py") if path.is_dir() else [path]
    return sum(len(f.read_text().splitlines()) for f in files)


def map_entries(text: str) -> dict[str, int]:
    """Path under evald/ -> the count the map gives, from the fenced block after 'evald/'."""
    block = text.split("```\nevald/\n", 1)[1].split("```", 1)[0]
    entries: dict[str, int] = {}
    folders: list[str] = []  # the folder open at each depth (two spaces a level)
    for line in block.splitlines():
        m = ENTRY.match(line)
        if m is None:
            continue
        name, depth = m["name"], len(m["indent"]) // 2 - 1
        del folders[depth:]
        path = "".join(folders) + name
        if name.endswith("/"):
            folders.append(name)
        entries[path.rstrip("/")] = int(m["lines"])
    return entries


def test_the_module_map_names_every_module_with_its_size() -> None:
    entries = map_entries((ROOT / "docs" / "architecture.md").read_text())
    evald = ROOT / "evald"
    for path, listed in entries.items():
        assert (evald / path).exists(), f"the map names evald/{path}, which does not exist"
        actual = _lines(evald / path)
        assert abs(actual - listed) <= max(10, 0.05 * actual), (
            f"evald/{path}: the map says {listed} lines, wc -l says {actual}"
        )
    for module in sorted(evald.rglob("*.py")):
        rel = module.relative_to(evald).as_posix()
        if module.name in {"__init__.py", "__main__.py"}:
            continue
        covered = rel in entries or rel.split("/")[0] in entries
        assert covered, f"evald/{rel} is not in docs/architecture.md's module map"


def test_the_maps_total_is_every_line_of_evald() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    total = re.search(r"^  \(all of evald/\) +(\d+)$", text, re.M)
    assert total is not None, "the module map has no '(all of evald/)' line"
    actual = _lines(ROOT / "evald")
    assert abs(actual - int(total[1])) <= 0.05 * actual, (
        f"the map says evald/ has {total[1]} lines, wc -l says {actual}"
    )


def test_the_map_reader_sees_folders_files_and_their_counts() -> None:
    text = (
        "```\nevald/\n  cli.py   86  x\n  join/   900  y\n    clock.py  135  z\n"
        "    deep/  50  w\n      a.py  40  v\n    b.py  9  u\n  top.py  3  t\n```\n"
    )
    assert map_entries(text) == {
        "cli.py": 86,
        "join": 900,
        "join/clock.py": 135,
        "join/deep": 50,
        "join/deep/a.py": 40,
        "join/b.py": 9,
        "top.py": 3,
    }
