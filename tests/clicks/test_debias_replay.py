"""Debiased measures and IPS rates, and ``evald replay --click-model`` end to end."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from evald.cli import main
from evald.clicks import simulate as sim
from evald.clicks.debias import debiased_values, ips
from evald.clicks.models import new_model
from evald.clicks.sessions import Sessions
from evald.clicks.settings import ClickSettings
from evald.metrics import Batch, evaluate, parse_measures

BATCH = ClickSettings(
    model="pbm", half_life=None, first_refit=10**9, refit_every=10**9, prior_strength=1.0
)
THETA = 1.0 / np.arange(1, 11)
NDCG = parse_measures("nDCG@10")[0]


def _log(seed: int, theta: np.ndarray) -> tuple[sim.World, np.ndarray, np.ndarray, Sessions]:
    """A ranker blind to attractiveness (random scores per query) and PBM users."""
    rng = np.random.default_rng(seed)
    world = sim.World.draw(rng, 40, 15)
    blind = rng.normal(size=world.shape)
    q, items = sim.serve(rng, world, blind, 30_000, 10, noise=0.5)
    attract, _ = sim.gathered(world, q, items)
    clicks = sim.pbm_clicks(rng, attract, theta)
    return world, q, items, sim.sessions_of(world, q, items, clicks)


def _gap(theta: np.ndarray) -> tuple[float, float]:
    """(|debiased - true| nDCG@10, |raw-click - true| nDCG@10), means over the lists, where
    each item's true grade is its attractiveness (its relevance under PBM) and the raw grade
    is its click-through rate over the log."""
    world, q, items, log = _log(7, theta)
    model = new_model(BATCH)
    model.segment(("all",))
    model.observe(log)
    model.fit()
    true = evaluate([NDCG], Batch.from_served_grades(world.attractiveness[q[:, None], items]))[NDCG]
    debiased = debiased_values(model, log, ["nDCG@10"])["nDCG@10"]
    keys = log.pairs.ravel()
    ctr = np.bincount(keys, log.clicks.ravel()) / np.maximum(np.bincount(keys), 1)
    raw = evaluate([NDCG], Batch.from_served_grades(ctr[log.pairs]))[NDCG]
    return float(np.abs(debiased.mean() - true.mean())), float(np.abs(raw.mean() - true.mean()))


def test_debiased_ndcg_tracks_true_relevance_where_raw_clicks_are_fooled() -> None:
    """Position bias credits whatever the ranker put on top: raw-click nDCG overstates the
    blind ranker; the PBM-debiased nDCG stays near the true one (seeded; measured 0.007 and
    0.044)."""
    debiased, raw = _gap(THETA)
    assert debiased < 0.015
    assert raw > 0.03


def test_negative_control_without_position_bias_both_agree() -> None:
    """Every rank examined: clicks are unbiased, and raw and debiased are both near the truth
    (measured 0.002 and 0.001)."""
    debiased, raw = _gap(np.ones(10))
    assert debiased < 0.015
    assert raw < 0.015


def test_ips_is_unbiased_unclipped_and_snips_corrects_the_clip() -> None:
    world, q, items, log = _log(8, THETA)
    truth = float(world.attractiveness[q[:, None], items].mean())  # mean attractiveness@10
    exam = THETA[None, :]
    free = ips(log, exam, clip=1e9)
    assert free.ips == pytest.approx(free.snips)
    assert abs(free.ips - truth) < 0.01  # measured 0.003
    clipped = ips(log, exam, clip=3.0)  # ranks 4-10 clipped
    assert truth - clipped.ips > 0.05  # clipping biases IPS low (measured 0.13)
    assert abs(clipped.snips - truth) < abs(clipped.ips - truth)


def _events(path: Path, seed: int = 11, lists: int = 4_000) -> tuple[Path, np.ndarray]:
    """PBM clicks on a blind ranker as native events: an impression per list, a click
    feedback per clicked item, one second apart (each list's window closes)."""
    _world, q, items, log = _log(seed, THETA)
    lines = []
    for i in range(lists):
        ts = 1_700_000_000_000 + i * 1000
        served = [f"d{q[i]}-{d}" for d in items[i]]
        arm = "a" if i % 2 else "b"
        lines.append(
            {
                "request_id": f"r{i}",
                "ts": ts,
                "items": served,
                "query": f"q{q[i]}",
                "labels": {"arm": arm},
            }
        )
        for r in np.flatnonzero(log.clicks[i]):
            lines.append(
                {"request_id": f"r{i}", "ts": ts + 10, "item": served[r], "action": "click"}
            )
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, THETA


@pytest.mark.parametrize("name", ["pbm", "cascade", "dbn", "coec"])
def test_replay_click_model_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    events, theta = _events(tmp_path / "e.jsonl")
    assert main(["replay", str(events), "--click-model", name, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["click_model"]
    assert doc["model"] == name and doc["relevance"] == name
    assert doc["lists"] == 4_000 and doc["unmodelled"] == 0
    assert [s["labels"]["arm"] for s in doc["segments"]] == ["b", "a"]
    assert set(doc["means"]) == set(json.loads(json.dumps(doc["segments"][0]["measures"])))
    curve = doc["rank_ctr" if name == "coec" else "examination"]
    assert len(curve) == 10
    if name == "pbm":  # the fitted curve is the simulator's, rank 1 first
        assert np.abs(np.asarray(curve) - theta).max() < 0.05
        assert doc["segments"][0]["IPS-CTR@10"] is not None
    if name == "dbn":
        assert 0 < doc["segments"][0]["continuation"] <= 1
    assert doc["fit"]["perplexity"] > 1


def test_replay_click_options_name_the_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events, _ = _events(tmp_path / "e.jsonl", lists=10)
    assert main(["replay", str(events), "--click-model", "pbm", "--click-depth", "0"]) == 2
    assert "--click-depth: must be between 1 and" in capsys.readouterr().err
    assert main(["replay", str(events), "--click-model", "pbm", "--ips-clip", "0.5"]) == 2
    assert "--ips-clip: must be a finite number >= 1, got 0.5" in capsys.readouterr().err
    # an infinite clip weighed a rank never examined inf: the summary's JSON said Infinity
    assert main(["replay", str(events), "--click-model", "pbm", "--ips-clip", "inf"]) == 2
    assert "--ips-clip: must be a finite number >= 1, got inf" in capsys.readouterr().err
    for flag in (["--click-depth", "5"], ["--ips-clip", "3"]):  # without a model: no effect
        assert main(["replay", str(events), *flag]) == 2
        assert f"{flag[0]}: only with --click-model" in capsys.readouterr().err


def test_settings_default_clip_is_the_documented_one() -> None:
    assert replace(BATCH).ips_clip == 10.0


def test_debiased_grade_scale() -> None:
    """Relevance / relevant_at is the grade: a PBM pair of attractiveness 0.5 or more counts
    relevant for binary measures; nDCG does not change with the scale."""
    model = new_model(replace(BATCH, depth=2))
    model.segment(("all",))
    log = Sessions.build(
        [[1, 2]] * 10 + [[2, 1]] * 10,
        [[1, 0]] * 9 + [[0, 0]] + [[0, 1]] * 8 + [[0, 0]] * 2,
        depth=2,
    )
    model.observe(log)
    model.fit()
    a = model.relevance(model.pairs.lookup(np.asarray([1, 2])))
    assert a[0] >= 0.5 > a[1]
    values = debiased_values(model, log.take(slice(0, 1)), ["P@2", "nDCG@2"])
    assert values["P@2"].tolist() == [0.5]  # pair 1 relevant, pair 2 not
    scaled = evaluate([parse_measures("nDCG@2")[0]], Batch.from_served_grades([a.tolist()]))
    assert values["nDCG@2"].tolist() == pytest.approx(next(iter(scaled.values())).tolist())


def test_ips_weighs_a_rank_never_shown_at_the_clip() -> None:
    """The cascade curve is NaN at a rank no list reached; its weight is the clip, not NaN."""
    log = Sessions.build([[1, 2]], [[0, 1]], depth=2)
    sums = ips(log, np.asarray([[1.0, np.nan]]), clip=4.0)
    assert (sums.weighted_clicks, sums.expected_weight, sums.slots) == (4.0, 1.0, 2.0)


def test_ips_weighs_a_subnormal_examination_at_the_clip_without_a_warning() -> None:
    """θ = 1e-320 at rank 2: 1 / θ would overflow (a numpy warning on the replay's stderr);
    the weight is the clip, as for θ = 0."""
    log = Sessions.build([[1, 2]], [[1, 1]], depth=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sums = ips(log, np.asarray([[1.0, 1e-320]]), clip=4.0)
    assert (sums.weighted_clicks, sums.expected_weight, sums.slots) == (5.0, 1.0 + 4e-320, 2.0)


def test_replay_text_summary_names_the_curve_and_the_relevance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events, _ = _events(tmp_path / "e.jsonl", lists=500)
    assert main(["replay", str(events), "--click-model", "coec"]) == 0
    out = capsys.readouterr().out
    assert "click model coec (500 lists" in out
    assert "rank_ctr by rank: " in out
    assert "debiased means (relevance=coec):" in out
