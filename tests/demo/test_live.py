"""The live view: window arithmetic, grouping, trend, rendering and when frames are drawn."""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
import pytest
from settable_clock import SettableClock

from evald.aggregate import Aggregates
from evald.config import EngineConfig
from evald.demo.live import (
    DOWN,
    FLAT,
    SHOWN,
    UP,
    Estimate,
    Health,
    LiveView,
    SegmentSummary,
    Snapshot,
    Versus,
    health,
    interleaving_lines,
    last_windows,
    render_lines,
    render_table,
    summarize,
    trend,
    versus_control,
)
from evald.demo.simulator import DEFAULT_START_MS, Simulator
from evald.engine import Engine
from evald.segments import SegmentIndex
from evald.stats import Z95, Stats

MEASURES = ["nDCG@10", "RR", "Success@10", "RBP(p=0.8)"]
MIN = 60_000


def _aggregates() -> Aggregates:
    segments = SegmentIndex(["model", "arm", "surface"], 50)
    return Aggregates(MEASURES, segments, [0.5, 1.0], MIN, [5 * MIN, 60 * MIN], 180 * MIN)


def _observe(agg: Aggregates, labels: dict[str, str], ts: list[int], values: list[float]) -> None:
    seg = agg.segments.segment_of(labels)
    rows = np.repeat(np.asarray(values, float)[:, None], len(MEASURES), axis=1)
    rows[:, 1] = 1.0  # RR constant: its CI is 0
    agg.observe(0, np.full(len(ts), seg), np.asarray(ts), rows)


def test_last_windows_are_aligned_to_the_width() -> None:
    assert last_windows(None, 5 * MIN) is None
    assert last_windows(12 * MIN + 5, 5 * MIN) == ((5 * MIN, 10 * MIN), (0, 5 * MIN))
    assert last_windows(10 * MIN, 5 * MIN) == ((5 * MIN, 10 * MIN), (0, 5 * MIN))


def test_trend_moves_only_beyond_the_noise() -> None:
    assert trend(Estimate(0.8, 0.01), Estimate(0.7, 0.01)) == UP
    assert trend(Estimate(0.6, 0.01), Estimate(0.7, 0.01)) == DOWN
    # |delta| = 0.05 < hypot(0.04, 0.04) = 0.0566: inside the noise
    assert trend(Estimate(0.75, 0.04), Estimate(0.7, 0.04)) == FLAT
    assert trend(Estimate(0.75, math.nan), Estimate(0.7, math.nan)) == UP
    assert trend(None, Estimate(0.7, 0.01)) == ""
    assert trend(Estimate(math.nan, math.nan), Estimate(0.7, 0.01)) == ""


def test_summarize_merges_surfaces_and_compares_windows() -> None:
    agg = _aggregates()
    control = {"model": "m1", "arm": "control"}
    treatment = {"model": "m2", "arm": "treatment"}
    prev_web, prev_app = [0.9, 0.7, 0.8], [0.6, 1.0]
    cur_web, cur_app = [0.5, 0.4], [0.3, 0.2, 0.1]
    _observe(agg, {**control, "surface": "web"}, [MIN, 2 * MIN, 3 * MIN], prev_web)
    _observe(agg, {**control, "surface": "app"}, [4 * MIN, 4 * MIN + 1], prev_app)
    _observe(agg, {**control, "surface": "web"}, [5 * MIN, 9 * MIN], cur_web)
    _observe(agg, {**control, "surface": "app"}, [6 * MIN, 7 * MIN, 8 * MIN], cur_app)
    _observe(agg, {**treatment, "surface": "web"}, [6 * MIN, 6 * MIN], [0.5, 0.5])
    # outside both windows: in the totals only
    _observe(agg, {**treatment, "surface": "web"}, [11 * MIN], [1.0])

    cur, prev = last_windows(10 * MIN, 5 * MIN)  # type: ignore[misc]
    rows = {row.name: row for row in summarize(agg, cur, prev)}
    assert set(rows) == {"control · m1", "treatment · m2"}

    c = rows["control · m1"]
    current = np.asarray(cur_web + cur_app)
    previous = np.asarray(prev_web + prev_app)
    assert c.count == 5 and c.total == 10
    assert c.current["nDCG@10"].mean == pytest.approx(current.mean())
    half = Z95 * current.std(ddof=1) / math.sqrt(len(current))
    assert c.current["nDCG@10"].half == pytest.approx(half)
    assert c.previous["nDCG@10"].mean == pytest.approx(previous.mean())
    assert c.current["RR"] == Estimate(1.0, 0.0)
    assert c.trend == DOWN

    t = rows["treatment · m2"]
    assert t.count == 2 and t.total == 3
    assert t.previous == {}
    assert t.trend == ""


