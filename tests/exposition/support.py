"""An independent model of what the engine should compute, and reading an exposition back.

Every expected number in these tests is computed from the events the test generated (grades
from the actions, measures from their textbook formulas, window sums from timestamps), never
copied from the engine's output. The exposition is parsed with prometheus_client's own parsers.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from evald.config import EngineConfig
from evald.engine import Engine
from evald.exposition import (
    Encoder,
    EngineCollector,
)

T0 = 1_763_683_200_000  # 2025-11-21T00:00:00Z, aligned to the hour
MINUTE = 60_000
WINDOW_MS = 2 * MINUTE
LATENESS_MS = MINUTE
MEASURES = ("P@3", "RR", "nDCG@3")
GRADE = {"click": 1.0, "add_to_cart": 2.0, "purchase": 3.0}
Z95 = 1.959963984540054
OPENMETRICS = "application/openmetrics-text;version=1.0.0"


# --------------------------------------------------------------------------------------------
# An independent model of what the engine should compute
# --------------------------------------------------------------------------------------------


@dataclass
class Served:
    request_id: str
    ts: int
    items: list[str]
    labels: dict[str, str]
    partition: int
    grades: dict[str, float] = field(default_factory=dict)

    def measures(self) -> dict[str, float]:
        """P@3, RR and nDCG@3 (linear gain, log2 discount, ideal = served grades sorted)."""
        g = [self.grades.get(item, 0.0) for item in self.items]
        p3 = sum(1 for x in g[:3] if x >= 1) / 3
        rr = next((1 / (i + 1) for i, x in enumerate(g) if x >= 1), 0.0)
        dcg = sum(x / math.log2(i + 2) for i, x in enumerate(g[:3]))
        ideal = sorted(g, reverse=True)
        idcg = sum(x / math.log2(i + 2) for i, x in enumerate(ideal[:3]))
        return {"P@3": p3, "RR": rr, "nDCG@3": dcg / idcg if idcg > 0 else 0.0}


def impression(
    request_id: str,
    ts: int,
    items: list[str],
    labels: dict[str, str],
    teams: list[str] | None = None,
) -> bytes:
    body: dict[str, object] = {"request_id": request_id, "ts": ts, "items": items, "labels": labels}
    if teams is not None:  # a team-draft interleaved list of rankers A and B
        body.update(teams=teams, interleaving="team_draft")
    return json.dumps(body).encode()


def feedback(
    request_id: str, ts: int, item: str, action: str, event_id: str | None = None
) -> bytes:
    doc = {"request_id": request_id, "ts": ts, "item": item, "action": action}
    if event_id is not None:
        doc["event_id"] = event_id
    return json.dumps(doc).encode()


def segment_key(labels: dict[str, str]) -> tuple[str, str, str]:
    """The segment an impression lands in: configured keys, ``__none__`` when missing."""
    return tuple(labels.get(k, "__none__") for k in ("model", "arm", "surface"))  # type: ignore[return-value]


SEGMENT_LABELS = [
    {"model": "m1", "arm": "control", "surface": "web"},
    {"model": "m2", "arm": "treatment", "surface": "web"},
    {"model": "m2", "arm": "treatment", "surface": "app", "locale": "de"},
    {"model": "m1", "arm": "control"},  # no surface: __none__
]


def traffic(seed: int, n: int, span_ms: int) -> tuple[list[Served], list[tuple[int, int, bytes]]]:
    """Seeded impressions over ``[T0, T0 + span_ms)`` with in-window feedback, in event order.

    Returns the model of each impression (with the grades its feedback earns) and the events
    as (partition, ts, bytes) sorted by time, impressions before feedback at equal times.
    """
    rng = random.Random(seed)
    served: list[Served] = []
    events: list[tuple[int, int, int, bytes]] = []
    for i in range(n):
        ts = T0 + rng.randrange(span_ms)
        items = [f"d{i}-{k}" for k in range(rng.randint(1, 6))]
        labels = dict(rng.choice(SEGMENT_LABELS))
        imp = Served(f"r{i}", ts, items, labels, partition=i % 2)
        served.append(imp)
        pair = ["A", "B"] if i % 3 else ["B", "A"]
        teams = (pair * 3)[: len(items)] if len(items) > 1 else None
        raw = impression(imp.request_id, ts, items, labels, teams)
        events.append((ts, 0, imp.partition, raw))
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            rank = min(int(rng.expovariate(0.7)), len(items) - 1)
            action = rng.choice(["click", "click", "click", "add_to_cart", "purchase"])
            fb_ts = ts + rng.randrange(WINDOW_MS + 1)  # inside [ts, ts + window]
            item = items[rank]
            imp.grades[item] = max(imp.grades.get(item, 0.0), GRADE[action])
            events.append((fb_ts, 1, imp.partition, feedback(imp.request_id, fb_ts, item, action)))
    events.sort(key=lambda e: (e[0], e[1]))
    return served, [(p, ts, raw) for ts, _, p, raw in events]


#: the traffic's interleaved lists credited, per 5-minute window, bands from 2 compared lists
INTERLEAVED: dict[str, object] = {"teams": ["A", "B"], "window": "5m", "min_n": 2}

#: one comparison of the SEGMENT_LABELS arms, folded per 5-minute window (tiny minimum n so
#: two windows of test traffic publish every comparison series)
COMPARED: dict[str, object] = {
    "window": "5m",
    "min_n": 2,
    "cusum_min_n": 2,
    "comparisons": [
        {
            "name": "ab",
            "label": "arm",
            "control": "control",
            "treatments": ["treatment"],
            "start": 0,
            "arm_scoped_labels": ["model"],
            "min_effect": {MEASURES[0]: 0.01},
        }
    ],
}


def make_engine(
    clock: list[float] | None = None, *, global_statistics: bool = False, **overrides: object
) -> Engine:
    settings: dict[str, object] = {
        "window": WINDOW_MS,
        "lateness": LATENESS_MS,
        "measures": list(MEASURES),
        "max_event_lead": None,  # the clock is frozen far before the events' times
    }
    settings.update(overrides)
    now = clock if clock is not None else [1_000.0]
    config = EngineConfig.model_validate(settings)
    return Engine(config, clock=lambda: now[0], global_statistics=global_statistics)


# --------------------------------------------------------------------------------------------
# Reading an exposition back
# --------------------------------------------------------------------------------------------

Key = tuple[str, frozenset[tuple[str, str]]]


def scrape(registry: CollectorRegistry, accept: str | None = None) -> dict[Key, float]:
    """Every sample of one scrape through Encoder, parsed by prometheus_client's parser."""
    body, content_type = Encoder().encode(registry, accept)
    text = body.decode()
    parse = parse_om if content_type.startswith("application/openmetrics-text") else parse_text
    out: dict[Key, float] = {}
    for family in parse(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def series(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def named(samples: dict[Key, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def seg_labels(key: tuple[str, str, str]) -> dict[str, str]:
    return dict(zip(("model", "arm", "surface"), key, strict=True))


def engine_registry(engine: Engine, **kwargs: object) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine, **kwargs))  # type: ignore[arg-type]
    return registry


def feed_all(engine: Engine, events: Iterable[tuple[int, int, bytes]]) -> None:
    for partition, _ts, raw in events:
        engine.feed(raw, partition=partition)
