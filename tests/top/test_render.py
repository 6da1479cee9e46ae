"""Golden screens of `evald top`: the exact frame for a known view, and the 80-column rule."""

from __future__ import annotations

import math
from typing import Any

from evald.durations import readable as duration
from evald.top.model import Comparison, Estimate, GroupRow, Progress, Verdict, View
from evald.top.render import render

ALL = ["nDCG@10", "RR", "Success@10", "RBP(p=0.8)"]


def _view(**changes: Any) -> View:
    fields: dict[str, Any] = {
        "source": "127.0.0.1:9464",
        "at": 1_767_226_060.0,
        "ready": True,
        "window": "5m",
        "window_end": 1_767_225_900.0,
        "measures": ALL,
        "groups": [
            GroupRow(
                "control",
                {
                    "nDCG@10": Estimate(0.6123, 0.0041, 12345),
                    "RR": Estimate(0.5, 0.005, 12345),
                    "Success@10": Estimate(0.81, 0.007, 12345),
                    "RBP(p=0.8)": Estimate(0.402, 0.003, 12345),
                },
            ),
            GroupRow(
                "treatment",
                {
                    "nDCG@10": Estimate(0.5981, 0.0043, 12400),
                    "RR": Estimate(0.503, 0.005, 12400),
                    "Success@10": Estimate(0.80, 0.007, 12400),
                    "RBP(p=0.8)": Estimate(0.41, math.nan, 1),
                },
            ),
        ],
        "comparison": {
            "nDCG@10": Comparison(-0.0142, 0.0059),
            "RR": Comparison(0.003, 0.007),
            "Success@10": Comparison(-0.01, 0.0099),
        },
        "events_per_s": 3012.4,
        "rejected_per_s": 1.25,
        "scored_per_s": 1433.0,
        "results_per_s": None,
        "pending_impressions": 40211.0,
        "pending_feedback": 23.0,
        "watermark_delay_s": 187.0,
        "consumer_lag": None,
        "rejects": [("invalid_json", 12.0), ("bad_timestamp", 3.0)],
        "unattributed": [("orphaned", 88.0), ("late", 4.0)],
        "arms": ("control", "treatment"),
    }
    fields.update(changes)
    return View(**fields)


GOLDEN_AB = """\
evald top · 127.0.0.1:9464 · ready · 00:07:40 UTC
5m window 00:00:00-00:05:00 UTC (event time) · mean±95% interval

measure              control       treatment  treatment−control
n                     12,345          12,400
nDCG@10          0.612±0.004     0.598±0.004     -0.014±0.006 *
RR               0.500±0.005     0.503±0.005     +0.003±0.007
Success@10       0.810±0.007     0.800±0.007     -0.010±0.010 *
RBP(p=0.8)       0.402±0.003           0.410                  -
*: the window's difference is outside its own 95% interval (descriptive)

events 3,012/s (rejected 1.2/s) · scored 1,433/s
pending 40,211 impressions, 23 feedback · watermark delay 3m07s
rejects since start: invalid_json 12 · bad_timestamp 3
unattributed feedback: orphaned 88 · late 4
"""

GOLDEN_DAEMON_STARTING = """\
evald top | 127.0.0.1:9464 | NOT READY | 00:07:40 UTC
no complete 5m window yet (windows close in event time)

(no scored impression in the window yet)

events 3,012/s (rejected 1.2/s) | scored 1,433/s | results 1,400/s
pending 40,211 impressions, 23 feedback | watermark 5m00s ahead of wall time
  consumer lag 123,456
rejects since start: none
unattributed feedback: orphaned 88 | late 4
"""


def test_golden_screen_treatment_against_control() -> None:
    assert render(_view()) == GOLDEN_AB


