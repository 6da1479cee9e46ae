"""Mapping files: built-ins, extends with overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evald.mapping import MappingError, load_spec
from evald.mapping.presets import UBI


def write(tmp_path: Path, tree: object, name: str = "m.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def test_the_evald_mapping_is_the_native_schema_and_ubi_is_built_in() -> None:
    assert load_spec("evald") is None
    spec = load_spec("ubi")
    assert spec is not None and spec.feedback is not None
    assert spec.feedback.actions == {"click": 1, "add_to_cart": 2, "purchase": 3}


def test_extends_overrides_grades_and_null_removes_an_action(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"extends": "ubi", "feedback": {"actions": {"add_to_cart": None, "purchase": 5}}},
    )
    spec = load_spec(path)
    assert spec is not None and spec.feedback is not None
    assert spec.feedback.actions == {"click": 1, "purchase": 5}
    assert spec.impression == load_spec("ubi").impression  # type: ignore[union-attr]
    assert UBI["feedback"]["actions"]["add_to_cart"] == 2  # the preset itself is untouched


def test_a_json_mapping_file_is_read_too(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{"extends": "ubi", "description": "json"}')
    spec = load_spec(str(path))
    assert spec is not None and spec.description == "json"


@pytest.mark.parametrize(
    ("tree", "named"),
    [
        ({"extends": "ubi", "feedback": {"item": "object_id"}}, "feedback.item: a JSON Pointer"),
        (
            {"extends": "ubi", "impression": {"time": {"format": "epoch_min"}}},
            "impression.time.format",
        ),
        ({"extends": "ubi", "feedback": {"actions": {"click": -1}}}, "feedback.actions.click"),
        ({"extends": "ubi", "feedback": {"acions": {}}}, "feedback.acions: unknown key"),
        ({"extends": "ubi", "kind": {"means": None}}, "kind: present needs means"),
        ({"extends": "nope"}, "extends: 'nope' is not a built-in"),
        ({"description": "empty"}, "needs an impression or a feedback section"),
        ({"impression": {"request_id": "/id"}}, "impression.time: Field required"),
        (
            {"extends": "ubi", "impression": {"time": {"source": "record"}}},
            "impression.time: source: record takes the Kafka record timestamp: no path or format",
        ),
        (
            {"extends": "ubi", "feedback": {"time": {"source": "header"}}},
            "feedback.time.source: Input should be 'field' or 'record'",
        ),
        (
            {"extends": "ubi", "feedback": {"time": {"path": None}}},
            "feedback.time: give path and format (or source: record for the Kafka timestamp)",
        ),
    ],
)
def test_a_bad_mapping_names_the_key(tmp_path: Path, tree: object, named: str) -> None:
    path = write(tmp_path, tree)
    with pytest.raises(MappingError) as caught:
        load_spec(path)
    assert named in str(caught.value)
    assert path in str(caught.value)


def test_neither_a_name_nor_a_file(tmp_path: Path) -> None:
    with pytest.raises(MappingError, match="neither a built-in"):
        load_spec(str(tmp_path / "missing.yaml"))


def test_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("impression: [unclosed")
    with pytest.raises(MappingError, match="not valid YAML"):
        load_spec(str(path))


def test_the_time_from_the_kafka_record(tmp_path: Path) -> None:
    """``time: {source: record}``; over a built-in, its path and format are removed (null)."""
    record = {"source": "record", "path": None, "format": None}
    spec = load_spec(write(tmp_path, {"extends": "ubi", "feedback": {"time": record}}))
    assert spec is not None and spec.reads_record_time()
    assert spec.feedback is not None and spec.feedback.time.source == "record"
    assert spec.impression is not None and spec.impression.time.path == "/timestamp"
    ubi = load_spec("ubi")
    assert ubi is not None and not ubi.reads_record_time()


def test_the_ubi_preset_reads_ubi_as_its_writers_write_it() -> None:
    spec = load_spec("ubi")
    assert spec is not None and spec.impression is not None and spec.feedback is not None
    assert spec.impression.repeats == "merge" and spec.feedback.shown_actions == ["impression"]
    assert spec.impression.time.formats == ("rfc3339", "epoch_ms")
    assert spec.indices == {"ubi_queries": "impression", "ubi_events": "feedback"}
    assert spec.merges_repeats()


@pytest.mark.parametrize(
    ("tree", "named"),
    [
        (
            {"extends": "ubi", "feedback": {"time": {"format": ["epoch_s", "epoch_ms"]}}},
            "feedback.time: epoch_s and epoch_ms: a number cannot tell its unit",
        ),
        ({"extends": "ubi", "feedback": {"time": {"format": []}}}, "declare at least one"),
        (
            {"extends": "ubi", "feedback": {"shown_actions": ["click"]}},
            "feedback: shown_actions: 'click' is a graded action too",
        ),
        (
            {"extends": "ubi", "feedback": {"position": None}},
            "feedback: shown_actions: needs position",
        ),
        (
            {"extends": "ubi", "impression": {"repeats": "duplicate"}},
            "feedback.shown_actions: needs impression.repeats: merge",
        ),
        (
            {"extends": "ubi", "impression": {"repeats": "last"}},
            "impression.repeats: Input should be 'duplicate' or 'merge'",
        ),
        ({"extends": "ubi", "indices": {"x": "query"}}, "indices.x"),
        (
            {"extends": "ubi", "impression": None, "feedback": {"shown_actions": None}},
            "indices.ubi_queries: the mapping has no impression section",
        ),
    ],
)
def test_the_ubi_features_are_checked_naming_the_key(
    tmp_path: Path, tree: object, named: str
) -> None:
    path = write(tmp_path, tree)
    with pytest.raises(MappingError) as caught:
        load_spec(path)
    assert named in str(caught.value)


def test_one_declared_format_over_the_preset_restricts_it(tmp_path: Path) -> None:
    spec = load_spec(
        write(tmp_path, {"extends": "ubi", "impression": {"time": {"format": "epoch_ms"}}})
    )
    assert spec is not None and spec.impression is not None
    assert spec.impression.time.formats == ("epoch_ms",)
