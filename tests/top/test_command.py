"""`evald top` against a real running `evald demo`: in a real terminal (tmux) and with --once."""

from __future__ import annotations

import contextlib
import http.server
import io
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from child_processes import announced_url, die_with_parent

from evald import cli
from evald.top.command import metrics_url
from evald.top.model import Scrape, parse

ROOT = Path(__file__).resolve().parents[2]
DEMO = [sys.executable, "-m", "evald", "demo", "--no-live", "--speed", "600"]


class StillPage:
    """A daemon's /metrics page that answers one exposition at every scrape."""

    def __init__(self, text: str, url: str = "http://127.0.0.1:9/metrics") -> None:
        self.text, self.url = text, url

    def scrape(self) -> Scrape:
        return parse(self.text, 1000.0)


def _wait_for(what: str, check: Callable[[], object], timeout: float = 60.0) -> object:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _has_both_arms_windowed(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
    except OSError:
        return False
    return all(
        f'arm="{arm}",measure="nDCG@10"' in body and "evald_window_count" in body
        for arm in ("control", "treatment")
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running `evald demo` on a free port with a complete 5m window; yields its metrics URL."""
    err_path = tmp_path_factory.mktemp("demo") / "stderr.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            [*DEMO, "--rate", "1500", "--metrics-address", "127.0.0.1:0"],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=die_with_parent,
        )
    try:
        url = _wait_for("the demo's URL", lambda: announced_url(err_path.read_text()))
        assert isinstance(url, str)
        _wait_for("a complete window for both arms", lambda: _has_both_arms_windowed(url))
        yield url
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)


class Tmux:
    """A private tmux server (own socket) running one command in an 80x30 window."""

    def __init__(self, command: list[str], socket_dir: Path) -> None:
        self.socket = str(socket_dir / "tmux.sock")
        self._run("new-session", "-d", "-x", "80", "-y", "30", "-s", "top", *command)
        self._run("set-option", "-t", "top", "remain-on-exit", "on")
        self.server_pid = int(self._run("display-message", "-p", "-t", "top", "#{pid}"))
        self.pane_pid = int(self._run("display-message", "-p", "-t", "top", "#{pane_pid}"))

    def _run(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-S", self.socket, *args], check=True, capture_output=True, text=True
        )
        return out.stdout.strip()

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-t", "top")

    def pane_dead(self) -> bool:
        return self._run("display-message", "-p", "-t", "top", "#{pane_dead}") == "1"

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", "top", *keys)

    def close(self) -> None:
        for pid in (self.pane_pid, self.server_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_live_view_in_a_real_terminal_fits_80_columns_and_quits_on_ctrl_c(
    demo: str, tmp_path: Path
) -> None:
    assert shutil.which("tmux"), "tmux is needed for this test: `make tools` installs it"
    # the shell records evald top's exit status in a file: tmux's own #{pane_dead_status}
    # stayed empty for over 30 s in one run of three after the pane was dead
    status_file = tmp_path / "status"
    top = shlex.join([sys.executable, "-m", "evald", "top", demo, "--interval", "0.5"])
    # (the shell catches SIGINT, so Ctrl-C stops only evald top; exec resets the handler)
    script = (
        f"trap : INT; PYTHONPATH={shlex.quote(str(ROOT))} {top}; "
        f"echo $? > {shlex.quote(str(status_file))}"
    )
    tmux = Tmux(["sh", "-c", script], tmp_path)
    try:

        def full_frame() -> str | None:
            screen = tmux.screen()
            lines = screen.splitlines()
            rates = any(line.startswith("events ") and "events -" not in line for line in lines)
            rows = [line for line in lines if line.startswith("nDCG@10")]
            return screen if rates and rows and "±" in rows[0] else None

        screen = str(_wait_for("a frame with rates and intervals", full_frame))
        lines = screen.splitlines()
        assert lines[0].startswith("evald top · 127.0.0.1:") and "ready" in lines[0]
        assert "control" in screen and "treatment" in screen and "treatment−control" in screen
        assert "pending " in screen and "watermark" in screen and "rejects since start" in screen
        assert max(len(line) for line in lines) <= 80
        assert screen.count("evald top ·") == 1  # redrawn in place, not scrolled
        tmux.keys("C-c")
        _wait_for("evald top to exit on Ctrl-C", tmux.pane_dead, timeout=30)
        status = _wait_for(
            "evald top's exit status", lambda: status_file.exists() and status_file.read_text()
        )
        assert status == "0\n", f"exit status {status!r}; screen:\n{tmux.screen()}"
    finally:
        tmux.close()


def test_once_prints_one_plain_snapshot(demo: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["top", demo, "--once", "--interval", "0.3", "--window", "5m"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.startswith("nDCG@10") and "±" in line for line in lines), out
    assert any(line.startswith("events ") and "events -" not in line for line in lines), out
    # the demo runs the zero-feedback signals: a line per arm, RBO with control for the others
    zero = {line.split()[0]: line for line in lines if " before feedback: " in line}
    assert set(zero) == {"control", "interleaved", "treatment"}, out
    assert "RBO - " in zero["control"] and "RBO - " not in zero["treatment"], out


def test_once_against_nothing_listening_exits_1_with_a_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert cli.main(["top", f"127.0.0.1:{port}", "--once", "--interval", "0.1"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach http://127.0.0.1:{port}/metrics" in err and "is evald running" in err


@pytest.mark.parametrize(
    "argv", [["ftp://x:1"], ["127.0.0.1:9", "--window", "5 minutes"]], ids=["url", "window"]
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["top", *argv, "--once"]) == 2
    assert capsys.readouterr().err.startswith("evald top: ")


def test_once_against_an_endpoint_asking_for_credentials_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A 401 is an evald (or a proxy) that is running and wants basic auth: saying "is evald
    running there?" sends the user looking for the wrong problem."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="evald"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            argv = ["top", f"127.0.0.1:{server.server_port}", "--once", "--interval", "0.1"]
            assert cli.main(argv) == 1
        finally:
            server.shutdown()
    err = capsys.readouterr().err
    assert "answered HTTP 401" in err and "basic auth" in err, err
    assert "is evald running" not in err, err


def test_a_url_with_credentials_is_refused_without_echoing_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["top", "http://prometheus:s3cret@127.0.0.1:9", "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evald top: ") and "credentials" in err and "s3cret" not in err, err


def test_urls_are_normalised_to_the_metrics_path() -> None:
    assert metrics_url("127.0.0.1:9464") == "http://127.0.0.1:9464/metrics"
    assert metrics_url("http://evald:9464/") == "http://evald:9464/metrics"
    assert metrics_url("https://h/custom/metrics") == "https://h/custom/metrics"


@pytest.mark.parametrize("seconds", ["0.05", "nan", "inf", "1e308", "3601"])
def test_an_interval_out_of_range_is_a_usage_error(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """1e308 passed, to end the live view with an OverflowError at its first sleep."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["top", "--interval", seconds])
    assert exc.value.code == 2
    assert "argument --interval: must be 0.1 to 3600 seconds" in capsys.readouterr().err


# each was scraped anyway and failed with exit status 1 as if the evald were down (port
# 70000 wrapped round to 4464); a window of 0 is none that is ever exported
@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["127.0.0.1:70000"], "bad address in '127.0.0.1:70000': Port out of range"),
        (["127.0.0.1:abc"], "bad address in '127.0.0.1:abc': Port could not be cast"),
        (["http://[::1/metrics"], "bad address in 'http://[::1/metrics': Invalid IPv6 URL"),
        (["127.0.0.1:0"], "port 0 is no server's"),
        (["127.0.0.1:9", "--window", "0"], "--window: must be longer than 0"),
    ],
)
def test_an_address_or_window_no_retry_reaches_exits_2(
    argv: list[str], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["top", *argv, "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evald top: ") and reason in err, err


def test_live_frames_fit_the_terminal_rows_and_a_pipe_gets_them_whole() -> None:
    """The terminal's rows bound each redrawn frame, with no newline after its last row (which
    would scroll it); frames written to a pipe are whole."""
    from evald.top.command import Top
    from top.test_model import _exposition, _values

    page = _exposition(_values(), events=100, at_end=900.0)

    source = StillPage(page)

    whole = render_lines = 0
    for tty in (True, False):
        out = io.StringIO()
        sleep = _interrupt_second_sleep()
        top = Top(source, window="5m", group_by=["arm", "surface"], measures=None,  # type: ignore[arg-type]
                  stream=out, sleep=sleep, width=lambda: 80, height=lambda: 10)  # fmt: skip
        assert top.live(0.1, tty=tty) == 0
        text = out.getvalue()
        if tty:
            frames = text.split("\x1b[H\x1b[J")[1:]
            assert len(frames) == 2
            first = frames[0]
            assert not first.endswith("\n") and len(first.split("\n")) == 10
            assert first.startswith("evald top · 127.0.0.1:9 · ready")
            assert first.split("\n")[-1].endswith("more lines: a taller terminal shows them")
            render_lines = len(first.split("\n"))
        else:
            whole = len(text.split("\n\n\n")[0].splitlines())
            assert "\x1b" not in text and "more lines" not in text
    assert whole > render_lines == 10


@pytest.mark.parametrize("rows", range(1, 12))
def test_frames_fit_a_terminal_of_any_rows_from_two_with_the_warnings_below(rows: int) -> None:
    """Frames were drawn for at least 10 rows, so a shorter terminal scrolled on every
    redraw. From 2 rows (``terminal.MIN_ROWS``) a frame keeps its first line and a count of
    the lines cut; on 1, that count alone; the warnings take what is left after 2 rows of the
    view, the last giving way first to a line counting them, which keeps a row from 2 rows
    (the view's count alone above it), every line cut to the width (in ASCII too)."""
    from evald.top.command import Top
    from top.test_model import _exposition, _values

    page = _exposition(_values(), events=100, at_end=900.0)

    source = StillPage(page)

    warnings = [HTTP_WARNING, "warning: two"]
    for shown, out in (([], io.StringIO()), (warnings, io.TextIOWrapper(io.BytesIO(), "ascii"))):
        top = Top(source, window="5m", group_by=["arm"], measures=None, stream=out,  # type: ignore[arg-type]
                  width=lambda: 40, height=lambda: rows, warnings=shown)  # fmt: skip
        lines = top.frame().splitlines()
        assert len(lines) == rows and max(map(len, lines)) <= 40, lines
        view = lines[: {1: 1, 2: 1, 3: 2}.get(rows, rows - 2) if shown else rows]
        footer = lines[len(view) :]
        assert re.fullmatch(r"[~…] \d+ more lines", view[-1]), view  # whole, in 40 columns
        assert len(view) == 1 or view[0].startswith("evald top")
        if shown and rows >= 4:
            assert footer == [HTTP_WARNING[:39] + "~", "warning: two"]
        elif shown and rows in (2, 3):
            assert footer == ["~ 2 more warnings"]
        else:
            assert footer == []


def test_the_plain_http_warning_keeps_a_row_on_a_terminal_of_two() -> None:
    """On 2 rows the view's 2 rows took the whole terminal and the password warning vanished
    from every frame without a word: from 2 rows the warnings keep one (the view's count of
    its cut lines above it)."""
    from evald.top.command import Top
    from top.test_model import _exposition, _values

    page = _exposition(_values(), events=100, at_end=900.0)

    source = StillPage(page)

    top = Top(source, window="5m", group_by=["arm"], measures=None, stream=io.StringIO(),  # type: ignore[arg-type]
              width=lambda: 200, height=lambda: 2, warnings=[HTTP_WARNING])  # fmt: skip
    first, last = top.frame().splitlines()
    assert "more lines: a taller terminal" in first and last == HTTP_WARNING


def _interrupt_second_sleep() -> Callable[[float], None]:
    """``Top.live``'s sleep: the first returns, the second interrupts (two frames drawn)."""
    calls = iter([False, True])

    def sleep(_seconds: float) -> None:
        if next(calls):
            raise KeyboardInterrupt

    return sleep


#: what ``from_args`` warns of before a live view starts (the password file's path varies)
HTTP_WARNING = (
    "warning: --user prometheus's password goes to evald.invalid over plain http://, readable "
    "on the way: serve TLS and use https:// (docs/security.md)"
)


@pytest.mark.parametrize("columns", [80, 40])
def test_the_warnings_printed_before_the_live_view_end_each_of_its_frames(columns: int) -> None:
    """The live view's first redraw wiped the warnings printed on stderr before it (a password
    going over plain http://, a password file readable by everyone): on a terminal they now end
    every frame, a line each cut to the width like the rows (a wrapped one scrolled the frame),
    within its rows and columns; a pipe keeps them on stderr only."""
    from evald.top.command import Top
    from top.test_model import _exposition, _values

    page = _exposition(_values(), events=100, at_end=900.0)
    warnings = [HTTP_WARNING, "warning: --password-file /run/s is readable by every user"]

    source = StillPage(page, "http://evald.invalid:9464/metrics")

    for tty in (True, False):
        out = io.StringIO()
        sleep = _interrupt_second_sleep()
        top = Top(source, window="5m", group_by=["arm", "surface"], measures=None,  # type: ignore[arg-type]
                  stream=out, sleep=sleep, width=lambda: columns, height=lambda: 12,
                  warnings=warnings)  # fmt: skip
        assert top.live(0.1, tty=tty) == 0
        text = out.getvalue()
        if not tty:
            assert "warning" not in text  # on stderr, not wiped
            continue
        frames = text.split("\x1b[H\x1b[J")[1:]
        assert len(frames) == 2
        for frame in frames:
            lines = frame.removesuffix("\n\x1b[?25h").split("\n")
            assert len(lines) == 12 and max(map(len, lines)) <= columns, lines
            assert lines[0].startswith("evald top · evald.invalid:9464"[:columns])
            assert lines[-3].startswith("… ")  # the frame's own cut, above the warnings
            assert lines[-2:] == [
                HTTP_WARNING[: columns - 1] + "…",
                "warning: --password-file /run/s is readable by every user"[: columns - 1]
                + ("…" if columns < 57 else ""),
            ]


def test_a_terminal_without_unicode_gets_the_warnings_cut_in_ascii() -> None:
    """The cut warning's ellipsis is spelt ``~`` where the frame's are: an ASCII terminal
    cannot encode ``…``."""
    from evald.top.command import Top
    from top.test_model import _exposition, _values

    page = _exposition(_values(), events=100, at_end=900.0)

    source = StillPage(page, "http://evald.invalid:9464/metrics")

    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    top = Top(source, window="5m", group_by=["arm"], measures=None, stream=out,  # type: ignore[arg-type]
              width=lambda: 40, height=lambda: 12, warnings=[HTTP_WARNING])  # fmt: skip
    assert not top.unicode
    assert top.frame().splitlines()[-1] == HTTP_WARNING[:39] + "~"


def test_an_unreachable_evald_is_one_line_of_the_terminal_width() -> None:
    """The retry line names the URL and the error, past 40 columns: it wrapped, and the
    redrawn frame scrolled."""
    from evald.top.command import Top

    class Down:
        url = "http://evald.invalid:9464/metrics"

        def scrape(self) -> None:
            raise OSError("cannot reach http://evald.invalid:9464/metrics: connection refused")

    top = Top(Down(), window="5m", group_by=["arm"], measures=None, stream=io.StringIO(),  # type: ignore[arg-type]
              width=lambda: 40, height=lambda: 12, warnings=["warning: short"])  # fmt: skip
    lines = top.frame().splitlines()
    assert lines == ["evald top: cannot reach http://evald.in…", "warning: short"]


def test_evald_top_hands_its_warnings_to_the_live_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Printed on stderr at once (before a prompt would be) and kept for the live view's
    frames, for the metrics view and the queries view alike."""
    from evald.top import command, queries

    secret = tmp_path / "secret"
    secret.write_text("pw\n")
    secret.chmod(0o644)
    kept: list[tuple[str, ...]] = []
    monkeypatch.setattr(command.Top, "live", lambda self, *_, **__: kept.append(self.warnings) or 0)
    monkeypatch.setattr(queries, "watch", lambda *_, **kw: kept.append(tuple(kw["warnings"])) or 0)
    argv = ["top", "http://evald.invalid:9464", "--user", "prometheus", "--password-file"]
    assert cli.main([*argv, str(secret)]) == 0
    assert cli.main([*argv, str(secret), "--queries"]) == 0
    printed = f"warning: --password-file {secret} is readable by every user (chmod 600 it)"
    assert kept == [(HTTP_WARNING, printed)] * 2
    err = capsys.readouterr().err
    assert err.count(f"evald top: {HTTP_WARNING}\n") == 2 and err.count(printed) == 2, err


def test_a_terminal_without_unicode_gets_the_retry_line_and_warnings_it_can_print() -> None:
    """The retry line's ellipsis and a warning's non-ASCII path raised UnicodeEncodeError on
    an ASCII terminal and ended the live view: they come out with '?' instead."""
    from evald.top.command import Top

    class Down:
        url = "http://evald.invalid:9464/metrics"

        def scrape(self) -> None:
            raise OSError("cannot reach http://evald.invalid:9464/metrics: connection refused")

    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii")
    naps = iter([False, True])

    def sleep(_seconds: float) -> None:
        if next(naps):
            raise KeyboardInterrupt

    top = Top(Down(), window="5m", group_by=["arm"], measures=None, stream=out,  # type: ignore[arg-type]
              width=lambda: 40, height=lambda: 12, sleep=sleep,
              warnings=["warning: /run/sécret is readable"])  # fmt: skip
    assert top.live(0.1, tty=True) == 0
    out.flush()
    text = raw.getvalue().decode("ascii")
    assert "evald top: cannot reach http://evald.in" in text
    assert "/run/s?cret" in text


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 13, 20, 28, 39, 40, 41, 47, 80])
def test_frames_fit_a_terminal_of_any_width_and_say_whole_how_many_lines_are_cut(
    width: int,
) -> None:
    """A terminal narrower than 40 columns was drawn to 40: every line wrapped and the frame
    scrolled on each redraw; at 40 the line counting the cut lines lost its end. Every line
    now fits the width, and that count is whole, in the longest of its forms that fits."""
    from evald.top.command import Top
    from top.test_model import _exposition, _values

    page = _exposition(_values(), events=100, at_end=900.0)

    source = StillPage(page)

    top = Top(source, window="5m", group_by=["arm"], measures=None, stream=io.StringIO(),  # type: ignore[arg-type]
              width=lambda: width, height=lambda: 6,
              warnings=[f"warning: {n}" for n in range(5)])  # fmt: skip
    lines = top.frame().splitlines()
    assert len(lines) == 6 and max(map(len, lines)) <= width, lines
    for line in (lines[1], lines[5]):  # the view's count (2 rows), the warnings' (4)
        forms = r"… \d+ more (lines|warnings)(: a taller terminal shows them)?|… \d+ more|…\d+|…"
        assert re.fullmatch(forms, line), line
        assert line != "…" or width < 3, line  # the count is given up only where it cannot fit