GOLDEN_VERDICTS = """\
evald top · 127.0.0.1:9464 · ready · 00:07:40 UTC
5m window 00:00:00-00:05:00 UTC (event time) · mean±95% interval

measure              control       treatment  treatment−control
n                     12,345          12,400
nDCG@10          0.612±0.004     0.598±0.004     -0.014±0.006 *
RR               0.500±0.005     0.503±0.005     +0.003±0.007
Success@10       0.810±0.007     0.800±0.007     -0.010±0.010 *
RBP(p=0.8)       0.402±0.003           0.410                  -
since start, ab surface=web: nDCG@10 -0.012±0.004 ▼ · RR +0.001±0.004
  Success@10 +0.020±0.004 ▲
since start, ab surface=app (list-level variance: no user ids):
  nDCG@10 -0.002±0.004
  RR +0.001, no band yet (too few lists or users, or no variance)
▲▼: the always-valid band since the start excludes 0 (a verdict)
*: the window's difference is outside its own 95% interval (descriptive)

events 3,012/s (rejected 1.2/s) · scored 1,433/s
pending 40,211 impressions, 23 feedback · watermark delay 3m07s
rejects since start: invalid_json 12 · bad_timestamp 3
unattributed feedback: orphaned 88 · late 4
"""


def test_golden_screen_with_the_verdicts_since_the_start() -> None:
    """The verdict marks (▲▼) come from the always-valid comparison and say so; the window's
    difference keeps its descriptive ``*``; the legend says which is which."""
    web = [("nDCG@10", -0.012), ("RR", 0.001), ("Success@10", 0.02)]
    verdicts = [Verdict("ab", "surface=web", m, d, d - 0.004, d + 0.004, True) for m, d in web]
    verdicts += [
        Verdict("ab", "surface=app", "nDCG@10", -0.002, -0.006, 0.002, False),
        Verdict("ab", "surface=app", "RR", 0.001, math.nan, math.nan, False),
    ]
    assert render(_view(verdicts=verdicts)) == GOLDEN_VERDICTS


def test_golden_screen_of_a_starting_daemon_in_ascii() -> None:
    view = _view(
        ready=False,
        results_per_s=1400.0,
        consumer_lag=123456.0,
        watermark_delay_s=-300.0,
        progress=Progress(watermark=1_767_226_360.0),  # 5 minutes ahead of its wall time
        groups=[],
        comparison=None,
        window_end=None,
        rejects=[],
    )
    assert render(view, unicode=False) == GOLDEN_DAEMON_STARTING


def test_many_groups_long_names_and_reasons_stay_within_80_columns() -> None:
    estimates = {m: Estimate(0.123456, 0.0123, 1_234_567) for m in ALL}
    groups = [GroupRow(f"arm-{i} · a-rather-long-model-name", estimates) for i in range(7)]
    rejects = [(f"reason_number_{i}", 1e9 + i) for i in range(12)]
    view = _view(groups=groups, comparison=None, rejects=rejects, consumer_lag=1e12)
    for unicode in (True, False):
        text = render(view, unicode=unicode)
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= 80, text
        # every group is shown (in tables of four columns) and every reason (wrapped)
        assert sum(line.startswith("nDCG@10") for line in lines) == 2
        assert all(f"reason_number_{i}" in text for i in range(12))
    assert render(view, unicode=False).isascii()


def test_narrow_terminal_lines_fit_too() -> None:
    text = render(_view(), 50)
    assert max(len(line) for line in text.splitlines()) <= 50


def test_durations_read_at_a_glance() -> None:
    assert [duration(s) for s in (0, 59.4, 187, 3600 * 5 + 61, 86400 * 3 + 7200)] == [
        "0s",
        "59s",
        "3m07s",
        "5h01m",
        "3d02h",
    ]


def test_other_arm_names_title_the_difference() -> None:
    groups = [
        GroupRow("baseline", {"RR": Estimate(0.5, 0.01, 100)}),
        GroupRow("candidate", {"RR": Estimate(0.6, 0.01, 100)}),
    ]
    view = _view(
        groups=groups,
        measures=["RR"],
        comparison={"RR": Comparison(0.1, 0.014)},
        arms=("baseline", "candidate"),
    )
    head = render(view).splitlines()[3]
    assert head.endswith("candidate−baseline") and len(head) <= 80


