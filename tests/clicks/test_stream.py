"""The click model of ``evald run`` (evald/clicks/stream.py) through the engine: events in, the
examination curve out, as the exposition shows it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from evald.clicks import simulate as sim
from evald.clicks import stream
from evald.clicks.model import ClickModel
from evald.clicks.models import new_model
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings
from evald.clicks.stream import ServedTee, StableKeys, pair_keys, stable_key
from evald.config import ConfigError, load_config
from evald.decode import Decoder
from evald.engine import Engine
from evald.exposition import Encoder, build_registry

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_763_683_200_000
THETA = np.array([1.0, 0.7, 0.5, 0.35, 0.25, 0.2])
ENGINE = {
    "window": "1m",
    "lateness": "10s",
    "windows": ["1m"],
    "min_event_time": 0,
    "max_event_lead": None,
    "label_keys": ["arm"],
    "measures": ["nDCG@6"],
}


def named(engine: Engine, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of one family in a scrape of the engine, by their labels."""
    registry, _ = build_registry(engine, ready=lambda: True, process=False)
    body, _ = Encoder().encode(registry, None)
    return {
        frozenset(sample.labels.items()): sample.value
        for family in parse_text(body.decode())
        for sample in family.samples
        if sample.name == name
    }


def events(seed: int, theta: np.ndarray, n: int = 6000) -> list[bytes]:
    """PBM users on a ranker blind to attractiveness: impressions of six items, a click
    record per clicked item a second later; two arms, the same users."""
    rng = np.random.default_rng(seed)
    world = sim.World.draw(rng, 20, 12)
    q, items = sim.serve(rng, world, rng.normal(size=world.shape), n, len(theta), noise=0.5)
    attract, _ = sim.gathered(world, q, items)
    clicks = sim.pbm_clicks(rng, attract, theta)
    out = []
    for i in range(n):
        ts = T0 + 50 * i
        served = [f"d{d}" for d in items[i]]
        imp = {"request_id": f"r{i}", "ts": ts, "items": served, "query": f"q{q[i]}"}
        out.append(json.dumps({**imp, "labels": {"arm": f"a{i % 2}"}}).encode())
        for rank in np.flatnonzero(clicks[i]):
            click = {"request_id": f"r{i}", "ts": ts + 1000, "item": served[rank]}
            out.append(json.dumps({**click, "action": "click"}).encode())
    return out


def run(theta: np.ndarray, **click_model: object) -> Engine:
    # a refit every 1,000 lists: the last one reads all 6,000
    settings = {"model": "pbm", "depth": 6, "refit_every": 1000, **click_model}
    config = load_config(ENGINE, click_model=settings)
    engine = Engine(config, clock=lambda: 0.0)
    raws = events(3, theta)
    for start in range(0, len(raws), 1000):
        engine.feed_batch(raws[start : start + 1000])
        engine.tick()
    engine.drain()
    return engine


def test_the_stream_recovers_the_examination_curve_and_exports_it() -> None:
    """Clicks simulated from a known curve, through decode, join and the online fit: each
    arm's exported curve within 0.1 of the truth (measured: at most 0.068), the most examined
    (arm, rank) being 1 (the scale PBM fixes, docs/click-models.md)."""
    engine = run(THETA)
    clicks = engine.clicks
    assert clicks is not None and clicks.unmodelled == 0
    exam = named(engine, "evald_click_examination")
    lists = named(engine, "evald_click_model_lists")
    for arm in ("a0", "a1"):
        curve = [exam[frozenset({("arm", arm), ("rank", str(r + 1))})] for r in range(6)]
        assert np.max(np.abs(np.asarray(curve) - THETA)) < 0.1, curve
        assert lists[frozenset({("arm", arm)})] == 3000
    assert max(exam.values()) == 1.0


def test_negative_control_no_position_bias_gives_a_flat_curve() -> None:
    """Every rank examined: the fit finds a flat curve, which the biased run's is not."""
    flat = run(np.ones(6)).clicks
    assert flat is not None
    assert np.min(flat.curve) > 0.9
    biased = run(THETA).clicks
    assert biased is not None and np.min(biased.curve) < 0.3


def test_without_a_click_model_the_engine_has_none_and_exports_nothing() -> None:
    engine = Engine(load_config(ENGINE), clock=lambda: 0.0)
    assert engine.clicks is None
    engine.feed_batch(events(3, THETA, n=50))
    engine.drain()
    assert not named(engine, "evald_click_examination")


def keys_of(query: str, items: list[str]) -> list[int]:
    return pair_keys(np.asarray([stable_key(query)]), np.asarray([stable_key(i) for i in items]))


