"""`evald top`'s numbers: intervals merged from exported window sums, rates, health folding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evald.stats import Z95
from evald.top.model import Estimate, build_view, compare, parse

SEED = 20261124


def _exposition(values: dict[tuple[str, str], np.ndarray], *, events: float, at_end: float) -> str:
    """A text exposition with window sums of ``values`` per (arm, surface) for two measures."""
    lines = [
        "# TYPE evald_window_count untyped",
        "# TYPE evald_window_sum untyped",
        "# TYPE evald_window_sum_squares gauge",
    ]
    for (arm, surface), v in values.items():
        for measure, x in (("nDCG@10", v), ("RR", v**2)):
            labels = f'arm="{arm}",measure="{measure}",model="m",surface="{surface}",window="5m"'
            lines.append(f"evald_window_count{{{labels}}} {len(x)}")
            lines.append(f"evald_window_sum{{{labels}}} {float(x.sum())!r}")
            lines.append(f"evald_window_sum_squares{{{labels}}} {float((x**2).sum())!r}")
    lines += [
        "# TYPE evald_window_end_timestamp_seconds gauge",
        f'evald_window_end_timestamp_seconds{{window="5m"}} {at_end}',
        "# TYPE evald_events_total counter",
        f'evald_events_total{{kind="impression",outcome="accepted"}} {events}',
        f'evald_events_total{{kind="feedback",outcome="rejected"}} {events / 10}',
        "# TYPE evald_rejected_total counter",
        'evald_rejected_total{reason="invalid_json"} 7',
        'evald_rejected_total{reason="bad_timestamp"} 0',
        'evald_rejected_total{reason="missing_field"} 9',
        "# TYPE evald_pending_impressions gauge",
        "evald_pending_impressions 321",
        "# TYPE evald_watermark_timestamp_seconds gauge",
        'evald_watermark_timestamp_seconds{partition="0"} 1000.0',
        'evald_watermark_timestamp_seconds{partition="1"} 940.0',
        "# TYPE evald_consumer_lag gauge",
        'evald_consumer_lag{partition="0",topic="impressions"} 5',
        'evald_consumer_lag{partition="1",topic="impressions"} 7',
        "# TYPE evald_ready gauge",
        "evald_ready 1.0",
        "# TYPE process_cpu_seconds_total counter",
        "process_cpu_seconds_total 3.5",
    ]
    return "\n".join(lines) + "\n"


def _values() -> dict[tuple[str, str], np.ndarray]:
    rng = np.random.default_rng(SEED)
    return {
        ("control", "web"): rng.uniform(0.4, 0.8, 500),
        ("control", "app"): rng.uniform(0.3, 0.7, 300),
        ("treatment", "web"): rng.uniform(0.5, 0.9, 450),
        ("treatment", "app"): rng.uniform(0.1, 0.5, 350),
    }


def test_intervals_merge_segments_from_sums_like_the_raw_values() -> None:
    values = _values()
    view = build_view("h:1", parse(_exposition(values, events=10, at_end=900.0), at=1060.0))
    groups = {g.name: g for g in view.groups}
    assert list(groups) == ["control", "treatment"]
    assert view.measures == ["nDCG@10", "RR"]
    for arm in groups:
        raw = np.concatenate([v for (a, _), v in values.items() if a == arm])
        est = groups[arm].estimates["nDCG@10"]
        assert est.n == len(raw)
        assert est.mean == pytest.approx(raw.mean())
        assert est.half == pytest.approx(Z95 * raw.std(ddof=1) / math.sqrt(len(raw)))
        assert groups[arm].estimates["RR"].mean == pytest.approx((raw**2).mean())
    t = np.concatenate([values["treatment", "web"], values["treatment", "app"]])
    c = np.concatenate([values["control", "web"], values["control", "app"]])
    bound = Z95 * math.sqrt(t.var(ddof=1) / len(t) + c.var(ddof=1) / len(c))
    assert view.comparison is not None
    assert view.comparison["nDCG@10"].delta == pytest.approx(t.mean() - c.mean())
    assert view.comparison["nDCG@10"].bound == pytest.approx(bound)


def test_group_by_two_labels_and_a_measure_subset() -> None:
    text = _exposition(_values(), events=10, at_end=900.0)
    view = build_view("h:1", parse(text, 0.0), group_by=["arm", "surface"], measures=["RR"])
    assert [g.name for g in view.groups] == [
        "control · app",
        "control · web",
        "treatment · app",
        "treatment · web",
    ]
    assert view.measures == ["RR"]
    assert view.comparison is None  # no group is called "treatment" and "control" alone


def test_health_rates_and_totals_from_two_scrapes() -> None:
    values = _values()
    first = parse(_exposition(values, events=1000, at_end=900.0), at=1058.0)
    second = parse(_exposition(values, events=1500, at_end=900.0), at=1060.0)
    view = build_view("h:1", second, first)
    assert view.events_per_s == pytest.approx((1650 - 1100) / 2)
    assert view.rejected_per_s == pytest.approx(50 / 2)
    assert view.scored_per_s is None  # the series is absent: unknown, not zero
    assert view.pending_impressions == 321
    assert view.watermark_delay_s == pytest.approx(1060.0 - 940.0)  # the slowest partition
    assert view.consumer_lag == 12
    assert view.ready is True
    assert view.window_end == 900.0
    assert view.rejects == [("missing_field", 9.0), ("invalid_json", 7.0)]
    # one scrape, or a restart between two (counters went down): no rate rather than a wrong one
    assert build_view("h:1", second).events_per_s is None
    assert build_view("h:1", first, second).events_per_s is None


def test_a_window_that_is_not_exported_shows_nothing() -> None:
    view = build_view("h:1", parse(_exposition(_values(), events=1, at_end=9), 0.0), window="1h")
    assert view.groups == [] and view.window_end is None and view.measures == []


def test_compare_marks_only_differences_beyond_the_bound() -> None:
    assert compare(Estimate(0.6, 0.02, 100), Estimate(0.5, 0.02, 100)).outside
    assert not compare(Estimate(0.52, 0.02, 100), Estimate(0.5, 0.02, 100)).outside
    assert not compare(Estimate(0.9, math.nan, 1), Estimate(0.5, 0.02, 100)).outside


def _comparison_series(control: str = "control", treatment: str = "treatment") -> str:
    """The comparison series as evald exports them: the arm label holds the treatment, the
    arm-scoped ``model`` is empty, ``surface`` is the comparison segment."""
    lines = []
    rows = [("web", "nDCG@10", -0.012, 0.004, 1), ("web", "RR", 0.001, 0.004, 1)]
    rows += [("app", "nDCG@10", 0.02, 0.005, 0), ("app", "RR", 0.0, float("nan"), 0)]
    for surface, measure, difference, half, clustered in rows:
        labels = (
            f'arm="{treatment}",comparison="ab",measure="{measure}",model="",surface="{surface}"'
        )
        lines.append(f"evald_comparison_difference{{{labels}}} {difference}")
        if half == half:
            lines.append(f"evald_comparison_lower{{{labels}}} {difference - half}")
            lines.append(f"evald_comparison_upper{{{labels}}} {difference + half}")
        lines.append(f"evald_comparison_clustered{{{labels}}} {clustered}")
        for arm in (control, treatment):
            arm_labels = labels.replace(f'arm="{treatment}"', f'arm="{arm}"')
            lines.append(f"evald_comparison_lists{{{arm_labels}}} 1000")
    return "\n".join(lines) + "\n"


def test_verdicts_come_from_the_exported_comparison_since_the_start() -> None:
    """One verdict per comparison segment and measure, marked only when the always-valid band
    excludes 0; the window's own difference stays descriptive."""
    text = _exposition(_values(), events=1, at_end=9) + _comparison_series()
    view = build_view("h:1", parse(text, 0.0))
    got = {(v.segment, v.measure): v for v in view.verdicts}
    assert sorted(got) == [
        ("surface=app", "RR"),
        ("surface=app", "nDCG@10"),
        ("surface=web", "RR"),
        ("surface=web", "nDCG@10"),
    ]
    assert got[("surface=web", "nDCG@10")].mark == "down"
    assert got[("surface=app", "nDCG@10")].mark == "up"
    assert got[("surface=web", "RR")].mark == "" == got[("surface=app", "RR")].mark
    assert math.isnan(got[("surface=app", "RR")].lower)  # no band yet: no verdict
    assert got[("surface=web", "RR")].clustered and not got[("surface=app", "RR")].clustered
    # a comparison of other arms is not these arms' verdict
    other = build_view("h:1", parse(text, 0.0), arms=("treatment", "control"))
    assert other.verdicts == []


