"""The debiased measures of ``evald run`` (evald/clicks/live_measures.py) through the engine:
the exported sums against an offline computation over the same lists."""

from __future__ import annotations

import numpy as np
import pytest

from evald.clicks.debias import debiased_values
from evald.clicks.live_measures import DebiasedSums
from evald.clicks.models import new_model
from evald.clicks.sessions import Sessions
from evald.config import load_config
from evald.engine import Engine
from tests.clicks.test_stream import ENGINE, THETA, events, named, offline_lists

MEASURES = ["nDCG@6", "RR", "P@3"]


def run(**click_model: object) -> Engine:
    """The events of test_stream, scored by three measures, a refit every 1,000 lists."""
    settings = {"model": "pbm", "depth": 6, "refit_every": 1000, **click_model}
    config = load_config({**ENGINE, "measures": MEASURES}, click_model=settings)
    engine = Engine(config, clock=lambda: 0.0)
    raws = events(3, THETA)
    for start in range(0, len(raws), 700):  # batches that cut across the refits
        engine.feed_batch(raws[start : start + 700])
        engine.tick()
    engine.drain()
    return engine


def offline(engine: Engine) -> dict[tuple[str, str], list[float]]:
    """A plain loop over the lists in the order they were scored: each list, just before the
    model reads it, scored one at a time by ``debiased_values`` (the replay's scorer) with
    the model's relevance then; the lists of a segment no refit has read skipped; the model
    fed the lists between refits in one piece. Per (arm, measure): Σ value, Σ value², n."""
    clicks = engine.clicks
    assert clicks is not None
    model = new_model(clicks.settings)
    lists, pairs, hit, segments, ts = offline_lists(model)
    lengths = np.full(len(lists), 6)
    everything = Sessions(pairs, hit, lengths, segments, ts, np.ones(len(lists)))
    sums: dict[tuple[str, str], list[float]] = {}
    start = 0
    while start < len(lists):
        stop = min(len(lists), start + model.next_refit - model.seen)
        for i in range(start, stop):
            s = int(segments[i])
            if s < len(model.fitted_shown) and model.fitted_shown[s, 0] > 0:
                values = debiased_values(model, everything.take([i]), MEASURES)
                for measure, value in values.items():
                    row = sums.setdefault((model.segments[s][0], measure), [0.0, 0.0, 0])
                    row[0] += float(value[0])
                    row[1] += float(value[0]) ** 2
                    row[2] += 1
        model.observe(everything.take(slice(start, stop)))
        start = stop
    fed = clicks.models[0]  # the same lists, in the same order (batched otherwise: to 1e-12)
    assert (model.seen, model.fits) == (fed.seen, fed.fits)
    assert np.allclose(model.curve(), fed.curve(), rtol=1e-12, atol=0)
    return sums


def test_the_debiased_sums_equal_an_offline_computation() -> None:
    engine = run()
    clicks = engine.clicks
    assert clicks is not None
    want = offline(engine)
    got = {(labels[0], m): [total, sq, n] for labels, m, total, sq, n in clicks.debiased.rows()}
    assert set(got) == set(want) and len(want) == 2 * len(MEASURES)
    for key, row in want.items():
        assert got[key] == pytest.approx(row, rel=1e-9), key
    assert got[("a0", "nDCG@6")][2] == 2500  # the first 1,000 lists wait for the first refit
    counts = named(engine, "evald_click_measure_count")
    totals = named(engine, "evald_click_measure_sum")
    squares = named(engine, "evald_click_measure_sum_squares_total")
    for (arm, measure), (total, sq, n) in got.items():
        labels = frozenset({("arm", arm), ("measure", measure), ("relevance", "pbm")})
        assert (totals[labels], squares[labels], counts[labels]) == (total, sq, n)
    # the raw series keep their label set; debiased nDCG is not the raw one
    raw = named(engine, "evald_measure_sum")
    raw_n = named(engine, "evald_measure_count")
    key = frozenset({("arm", "a0"), ("measure", "nDCG@6")})
    assert key in raw and all("relevance" not in dict(k) for k in raw)
    debiased_mean = got[("a0", "nDCG@6")][0] / got[("a0", "nDCG@6")][2]
    assert abs(debiased_mean - raw[key] / raw_n[key]) > 0.05


def test_the_sums_ride_in_the_checkpoint_and_other_measures_start_again() -> None:
    """``state`` carries the sums as of the model's snapshot, and a load adds the logged
    lists; without them a load starts from nothing (the negative control)."""
    engine = run()
    clicks = engine.clicks
    assert clicks is not None
    doc = clicks.state(0)
    assert doc is not None and doc["debiased"]["measures"] == MEASURES
    again = Engine(engine.config, clock=lambda: 0.0).clicks
    assert again is not None
    assert again.load(0, doc)
    assert again.debiased.rows() == clicks.debiased.rows()
    assert again.load(0, {k: v for k, v in doc.items() if k != "debiased"})
    assert again.debiased.rows() != clicks.debiased.rows()
    other = DebiasedSums(["nDCG@6"])
    other.load(0, doc["debiased"])
    assert other.rows() == []
    with pytest.raises(ValueError, match="debiased sums"):
        DebiasedSums(MEASURES).load(0, {"measures": MEASURES, "rows": [[["a0"], [[1, 2]]]]})
