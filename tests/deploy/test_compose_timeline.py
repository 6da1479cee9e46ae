"""The compose stack's alert timeline, from its own command lines through evald's engine: what
README's "Run the full stack" promises (the traffic is seeded, so the run is deterministic)."""

from __future__ import annotations

import re

import pytest
from deploy_support import REPO

from deploy.compose_timeline import timeline


def _readme_minutes(alert: str) -> float:
    text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    match = re.search(rf"\*{alert}\* after about \*\*(\d+) minutes\*\*", text)
    assert match, f"README.md no longer says when {alert} fires"
    return float(match.group(1))


@pytest.mark.long
def test_the_readme_says_when_the_compose_stacks_quality_alerts_fire() -> None:
    detections = timeline(hours_after=4.5)
    first = {
        signal: min(d.fires_min for d in detections if d.signal == signal)
        for signal in ("cusum", "below")
    }
    # the drop is found in the first statistics window after the regression (15 minutes in)
    assert 15 < first["cusum"] - 5 < 16
    assert abs(first["cusum"] - _readme_minutes("EvaldTreatmentDropDetected")) < 1
    assert abs(first["below"] - _readme_minutes("EvaldTreatmentBelowControl")) < 1
    # both alerting measures on both surfaces, not one lucky segment
    below = {(d.key[1], d.key[2]) for d in detections if d.signal == "below"}
    assert below == {((("surface", s),), m) for s in ("web", "app") for m in ("nDCG@10", "RR")}
