"""Hostile streams through everything the engine exports: no numpy warning, no non-finite
number.

A warning is a line in the daemon's log per batch or refit, and NaN or Infinity breaks strict
JSON readers and Prometheus rules. Each stream (seeded: the same on every run) goes through an
engine with every part on that reads the data (the PBM click model refitted every 50 lists,
zero-feedback signals, the query drill-down, an A/B comparison, interleaving credit by grade,
measures of every family the window sums take), with warnings turned into errors; the
exposition must parse with every sample finite and ``/queries`` must be strict JSON.
"""

from __future__ import annotations

import json
import math
import warnings
from contextlib import nullcontext
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from evald.config import load_config
from evald.drilldown.page import QueriesPage
from evald.engine import Engine
from evald.events import MAX_TS_MS
from evald.exposition import Encoder, build_registry

T0 = 1_763_683_200_000
MEASURES = (
    "P@10,R@10,F1@10,CG,DCG,nDCG@10,nDCG(dcg='exp-log2')@10,AP,RR,Success@10,RBP(p=0.8),"
    "RBP(p=0.8,graded=True),RBPResidual(p=0.8),ERR@10,AUC,GAUC,KendallTau,Rprec,Bpref,infAP,"
    "NumRet,NumRel,NumRelRet,SetP,SetR,SetF,Judged@10,IPrec@0.5,IPrec11pt"
)
CONFIG: dict[str, Any] = {
    "min_event_time": 0,
    "max_event_lead": None,
    "window": "1m",
    "lateness": "10s",
    "watermark_quorum": 1,
    "measures": MEASURES,
    "label_keys": ["arm", "surface"],
    "max_segments": 20,
    "max_series": 1_000_000,
    "windows": ["5m", "1h"],
    "retention": "6h",
    "statistics": {
        "window": "5m",
        "bootstrap_replicates": 20,
        "min_n": 2,
        "cusum_min_n": 2,
        "comparisons": [
            {
                "name": "ab",
                "label": "arm",
                "control": "control",
                "treatments": ["treatment"],
                "start": 0,
                "min_effect": {"RR": 0.0},
            }
        ],
    },
    "zero_feedback": {"depth": 10, "reference_capacity": 80},
    "drilldown": {"top": 1000, "label_capacity": 1},
    "interleaving": {
        "window": "5m",
        "teams": ["control", "treatment"],
        "min_n": 2,
        "credit": "grades",
    },
    "click_model": {"model": "pbm", "depth": 10, "refit_every": 50},
}
KINDS = ["plain", "rank1", "none", "one", "long", "last", "zero", "grades", "skew", "gaps",
         "weird"]  # fmt: skip


def stream(kind: str, n: int = 600) -> list[bytes]:
    """``n`` lists of a hostile kind and their clicks: every click at rank 1 (``rank1``) or
    none, lists of one item or 300 (clicked at ranks 1, 255 and 300), event times at the
    last day there is or from 0, grades 0, 100 and subnormal (and 1e308, rejected), one
    treatment list in a thousand, two-hour gaps (empty windows), and lists repeating one
    item, empty ones and queries empty, blank, invisible or 512 characters long."""
    rng = np.random.default_rng(20261128)
    out = []
    for i in range(n):
        arm = ("control", "treatment")[i % 2]
        if kind == "skew":
            arm = "treatment" if i == n // 2 else "control"
        ts = {
            "last": MAX_TS_MS - 3000 * (n - i),
            "zero": 10 * i,
            "gaps": T0 + (i // 50) * 7_200_000 + i,
        }.get(kind, T0 + 500 * i)
        length = {"one": 1, "long": 300}.get(kind, int(rng.integers(1, 12)))
        items = [f"d{int(x)}" for x in rng.choice(400, size=length, replace=False)]
        query = f"q{int(rng.integers(0, 30))}"
        if kind == "weird":
            items = [["x"] * length, [], ["é"] * 3, items][i % 4]
            query = ["", " ", "Ünïcödé\u200b", "q" * 512][i % 4]
        doc: dict[str, Any] = {
            "request_id": f"r{i}",
            "ts": ts,
            "items": items,
            "query": query,
            "labels": {"arm": arm, "surface": "s", "country": f"c{i % 5}"},
        }
        if i % 3 == 0 and items and kind == "plain":
            doc["teams"] = [
                ("control", "treatment")[int(x)] for x in rng.integers(0, 2, len(items))
            ]
            doc["interleaving"] = "team_draft"
        out.append(json.dumps(doc).encode())
        if kind == "none" or not items:
            continue
        clicked = np.flatnonzero(rng.random(len(items)) < 0.3)
        if kind in ("rank1", "last", "zero"):
            clicked = np.asarray([0])
        elif kind == "long":
            clicked = np.asarray([0, 254, 299])
        for rank in clicked.tolist():
            click: dict[str, Any] = {"request_id": f"r{i}", "ts": min(ts + 1000, MAX_TS_MS),
                                     "item": items[rank], "action": "click"}  # fmt: skip
            if kind == "grades":
                click["grade"] = float(rng.choice([0.0, 100.0, 5e-324, 1e308]))
            out.append(json.dumps(click).encode())
    return out


def strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} in JSON")

    return json.loads(text, parse_constant=refuse)


def finite_exposition(engine: Engine) -> int:
    registry, _ = build_registry(engine, ready=lambda: True, process=False)
    body, _ = Encoder().encode(registry, None)
    samples = [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]
    bad = [(s.name, s.labels, s.value) for s in samples if not math.isfinite(s.value)]
    assert not bad, bad[:5]
    return len(samples)


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_stream_warns_of_nothing_and_exports_finite_numbers(kind: str) -> None:
    engine = Engine(load_config(CONFIG), clock=lambda: 0.0, global_statistics=True)
    raws = stream(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for start in range(0, len(raws), 250):
            engine.feed_batch(raws[start : start + 250])
            engine.tick()
            finite_exposition(engine)
        engine.drain()
        assert finite_exposition(engine) > 0
        status, doc = QueriesPage(lambda: engine, nullcontext())({})
        assert status == 200
        strict(json.dumps(doc))
    assert engine.clicks is not None and engine.clicks.models
