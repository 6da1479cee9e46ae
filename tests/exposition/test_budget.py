"""The series budget: a saturated engine exposes exactly SeriesShape's worst case, never more."""

from __future__ import annotations

import random

import pytest

from evald.config import ConfigError, EngineConfig, load_config
from evald.exposition import SeriesShape, check_series_budget
from evald.stats import MAX_SKIPPED_ACTIONS

from .support import (
    T0,
    engine_registry,
    feedback,
    impression,
    make_engine,
    named,
    scrape,
    series,
)

# --------------------------------------------------------------------------------------------
# Segment cap and series budget
# --------------------------------------------------------------------------------------------


def test_the_overflow_counter_is_exported_at_zero_from_the_start() -> None:
    samples = scrape(engine_registry(make_engine()))
    assert series(samples, "evald_segments_overflow_total") == 0


def test_a_saturated_engine_exposes_exactly_the_worst_case_of_its_settings() -> None:
    """Every kept segment and the overflow hold >= 30 impressions (the clustered interval's
    minimum) in the last complete window of both widths, so every per-segment series exists:
    the count must equal SeriesShape's."""
    kept, combinations, per_combination = 4, 9, 40
    engine = make_engine(max_segments=kept, windows=["5m", "1h"])
    rng = random.Random(11)
    served = []
    for i in range(combinations * per_combination):
        combo = i % combinations
        labels = {"model": f"m{combo}", "arm": f"a{combo % 2}", "surface": "web"}
        ts = T0 + i * 100
        items = [f"d{i}-{k}" for k in range(3)]
        engine.feed(impression(f"r{i}", ts, items, labels))
        if rng.random() < 0.6:
            engine.feed(feedback(f"r{i}", ts + 10, items[rng.randrange(3)], "click"))
        served.append(combo)
    engine.drain()
    samples = scrape(engine_registry(engine))
    shape = SeriesShape.of(engine.config)
    watermarks = len(named(samples, "evald_watermark_timestamp_seconds"))
    assert watermarks == 1
    # the native schema skips no action: evald_feedback_skipped_total holds none of its room
    # (the mapping tests fill it: tests/mapping)
    assert named(samples, "evald_feedback_skipped_total") == {}
    skipped_room = MAX_SKIPPED_ACTIONS + 1
    # drained: no impression waits, so the oldest waiting one's gauge holds none of its room
    assert named(samples, "evald_oldest_open_impression_timestamp_seconds") == {}
    assert len(samples) + skipped_room + 1 == shape.worst_case(kept) + watermarks
    segments = {
        (dict(k)["model"], dict(k)["arm"])
        for k in named(samples, "evald_impressions_abandoned_total")
    }
    assert segments == {(f"m{c}", f"a{c % 2}") for c in range(kept)} | {("__other__", "__other__")}
    folded = sum(1 for combo in served if combo >= kept)
    assert series(samples, "evald_segments_overflow_total") == folded
    other = {"measure": "RR", "model": "__other__", "arm": "__other__", "surface": "__other__"}
    assert series(samples, "evald_measure_count", **other) == folded


def test_label_combinations_cannot_push_a_scrape_past_the_budget() -> None:
    """20,000 distinct combinations (every key within its value cap) against the defaults."""
    engine = make_engine()
    for i in range(20_000):
        labels = {"model": f"m{i % 50}", "arm": f"a{i // 50 % 50}", "surface": f"s{i // 2500}"}
        engine.feed(impression(f"r{i}", T0 + i * 10, ["a", "b"], labels))
    engine.drain()
    samples = scrape(engine_registry(engine))
    config = engine.config
    assert len(engine.segments) == config.max_segments + 1
    assert len(samples) <= SeriesShape.of(config).worst_case(config.max_segments) + 1
    assert len(samples) <= config.max_series
    assert series(samples, "evald_segments_overflow_total") == 20_000 - config.max_segments


def test_a_segment_cap_over_the_series_budget_is_refused_with_what_fits():
    config = EngineConfig()
    shape = SeriesShape.of(config)
    assert shape.worst_case(config.max_segments) <= config.max_series
    fits = shape.segments_within(config.max_series)
    assert load_config(max_segments=fits).max_segments == fits
    with pytest.raises(ConfigError) as err:
        check_series_budget(load_config(max_segments=fits + 1))
    message = str(err.value)
    assert message.startswith("max_segments:"), message
    assert "max_series" in message and f"lower max_segments to {fits}" in message


def test_more_measures_shrink_the_segments_that_fit():
    many = ["nDCG@10", "RR", "P@10", "R@10", "AP@10", "Success@10", "nDCG@5", "P@5", "R@5"]
    with pytest.raises(ConfigError, match=r"^max_segments:.*over max_series"):
        check_series_budget(load_config(measures=many, max_series=20_000))
    assert load_config(measures=many, max_series=20_000, max_segments=50).max_segments == 50


def test_a_budget_too_small_for_one_segment_says_how_much_is_needed():
    with pytest.raises(ConfigError, match=r"^max_segments:.*raise max_series to at least"):
        check_series_budget(load_config(max_series=100))
