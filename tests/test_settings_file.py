"""Files a person wrote (settings, a mapping, a web config) that cannot be read: every command
exits 2 naming the file and what is wrong, never with a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evald import settings_file
from evald.cli import main
from evald.settings_file import SettingsFileError, read_settings_file

#: each unreadable file and the words the message must hold after its path
BAD_FILES = {
    "latin1.yaml": (b"measures: [caf\xe9]\n", "not UTF-8 text (invalid continuation byte"),
    "directory.yaml": (None, "Is a directory"),
    "broken.yaml": (b"measures: [RR\n  window: {\n", "not valid YAML"),
    "deep.yaml": (b"[" * 600, "not valid YAML: nested too deeply for the parser"),
    # PyYAML keeps the last of two values without a word: one of them was a mistake
    "twice.yaml": (
        b"measures: [RR]\nwindow: 5m\nmeasures: [AP]\n",
        "not valid YAML: key 'measures' appears twice in one mapping (lines 1 and 3): keep one",
    ),
    "twice_flow.yaml": (
        b"tls_server_config: {cert_file: a, cert_file: b}\n",
        "not valid YAML: key 'cert_file' appears twice in one mapping (line 1): keep one",
    ),
}


def _make(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    content, _ = BAD_FILES[name]
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_every_command_names_the_file_and_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = _make(tmp_path, name)
    events = tmp_path / "events.jsonl"
    events.write_text("")
    words = BAD_FILES[name][1]
    commands = {
        "evald replay: --config: ": ["replay", str(events), "--config", str(path)],
        "evald replay: --mapping: mapping ": ["replay", str(events), "--mapping", str(path)],
        "config file ": ["check-config", "--config", str(path)],
        "input.mapping: mapping ": ["check-config", "--mapping", str(path)],
        "daemon.web_config_file: ": ["check-config", "--web-config-file", str(path)],
    }
    for prefix, argv in commands.items():
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{prefix}{path}: {words}" in err, (argv, err)


def test_replay_on_a_config_file_that_is_not_utf8_exits_2_in_the_real_process(
    tmp_path: Path,
) -> None:
    """It ended with a UnicodeDecodeError traceback and exit status 1."""
    path = _make(tmp_path, "latin1.yaml")
    events = tmp_path / "events.jsonl"
    events.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "evald", "replay", str(events), "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"evald replay: --config: {path}: not UTF-8 text" in done.stderr
    assert "save it as UTF-8" in done.stderr


def test_permission_denied_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the tests may run as root, which reads any file: the refusal is the kernel's, simulated
    def refuse(path: object, mode: str = "r") -> object:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(settings_file, "open", refuse, raising=False)
    with pytest.raises(SettingsFileError, match=r"^/etc/evald\.yaml: Permission denied$"):
        read_settings_file("/etc/evald.yaml")


def test_a_file_too_large_to_be_settings_is_not_read_to_its_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(settings_file, "MAX_BYTES", 10)
    path = tmp_path / "big.yaml"
    path.write_text("window: 5m\nlateness: 0\n")
    with pytest.raises(SettingsFileError, match="larger than"):
        read_settings_file(path)
    if Path("/dev/zero").exists():  # endless: refused after MAX_BYTES
        with pytest.raises(SettingsFileError, match="larger than"):
            read_settings_file("/dev/zero")


def test_json_and_yaml_documents_are_read(tmp_path: Path) -> None:
    yaml_path, json_path, empty = tmp_path / "a.yaml", tmp_path / "a.json", tmp_path / "e.yaml"
    yaml_path.write_text("window: 5m\n")
    json_path.write_text('{"window": "5m"}')
    empty.write_text("")
    assert read_settings_file(yaml_path) == {"window": "5m"}
    assert read_settings_file(json_path, json_text=True) == {"window": "5m"}
    assert read_settings_file(empty) is None
    with pytest.raises(SettingsFileError, match="not valid JSON"):
        read_settings_file(yaml_path, json_text=True)


def test_a_key_given_twice_in_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "twice.json"
    path.write_text('{"fields": {"ts": "a", "query": "q", "ts": "b"}}')
    with pytest.raises(SettingsFileError, match="key 'ts' appears twice in one object: keep one"):
        read_settings_file(path, json_text=True)


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {window: 5m, lateness: 0}\nother:\n  <<: *b\n  window: 10m\n")
    assert read_settings_file(path)["other"] == {"window": "10m", "lateness": 0}
