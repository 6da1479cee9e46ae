"""The demo's story on the new statistics: its injected regression is detected by the alerts'
conditions, and an A/A run with the same seed raises none (the negative control)."""

from __future__ import annotations

from evald.config import load_config
from evald.demo import command
from evald.demo.live import comparison_lines
from evald.demo.simulator import DEFAULT_START_MS, Faults, Simulator
from evald.engine import Engine
from evald.statistics.live import ComparisonView

MIN = 60_000
HALF = 20 * MIN


def run(regress: bool) -> ComparisonView:
    """40 minutes of event time of the demo's traffic through the demo's settings."""
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
    assert engine.statistics is not None
    (view,) = engine.statistics.views()
    return view


def alerts(view: ComparisonView) -> set[str]:
    """What the generated rules fire on at the end, by their conditions on the exported
    series: EvaldTreatmentBelowControl, EvaldTreatmentDropDetected, EvaldArmDropDetected, each
    held back while the sample-ratio guard fires, and EvaldSampleRatioMismatch."""
    settings = load_config(statistics=command.STATISTICS).statistics
    state, fired = view.state, set()
    for rest, ratio in state.ratio.items():
        if ratio.p_value < settings.srm_alpha:
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
        delay = detected - (DEFAULT_START_MS + HALF)
        assert 0 <= delay <= 15 * MIN  # within three 5-minute windows of the change
    assert not any(name.startswith("srm") for name in fired)
    text = "\n".join(comparison_lines([view], DEFAULT_START_MS + HALF))
    assert "drop detected web by the CUSUM" in text and "after the change" in text
    assert text.startswith("nDCG@10: treatment − control since the start")
    assert all(len(line) <= 80 for line in text.splitlines())  # the view's width


def test_an_a_a_run_with_the_same_seed_raises_no_alert() -> None:
    view = run(regress=False)
    assert view.state.windows >= 6 and view.state.sequences
    assert alerts(view) == set()
    assert view.detected == {}
    for bound in view.state.bounds.values():
        assert bound.low <= 0.0 <= bound.high or bound.low != bound.low  # NaN: too few lists
