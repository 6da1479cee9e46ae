"""Per-segment moments from results: intervals equal numpy's on the raw values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evald.engine import Result
from evald.moments import SegmentMoments
from evald.segments import SegmentIndex
from evald.stats import Z95

SEED = 7


def test_intervals_per_segment_and_overall_equal_the_raw_values() -> None:
    rng = np.random.default_rng(SEED)
    moments = SegmentMoments(["a", "b"], SegmentIndex(["arm", "surface"], 50))
    raw: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for i in range(20_000):  # more than one block
        key = (("control", "treatment")[i % 2], ("web", "app", "tv")[i % 3])
        a, b = float(rng.uniform()), float(rng.uniform())
        if i % 1000 == 0:
            b = math.nan  # a non-finite value counts for no mean
        raw.setdefault(key, []).append((a, b))
        labels = {"arm": key[0], "surface": key[1], "locale": "de"}
        moments.add(Result(f"r{i}", i, labels, {"a": a, "b": b}, 0, "window", False))
    rows = moments.rows()
    assert [tuple(r.labels.values()) for r in rows] == sorted(raw)
    for row in rows:
        values = np.asarray(raw[row.labels["arm"], row.labels["surface"]])
        assert row.n == len(values)
        for m, name in enumerate(("a", "b")):
            col = values[:, m][np.isfinite(values[:, m])]
            est = row.measures[name]
            assert est.n == len(col)
            assert est.mean == pytest.approx(col.mean())
            assert est.half == pytest.approx(Z95 * col.std(ddof=1) / math.sqrt(len(col)))
    everything = np.asarray([v for values in raw.values() for v in values])
    overall = moments.overall()
    assert overall["a"].n == 20_000 and overall["b"].n == 20_000 - 20
    assert overall["a"].mean == pytest.approx(everything[:, 0].mean())


def test_nothing_added_gives_nothing() -> None:
    moments = SegmentMoments(["a"], SegmentIndex(["arm"], 50))
    assert moments.rows() == [] and moments.overall() == {}
