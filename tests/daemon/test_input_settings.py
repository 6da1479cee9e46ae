"""``input.mapping`` (``--mapping`` on `evald run` and `evald check-config`): validated with
the other settings, a bad mapping exits 2 naming the setting and the mapping's key. And
``input.repartition`` / ``input.repartition_partitions``: validated, shown, set from the
environment."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from evald.cli import main
from evald.daemon import check_config
from evald.daemon.settings import SettingsError, load_settings, merge


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    check_config.configure(parser)
    return parser.parse_args(argv)


@pytest.fixture
def bad_mapping(tmp_path: Path) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"extends": "ubi", "feedback": {"item": "object/object_id"}}))
    return str(path)


def test_the_default_is_the_native_schema_and_ubi_is_accepted() -> None:
    assert load_settings(environ={}).input.mapping == "evald"
    assert load_settings(environ={"EVALD_INPUT__MAPPING": "ubi"}).input.mapping == "ubi"


def test_a_bad_mapping_names_the_setting_and_the_key(bad_mapping: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(environ={}, flags={"input": {"mapping": bad_mapping}})
    message = str(caught.value)
    assert message.startswith("input.mapping: ")
    assert "feedback.item: a JSON Pointer starts with '/'" in message


def test_check_config_prints_the_mapping_and_exits_2_on_a_bad_one(
    bad_mapping: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EVALD_CONFIG", raising=False)
    assert check_config.run(_parse(["--mapping", "ubi"])) == 0
    assert yaml.safe_load(capsys.readouterr().out)["input"] == {
        "mapping": "ubi",
        "repartition": False,
        "repartition_partitions": None,
    }
    assert check_config.run(_parse(["--mapping", bad_mapping])) == 2
    assert "input.mapping: mapping" in capsys.readouterr().err


def test_run_refuses_a_bad_mapping_before_connecting(
    bad_mapping: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EVALD_CONFIG", raising=False)
    # no broker listens on this address: exit 2 means nothing was tried
    argv = ["run", "--bootstrap-servers", "127.0.0.1:9", "--mapping", bad_mapping]
    assert main(argv) == 2
    assert "feedback.item" in capsys.readouterr().err


def test_repartitioning_is_off_by_default_and_set_from_the_environment() -> None:
    default = load_settings(environ={}).input
    assert (default.repartition, default.repartition_partitions) == (False, None)
    env = {"EVALD_INPUT__REPARTITION": "true", "EVALD_INPUT__REPARTITION_PARTITIONS": "6"}
    settings = load_settings(environ=env).input
    assert (settings.repartition, settings.repartition_partitions) == (True, 6)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"input": {"repartition": "maybe"}}, "input.repartition: Input should be a valid bool"),
        ({"input": {"repartition_partitions": 0}}, "input.repartition_partitions: Input should"),
        (
            {"input": {"repartition": True}, "topics": {"dlq": "g.fb.evald-repartition"}},
            "topics: g.fb.evald-repartition is the internal topic of fb",
        ),
        (
            {"input": {"repartition": True}, "topics": {"impressions": "i" * 230}},
            "over 249 characters",
        ),
        (
            {"input": {"repartition": True}, "daemon": {"group_id": "team/evald"}},
            "daemon: group_id 'team/evald' names the internal topics",
        ),
    ],
)
def test_bad_repartition_settings_name_the_field(flags: dict, expected: str) -> None:
    base = {"topics": {"feedback": "fb"}, "daemon": {"group_id": "g"}}
    with pytest.raises(SettingsError) as caught:
        load_settings(environ={}, flags=merge(base, flags))
    assert expected in str(caught.value)


def test_check_config_shows_repartitioning(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EVALD_CONFIG", raising=False)
    monkeypatch.setenv("EVALD_INPUT__REPARTITION", "true")
    assert check_config.run(_parse(["--mapping", "ubi"])) == 0
    assert yaml.safe_load(capsys.readouterr().out)["input"]["repartition"] is True
    assert check_config.run(_parse(["--set", "input.repartition_partitions=0"])) == 2
    assert "input.repartition_partitions: " in capsys.readouterr().err