def test_an_empty_view_says_why_and_when_the_first_window_is_complete() -> None:
    """Data from 00:02:10 (event time), a 30m attribution window, the watermark at 00:10:00
    moving 60 event seconds per wall second: the first 5m window ends 00:05:00 and is complete
    at watermark 00:35:00, 25 event minutes = 25 wall seconds away."""
    base = {"groups": [], "comparison": None, "window_end": None}

    def progress(**fields: float | None) -> Progress:
        return Progress(**{"attribution_s": 1800.0, "oldest_open": 130.0, **fields})

    view = _view(**base, progress=progress(watermark=600.0, watermark_pace=60.0))
    lines = render(view).splitlines()
    assert lines[1:4] == [
        "no complete 5m window yet: the first ends 00:05:00 UTC (event time) and is",
        "complete at watermark 00:35:00 (its end + the 30m attribution window);",
        "watermark now 00:10:00, about 25s away at its pace",
    ]
    still = render(_view(**base, progress=progress(watermark=600.0, watermark_pace=0.0)))
    assert "watermark now 00:10:00, standing still: no newer events" in still
    nothing = render(_view(**base, progress=progress(oldest_open=None, watermark=None)))
    assert "no complete 5m window yet: no event read yet" in nothing


def _many_verdicts(segments: int) -> list[Verdict]:
    return [
        Verdict("ab", f"surface=s{i}", m, 0.01, 0.005, 0.015, True)
        for i in range(segments)
        for m in ALL
    ]


def test_a_frame_taller_than_the_terminal_gives_up_verdict_lines_first() -> None:
    """On a terminal a frame taller than its rows scrolls the header away on every redraw
    (30 rows, a demo with four segments did): the verdicts since the start give way, said so."""
    view = _view(verdicts=_many_verdicts(8))
    full = render(view).splitlines()
    assert len(full) > 30
    lines = render(view, height=30).splitlines()
    assert len(lines) == 30
    assert lines[0] == full[0] and lines[-5:] == full[-5:]  # header and health kept
    hidden = [line for line in lines if line.startswith("… ") and "lines of verdicts" in line]
    assert len(hidden) == 1
    shown = sum(line.startswith("since start") or line.startswith("  ") for line in lines)
    assert int(hidden[0].split()[1]) == len(full) - 30 + 1
    assert "▲▼: the always-valid band" in "\n".join(lines) and shown > 0
    assert render(view, height=len(full)) == render(view)  # a frame that fits is untouched


def test_a_terminal_too_short_for_the_rest_cuts_the_last_lines_and_says_so() -> None:
    view = _view(verdicts=_many_verdicts(2))
    lines = render(view, height=12).splitlines()
    assert len(lines) == 12 and lines[0].startswith("evald top · 127.0.0.1:9464")
    assert lines[-1].startswith("… ") and lines[-1].endswith(
        "more lines: a taller terminal shows them"
    )
    assert max(len(line) for line in lines) <= 80


