"""The Dockerfile and its build context, checked offline (no Docker engine here)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from deploy_support import REPO

from deploy.generator.spec import Spec

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_runtime_image_is_python_slim() -> None:
    assert final_stage()[0] == ("FROM", "python:3.11-slim")
    for word, args in instructions():
        if word == "FROM":
            assert args.split()[0] == "python:3.11-slim"


def test_runs_as_a_non_root_user_created_in_the_image() -> None:
    stage = final_stage()
    users = [args for word, args in stage if word == "USER"]
    assert users, "no USER in the final stage"
    uid = users[-1].split(":")[0]
    assert uid not in {"0", "root"}
    created = " ".join(args for word, args in stage if word == "RUN")
    assert f"--uid {uid}" in created
    user_at = max(i for i, (w, _) in enumerate(stage) if w == "USER")
    entry_at = max(i for i, (w, _) in enumerate(stage) if w == "ENTRYPOINT")
    assert user_at < entry_at


def test_healthcheck_probes_healthz_with_python_on_the_exposed_port() -> None:
    stage = dict(final_stage())
    port = Spec().metrics_port
    assert stage["EXPOSE"] == str(port)
    health = stage["HEALTHCHECK"]
    cmd = json.loads(health[health.index("CMD") + 3 :].strip())
    assert cmd[0] == "python"
    env = dict(item.split("=", 1) for item in shlex.split(stage["ENV"]) if "=" in item)
    url = env["HEALTHCHECK_URL"]
    assert url == f"http://127.0.0.1:{port}/healthz"
    assert "HEALTHCHECK_URL" in cmd[-1]
    # the daemon listens on all interfaces inside the container, on the exposed port
    assert _image_settings(image_env()).daemon.metrics_address == f"0.0.0.0:{port}"


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in final_stage():
        if word == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(args) if "=" in item)
    return env


def _copied_from(dest: str) -> Path:
    """The build-context file a COPY of the final stage puts at ``dest``."""
    for word, args in final_stage():
        if word == "COPY" and not args.startswith("--from"):
            *sources, target = args.split()
            if target == dest:
                (source,) = sources
                return REPO / source
    raise AssertionError(f"nothing is copied to {dest}")


def _image_settings(env: dict[str, str], file: Path | None = None) -> Any:
    """Settings as `evald run` in the image loads them: the image's environment, its settings
    file (EVALD_CONFIG, read from the build context) unless ``file`` replaces it."""
    from evald.daemon.settings import load_settings

    image_file = _copied_from(env["EVALD_CONFIG"])
    rest = {k: v for k, v in env.items() if k != "EVALD_CONFIG"}
    return load_settings(file=file or image_file, environ=rest)


def test_image_environment_is_accepted_by_evald_settings() -> None:
    """`evald run` reads every EVALD_* variable as a setting and refuses unknown ones: the
    image's own environment must load."""
    env = image_env()
    assert any(name.startswith("EVALD_") for name in env)
    assert _image_settings(env).daemon.metrics_address == "0.0.0.0:9464"


def test_a_settings_file_is_not_overridden_by_the_image(tmp_path: Path) -> None:
    """Flags > EVALD_* variables > file > defaults: a setting in the image's environment would
    silently beat the operator's file, so the image sets none (its defaults are a file)."""
    env = image_env()
    settings_vars = [name for name in env if "__" in name and name.startswith("EVALD_")]
    assert settings_vars == [], f"{settings_vars} would override every settings file"
    mine = tmp_path / "evald.yaml"
    mine.write_text("daemon:\n  metrics_address: 0.0.0.0:9100\n")
    assert _image_settings(env, mine).daemon.metrics_address == "0.0.0.0:9100"


def test_entrypoint_is_evald() -> None:
    stage = dict(final_stage())
    assert json.loads(stage["ENTRYPOINT"]) == ["evald"]
    assert json.loads(stage["CMD"]) == ["run"]


def test_the_image_installs_the_project_with_pip() -> None:
    runs = " ".join(args for word, args in instructions() if word == "RUN")
    assert re.search(r"pip (wheel|install) [^&]*\s\.(\s|$)", runs)
    assert "--no-cache-dir" in runs


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore semantics for the patterns used here (last match wins)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        parts = rel.split("/")
        hit = any(
            fnmatch.fnmatch("/".join(parts[:i]), pat.replace("**/", "*"))
            or fnmatch.fnmatch("/".join(parts[:i]), pat)
            for i in range(1, len(parts) + 1)
        )
        if hit:
            ignored = not negate
    return ignored


@pytest.fixture(scope="module")
def ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def test_build_context_keeps_what_pip_install_reads(ignore_patterns: list[str]) -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    readme = re.search(r'^readme = "([^"]+)"', pyproject, re.MULTILINE)
    assert readme is not None
    needed = ["pyproject.toml", readme.group(1), "evald/__init__.py", "evald/cli.py"]
    needed += [p.relative_to(REPO).as_posix() for p in (REPO / "evald").rglob("*.py")]
    for rel in needed:
        assert not _ignored(rel, ignore_patterns), f"{rel} is excluded from the build context"
    for rel in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/deploy/conftest.py",
        "evald/__pycache__/cli.cpython-311.pyc",
    ):
        assert _ignored(rel, ignore_patterns), f"{rel} would be sent to the daemon"


def test_every_copied_source_exists_in_the_context(ignore_patterns: list[str]) -> None:
    for word, args in instructions():
        if word != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        for source in sources:
            path = REPO / source
            assert path.exists(), source
            assert not _ignored(Path(source).as_posix(), ignore_patterns), source