def test_summarize_without_windows_still_lists_scored_segments() -> None:
    agg = _aggregates()
    _observe(agg, {"model": "m1", "arm": "control", "surface": "web"}, [MIN], [0.5])
    rows = summarize(agg, None, None, group_by=("arm",))
    assert [(r.name, r.count, r.total, r.current) for r in rows] == [("control", 0, 1, {})]
    assert summarize(_aggregates(), None, None) == []


def test_health_folds_engine_counters() -> None:
    stats = Stats()
    stats.events[("impression", "accepted")] = 10
    stats.events[("feedback", "accepted")] = 5
    stats.events[("impression", "duplicate")] = 2
    stats.events[("feedback", "duplicate")] = 3
    stats.unattributed["duplicate"] = 3  # the same 3 duplicate feedback, counted once
    stats.unattributed["late"] = 4
    stats.unattributed["orphaned"] = 1
    reason = next(iter(stats.rejected))
    stats.rejected[reason] = 6
    h = health(stats, pending=7, newest_ms=200_000, watermark_ms=80_000, events_per_s=12.5)
    assert (h.accepted, h.duplicates, h.late, h.orphaned, h.rejected, h.pending) == (
        15,
        5,
        4,
        1,
        6,
        7,
    )
    assert h.watermark_lag_s == 120.0
    assert (
        health(stats, pending=0, newest_ms=None, watermark_ms=1, events_per_s=0).watermark_lag_s
        is None
    )


def _snapshot() -> Snapshot:
    rows = [
        SegmentSummary("control · m1", 120, 900, {"nDCG@10": Estimate(0.7, 0.02)}, {}, FLAT),
        SegmentSummary("treatment · m2", 130, 950, {"nDCG@10": Estimate(0.4, 0.02)}, {}, DOWN),
    ]
    h = Health(3000.0, 100, 5, 1, 2, 3, 4, 0, 6, 90, 120.0)
    return Snapshot(1_767_225_900_000, (1_767_225_600_000, 1_767_225_900_000), rows, h, ["note"])


def test_duplicates_are_what_metrics_count_each_once() -> None:
    """The simulator's duplicated records through the real engine: the view's duplicates equal
    evald_events_total{outcome="duplicate"} (impressions and feedback), each counted once."""
    engine = Engine(EngineConfig(window="5m", lateness="2m"))
    sim = Simulator(3, rate=3000, speed=60, stop_ms=DEFAULT_START_MS + 20 * MIN)
    for event in sim:
        engine.feed(event.value, kind=event.kind)
    engine.drain()
    by_kind = {k: engine.stats.events[(k, "duplicate")] for k in ("impression", "feedback")}
    assert by_kind["impression"] > 10 and by_kind["feedback"] > 10
    assert engine.stats.unattributed["duplicate"] == by_kind["feedback"]
    h = health(engine.stats, pending=0, newest_ms=None, watermark_ms=None, events_per_s=0)
    assert h.duplicates == by_kind["impression"] + by_kind["feedback"]


def test_render_table_colour_and_plain() -> None:
    text = render_table(_snapshot())
    assert "\x1b[31m↓" in text  # the drop is red
    assert "0.700±0.020" in text and "0.400±0.020" in text
    assert "window 00:00:00-00:05:00" in text
    assert "watermark lag 2m00s" in text and text.rstrip().endswith("note")
    plain = render_table(_snapshot(), color=False, unicode=False)
    assert "\x1b" not in plain
    assert " v" in plain and "↓" not in plain


def test_render_lines_one_line_per_segment_plus_health() -> None:
    text = render_lines(_snapshot(), 65.0)
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("[ 1m05s]") and "segment='control · m1'" in lines[0]
    assert "nDCG@10=0.700" in lines[0] and "RR=-" in lines[0] and "trend=flat" in lines[0]
    assert "trend=down" in lines[1]
    assert "3,000 events/s" in lines[2]


def test_live_view_on_a_terminal_redraws_in_place_each_interval() -> None:
    clock, out = SettableClock(), io.StringIO()
    view = LiveView(out, tty=True, interval=1.0, clock=clock)
    assert view.show(_snapshot())
    assert not view.show(_snapshot())  # not due yet
    clock.now += 1.0
    assert view.show(_snapshot())
    assert out.getvalue().count("\x1b[H\x1b[J") == 2 == view.frames