def test_pair_keys_are_the_same_in_another_process() -> None:
    """The checkpointed model names pairs by key: a restarted process must compute the same
    keys (Python's string hash differs per process: the negative control)."""
    code = (
        "import sys; from tests.clicks.test_stream import keys_of; "
        "sys.stdout.write(str(keys_of('shoes', ['d1', 'd2']).tolist()) + ' ' + str(hash('shoes')))"
    )
    outs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.rsplit(" ", 1)
        for seed in ("1", "2")
    ]
    assert outs[0][0] == outs[1][0] == str(keys_of("shoes", ["d1", "d2"]).tolist())
    assert outs[0][1] != outs[1][1]
    # the pair, not its parts: the same item under two queries, two items under one
    keys = [*keys_of("shoes", ["d1", "d2"]), *keys_of("boots", ["d1"])]
    assert len(set(keys)) == 3 and 0 not in keys


def test_remembered_keys_are_the_digests_also_when_new_repeated_forgotten_or_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = StableKeys()
    texts = ["q", "a", "b", "a", "q"]
    assert keys.many(texts).tolist() == [stable_key(t) for t in texts]
    assert keys.many(["b", "c"]).tolist() == [stable_key("b"), stable_key("c")]
    monkeypatch.setattr(stream, "CACHED_KEYS", 3)  # the cache starts over: the same keys
    assert keys.many(["d", "a", "e"]).tolist() == [stable_key(t) for t in "dae"]
    monkeypatch.setattr(stream, "stable_key", lambda text: 0 if text == "z" else 7)
    assert keys.many(["z", "y", "z"]).tolist() == [0, 7, 0]  # a key of 0 is a key too


