"""`evald top --queries`: the worst queries of the treatment arm from a served /queries page."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest

from evald.cli import main
from evald.config import load_config
from evald.drilldown.page import QueriesPage
from evald.engine import Engine
from evald.http import MetricsServer
from evald.top.queries import render_queries


def engine() -> Engine:
    """Two 5-minute windows; in the second, arm t's query "lamp" gets no click (RR 0)."""
    config = load_config(
        {
            "min_event_time": 0,
            "max_event_lead": None,
            "window": "1m",
            "lateness": "30s",
            "watermark_quorum": 1,
            "measures": "RR",
            "windows": ["5m"],
            "label_keys": ["arm"],
            "statistics": {"bootstrap_replicates": 0},
        }
    )
    out = Engine(config, clock=lambda: 0.0)
    for k in range(1_200):
        ts, arm, query = k * 500, "t" if k % 2 else "c", ("lamp", "desk", "chair")[k % 3]
        body = {"request_id": f"r{k}", "ts": ts, "items": ["a"], "query": query}
        out.feed(json.dumps({**body, "labels": {"arm": arm}}).encode())
        if not (ts >= 300_000 and arm == "t" and query == "lamp"):
            click = {"request_id": f"r{k}", "ts": ts + 10, "item": "a", "action": "click"}
            out.feed(json.dumps(click).encode())
    out.feed(json.dumps({"request_id": "end", "ts": 1_800_000, "items": ["a"]}).encode())
    out.tick()
    return out


def test_the_view_names_the_query_that_fell(capsys: pytest.CaptureFixture[str]) -> None:
    served = engine()
    page = QueriesPage(lambda: served, threading.Lock())
    with MetricsServer("127.0.0.1:0", pages={"/queries": page}) as server:
        argv = ["top", server.url, "--queries", "--once", "--arms", "c,t", "--measures", "RR"]
        assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("arm=t  5m to 1970-01-01T00:10:00.000Z  300 lists")
    first = lines[2].split()
    assert first[0] == "lamp" and first[2:4] == ["0.000", "1.000"]
    assert first[4] == "-0.3333"  # 100 of 300 lists, mean 1 -> 0
    assert len(lines) == 3  # desk and chair did not fall: not listed as if they had


def test_queries_that_did_not_fall_are_not_shown_as_fallen() -> None:
    def row(contributions: list[float]) -> dict[str, Any]:
        fallen = [
            {"query": f"q{i}", "lists": 10, "mean": 0.5, "baseline_mean": 0.5, "contribution": c}
            for i, c in enumerate(contributions)
        ]
        return {
            "window": "5m",
            "end": "E",
            "labels": {"arm": "t"},
            "lists": 10,
            "fallen": {"RR": fallen},
        }

    text = render_queries({"queries": [row([-0.2, 0.0, 0.1])]}, "RR")
    assert [line.split()[0] for line in text.splitlines()[2:]] == ["q0"]
    text = render_queries({"queries": [row([0.0, 0.1])]}, "RR")
    assert text.splitlines()[1:] == ["  RR: no query fell against the window before"]
    text = render_queries({"queries": [{**row([]), "fallen": {}}]}, "RR")
    assert text.splitlines()[1:] == ["  (no window before to compare with)"]