def test_an_interleaving_line_too_long_wraps_and_keeps_its_verdict() -> None:
    """The demo's segments (arm, model, surface) and team names take most of 80 columns: the
    preference, its band and who beats whom go on the next line rather than under an ellipsis;
    a kept verdict whose band holds 0 again says so rather than who beats whom."""
    from evald.top.interleaving import Preference

    segment = "arm=interleaved model=team-draft surface=web"
    decided = Preference(segment, "ranker-v1", "ranker-v2", -0.0566, -0.0880, -0.0252, "ranker-v2")
    early = Preference(segment, "ranker-v1", "ranker-v2", 0.25, math.nan, math.nan, None)
    text = render(_view(preferences=[decided, early]), width=80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text
    assert f"interleaving {segment}:\n  ranker-v1 vs ranker-v2 -0.057±0.031 ranker-v2 beats" in text
    assert "ranker-v1 vs ranker-v2 +0.250, no band yet (too few lists or users," in text
    short = Preference("surface=app", "A", "B", 0.12, 0.079, 0.161, "A")
    assert "interleaving surface=app: A vs B +0.120±0.041 A beats B\n" in render(
        _view(preferences=[short]), width=80
    )
    again = Preference(segment, "ranker-v1", "ranker-v2", -0.0314, -0.0880, 0.0252, "ranker-v2")
    lines = render(_view(preferences=[again]), width=80).splitlines()
    at = lines.index(f"interleaving {segment}:")
    assert (
        lines[at + 1]
        == "  ranker-v1 vs ranker-v2 -0.031±0.057 ranker-v2 won · no difference shown now"
    )


def test_a_verdict_the_band_since_reverses_says_so_within_80_columns() -> None:
    """The test stopped at ranker-v2's verdict and keeps it; after the rankers changed the band
    since the start excludes 0 for ranker-v1: the line says ranker-v2 won and that the
    preference has reversed since, rather than a band and a "beats" that disagree."""
    from evald.top.interleaving import Preference

    segment = "arm=interleaved model=team-draft surface=web"
    turned = Preference(segment, "ranker-v1", "ranker-v2", 0.0535, 0.035, 0.072, "ranker-v2")
    for width in (80, 160):
        text = render(_view(preferences=[turned]), width=width)
        assert all(len(line) <= width for line in text.splitlines())
        assert "…" not in text and "beats" not in text
    assert (
        f"interleaving {segment}: ranker-v1 vs ranker-v2 +0.053±0.018 ranker-v2 won"
        " · reversed since: ranker-v1 ahead\n"
    ) in render(_view(preferences=[turned]), width=160)
    lines = render(_view(preferences=[turned]), width=80).splitlines()
    at = lines.index(f"interleaving {segment}:")
    assert lines[at + 1 : at + 3] == [
        "  ranker-v1 vs ranker-v2 +0.053±0.018 ranker-v2 won",
        "  reversed since: ranker-v1 ahead",
    ]


def test_a_segment_whose_bands_wait_for_lists_does_not_blame_user_ids() -> None:
    """Before any band is defined the variance is list level because an arm has too few
    lists; saying "no user ids" there sent users looking for a defect in their events."""
    verdicts = [Verdict("ab", "surface=app", "nDCG@10", 0.01, math.nan, math.nan, False)]
    text = render(_view(verdicts=verdicts))
    assert "since start, ab surface=app" in text
    assert "no user ids" not in text


def columns(line: str) -> int:
    """Terminal columns of a line: East Asian wide characters take two, combining ones none."""
    import unicodedata

    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in line
    )


#: label values an event may carry: an escape sequence (clear the screen, turn red), a bidi
#: override, twelve wide characters (24 columns in 12 characters), combining accents
HOSTILE_ARMS = ["\x1b[2J\x1b[31mtreat", "a\u202eb", "実験群" * 4, "e\u0301\u0301\u0301x"]


def test_label_values_are_shown_as_text_and_lines_cut_in_terminal_columns() -> None:
    """An escape sequence in an arm's value reached the terminal as it was (it cleared the
    screen), and a line of wide characters within 80 characters but past 80 columns wrapped
    (the frame scrolled): controls and format characters are ``?``, each line is cut in
    columns, at 80 and at 40, in Unicode and in ASCII."""
    groups = _view().groups
    rows = [GroupRow(name, groups[0].estimates) for name in HOSTILE_ARMS]
    view = _view(groups=rows, arms=("control", HOSTILE_ARMS[0]))
    for width in (80, 40):
        for unicode in (True, False):
            text = render(view, width, unicode=unicode)
            assert "\x1b" not in text and "\u202e" not in text
            assert all(columns(line) <= width for line in text.splitlines()), text
            assert "?[2J?[31m" in text
            if not unicode:
                assert text.isascii()
    assert "実験群実験群" in render(view, 80)


def _ends(line: str) -> list[int]:
    """The terminal column after each space-separated cell of a table row."""
    ends, at = [], 0
    for cell in line.split(" "):
        at += columns(cell)
        if cell:
            ends.append(at)
        at += 1
    return ends


