"""`evald demo` end to end: the real engine on simulated traffic, /metrics, signals."""

from __future__ import annotations

import argparse
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from child_processes import announced_url, die_with_parent
from prometheus_client.parser import text_string_to_metric_families

from evald.config import EngineConfig
from evald.demo import command
from evald.demo.command import DemoLoop, build_demo, regress_at
from evald.demo.live import LiveView
from evald.demo.simulator import DEFAULT_START_MS, Faults, Simulator
from evald.engine import Engine, Result

ROOT = Path(__file__).resolve().parents[2]
MIN = 60_000


class VirtualTime:
    """A clock that only moves when the loop sleeps: runs take CPU time, not wall time."""

    def __init__(self) -> None:
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.configure(parser)
    return parser.parse_args(argv)


def _measure_counts(body: str) -> dict[tuple[str, str], float]:
    """``evald_measure_count`` per (arm, measure), summed over the other labels."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "evald_measure_count":
                key = (sample.labels["arm"], sample.labels["measure"])
                out[key] = out.get(key, 0.0) + sample.value
    return out


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_regression_lowers_the_treatment_ndcg_measured_by_the_engine() -> None:
    """Real engine, generated events: treatment beats control, then drops after the regression."""
    start, half = DEFAULT_START_MS, 20 * MIN
    sim = Simulator(
        21,
        rate=3000,
        speed=60,
        stop_ms=start + 2 * half,
        regress_at_ms=start + half,
        faults=Faults(malformed=0.0),
    )
    results: list[Result] = []
    engine = Engine(EngineConfig(window="5m", lateness="2m"), on_result=results.append)
    for event in sim:
        engine.feed(event.value, kind=event.kind)
    engine.drain()
    assert engine.pending() == 0
    # every generated record is valid for the real decoder when no garbage is injected
    assert sum(engine.stats.rejected.values()) == 0

    scores: dict[tuple[str, bool], list[float]] = {}
    for r in results:
        scores.setdefault((r.labels["arm"], r.ts >= start + half), []).append(r.measures["nDCG@10"])
    mean = {key: float(np.mean(v)) for key, v in scores.items()}
    assert min(len(v) for v in scores.values()) > 5_000
    assert mean[("treatment", False)] > mean[("control", False)] + 0.02
    assert mean[("treatment", True)] < mean[("treatment", False)] - 0.15
    assert mean[("control", True)] == pytest.approx(mean[("control", False)], abs=0.03)


def test_loop_paces_feeds_and_drains_in_virtual_time() -> None:
    vt = VirtualTime()
    out = io.StringIO()
    speed, start = 60.0, DEFAULT_START_MS
    regress = start + int(20 * speed * 1000)
    sim = Simulator(4, rate=2000, speed=speed, start_ms=start, regress_at_ms=regress)
    engine = Engine(EngineConfig(window="5m", lateness="2m"))
    view = LiveView(out, tty=False, plain_interval=5.0, clock=vt.clock)
    loop = DemoLoop(
        engine,
        sim,
        view,
        lock=threading.Lock(),
        regress_at_ms=regress,
        clock=vt.clock,
        sleep=vt.sleep,
    )
    loop.run(40.0)

    # fed what fell due in 40 s at 60x: event time advanced 40 min, about rate x 40 records
    step_ms = 0.02 * speed * 1000  # the loop sleeps 20 ms between feeds
    assert start + 40 * speed * 1000 - step_ms <= loop.event_time_ms <= start + 40 * speed * 1000
    assert 2000 * 40 * 0.75 < loop.fed < 2000 * 40 * 1.25
    assert engine.pending() == 0  # drained
    accepted = sum(n for (_, outcome), n in engine.stats.events.items() if outcome == "accepted")
    assert accepted > 0.9 * loop.fed
    assert sum(engine.stats.rejected.values()) > 0  # the simulator's malformed records
    assert loop.engine_errors == 0, "the engine raised on a record instead of rejecting it"

    text = out.getvalue()
    assert view.frames >= 8  # a plain summary every 5 virtual seconds
    assert "segment='control · ranker-v1'" in text
    final = text[text.rindex("evald demo · event time") :]
    assert "stopped (duration)" in final
    assert "after the regression" in final
    header = next(line for line in final.splitlines() if line.startswith("measure"))
    # no comparison configured here: a column per segment and no treatment − control column
    assert re.split(r"\s{2,}", header) == [
        "measure",
        "control · ranker-v1",
        "treatment · ranker-v2",
    ]
    first = next(line for line in final.splitlines() if line.startswith("nDCG@10"))
    assert [c for c in first if c in "↑↓→▲▼"] == ["→", "↓"]  # control flat, treatment down


def test_final_summary_without_regression_covers_the_whole_run() -> None:
    vt = VirtualTime()
    out = io.StringIO()
    sim = Simulator(5, rate=2000, speed=60, start_ms=DEFAULT_START_MS)
    engine = Engine(EngineConfig(window="5m", lateness="2m"))
    view = LiveView(out, tty=False, clock=vt.clock)
    loop = DemoLoop(engine, sim, view, lock=threading.Lock(), clock=vt.clock, sleep=vt.sleep)
    loop.run(15.0)
    snap = loop.final_snapshot()
    assert snap.notes[0] == "whole run (no trend)"
    assert {row.name for row in snap.segments} == {"control · ranker-v1", "treatment · ranker-v2"}
    for row in snap.segments:
        assert row.count == row.total > 0  # every scored impression is in the range
        assert row.trend == ""
    assert sum(row.total for row in snap.segments) == sum(engine.stats.finalized.values())


def test_regress_at_defaults_to_mid_run() -> None:
    assert regress_at(_parse(["--duration", "30"])) == 15.0
    assert regress_at(_parse([])) == command.DEFAULT_REGRESS_AT
    assert regress_at(_parse(["--regress-at", "5", "--duration", "30"])) == 5.0
    assert regress_at(_parse(["--regress-at", "off"])) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--speed", "0"],
        ["--rate", "-1"],
        ["--duration", "nan"],
        ["--regress-at", "soon"],
        # each ended the demo with a traceback: an event time past any float, a negative seed
        ["--duration", "1e308"],
        ["--speed", "1e308"],
        ["--regress-at", "1e308"],
        ["--seed", "-1"],
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(argv)
    assert exc.value.code == 2


def test_bad_window_or_address_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.run(_parse(["--window", "soon", "--duration", "1"])) == 2
    assert "evald demo: --window:" in capsys.readouterr().err
    assert command.run(_parse(["--metrics-address", "nowhere", "--duration", "1"])) == 2
    assert "--metrics-address" in capsys.readouterr().err


def test_taken_port_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    monkeypatch.delenv("MAKELEVEL", raising=False)  # `make test` runs this under make
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = _parse(["--metrics-address", f"127.0.0.1:{port}", "--duration", "1"])
        assert command.run(args) == 1
    err = capsys.readouterr().err
    assert "cannot listen" in err
    assert "evald demo --metrics-address 127.0.0.1:0 picks any free port" in err


def test_taken_port_under_make_suggests_a_make_command_that_passes_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under `make demo` the hint is a make command, and make hands its flag to evald demo."""
    import shlex
    import socket
    import subprocess
    from pathlib import Path

    monkeypatch.setenv("MAKELEVEL", "1")  # what make sets in its recipes' environment
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert command.run(_parse(["--metrics-address", f"127.0.0.1:{port}"])) == 1
    err = capsys.readouterr().err
    hint = err.split("? ", 1)[1].split(" picks any free port")[0]
    argv = shlex.split(hint)
    assert argv[:2] == ["make", "demo"], err
    monkeypatch.delenv("MAKELEVEL")
    plan = subprocess.run(
        [*argv[:1], "--no-print-directory", "-n", *argv[1:]],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert plan[-1] == ".venv-demo/bin/evald demo --metrics-address 127.0.0.1:0"


ARMS = ("control", "treatment")


def test_run_in_process_serves_metrics_and_restores_signal_handlers() -> None:
    """build_demo + run as the command does, scraping /metrics over HTTP while it runs."""
    before = signal.getsignal(signal.SIGINT)
    out = io.StringIO()
    demo = build_demo(
        EngineConfig(window="5m", lateness="2m"),
        seed=1,
        rate=3000,
        speed=600,
        regress_at_s=1.0,
        metrics_address="127.0.0.1:0",
        live=False,
        stream=out,
    )
    url = demo.server.url  # type: ignore[union-attr]
    assert url.startswith("http://127.0.0.1:")
    # listening but not fed yet: not ready, and the body says why
    assert _get(url + "/readyz") == (503, "simulated traffic is not flowing\n")
    scraped: dict[str, object] = {}

    def scrape() -> None:
        """Sample once both arms are scored, then stop the run (at the deadline regardless)."""
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                status, body = _get(url + "/metrics")
                counts = _measure_counts(body)
                if status == 200 and all(counts.get((arm, "nDCG@10")) for arm in ARMS):
                    scraped["counts"] = counts
                    scraped["ready"] = _get(url + "/readyz")
                    scraped["healthy"] = _get(url + "/healthz")[0]
                    return
                time.sleep(0.1)
        finally:
            demo.stop("test")

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        assert command._run_with_signals(demo, None) == 0
    finally:
        scraper.join(65)
        demo.close()
    counts = scraped.get("counts")
    assert isinstance(counts, dict) and counts[("control", "nDCG@10")] > 0
    assert counts[("treatment", "nDCG@10")] > 0
    assert scraped["ready"] == (200, "ok\n") and scraped["healthy"] == 200
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(OSError):  # the port is released
        urllib.request.urlopen(url + "/metrics", timeout=2)
    assert "stopped (test)" in out.getvalue()


# ------------------------------------------------------------------ as a process


class Demo:
    """A running `python -m evald demo`; stderr goes to a file the test can poll."""

    def __init__(self, argv: list[str], err_path: Path) -> None:
        self.err_path = err_path
        self._err = err_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evald", "demo", *argv],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            preexec_fn=die_with_parent,
        )

    def err(self) -> str:
        return self.err_path.read_text()

    def metrics_url(self, timeout: float = 30.0) -> str:
        """Wait (bounded) until the demo says where it serves."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            url = announced_url(self.err())
            if url is not None:
                return url
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"the demo never said where it serves; stderr: {self.err()!r}")

    def finish(self, timeout: float = 30.0) -> tuple[int, str, str]:
        """Wait for exit: (status, stdout, stderr)."""
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, self.err()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Demo]]:
    """Start `python -m evald demo ...`; every process started is killed at teardown."""
    demos: list[Demo] = []

    def start(*argv: str) -> Demo:
        demos.append(Demo(list(argv), tmp_path / f"stderr-{len(demos)}.txt"))
        return demos[-1]

    yield start
    for demo in demos:
        demo.close()


def _wait_for_scores(url: str, timeout: float = 30.0) -> dict[tuple[str, str], float]:
    """Counts per (arm, measure) once both arms have nDCG@10 scores."""
    deadline = time.monotonic() + timeout
    counts: dict[tuple[str, str], float] = {}
    while time.monotonic() < deadline:
        status, body = _get(url)
        counts = _measure_counts(body) if status == 200 else {}
        if all(counts.get((arm, "nDCG@10"), 0) > 0 for arm in ("control", "treatment")):
            return counts
        time.sleep(0.2)
    raise AssertionError(f"no nDCG@10 count > 0 for both arms within {timeout}s: {counts}")


def test_process_with_duration_serves_metrics_and_exits_0(
    spawn: Callable[..., Demo],
) -> None:
    demo = spawn("--duration", "8", "--speed", "600", "--metrics-address", "127.0.0.1:0")
    url = demo.metrics_url()
    assert url.startswith("http://127.0.0.1:")
    _wait_for_scores(url)
    status, out, err = demo.finish()
    assert status == 0, err
    # stdout is a pipe, not a terminal: plain lines, no cursor control
    assert "\x1b[" not in out
    final = out[out.rindex("evald demo · event time") :]
    header = next(line for line in final.splitlines() if line.startswith("measure"))
    assert "treatment · ranker-v2" in header and header.endswith("treatment−control")
    assert "stopped (duration)" in final


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_cleanly_with_a_final_summary(
    spawn: Callable[..., Demo], sig: signal.Signals
) -> None:
    demo = spawn("--speed", "600", "--metrics-address", "127.0.0.1:0")
    url = demo.metrics_url()
    _wait_for_scores(url)
    demo.proc.send_signal(sig)
    status, out, err = demo.finish()
    assert status == 0, err
    assert f"stopped ({sig.name})" in out, (out, err)
    assert "engine drained" in out, (out, err)
    assert "Traceback" not in err, err
