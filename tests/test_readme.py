"""The README's walk-throughs as executable documentation: the Kafka one's command lines, parsed
from the README and run in order as written, against a broker of the test's own, must end in
numbers in `evald top`. Only the ports change (the walk-through's fixed 9092 and 9464 may be
taken on a shared machine) and where the broker keeps its data. The offline scoring one's run
on the example data set, with docs/score.md's runner.

A command the runner does not know fails the test: a new line in the walk-through needs a
rule here saying how to tell it worked.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from child_processes import like_a_terminal

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BROKER, METRICS = "127.0.0.1:9092", "127.0.0.1:9464"


def walk_through(name: str) -> list[str]:
    """The command lines of the fenced block after ``<!-- walk-through: NAME -->``, their
    trailing comments removed."""
    text = README.read_text(encoding="utf-8")
    marker = f"<!-- walk-through: {name} -->"
    assert marker in text, f"README.md has no {marker}"
    block = re.search(r"```\w*\n(.*?)```", text[text.index(marker) :], re.S)
    assert block is not None, f"no fenced block after {marker}"
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_state(pid: int) -> str:
    """The process's state, signal masks and where it waits in the kernel (Linux /proc)."""
    lines = []
    for name in ("status", "wchan", "stack"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text(errors="replace")
        except OSError as exc:
            text = f"({exc})"
        if name == "status":
            keys = ("State", "Threads", "SigQ", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
            text = "\n".join(x for x in text.splitlines() if x.startswith(keys))
        lines.append(f"{name}: {text.strip()}")
    return "\n".join(lines)


class Terminal:
    """One of the walk-through's terminals: a process in a session of its own (Ctrl-C there
    reaches every process of it), its output collected in a file."""

    def __init__(self, argv: list[str], out: Path, env: dict[str, str] | None = None) -> None:
        self.out = out
        self.hung = ""
        with out.open("wb") as sink:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=like_a_terminal,
            )

    def text(self) -> str:
        return self.out.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.text(), re.M)
            if found:
                return found
            if self.proc.poll() is not None:
                pytest.fail(f"{self.proc.args} exited ({self.proc.returncode}):\n{self.text()}")
            if time.monotonic() > deadline:
                args = self.proc.args
                pytest.fail(f"no {pattern!r} within {timeout}s from {args}:\n{self.text()}")
            time.sleep(0.2)

    def ctrl_c(self, times: int = 1) -> None:
        for _ in range(times):
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGINT)
                time.sleep(0.05)

    def stop(self, timeout: float = 60.0) -> int | None:
        """Ctrl-C, then kill -9 if it does not end in ``timeout`` seconds (what the kernel said
        of the process then is kept in ``hung``, for the failure's message)."""
        self.ctrl_c()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.hung = proc_state(self.proc.pid)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    try:
        yield opened
    finally:
        for terminal in reversed(opened):
            if terminal.proc.poll() is None:
                os.killpg(terminal.proc.pid, signal.SIGKILL)
                terminal.proc.wait()


def test_the_score_walk_through_runs_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offline scoring lines run on the example data set, in a directory holding the
    checkout's ``evald/`` (``out/`` is made there), with the page runner of docs/score.md."""
    from score.test_docs import Page

    (tmp_path / "evald").symlink_to(ROOT / "evald")
    page = Page(tmp_path, capsys, monkeypatch)
    lines = [line.replace(".venv/bin/evald ", "evald ") for line in walk_through("score")]
    outputs = [out for line in lines for out in page.line(line)]
    assert len(lines) == 7 and len(outputs) == 6 and all(outputs)
    assert len((tmp_path / "out/per_query.jsonl").read_text().splitlines()) == 30
    assert '"run": "out/last.run"' in outputs[-1]  # the comparison JSON (stdout is no terminal)


@pytest.mark.kafka
def test_the_kafka_walk_through_gives_numbers_in_evald_top(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    lines = walk_through("kafka")
    broker, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    port = broker.rsplit(":", 1)[1]
    began = time.monotonic()
    kafka_pid = 0
    shown = ""
    steps: list[str] = []
    for number, line in enumerate(lines):
        argv = shlex.split(line.replace(BROKER, broker))
        out = tmp_path / f"terminal-{number}.txt"
        if argv[:2] == ["make", "kafka"]:
            # its data and controller port of the test's own; `make kafka ARGS=...` as documented
            args = f"--port {port} --controller-port {free_port()} --data {tmp_path / 'kafka'}"
            terminals.append(Terminal([*argv, f"ARGS={args}"], out))
            ready = terminals[-1].wait_for(rf"ready on {broker} \(pid (\d+)", 300)
            kafka_pid = int(ready.group(1))
        elif argv[:2] == [".venv/bin/evald", "produce"]:
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
            assert "100,000 acknowledged by the broker" in done.stderr, done.stderr
        elif argv[:2] == [".venv/bin/evald", "run"]:
            # the walk-through relies on the default metrics address; here it is a free port
            env = {"EVALD_DAEMON__METRICS_ADDRESS": metrics}
            terminals.append(Terminal(argv, out, env))
            terminals[-1].wait_for(rf"metrics on http://{metrics}", 120)
        elif argv[:2] == [".venv/bin/evald", "top"]:
            assert argv[2:] == [], "the walk-through's evald top reads the default address"
            terminals.append(Terminal([*argv, metrics, "--interval", "1"], out))
            # a whole 5-minute window of both arms (a window holding only the burst's first
            # seconds can be complete with any attribution window)
            numbers = (
                r"^n\s+\d{1,3}(?:,\d{3})+\s+\d{1,3}(?:,\d{3})+\s*$"  # 1,000 or more each
                r"\n^nDCG@10\s+\d\.\d{3}±\d\.\d{3}\s+\d\.\d{3}±\d\.\d{3}"
            )
            terminals[-1].wait_for(numbers, 180)
            shown = terminals[-1].text()
        else:
            pytest.fail(f"the test does not know how to run the README's {line!r}")
        steps.append(f"{' '.join(argv[:2])} {time.monotonic() - began:.1f}s")
    took = time.monotonic() - began
    assert shown, "the walk-through has no evald top"
    print(f"README Kafka walk-through: numbers in evald top {took:.1f}s after `make kafka`")
    print("  each step done at: " + ", ".join(steps))

    top, run, kafka = terminals[-1], terminals[-2], terminals[0]
    assert top.stop() is not None, f"evald top ignored Ctrl-C for 60 s:\n{top.hung}"
    assert run.stop() == 0, run.text()
    kafka.ctrl_c(times=3)  # pressed again while it stops: still a clean stop
    kafka.proc.wait(120)
    assert "stopped" in kafka.text(), kafka.text()
    with pytest.raises(ProcessLookupError):
        os.kill(kafka_pid, 0)  # the broker's JVM is gone too