def test_columns_after_a_wide_label_value_stand_in_line() -> None:
    """A wide character takes two columns and a cell was padded by characters: after an arm
    or a measure named in CJK every column stood further right than in the rows without one.
    Padded in columns, each cell ends at the same column in every row, in Unicode and ASCII."""
    estimate, comparison = Estimate(0.5, 0.005, 12345), Comparison(-0.0142, 0.0059)
    measures = ["RR", "適合率@10"]
    rows = [GroupRow(name, dict.fromkeys(measures, estimate)) for name in ("control", "処理群")]
    view = _view(
        groups=rows,
        measures=measures,
        arms=("control", "処理群"),
        comparison=dict.fromkeys(measures, comparison),
    )
    for unicode in (True, False):
        lines = render(view, 80, unicode=unicode).splitlines()
        head, n, ascii_row, wide_row = lines[3:7]
        assert [row.split()[0] for row in lines[3:6]] == ["measure", "n", "RR"], lines
        assert ("処理群" in head) is unicode, lines
        # the two arms' cells, then the difference's (its "*" a column after the title)
        assert _ends(ascii_row)[1:] == _ends(wide_row)[1:], lines
        assert _ends(n)[1:] == _ends(ascii_row)[1:3] == _ends(head)[1:3], lines
        assert _ends(ascii_row)[-1] == _ends(head)[-1], lines


def test_long_lines_wrap_between_words_in_terminal_columns() -> None:
    """The verdict lines were wrapped counting characters and then cut in columns: after a
    segment of wide characters a line that fit in characters lost its last verdict under an
    ellipsis, and a verdict, a legend or a waiting line wider than the terminal lost its end.
    Wrapped between words in columns, every word is shown, at 40 to 80 columns, in Unicode
    and in ASCII (where ``±`` takes two columns)."""
    verdicts = [
        Verdict("ab", "surface=検索結果ページ", m, -0.011, -0.015, -0.007, True) for m in ALL
    ]
    verdicts.append(Verdict("ab", "surface=app", "nDCG@10", 0.01, math.nan, math.nan, False))
    for width in range(40, 81):
        for unicode in (True, False):
            lines = render(_view(verdicts=verdicts), width, unicode=unicode).splitlines()
            start = next(i for i, line in enumerate(lines) if line.startswith("since start"))
            block = lines[start : lines.index("", start)]
            assert all(columns(line) <= width for line in block), block
            assert not any(line.endswith(("…", "~")) for line in block), block
            words = " ".join(" ".join(block).split())
            band = "-0.011±0.004 ▼" if unicode else "-0.011+-0.004 v"
            for measure in ALL:
                assert f"{measure} {band}" in words, block
            assert "nDCG@10 +0.010, no band yet (too few lists or users, or no variance)" in words
            assert "since the start excludes 0 (a verdict)" in words
            assert "outside its own 95% interval (descriptive)" in words
    progress = Progress(attribution_s=1800.0, oldest_open=130.0, watermark=600.0)
    waiting = _view(groups=[], comparison=None, window_end=None, progress=progress)
    lines = render(waiting, 40).splitlines()
    assert not any(line.endswith("…") for line in lines), lines
    assert "complete at watermark 00:35:00 (its end + the 30m attribution window);" in " ".join(
        " ".join(lines).split()
    )


def test_a_measure_not_in_the_window_is_named_with_the_ones_it_has() -> None:
    view = _view(measures=["ndcg@10", "RR"], exported=["nDCG@10", "RR"])
    lines = render(view, 80).splitlines()
    assert "not in the 5m window: ndcg@10; it has nDCG@10, RR" in lines
    assert "not in the" not in render(_view(), 80)


def test_a_window_not_yet_complete_while_others_are_says_which_are() -> None:
    """``--window 10m`` against an evald of 5m and 1h windows said when the first 10m window
    would be complete, and went on saying it past that watermark: it never is."""
    base = {"groups": [], "comparison": None, "window_end": None, "window": "10m"}
    waiting = Progress(1800.0, 130.0, 600.0, 60.0, complete=("1h", "5m"))
    lines = render(_view(**base, progress=waiting)).splitlines()
    assert "complete: 1h, 5m (a window not in engine.windows never is)" in lines
    assert "complete:" not in render(_view(**base, progress=Progress(1800.0, 130.0, 600.0)))
