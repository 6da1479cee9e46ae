"""``clash``: outputs that would destroy an input or each other, and those that would not."""

from __future__ import annotations

import os
from pathlib import Path

from evald.output_files import clash


def test_a_regular_file_named_twice_is_refused_by_any_name(tmp_path: Path) -> None:
    first = tmp_path / "o1"
    first.write_text("")
    os.link(first, tmp_path / "o2")  # a hard link: another path, the same file
    (tmp_path / "o3").symlink_to(first)
    for other in ("o1", "o2", "o3"):
        outputs = {"--results": str(first), "--rejected": str(tmp_path / other)}
        assert (
            clash(outputs, [])
            == f"--rejected {tmp_path / other} is also --results: give each its own file"
        )
    new = str(tmp_path / "new")  # not there yet: the path it will be made at
    assert clash({"--results": new, "--windows": new}, []) is not None
    assert clash({"--results": str(tmp_path / "o2")}, [str(first)]) is not None


def test_devices_take_any_number_of_outputs(tmp_path: Path) -> None:
    """``/dev/null`` twice was refused as one file written twice; writing it destroys nothing."""
    outputs = {"--results": os.devnull, "--rejected": os.devnull, "--windows": "-", "--looks": "-"}
    assert clash(outputs, [os.devnull]) is None
    assert clash({"--results": str(tmp_path / "a")}, [str(tmp_path / "b")]) is None
