"""Hostile settings through the real `evald` process: Kubernetes service-link variables, log
levels in any case, a settings file that is not UTF-8, a windows_file that cannot be written.

Each case runs ``python -m evald`` as a child and reads its exit status and stderr; nothing here
needs a broker (the bad cases exit before connecting, and the bootstrap server is a closed port).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from child_processes import die_with_parent

from evald.daemon.settings import env_overrides

# The Service named `evald` makes Kubernetes inject these into every pod started after it.
SERVICE_LINKS = {
    "EVALD_PORT": "tcp://10.0.0.1:9464",
    "EVALD_PORT_9464_TCP": "tcp://10.0.0.1:9464",
    "EVALD_PORT_9464_TCP_ADDR": "10.0.0.1",
    "EVALD_PORT_9464_TCP_PORT": "9464",
    "EVALD_PORT_9464_TCP_PROTO": "tcp",
    "EVALD_SERVICE_HOST": "10.0.0.1",
    "EVALD_SERVICE_PORT": "9464",
    "EVALD_SERVICE_PORT_METRICS": "9464",
}

CLOSED = "127.0.0.1:1"  # nothing listens: a run that got past its checks would retry forever
TIMEOUT = 120  # generous: only reached if a bad setting is not refused at start


def evald(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("EVALD_")}
    return subprocess.run(
        [sys.executable, "-m", "evald", *argv],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        preexec_fn=die_with_parent,
    )


def test_service_link_variables_are_not_settings() -> None:
    env = {**SERVICE_LINKS, "EVALD_DAEMON__GROUP_ID": "from-env"}
    assert env_overrides(env) == {"daemon": {"group_id": "from-env"}}


def test_check_config_passes_with_kubernetes_service_links() -> None:
    done = evald("check-config", env={**SERVICE_LINKS, "EVALD_DAEMON__GROUP_ID": "linked"})
    assert done.returncode == 0, done.stderr
    assert "group_id: linked" in done.stdout


def test_lower_case_log_level_enables_debug_and_ignored_names_are_logged_once(
    tmp_path: Path,
) -> None:
    # exits 2 on the windows_file, after logging is set up at DEBUG from the lower-case name
    bad = str(tmp_path / "missing-dir" / "windows.jsonl")
    env = {**SERVICE_LINKS, "EVALD_LOG_LEVEL": "debug"}
    done = evald(
        "run", "--bootstrap-servers", CLOSED, "--set", f"daemon.windows_file={bad}", env=env
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("EVALD_SERVICE_HOST is not a setting") == 1, done.stderr


def test_a_bad_log_level_exits_2_naming_the_variable() -> None:
    done = evald("run", "--bootstrap-servers", CLOSED, env={"EVALD_LOG_LEVEL": "verbose"})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "'verbose' is not a log level (EVALD_LOG_LEVEL" in done.stderr


def test_a_settings_file_that_is_not_utf8_exits_2_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "evald.yaml"
    path.write_bytes(b"daemon:\n  group_id: caf\xe9\n")  # Latin-1, as an editor may save it
    for command in ("check-config", "run"):
        done = evald(command, "--config", str(path), "--bootstrap-servers", CLOSED)
        assert done.returncode == 2, (command, done.stderr)
        assert "Traceback" not in done.stderr
        assert f"config file {path}: not UTF-8 text" in done.stderr


def test_an_unwritable_windows_file_fails_the_start(tmp_path: Path) -> None:
    cases = {
        str(tmp_path / "missing-dir" / "w.jsonl"): "No such file or directory",
        str(tmp_path): "is a directory",
    }
    for path, why in cases.items():
        done = evald("run", "--bootstrap-servers", CLOSED, "--set", f"daemon.windows_file={path}")
        assert done.returncode == 2, done.stderr
        assert "daemon.windows_file:" in done.stderr and why in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())  # the probe left nothing behind


def test_a_writable_windows_file_passes_and_leaves_no_probe(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    done = evald("check-config", "--set", f"daemon.windows_file={path}")
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.iterdir())


def test_a_metrics_port_already_taken_exits_2_saying_what_to_do() -> None:
    """`make demo` still serving 9464 while the README's `evald run` starts is the first hour's
    likeliest clash: it must read as one line that says what to do, not a traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = evald("run", "--bootstrap-servers", CLOSED, "--metrics-address", address)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (last,) = done.stderr.strip().splitlines()[-1:]
    assert f"cannot listen on {address}: Address already in use" in last, done.stderr
    assert "--metrics-address" in last and "daemon.metrics_address" in last, done.stderr


def test_a_metrics_host_that_does_not_resolve_exits_2_saying_what_to_do() -> None:
    """It ended with an AddressError traceback and exit status 1."""
    address = "no-such-host.invalid:9464"  # .invalid never resolves (RFC 2606)
    done = evald("run", "--bootstrap-servers", CLOSED, "--metrics-address", address)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (last,) = done.stderr.strip().splitlines()[-1:]
    assert last.startswith("evald run: daemon.metrics_address: cannot resolve listen host"), last
    assert "--metrics-address" in last, last
