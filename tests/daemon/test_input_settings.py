"""``input.mapping`` (``--mapping`` on `evald run` and `evald check-config`): validated with
the other settings, a bad mapping exits 2 naming the setting and the mapping's key."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from evald.cli import main
from evald.daemon import check_config
from evald.daemon.settings import SettingsError, load_settings


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
    assert yaml.safe_load(capsys.readouterr().out)["input"] == {"mapping": "ubi"}
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
