"""``python -m deploy.compose_timeline``: when the compose stack's quality alerts fire.

README's "Run the full stack" says when; Docker is not needed to check it. This runs the traffic
compose's ``producer`` writes (its command line, parsed by ``evald produce``) through evald's
engine with the settings compose's ``evald`` runs with (its command line, parsed by
``evald run``), without Kafka or containers, and prints per comparison segment and alerting
measure when the CUSUM against control first crossed h and when the confidence sequence first
lay wholly below minus the minimum effect, then when the alerts fire (plus the rules' ``for``),
in wall minutes from the first record (event time / ``--speed``). Container start-up, the
scrape and the rule evaluation add seconds, not minutes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploy.generator.spec import Thresholds

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"
MINUTE_MS = 60_000
RUN_ID = "timeline"


@dataclass(frozen=True)
class Detection:
    """One signal of one treatment x comparison segment x measure, in wall minutes."""

    signal: str  # "cusum" (EvaldTreatmentDropDetected) or "below" (EvaldTreatmentBelowControl)
    key: tuple[Any, ...]
    condition_min: float  # the condition first holds
    fires_min: float  # then the rule's ``for`` has passed


def _command(compose: dict[str, Any], service: str) -> list[str]:
    return [str(part) for part in compose["services"][service]["command"]]


def _minutes(duration: str) -> float:
    units = {"s": 1 / 60, "m": 1.0, "h": 60.0}
    return float(duration[:-1]) * units[duration[-1]]


def timeline(compose_path: Path = COMPOSE, hours_after: float = 6.0) -> list[Detection]:
    """Every detection from the start until ``hours_after`` event hours past the regression."""
    from evald.cli import build_parser
    from evald.daemon.options import settings_from_args
    from evald.daemon.produce import simulate
    from evald.demo.simulator import DEFAULT_START_MS
    from evald.engine import Engine

    compose = yaml.safe_load(compose_path.read_text(encoding="utf-8"))
    settings = settings_from_args(build_parser().parse_args(_command(compose, "evald")))
    produce = build_parser().parse_args(_command(compose, "producer"))
    if produce.regress_at is None:
        raise SystemExit("the compose producer has no --regress-at: nothing to detect")
    start = DEFAULT_START_MS
    speed = float(produce.speed)
    stop = start + int((produce.regress_at * speed / 60 + hours_after * 60) * MINUTE_MS)
    engine = Engine(settings.engine_config(), global_statistics=True)
    for i, event in enumerate(simulate(produce, RUN_ID, start)):
        if event.at_ms > stop:
            break
        engine.feed(event.value, kind=event.kind)
        if i % 5000 == 0:
            engine.tick()
    engine.drain()
    if engine.statistics is None:
        raise SystemExit("the compose evald configures no statistics.comparisons")
    th = Thresholds()
    wait = {"cusum": _minutes(th.cusum_for), "below": _minutes(th.sequence_for)}
    out = []
    for view in engine.statistics.views():
        for (key, signal), found in view.detected.items():
            if signal not in wait:  # the alerts read these two; replay reports the others
                continue
            wall = (found.end_ms - start) / MINUTE_MS / speed
            out.append(Detection(signal, key, wall, wall + wait[signal]))
    return sorted(out, key=lambda d: (d.fires_min, d.signal, d.key))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.compose_timeline", description=__doc__)
    parser.add_argument("--compose", type=Path, default=COMPOSE)
    parser.add_argument("--hours-after", type=float, default=6.0, help="event hours simulated")
    args = parser.parse_args(argv)
    names = {"cusum": "EvaldTreatmentDropDetected", "below": "EvaldTreatmentBelowControl"}
    for d in timeline(args.compose, args.hours_after):
        arm, segment, measure = d.key
        where = " ".join(f"{k}={v}" for k, v in segment)
        print(
            f"{names[d.signal]:<27} {arm} {where} {measure:<11} condition at "
            f"{d.condition_min:5.1f} min, fires at {d.fires_min:5.1f} min"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