def test_live_view_plain_every_few_seconds_and_ascii_when_needed() -> None:
    clock = SettableClock()
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii")
    view = LiveView(out, tty=False, plain_interval=5.0, clock=clock)
    view.show(_snapshot())
    clock.now += 4.9
    assert not view.show(_snapshot())
    clock.now += 0.1
    assert view.show(_snapshot())
    view.final(_snapshot())
    text = raw.getvalue().decode("ascii")  # nothing unencodable reached the stream
    assert "\x1b" not in text
    assert "control | m1" in text and "0.700+-0.020" in text


def _wide_snapshot() -> Snapshot:
    """The demo's real segment names, every measure filled, big counters and long notes."""
    full = {name: Estimate(0.71234, 0.01234) for name in SHOWN}
    rows = [
        SegmentSummary("control · ranker-v1", 123_456, 9_999_999, full, {}, FLAT),
        SegmentSummary("treatment · ranker-v2", 123_457, 9_999_999, full, {}, DOWN),
    ]
    h = Health(123_456.0, 10**9, 10**7, 10**6, 10**6, 10**6, 10**6, 10**6, 10**6, 10**9, 7200.0)
    notes = ["last rejected record: invalid_json: " + "x" * 200]
    versus = [Versus("treatment", "control", {name: Estimate(-0.30567, 0.01745) for name in SHOWN})]
    window = (1_767_225_600_000, 1_767_225_900_000)
    return Snapshot(1_767_225_900_000, window, rows, h, notes, [], versus)


GOLDEN_TABLE = """\
evald demo · event time 00:05:00 · window 00:00:00-00:05:00
measure         control · ranker-v1  treatment · ranker-v2  treatment−control
nDCG@10               0.712±0.012 →          0.712±0.012 ↓    -0.306±0.017 *
RR                    0.712±0.012            0.712±0.012      -0.306±0.017 *
Success@10            0.712±0.012            0.712±0.012      -0.306±0.017 *
RBP(p=0.8)            0.712±0.012            0.712±0.012      -0.306±0.017 *
impressions               123,456                123,457
arrow: nDCG@10 against the window before
  *: the window's difference outside its 95% interval (descriptive)
"""


def test_table_fits_80_columns_with_the_measure_names_as_titles() -> None:
    text = render_table(_wide_snapshot(), color=False)
    assert text.startswith(GOLDEN_TABLE)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    # the health figures are all there, wrapped rather than cut
    assert "123,456 events/s" in text and "watermark lag 2h00m" in text
    assert "unknown item 1,000,000" in text
    # the measure names title the rows, in the demo's order
    assert [line.split()[0] for line in lines[2:6]] == list(SHOWN)
    assert list(SHOWN) == ["nDCG@10", "RR", "Success@10", "RBP(p=0.8)"]
    plain = render_table(_wide_snapshot(), color=False, unicode=False)
    assert max(len(line) for line in plain.splitlines()) <= 80


def test_versus_control_is_the_difference_of_the_arms_merged_over_models_and_surfaces() -> None:
    agg = _aggregates()
    control = [0.9, 0.7, 0.8, 0.6]
    treatment = [0.5, 0.4, 0.3]
    _observe(agg, {"model": "m1", "arm": "control", "surface": "web"}, [6 * MIN] * 2, control[:2])
    _observe(agg, {"model": "m1", "arm": "control", "surface": "app"}, [7 * MIN] * 2, control[2:])
    _observe(agg, {"model": "m2", "arm": "treatment", "surface": "web"}, [8 * MIN] * 3, treatment)
    arms = summarize(agg, (5 * MIN, 10 * MIN), None, group_by=("arm",))
    (versus,) = versus_control(arms, "control", ["treatment"])
    assert versus.title == "treatment−control"
    diff = versus.difference["nDCG@10"]
    assert diff.mean == pytest.approx(np.mean(treatment) - np.mean(control))
    halves = [Z95 * np.std(x, ddof=1) / math.sqrt(len(x)) for x in (treatment, control)]
    assert diff.half == pytest.approx(math.hypot(*halves))
    assert versus.difference["RR"] == Estimate(0.0, 0.0)  # RR is 1 in both arms


def test_the_treatment_control_column_is_there_from_the_first_frame() -> None:
    """Before any window closes the column is titled, with a dash per measure; a treatment
    arm without traffic gets its column too."""
    (empty,) = versus_control([], "control", ["treatment"])
    assert empty.difference == {}
    h = Health(0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, None)
    snap = Snapshot(1_767_225_900_000, None, [], h, [], [], [empty])
    lines = render_table(snap, color=False).splitlines()
    assert lines[1].split() == ["measure", "treatment−control"]
    assert [line.split() for line in lines[2:6]] == [[name, "-"] for name in SHOWN]
    plain = render_lines(snap, 1.0)
    assert "treatment−control nDCG@10=- RR=-" in plain