def test_text_that_is_not_an_exposition_is_refused() -> None:
    with pytest.raises(ValueError):
        parse("<html><body>502 Bad Gateway</body></html>\n", 0.0)


def test_the_compared_arms_can_have_other_names() -> None:
    values = {
        (("baseline", "candidate")[a == "treatment"], s): v for (a, s), v in _values().items()
    }
    view = build_view("h:1", parse(_exposition(values, events=1, at_end=9), 0.0))
    assert view.comparison is None  # no group is called control/treatment
    named = build_view(
        "h:1", parse(_exposition(values, events=1, at_end=9), 0.0), arms=("baseline", "candidate")
    )
    assert named.comparison is not None and named.arms == ("baseline", "candidate")


def _utc_clock(seconds: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%H:%M:%S")


def _scrape_of(engine: object, at: float) -> object:
    from prometheus_client import generate_latest

    from evald.exposition.registry import build_registry

    registry, _ = build_registry(engine, process=False)  # type: ignore[arg-type]
    return parse(generate_latest(registry).decode(), at)


def test_before_the_first_window_the_view_says_when_it_will_be_complete() -> None:
    """A real engine fed simulated traffic a minute at a time: while no 5m window is complete
    the view carries the attribution window, the oldest waiting impression and the watermark,
    and the first window is exported exactly once the watermark passes the end it announced
    plus the attribution window."""
    from evald.config import EngineConfig
    from evald.demo.simulator import DEFAULT_START_MS, Faults, Simulator
    from evald.engine import Engine
    from evald.top.render import render

    engine = Engine(EngineConfig(window="5m", lateness="1m"))
    events = iter(Simulator(2, faults=Faults.none()).events())
    minute, fed_to, prev = 60_000, DEFAULT_START_MS, None
    announced = None
    for step in range(1, 30):
        fed_to = DEFAULT_START_MS + step * minute
        for event in events:
            engine.feed(event.value, kind=event.kind, timestamp=event.at_ms)
            if event.at_ms >= fed_to:
                break
        engine.tick()
        cur = _scrape_of(engine, float(step))
        view = build_view("demo", cur, prev)  # type: ignore[arg-type]
        prev = cur
        if view.window_end is not None:
            break
        progress = view.progress
        assert progress.attribution_s == 300.0 and progress.oldest_open is not None
        assert progress.watermark is not None
        end = progress.oldest_open // 300 * 300 + 300
        announced = announced or end + 300
        assert announced == end + 300  # the same first window all along
        assert progress.watermark < announced
        text = render(view)
        assert f"complete at watermark {_utc_clock(announced)} (its end + the 5m" in text
        assert all(len(line) <= 80 for line in text.splitlines())
    assert announced is not None and view.window_end is not None
    assert view.window_end + 300 == announced
    watermark = view.progress.watermark
    assert watermark is not None and watermark >= announced - 0.001


def test_a_measure_the_window_does_not_hold_is_told_apart_from_an_empty_one() -> None:
    """``--measures ndcg@10`` (misspelt) showed a row of dashes with n 0, as if nothing was
    scored: the view now carries the window's measures for the note that says so."""
    scrape = parse(_exposition(_values(), events=10, at_end=900.0), 0.0)
    view = build_view("h:1", scrape, measures=["ndcg@10", "RR"])
    assert view.exported == ["nDCG@10", "RR"]
    assert build_view("h:1", scrape, measures=["RR"]).exported == []
    assert build_view("h:1", scrape).exported == []
    # no window yet: the header says why, not this
    assert build_view("h:1", scrape, window="1h", measures=["RR"]).exported == []


def test_the_complete_windows_are_listed_while_the_shown_one_is_not() -> None:
    scrape = parse(_exposition(_values(), events=10, at_end=900.0), 0.0)
    assert build_view("h:1", scrape, window="10m").progress.complete == ("5m",)
    assert build_view("h:1", scrape, window="5m").progress.complete == ()