def test_an_unreachable_evald_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "127.0.0.1:9", "--queries", "--once"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_long_queries_are_cut_to_the_width() -> None:
    row: dict[str, Any] = {
        "labels": {"arm": "t"},
        "window": "5m",
        "end": "x",
        "lists": 3,
        "fallen": {
            "RR": [
                {
                    "query": "q" * 500,
                    "lists": 3,
                    "mean": 0.0,
                    "baseline_mean": 1.0,
                    "contribution": -1.0,
                }
            ]
        },
    }
    text = render_queries({"queries": [row]}, None, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert render_queries({"queries": []}, "RR").startswith("no complete window")


def test_a_segment_header_too_long_keeps_its_window_and_list_count() -> None:
    """Three segment labels, as `evald produce`'s traffic has, and an RFC 3339 end pass 80
    columns: the window and the lists go to the next line rather than losing the count."""
    fallen = {"query": "q0", "lists": 217, "mean": 0.7, "baseline_mean": 0.8, "contribution": -0.1}
    row: dict[str, Any] = {
        "labels": {"model": "ranker-v2", "arm": "treatment", "surface": "web"},
        "window": "5m",
        "end": "2026-11-28T07:45:00.000Z",
        "lists": 1447,
        "fallen": {"nDCG@10": [fallen]},
    }
    lines = render_queries({"queries": [row]}, "nDCG@10").splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[:2] == [
        "model=ranker-v2 arm=treatment surface=web",
        "  5m to 2026-11-28T07:45:00.000Z  1,447 lists",
    ]
    short = {**row, "labels": {"arm": "t"}}
    assert render_queries({"queries": [short]}, "nDCG@10").splitlines()[0] == (
        "arm=t  5m to 2026-11-28T07:45:00.000Z  1,447 lists"
    )


def test_the_live_queries_view_ends_each_frame_with_the_warnings_printed_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its redraws wiped them from the terminal; a pipe keeps them on stderr only."""
    from evald.top import queries

    monkeypatch.setattr(queries, "fetch", lambda url, client: {"queries": []})
    warning = "warning: --password-file /run/s is readable by every user (chmod 600 it)"
    for tty in (True, False):
        out, naps = io.StringIO(), iter([False, True])

        def sleep(_seconds: float, naps: Any = naps) -> None:
            if next(naps):  # Ctrl-C after the second frame
                raise KeyboardInterrupt

        assert queries.watch("u", None, out, once=False, interval=0.1, tty=tty, sleep=sleep,
                             warnings=[warning]) == 0  # fmt: skip
        frames = out.getvalue().split("\x1b[H\x1b[J")
        if tty:  # no newline after a frame's last row (it scrolls), one after the last frame
            frame = render_queries({}, None) + warning
            assert frames[1:] == [frame, frame + "\n"]
        else:
            assert frames == [(render_queries({}, None) + "\n") * 2]


#: a warning longer than the 80 columns of a terminal, as ``from_args`` prints them
LONG_WARNING = (
    "warning: --user prometheus's password goes to evald.invalid over plain http://, readable "
    "on the way: serve TLS and use https:// (docs/security.md)"
)


@pytest.mark.parametrize("columns", [80, 40])
def test_the_live_queries_view_cuts_its_rows_and_warnings_to_the_terminal_width(
    monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    """A line wider than the terminal wraps, and the redrawn frame scrolls: every line of
    the frame, the warnings kept as its footer too, is cut (``~``) to the terminal's width,
    one line a warning, as wide as the terminal when it is cut."""
    from evald.top import queries

    fallen = {"query": "q" * 90, "lists": 217, "mean": 0.7, "baseline_mean": 0.8,
              "contribution": -0.1}  # fmt: skip
    row = {
        "labels": {"model": "ranker-v2", "arm": "treatment", "surface": "web"},
        "window": "5m",
        "end": "2026-11-28T07:45:00.000Z",
        "lists": 1447,
        "fallen": {"nDCG@10": [fallen]},
    }
    monkeypatch.setattr(queries, "fetch", lambda url, client: {"queries": [row]})
    naps = iter([False, True])

    def sleep(_seconds: float) -> None:
        if next(naps):  # Ctrl-C after the second frame
            raise KeyboardInterrupt

    out = io.StringIO()
    warnings = [LONG_WARNING, "warning: short"]
    assert queries.watch("u", None, out, once=False, interval=0.1, tty=True, sleep=sleep,
                         warnings=warnings, width=lambda: columns) == 0  # fmt: skip
    frames = out.getvalue().split("\x1b[H\x1b[J")[1:]
    assert len(frames) == 2
    for frame in frames:
        lines = frame.removesuffix("\n").split("\n")
        assert max(map(len, lines)) <= columns, lines
        assert lines[-2:] == [LONG_WARNING[: columns - 1] + "~", "warning: short"]
        assert lines[0].startswith("model=ranker-v2 arm=treatment surface=web"[: columns - 1])
        assert any(line.startswith("  qqq") for line in lines)


def test_the_queries_view_shows_labels_as_text_and_cuts_lines_in_terminal_columns() -> None:
    """A label value's escape sequence reached the terminal; a query of wide characters took
    twice its length in columns: ``?`` for the controls, every line cut in columns."""
    import unicodedata

    def columns(line: str) -> int:
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)

    fallen = {"query": "検索語" * 20, "lists": 3, "mean": 0.0, "baseline_mean": 1.0,
              "contribution": -1.0}  # fmt: skip
    row = {"labels": {"arm": "\x1b[2J" + "実" * 40}, "window": "5m", "end": "x", "lists": 3,
           "fallen": {"RR": [fallen]}}  # fmt: skip
    for width in (80, 40):
        text = render_queries({"queries": [row]}, None, width)
        assert "\x1b" not in text and "?[2J実" in text
        assert all(columns(line) <= width for line in text.splitlines()), text


def test_the_columns_after_a_query_of_wide_characters_stand_in_line() -> None:
    """A wide character takes two columns and the query was padded by characters: the lists,
    means and contribution after a CJK query stood further right than after an ASCII one."""
    import unicodedata

    def ends(line: str) -> list[int]:
        """The terminal column after each space-separated cell."""
        out, at = [], 0
        for cell in line.split(" "):
            at += sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in cell)
            if cell:
                out.append(at)
            at += 1
        return out

    fallen = [
        {"query": query, "lists": 217, "mean": 0.7, "baseline_mean": 0.8, "contribution": -0.1}
        for query in ("lamp", "電気スタンド", "検索語" * 20)
    ]
    row = {"labels": {"arm": "t"}, "window": "5m", "end": "x", "lists": 3,
           "fallen": {"適合率": fallen}}  # fmt: skip
    for width in (80, 40):
        head, *rows = render_queries({"queries": [row]}, None, width).splitlines()[1:]
        assert [line.split()[0] for line in rows[:2]] == ["lamp", "電気スタンド"]
        assert rows[2].startswith("  検索語検索") and rows[2].split()[0].endswith("~")
        assert ends(rows[0])[1:] == ends(rows[1])[1:] == ends(rows[2])[1:] == ends(head)[2:]


def test_the_live_queries_view_fits_the_terminal_rows_keeping_its_header_and_warnings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frame taller than the terminal scrolled on every redraw, its header out of sight: the
    last rows give way to a line saying how many, above the warnings; a pipe gets it whole."""
    from evald.top import queries

    fallen = [
        {"query": f"q{i}", "lists": 10, "mean": 0.5, "baseline_mean": 0.6, "contribution": -0.01}
        for i in range(30)
    ]
    row = {"labels": {"arm": "t"}, "window": "5m", "end": "x", "lists": 300,
           "fallen": {"RR": fallen}}  # fmt: skip
    monkeypatch.setattr(queries, "fetch", lambda url, client: {"queries": [row, row]})
    whole = render_queries({"queries": [row, row]}, None).splitlines()
    assert len(whole) == 64
    warnings = ["warning: one", "warning: two"]
    for tty in (True, False):
        out, naps = io.StringIO(), iter([False, True])

        def sleep(_seconds: float, naps: Any = naps) -> None:
            if next(naps):  # Ctrl-C after the second frame
                raise KeyboardInterrupt

        size = {"width": lambda: 80, "height": lambda: 12}
        assert queries.watch("u", None, out, once=False, interval=0.1, tty=tty, sleep=sleep,
                             warnings=warnings, **size) == 0  # fmt: skip
        if not tty:
            assert out.getvalue() == "\n".join(whole) + "\n\n" + "\n".join(whole) + "\n\n"
            continue
        frames = out.getvalue().split("\x1b[H\x1b[J")[1:]
        assert len(frames) == 2 and frames[1].endswith("\n") and not frames[0].endswith("\n")
        for frame in frames:
            lines = frame.removesuffix("\n").split("\n")
            assert len(lines) == 12, lines
            assert lines[:9] == whole[:9]  # the segment, its column heads, the first rows
            assert lines[9] == "~ 55 more lines: a taller terminal shows them"
            assert lines[10:] == warnings


@pytest.mark.parametrize("rows", range(1, 12))
def test_the_live_queries_view_fits_a_terminal_of_any_rows_from_two(
    monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    """Frames were drawn for at least 10 rows: a shorter terminal scrolled on every redraw.
    From 2 rows (``terminal.MIN_ROWS``) the segment's header and a count of the rows cut; on
    1, that count alone; the warnings take what is left after 2 rows of the view, and from 2
    rows keep one at least (a line counting them: the view gives up its header for it)."""
    from evald.top import queries

    fallen = [
        {"query": f"q{i}", "lists": 10, "mean": 0.5, "baseline_mean": 0.6, "contribution": -0.01}
        for i in range(30)
    ]
    row = {"labels": {"arm": "t"}, "window": "5m", "end": "x", "lists": 300,
           "fallen": {"RR": fallen}}  # fmt: skip
    monkeypatch.setattr(queries, "fetch", lambda url, client: {"queries": [row]})
    whole = render_queries({"queries": [row]}, None, 40).splitlines()
    warnings = ["warning: one", "warning: two"]
    for given in ([], warnings):
        out, naps = io.StringIO(), iter([True])

        def sleep(_seconds: float, naps: Any = naps) -> None:
            if next(naps):  # Ctrl-C after the first frame
                raise KeyboardInterrupt

        size = {"width": lambda: 40, "height": lambda: rows}
        assert queries.watch("u", None, out, once=False, interval=0.1, tty=True, sleep=sleep,
                             warnings=given, **size) == 0  # fmt: skip
        (frame,) = out.getvalue().split("\x1b[H\x1b[J")[1:]
        lines = frame.removesuffix("\n").split("\n")
        assert len(lines) == rows and max(map(len, lines)) <= 40, lines
        view = {1: 1, 2: 1, 3: 2}.get(rows, rows - 2) if given else rows
        assert lines[: view - 1] == whole[: view - 1]  # the segment's header first
        # the count whole, in the longest of its forms that fits 40 columns
        assert lines[view - 1] == f"~ {len(whole) - view + 1} more lines"
        footer = lines[view:]
        if given and rows >= 4:
            assert footer == warnings
        elif given and rows in (2, 3):
            assert footer == ["~ 2 more warnings"]
        else:
            assert footer == []


def one_fallen(query: str, measure: str) -> dict[str, Any]:
    """A /queries page of one segment with one query fallen in ``measure``."""
    fallen = {"query": query, "lists": 3, "mean": 0.5, "baseline_mean": 0.6, "contribution": -0.1}
    window = {"window": "5m", "end": "2026-01-01T00:05:00.000Z", "lists": 10}
    return {"queries": [{"labels": {"arm": "t"}, **window, "fallen": {measure: [fallen]}}]}


def test_a_terminal_that_cannot_encode_a_query_gets_question_marks_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A query (or warning, or error) holding characters an ASCII terminal lacks raised
    UnicodeEncodeError on write and ended the view; each such character is a '?'."""
    from evald.top import queries

    doc = one_fallen("lámpara 電気", "nDCG@10")
    monkeypatch.setattr(queries, "fetch", lambda url, client: doc)
    for tty, once in ((True, False), (False, False), (False, True)):
        raw = io.BytesIO()
        out = io.TextIOWrapper(raw, encoding="ascii")
        naps = iter([False, True])

        def sleep(_seconds: float, naps: Any = naps) -> None:
            if next(naps):
                raise KeyboardInterrupt

        assert queries.watch("u", None, out, once=once, interval=0.1, tty=tty, sleep=sleep,
                             warnings=["warning: /run/sécret is readable"]) == 0  # fmt: skip
        out.flush()
        text = raw.getvalue().decode("ascii")
        assert "l?mpara ??" in text
        assert ("/run/s?cret" in text) == tty


@pytest.mark.parametrize("width", [40, 57])
def test_a_measure_name_longer_than_the_query_column_is_no_crash(width: int) -> None:
    """At the terminal's width (not a fixed 80 any more) the header's padding went negative
    for a long measure name: a ValueError from the format that ended the live view."""
    from evald.terminal import columns

    long = "nDCG(dcg='exp-log2')@10"
    doc = one_fallen("q", long)
    lines = render_queries(doc, long, width).splitlines()
    assert any(line.startswith(f"  {long} ") for line in lines)
    assert all(columns(line) <= width for line in lines)


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 13, 20, 39, 40, 41, 57, 80])
def test_the_live_queries_view_fits_any_width_and_says_whole_how_many_lines_are_cut(
    monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    """Narrower than 40 columns the view was drawn to 40 (each line wrapped, the frame
    scrolled); at 40 the count of the lines cut lost its end. Every line fits now, the count
    whole in the longest of its forms that fits (``~`` alone only where none does)."""
    import re

    from evald.top import queries

    fallen = [
        {"query": f"q{i}", "lists": 10, "mean": 0.5, "baseline_mean": 0.6, "contribution": -0.01}
        for i in range(30)
    ]
    row = {"labels": {"arm": "t"}, "window": "5m", "end": "x", "lists": 300,
           "fallen": {"RR": fallen}}  # fmt: skip
    monkeypatch.setattr(queries, "fetch", lambda url, client: {"queries": [row]})
    out, naps = io.StringIO(), iter([True])

    def sleep(_seconds: float) -> None:
        if next(naps):
            raise KeyboardInterrupt

    warnings = [f"warning: {n}" for n in range(5)]
    assert queries.watch("u", None, out, once=False, interval=0.1, tty=True, sleep=sleep,
                         warnings=warnings, width=lambda: width, height=lambda: 6) == 0  # fmt: skip
    (frame,) = out.getvalue().split("\x1b[H\x1b[J")[1:]
    lines = frame.removesuffix("\n").split("\n")
    assert len(lines) == 6 and max(map(len, lines)) <= width, lines
    for line in (lines[1], lines[5]):  # the view's count (2 rows), the warnings' (4)
        forms = r"~ \d+ more (lines|warnings)(: a taller terminal shows them)?|~ \d+ more|~\d+|~"
        assert re.fullmatch(forms, line), line
        assert line != "~" or width < 3, line
