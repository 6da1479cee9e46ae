"""Adtributor's explanatory power, surprise and selection on hand-computed slices."""

from __future__ import annotations

import math

import pytest

from evald.drilldown.attribution import Slice, explain


def test_adtributor_on_hand_computed_slices() -> None:
    """Total: 1000 lists, mean 0.5 at baseline, 0.4 now: a drop of 100 in the sum. Query "a"
    (200 lists) fell from 0.5 to 0.0 (-100: EP 1); "b" and "c" did not move (EP 0)."""
    slices = [
        Slice("a", 200, 0.0, 200, 100.0),
        Slice("b", 500, 250.0, 500, 250.0),
        Slice("c", 300, 150.0, 300, 150.0),
    ]
    total = Slice("", 1000, 400.0, 1000, 500.0)
    flat = [Slice("x", 1000, 400.0, 1000, 500.0)]  # one value: all of the drop, no surprise
    (only,) = explain({"flat": flat, "query": slices}, total)
    (trivial,) = explain({"flat": flat, "query": slices}, total, min_lift=1.0)[1:]
    assert (trivial.dimension, trivial.power, trivial.surprise) == ("flat", 1.0, 0.0)
    assert (only.dimension, only.value, only.lists) == ("query", "a", 200)
    assert only.power == pytest.approx(1.0)
    p, q = 100 / 500, 0 / 400  # forecast share, actual share
    assert only.surprise == pytest.approx(0.5 * p * math.log(2 * p / (p + q)))
    assert (only.mean, only.baseline_mean) == (0.0, 0.5)


def test_adtributor_names_nothing_without_a_drop_or_below_the_power() -> None:
    up = Slice("", 100, 60.0, 100, 50.0)
    assert explain({"query": [Slice("a", 100, 60.0, 100, 50.0)]}, up) == []
    total = Slice("", 1000, 400.0, 1000, 500.0)
    even = [Slice(f"q{i}", 100, 40.0, 100, 50.0) for i in range(10)]  # each EP 0.1
    assert explain({"query": even}, total, min_power=0.11, min_lift=0) == []
    assert len(explain({"query": even}, total, min_power=0.1, min_lift=0)) == 7  # 7 x 0.1
    # each fell exactly as much as the whole (lift 1): not unlike its share of traffic
    assert explain({"query": even}, total, min_power=0.1) == []


def test_a_slice_must_fall_more_than_the_scope_by_the_minimum_lift() -> None:
    """Three devices of 300, 450 and 250 lists; "a" fell from 0.5 to 0.2 (-90: EP 0.9, its
    traffic share 0.3: lift 3), "b" from 0.5 to 0.478 (-10: EP 0.1, lift 0.22)."""
    devices = [
        Slice("a", 300, 60.0, 300, 150.0),
        Slice("b", 450, 215.0, 450, 225.0),
        Slice("c", 250, 125.0, 250, 125.0),
    ]
    total = Slice("", 1000, 400.0, 1000, 500.0)
    (found,) = explain({"device": devices}, total)
    assert (found.value, found.power) == ("a", pytest.approx(0.9))
    assert explain({"device": devices}, total, min_lift=3.01) == []


def test_a_total_within_rounding_of_its_forecast_is_no_drop() -> None:
    """Slices that fell and rose by as much leave the total's sum one ulp under its forecast
    (0.3 against 0.1 + 0.2): its EP divided by that named slice "a" with a power of 1.8e15."""
    slices = {"d": [Slice("a", 1, 0.0, 1, 0.1), Slice("b", 2, 0.3, 2, 0.2)]}
    assert explain(slices, Slice("", 3, 0.3, 3, 0.1 + 0.2)) == []
    # the control: a real drop of the same slices' total (0.1 of 0.4) is explained by "a"
    (found,) = explain(slices, Slice("", 3, 0.3, 3, 0.4))
    assert found.value == "a" and 0 < found.power < 10
