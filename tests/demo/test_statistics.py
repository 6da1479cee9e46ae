"""The demo's story on the new statistics: its injected regression is detected by the alerts'
conditions, and an A/A run with the same seed raises none (the negative control)."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from evald import replay
from evald.config import load_config
from evald.demo import command
from evald.demo.live import comparison_lines
from evald.demo.simulator import DEFAULT_START_MS, Faults, Simulator
from evald.engine import Engine
from evald.exposition import Encoder, build_registry
from evald.statistics.live import ComparisonView, summary

MIN = 60_000
HALF = 20 * MIN


def run(regress: bool) -> ComparisonView:
    """40 minutes of event time of the demo's traffic through the demo's settings."""
    engine = run_engine(regress)
    assert engine.statistics is not None
    (view,) = engine.statistics.views()
    return view


def run_engine(regress: bool) -> Engine:
    """The drained engine of :func:`run`."""
    sim = Simulator(
        21,
        rate=3000,
        speed=60,
        stop_ms=DEFAULT_START_MS + 2 * HALF,
        regress_at_ms=DEFAULT_START_MS + HALF if regress else None,
        noise=(1.0, 0.7) if regress else (1.0, 1.0),  # A/A: both arms rank alike
        faults=Faults(malformed=0.0),
    )
    config = load_config(window="5m", lateness="2m", statistics=command.STATISTICS)
    engine = Engine(config, global_statistics=True)
    for i, event in enumerate(sim):
        engine.feed(event.value, kind=event.kind)
        if i % 5000 == 0:
            engine.tick()
    engine.drain()
    return engine


def alerts(view: ComparisonView) -> set[str]:
    """What the generated rules fire on at the end, by their conditions on the exported
    series: EvaldTreatmentBelowControl, EvaldTreatmentDropDetected, EvaldArmDropDetected, each
    held back while the sample-ratio guard fires, and EvaldSampleRatioMismatch."""
    settings = load_config(statistics=command.STATISTICS).statistics
    state, fired = view.state, set()
    for rest, p_value in state.srm_p_values().items():
        if p_value < settings.srm_alpha:
            fired.add(f"srm {rest}")
    for key, bound in state.bounds.items():
        effect = view.config.min_effect.get(key[2])
        if effect is not None and bound.high < -effect:
            fired.add(f"below {key}")
        if state.vs_control[key].statistic > settings.cusum_h:
            fired.add(f"cusum vs control {key}")
    for key, cusum in state.vs_baseline.items():
        if cusum.statistic > settings.cusum_h:
            fired.add(f"cusum vs baseline {key}")
    return fired


def test_the_injected_regression_is_detected_soon_after_the_change() -> None:
    view = run(regress=True)
    fired = alerts(view)
    for surface in ("web", "app"):
        key = ("treatment", (("surface", surface),), "nDCG@10")
        assert f"cusum vs control {key}" in fired
        assert f"below {key}" in fired
        detected = view.detected[(key, "cusum")]
        delay = detected.end_ms - (DEFAULT_START_MS + HALF)
        assert 0 <= delay <= 15 * MIN  # within three 5-minute windows of the change
    assert not any(name.startswith("srm") for name in fired)
    text = "\n".join(comparison_lines([view], DEFAULT_START_MS + HALF))
    assert "drop detected web by the CUSUM" in text and "after the change" in text
    assert text.count("bands disjoint") == 2  # better at first, worse after: both surfaces
    assert text.startswith("nDCG@10: treatment − control since the start")
    assert all(len(line) <= 80 for line in text.splitlines())  # the view's width


def test_an_a_a_run_with_the_same_seed_raises_no_alert() -> None:
    view = run(regress=False)
    assert view.state.windows >= 6 and view.state.sequences
    assert alerts(view) == set()
    assert view.detected == {}
    assert "bands disjoint" not in "\n".join(comparison_lines([view], None))
    for bound in view.state.bounds.values():
        assert bound.low <= 0.0 <= bound.high or bound.low != bound.low  # NaN: too few lists


def exposed(engine: Engine) -> dict[tuple[str, str, str], float]:
    """(series, surface, measure) -> value of the treatment's comparison series on /metrics."""
    registry, _ = build_registry(engine, process=False)
    body, _ = Encoder().encode(registry)
    out = {}
    for family in parse_text(body.decode()):
        for sample in family.samples:
            labels = sample.labels
            if sample.name.startswith("evald_comparison_") and labels.get("arm") == "treatment":
                out[(sample.name, labels["surface"], labels["measure"])] = sample.value
    return out


@pytest.mark.parametrize("regress", [True, False], ids=["regression", "A/A"])
def test_the_exposition_carries_the_latest_band_and_the_running_intersection(
    regress: bool,
) -> None:
    """The regression (treatment better at first, worse after) empties the intersection: its
    bounds leave /metrics and the empty gauge says why, while the latest look's band (what the
    alert reads) stays below minus the minimum effect. In the A/A run the intersection is the
    tightest band, inside the latest."""
    engine = run_engine(regress)
    assert engine.statistics is not None
    (view,) = engine.statistics.views()
    series = exposed(engine)
    for (treatment, rest, measure), seq in view.state.sequences.items():
        surface = dict(rest)["surface"]
        value = {
            name.removeprefix("evald_comparison_"): v
            for (name, where, what), v in series.items()
            if (where, what) == (surface, measure)
        }.get
        bound = view.state.bounds[(treatment, rest, measure)]
        assert value("lower") == bound.low and value("upper") == bound.high
        assert seq.empty is regress  # the demo's story empties it; A/A never does
        assert value("intersection_empty") == float(regress)
        if regress:
            assert value("intersection_lower") is None and value("intersection_upper") is None
            assert seq.low > 0 > -0.01 > seq.high  # once above 0, now below -δ
        else:
            low, high = value("intersection_lower"), value("intersection_upper")
            assert (low, high) == (seq.low, seq.high)
            assert math.isfinite(low) and bound.low <= low < high <= bound.high
    # replay's text (evald replay prints the same fold's records)
    text = "\n".join(replay.comparisons(engine))
    said = "the running intersection is empty" if regress else "running intersection ["
    assert text.count(said) == len(view.state.sequences)  # every measure of both surfaces
    # replay's JSON records (the same fold, read by evald replay --format json)
    for record in summary(view, 0.05):
        assert record["intersection_empty"] is regress
        if regress:
            assert record["intersection_lower"] is None is record["intersection_upper"]
        else:
            low, high = record["intersection_lower"], record["intersection_upper"]
            assert record["lower"] <= low < high <= record["upper"]  # type: ignore[operator]