def test_a_difference_inside_its_bound_is_not_marked_and_plain_lines_carry_the_column() -> None:
    inside = Versus("treatment", "control", {"nDCG@10": Estimate(0.01, 0.02)})
    snap = Snapshot(0, None, [], Health(0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, None), [], [], [inside])
    row = render_table(snap, color=False).splitlines()[2]
    assert row.endswith("0.010±0.020") and "*" not in row
    text = render_lines(_wide_snapshot(), 5.0)
    assert "treatment−control nDCG@10=-0.306±0.017* RR=-0.306±0.017*" in text
    ascii_table = render_table(_wide_snapshot(), color=False, unicode=False)
    assert "-0.306±0.017 *" in ascii_table and "▼" not in ascii_table and "↓" not in ascii_table


def test_verdict_marks_come_from_the_band_since_the_start_and_the_legend_says_so() -> None:
    """The window's difference is marked ``*`` (descriptive); ▲▼ only on the always-valid band
    since the start, and the legend tells the two apart, in colour red/green on a terminal."""
    snap = _wide_snapshot()
    lines = [
        "nDCG@10: treatment − control since the start (always-valid band):",
        "  treatment web    -0.0123 [-0.020, -0.004] ▼  CUSUM  12.3",
        "  treatment app    +0.0010 [-0.006, +0.008]    CUSUM   0.0",
    ]
    marked = dataclasses.replace(snap, comparison=lines)
    text = render_table(marked, color=False)
    assert "*: the window's difference outside its 95% interval (descriptive)" in text
    assert "▲▼: the always-valid band since the start excludes 0 (a verdict)" in text
    assert text.count("▼") == 2  # the verdict and its legend; none in the window column
    coloured = render_table(marked, color=True)
    assert "] \x1b[31m▼\x1b[0m  CUSUM" in coloured


def _pair(surface: str, **values: object) -> dict[str, object]:
    record: dict[str, object] = {
        "segment": {"model": "team-draft", "arm": "interleaved", "surface": surface},
        "team_a": "ranker-v1",
        "team_b": "ranker-v2",
        "compared": 1234,
        "preference": None,
        "lower": None,
        "upper": None,
        "winner": None,
        "decided_at": None,
    }
    record.update(values)
    return record


def test_interleaving_lines_show_band_verdict_and_who_won() -> None:
    records = [
        _pair(
            "web",
            preference=-0.12,
            lower=-0.159,
            upper=-0.082,
            winner="ranker-v2",
            decided_at="2026-01-01T00:10:00.000Z",
        ),
        _pair(
            "app",
            preference=0.1523,
            lower=0.039,
            upper=0.266,
            winner="ranker-v1",
            decided_at="2026-01-01T00:20:00.000Z",
        ),
        _pair("tv", preference=0.01, lower=-0.05, upper=0.07),
        _pair("car", preference=0.5),
    ]
    assert interleaving_lines(records) == [
        "interleaving: ranker-v1 vs ranker-v2, preference since the start:",
        "  web    -0.1200 [-0.159, -0.082] ▼  ranker-v2 won at 00:10:00 (1,234 lists)",
        "  app    +0.1523 [+0.039, +0.266] ▲  ranker-v1 won at 00:20:00 (1,234 lists)",
        "  tv     +0.0100 [-0.050, +0.070]  no difference shown yet (1,234 lists)",
        "  car    +0.5000 no band yet (too few lists or users, or no variance)"
        "  no difference shown yet (1,234 lists)",
    ]
    assert interleaving_lines([]) == []


def test_interleaving_lines_say_when_the_band_since_reverses_the_kept_verdict() -> None:
    """ranker-v2 won at 00:10:00 (the test stops at its verdict); after the regression the band
    since the start excludes 0 for ranker-v1: a line of its own says the preference reversed."""
    turned = _pair(
        "web",
        preference=0.0535,
        lower=0.035,
        upper=0.072,
        winner="ranker-v2",
        decided_at="2026-01-01T00:10:00.000Z",
        compared=12345,
    )
    lines = interleaving_lines([turned])
    assert lines[1:] == [
        "  web    +0.0535 [+0.035, +0.072] ▼  ranker-v2 won at 00:10:00 (12,345 lists)",
        "  web    reversed since: the band now favours ranker-v1",
    ]
    assert all(len(line) <= 80 for line in lines)