def test_the_tee_forgets_lists_that_can_no_longer_be_scored() -> None:
    tee = ServedTee(Decoder(load_config(ENGINE).limits, {"click": 1.0}), depth=3)
    for i, ts in enumerate((T0, T0 + 10, T0 + 20)):
        tee.decode(json.dumps({"request_id": f"r{i}", "ts": ts, "items": ["a"]}).encode())
    assert tee.prune(T0 + 15) == 2 and list(tee.served) == ["r2"]


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ({"model": "dbn"}, "click_model.model"),
        ({"model": "cascade"}, "click_model.model"),
        ({"model": "pbm", "max_pairs": 8}, "click_model.max_pairs"),
        ({"model": "pbm", "depth": 0}, "click_model.depth"),
        ({"model": "pbm", "half_life": "soon"}, "click_model.half_life"),
        ({"model": "pbm", "caps": 3}, "click_model.caps"),
    ],
)
def test_a_bad_click_model_setting_names_the_field(setting: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: "):
        load_config(ENGINE, click_model=setting)


def test_click_model_pbm_is_short_for_its_section() -> None:
    assert load_config(click_model="pbm").click_model.model == "pbm"
    assert load_config().click_model.model is None


def test_a_checkpoint_is_the_last_snapshot_plus_the_lists_logged_since(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between snapshots a checkpoint names the same snapshot and logs the lists observed
    since; loading it observes them again, so the model is the fed one to the last bit (and
    with the log dropped it is not: the negative control)."""
    config = load_config(ENGINE, click_model={"model": "pbm", "depth": 6, "refit_every": 100})
    raws = events(4, THETA, n=2000)
    monkeypatch.setattr(stream, "LOG_SHARE", 1e9)
    fed = Engine(config, clock=lambda: 0.0)
    docs = []
    for start in range(0, len(raws), 500):  # a commit after each poll batch
        fed.feed_batch(raws[start : start + 500])
        fed.tick()
        assert fed.clicks is not None
        doc = fed.clicks.state(0)
        if doc is not None:  # a list was scored
            docs.append(doc)
    assert len(docs) >= 3
    first, last = docs[0], docs[-1]
    assert first is not None and last is not None
    assert last["snapshot"] is first["snapshot"] and len(last["log"]) > len(first.get("log", ""))
    model = fed.clicks.models[0]
    assert model.fits >= 2
    loaded = stream.StreamClicks(config.click_model, fed.segments)
    assert loaded.load(0, last)
    assert loaded.models[0].snapshot() == model.snapshot()
    assert loaded.state(0) == last  # the same snapshot named, the same log carried on
    assert loaded.load(0, {"snapshot": last["snapshot"]})
    assert loaded.models[0].snapshot() != model.snapshot()
    monkeypatch.setattr(stream, "LOG_MAX_BYTES", len(last["log"]) // 2)
    assert "log" not in (fed.clicks.state(0) or {})  # the log outgrew its bound: a snapshot
    with pytest.raises(ValueError, match="click-model log"):
        loaded.load(0, {**last, "log": base64.b64encode(b"\x05\x00\x00\x00{oops").decode()})


def offline_lists(model: ClickModel) -> tuple[list[dict[str, Any]], Any, Any, Any, Any]:
    """The lists of ``events(3, THETA)`` as a plain offline loop reads them: (the impression
    documents, their pair keys, which items were clicked, their segments in ``model``,
    their times), in stream order."""
    docs = [json.loads(raw) for raw in events(3, THETA)]
    clicked: dict[str, set[str]] = {}
    for doc in docs:
        if "item" in doc:
            clicked.setdefault(doc["request_id"], set()).add(doc["item"])
    lists = [d for d in docs if "items" in d]
    pairs = np.asarray([keys_of(d["query"], d["items"]) for d in lists])
    hit = np.asarray([[i in clicked.get(d["request_id"], ()) for i in d["items"]] for d in lists])
    segments = np.asarray([model.segment((d["labels"]["arm"],)) for d in lists])
    ts = np.asarray([d["ts"] for d in lists], np.int64)
    return lists, pairs, hit, segments, ts


def test_the_ips_sums_equal_an_offline_computation() -> None:
    """The exported IPS sums against a plain loop over the same lists, in the order they were
    scored: each list weighed by the curve of the model's last refit before it, min(1/θ, 10)
    per shown rank, the lists of a segment no refit has read skipped; the model fed the lists
    between refits in one piece."""
    engine = run(THETA)
    clicks = engine.clicks
    assert clicks is not None
    model = new_model(clicks.settings)
    lists, pairs, hit, segments, ts = offline_lists(model)
    sums: dict[tuple[str, ...], list[float]] = {}
    raw_clicks, start = 0, 0
    while start < len(lists):
        stop = min(len(lists), start + model.next_refit - model.seen)
        curve = model.curve()
        for i in range(start, stop):
            s = int(segments[i])
            if s < len(model.fitted_shown) and model.fitted_shown[s, 0] > 0:
                row = sums.setdefault(model.segments[s], [0.0, 0.0, 0.0])
                for rank, theta in enumerate(curve[s].tolist()):
                    weight = min(1 / theta, 10.0)
                    row[0] += weight * bool(hit[i, rank])
                    row[1] += weight * theta
                    row[2] += 1
                raw_clicks += int(hit[i].sum())
        n = stop - start
        piece = slice(start, stop)
        lengths = np.full(n, 6)
        model.observe(
            Sessions(pairs[piece], hit[piece], lengths, segments[piece], ts[piece], np.ones(n))
        )
        start = stop
    fed = clicks.models[0]  # the same lists, in the same order (batched otherwise: to 1e-12)
    assert (model.seen, model.fits) == (fed.seen, fed.fits)
    assert np.allclose(model.curve(), fed.curve(), rtol=1e-12, atol=0)
    got = {labels: row for labels, *row in clicks.ips_rows()}
    assert set(got) == set(sums) == {("a0",), ("a1",)}
    for labels, row in sums.items():
        assert got[labels] == pytest.approx(row, rel=1e-9), labels
    assert sum(row[0] for row in got.values()) > 1.5 * raw_clicks  # the weights matter
    exported = named(engine, "evald_click_ips_clicks_total")
    assert exported[frozenset({("arm", "a0")})] == got[("a0",)][0]


def test_ips_weights_of_a_subnormal_examination_are_clipped_without_a_warning() -> None:
    """A fitted examination of 1e-320 (a rank never clicked, driven down refit after refit)
    weighs the clip, as 0 and NaN do, and numpy warns of no overflow: in the daemon a
    warning is a line in its log per refit."""
    model = new_model(ClickSettings(depth=6))
    model.segment(("a",))
    model.theta[0] = [1.0, 1e-320, 5e-324, 0.0, np.nan, 0.25]  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clicked, expected = stream.ips_weights(model, 10.0)
    unit = stream.IPS_UNIT
    assert (clicked / unit).tolist() == [[1.0, 10.0, 10.0, 10.0, 10.0, 4.0]]
    assert (expected / unit).tolist() == [[1.0, 1e-319, 5e-323, 0.0, 0.0, 1.0]]


@pytest.mark.parametrize("clip", [1.0, 10.0, 1e6])
def test_ips_weights_are_min_of_the_inverse_and_the_clip_to_the_bit(clip: float) -> None:
    """On curves ordinary and not (every power of two down to the least subnormal, the
    neighbours of the last one whose inverse is finite), the weights are the bits of
    min(1 / θ, clip) (θ <= 0 or NaN: the clip) as numpy computes it, overflow and all."""
    rng = np.random.default_rng(7)
    edge = np.ldexp(1.0, -1024)
    theta = np.concatenate(
        [
            rng.random(6000),
            rng.random(6000) ** 40,
            np.ldexp(1.0, np.arange(-1074, 1)),
            [edge, np.nextafter(edge, 0), np.nextafter(edge, 1), 0.0, -0.0, np.nan, 0.1, 1.0],
            [0.5, 1e-300, 3e-10],
        ]
    ).reshape(-1, 6)
    model = new_model(ClickSettings(depth=6))
    for s in range(len(theta)):
        model.segment((str(s),))
    model.theta[:] = theta  # type: ignore[attr-defined]
    with np.errstate(all="ignore"):
        plain = np.nan_to_num(theta, nan=0.0)
        w = np.minimum(np.where(plain > 0, 1.0 / np.where(plain > 0, plain, 1.0), clip), clip)
        want = (w * stream.IPS_UNIT, w * plain * stream.IPS_UNIT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = stream.ips_weights(model, clip)
    assert got[0].tobytes() == want[0].tobytes()
    assert got[1].tobytes() == want[1].tobytes()
