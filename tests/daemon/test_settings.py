"""Settings precedence, field-named errors and secret masking of `evald run`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from evald.daemon import check_config
from evald.daemon.options import flag_overrides
from evald.daemon.settings import (
    MASK,
    SettingsError,
    env_overrides,
    load_settings,
    masked,
    set_overrides,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "evald.yaml"
    path.write_text(text)
    return path


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "kafka:\n  bootstrap_servers: file:1\n  client_id: from-file\n"
        "daemon:\n  group_id: file-group\n  instance_id: file-inst\n",
    )
    env = {"EVALD_KAFKA__BOOTSTRAP_SERVERS": "env:1,env:2", "EVALD_DAEMON__GROUP_ID": "env-group"}
    settings = load_settings(
        file=path, environ=env, flags={"daemon": {"group_id": "flag-group"}}, validate_engine=False
    )
    assert settings.kafka.bootstrap_servers == ["env:1", "env:2"]
    assert settings.kafka.client_id == "from-file"
    assert settings.daemon.group_id == "flag-group"
    assert settings.daemon.instance_id == "file-inst"


def test_env_values_are_yaml_scalars_but_secrets_stay_strings() -> None:
    env = {
        "EVALD_DAEMON__COMMIT_INTERVAL_MS": "250",
        "EVALD_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "EVALD_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "EVALD_KAFKA__SASL_USERNAME": "007",
        "EVALD_KAFKA__SASL_PASSWORD": "0123",
    }
    settings = load_settings(environ=env, validate_engine=False)
    assert settings.daemon.commit_interval_ms == 250
    assert settings.kafka.sasl_username == "007"
    config = settings.kafka.client_config()
    assert config["sasl_plain_password"] == "0123"
    assert config["sasl_mechanism"] == "SCRAM-SHA-512"
    assert config["security_protocol"] == "SASL_SSL"


def test_masked_hides_every_secret() -> None:
    env = {
        "EVALD_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "EVALD_KAFKA__SASL_MECHANISM": "PLAIN",
        "EVALD_KAFKA__SASL_USERNAME": "svc",
        "EVALD_KAFKA__SASL_PASSWORD": "hunter2",
        "EVALD_KAFKA__SSL_PASSWORD": "keypass",
    }
    data = masked(load_settings(environ=env, validate_engine=False))
    assert data["kafka"]["sasl_password"] == MASK
    assert data["kafka"]["ssl_password"] == MASK
    assert "hunter2" not in repr(data) and "keypass" not in repr(data)
    assert data["kafka"]["sasl_username"] == "svc"


HUGE = "1" + "0" * 400


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"EVALD_KAFKA__BOOTSTRAP_SERVERS": "no-port"}, "kafka.bootstrap_servers"),
        ({"EVALD_DAEMON__COMMIT_INTERVAL_MS": "-5"}, "daemon.commit_interval_ms"),
        ({"EVALD_DAEMON__NOPE": "1"}, "daemon.nope: unknown setting"),
        ({"EVALD_TOPICS__RESULTS": "bad topic!"}, "topics.results"),
        ({"EVALD_TOPICS__DLQ": "evald.impressions"}, "topics: "),
        ({"EVALD_KAFKA__SECURITY_PROTOCOL": "SASL_SSL"}, "kafka: sasl_mechanism is required"),
        ({"EVALD_DAEMON__METRICS_ADDRESS": "nowhere"}, "daemon.metrics_address"),
        ({"EVALD_DAEMON__PAUSE_AT": "0.5", "EVALD_DAEMON__RESUME_AT": "0.7"}, "daemon: resume_at"),
        ({"EVALD_ENGINE__WINDOW": "soon"}, "engine.window: invalid duration"),
        # each passed, to fail at the first request (past the protocol's INT32), keep /readyz
        # green forever or overflow at the stop
        ({"EVALD_KAFKA__SESSION_TIMEOUT_MS": HUGE}, "kafka.session_timeout_ms"),
        ({"EVALD_KAFKA__REQUEST_TIMEOUT_MS": HUGE}, "kafka.request_timeout_ms"),
        ({"EVALD_KAFKA__MAX_POLL_INTERVAL_MS": HUGE}, "kafka.max_poll_interval_ms"),
        ({"EVALD_KAFKA__TRANSACTION_TIMEOUT_MS": str(2**31)}, "kafka.transaction_timeout_ms"),
        ({"EVALD_INPUT__REPARTITION_PARTITIONS": HUGE}, "input.repartition_partitions"),
        ({"EVALD_DAEMON__COMMIT_INTERVAL_MS": HUGE}, "daemon.commit_interval_ms"),
        ({"EVALD_DAEMON__RETRY_BACKOFF_MAX_MS": HUGE}, "daemon.retry_backoff_max_ms"),
        ({"EVALD_DAEMON__STALL_TIMEOUT_S": ".inf"}, "daemon.stall_timeout_s"),
        ({"EVALD_DAEMON__SHUTDOWN_TIMEOUT_S": ".inf"}, "daemon.shutdown_timeout_s"),
        ({"EVALD_DAEMON__SHUTDOWN_TIMEOUT_S": "1e308"}, "daemon.shutdown_timeout_s"),
        # YAML reads yes/true as a boolean, which pydantic took as 1
        ({"EVALD_DAEMON__PAUSE_AT": "yes"}, "daemon.pause_at: a number, not true"),
        ({"EVALD_INPUT__REPARTITION_PARTITIONS": "on"}, "input.repartition_partitions: a number"),
    ],
)
def test_errors_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(environ=env)
    assert str(info.value).startswith(field) or f"\n{field}" in str(info.value), str(info.value)


def test_bad_yaml_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(file=write(tmp_path, "kafka: [unclosed"), environ={})
    with pytest.raises(SettingsError, match="top level must be a mapping"):
        load_settings(file=write(tmp_path, "- a\n- b\n"), environ={})
    with pytest.raises(SettingsError, match="config file"):
        load_settings(file=tmp_path / "missing.yaml", environ={})


def test_env_mapping_ignores_other_variables() -> None:
    process = {"PATH": "/bin", "EVALD_CONFIG": "x.yaml", "EVALD_LOG_LEVEL": "DEBUG"}
    assert env_overrides(process) == {}
    assert env_overrides({"evald_topics__results": "r"}) == {"topics": {"results": "r"}}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    check_config.configure(parser)
    return parser.parse_args(argv)


def test_flags_map_onto_settings_paths() -> None:
    args = parse(
        [
            "--bootstrap-servers",
            "a:1,b:2",
            "--results-topic",
            "res",
            "--group-id",
            "g",
            "--set",
            "engine.window=10m",
            "--set",
            "daemon.group_id=ignored",
        ]
    )
    assert flag_overrides(args) == {
        "kafka": {"bootstrap_servers": "a:1,b:2"},
        "topics": {"results": "res"},
        "daemon": {"group_id": "g"},
        "engine": {"window": "10m"},
    }


def test_check_config_exit_codes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in __import__("os").environ if n.upper().startswith("EVALD_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EVALD_KAFKA__SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("EVALD_KAFKA__SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("EVALD_KAFKA__SASL_USERNAME", "svc")
    monkeypatch.setenv("EVALD_KAFKA__SASL_PASSWORD", "s3cret-value")
    assert check_config.run(parse(["--set", "engine.window=10m"])) == 0
    out = capsys.readouterr().out
    assert "s3cret-value" not in out and MASK in out
    assert "window: 10m" in out  # durations as written, not milliseconds
    assert check_config.run(parse(["--bootstrap-servers", "nohost"])) == 2
    err = capsys.readouterr().err
    assert "kafka.bootstrap_servers" in err and "HOST:PORT" in err


def test_engine_fields_outside_the_engine_section_are_pointed_there() -> None:
    """`statistics` belongs under `engine`: check-config names where, with every other error."""
    with pytest.raises(SettingsError) as err:
        load_settings(
            flags={"statistics": {"alpha": 0.1}, "engine": {"comparisons": []}}, environ={}
        )
    lines = str(err.value).splitlines()
    assert "statistics: unknown setting (did you mean engine.statistics? it belongs there)" in lines
    assert (
        "engine.comparisons: unknown setting "
        "(did you mean engine.statistics.comparisons? it belongs there)"
    ) in lines


def test_an_inline_mapping_giving_a_key_twice_is_refused_as_in_a_file() -> None:
    """A settings file refused ``{click: 1, click: 2}``; the same value in ``--set`` or the
    environment kept the last grade without a word."""
    twice = "{click: 1, click: 2}"
    with pytest.raises(SettingsError, match=r"^--set engine\.action_grades: key 'click' appears"):
        set_overrides([f"engine.action_grades={twice}"])
    with pytest.raises(SettingsError, match=r"^EVALD_ENGINE__ACTION_GRADES: key 'click' appears"):
        env_overrides({"EVALD_ENGINE__ACTION_GRADES": twice})
    assert set_overrides(["engine.action_grades={click: 1, buy: 2}"]) == {
        "engine": {"action_grades": {"click": 1, "buy": 2}}
    }
    assert set_overrides(["engine.window={oops"]) == {"engine": {"window": "{oops"}}  # as before
