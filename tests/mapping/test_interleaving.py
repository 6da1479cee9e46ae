"""Interleaved lists through a mapping: the teams at any path (an array aligned with the
items, or a field of each hit), the method read or stated; bad team data rejected with the
native reasons; the credit as the native schema gives it (docs/mapping.md)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from evald.config import load_config
from evald.decode import Rejection
from evald.engine import Engine, Result
from evald.events import Impression, Limits
from evald.mapping import MappingDecoder, MappingSpec

NOW = 1_714_564_800_000
HOUR = 3_600_000


def tree(teams: Any, interleaving: Any) -> dict[str, Any]:
    return {
        "kind": {"field": "/type", "impression": "serve", "feedback": "act"},
        "impression": {
            "request_id": "/req",
            "time": {"path": "/at", "format": "epoch_ms"},
            "items": {"path": "/hits", "id": "/id"},
            "teams": teams,
            "interleaving": interleaving,
        },
        "feedback": {
            "request_id": "/req",
            "time": {"path": "/at", "format": "epoch_ms"},
            "item": "/id",
            "action": "/what",
            "actions": {"click": 1},
        },
    }


PER_HIT = tree({"path": "/hits", "id": "/team"}, "team_draft")
ARRAY = tree("/attribution", "/method")


def decoder(spec: dict[str, Any], max_lead: int | None = HOUR) -> MappingDecoder:
    return MappingDecoder(
        MappingSpec.model_validate(spec), Limits(), min_ts=NOW - HOUR, max_lead=max_lead
    )


def serve(teams: list[str], **extra: Any) -> bytes:
    hits = [{"id": f"d{i}", "team": t} for i, t in enumerate(teams)]
    body = {"type": "serve", "req": "r1", "at": NOW, "hits": hits, "attribution": teams,
            "method": "team_draft", **extra}  # fmt: skip
    return json.dumps(body).encode()


@pytest.mark.parametrize("spec", [PER_HIT, ARRAY], ids=["per hit", "array"])
def test_teams_are_read_at_their_path(spec: dict[str, Any]) -> None:
    got = decoder(spec).decode(serve(["B", "A", "A"]))
    assert isinstance(got, Impression)
    assert (got.items, got.teams, got.interleaving) == (
        ["d0", "d1", "d2"],
        ["B", "A", "A"],
        "team_draft",
    )


@pytest.mark.parametrize(
    ("spec", "record", "reason", "detail"),
    [
        (PER_HIT, serve(["A", "A"]), "bad_teams", "a team is missing"),
        (ARRAY, serve(["A", "B"], attribution=["A"]), "bad_teams", "1 team for 2 items"),
        (ARRAY, serve(["A", "B"], method="coin"), "unknown_interleaving", "'coin'"),
        (ARRAY, serve(["A", "B"], method=None), "missing_field", "/method: missing"),
        (
            PER_HIT,
            json.dumps({"type": "serve", "req": "r", "at": NOW, "hits": [{"id": "a"}]}).encode(),
            "missing_field",
            "/hits/0/team: missing",
        ),
        (ARRAY, serve(["A", "B"], method="balanced"), "missing_field", "rankings"),
    ],
)
def test_bad_team_data_is_rejected_with_the_native_reasons(spec, record, reason, detail) -> None:
    got = decoder(spec).decode(record)
    assert isinstance(got, Rejection) and got.reason == reason and detail in got.detail, got


def test_teams_and_interleaving_go_together() -> None:
    broken = copy.deepcopy(PER_HIT)
    del broken["impression"]["interleaving"]
    with pytest.raises(ValueError, match="teams and interleaving go together"):
        MappingSpec.model_validate(broken)


def test_the_credit_through_a_mapping_is_the_native_one() -> None:
    config = load_config({"min_event_time": 0, "max_event_lead": None,
                          "interleaving": {"teams": ["A", "B"]}})  # fmt: skip
    results: list[Result] = []
    engine = Engine(
        config, clock=lambda: 0.0, decoder=decoder(PER_HIT, None), on_result=results.append
    )
    click = {"type": "act", "req": "r1", "at": NOW + 1000, "id": "d2", "what": "click"}
    assert engine.feed_batch([serve(["B", "A", "A"]), json.dumps(click).encode()]) == []
    engine.drain()
    (result,) = results
    assert result.interleaving == {
        "method": "team_draft",
        "credit": {"A": 1.0, "B": 0.0},
        "order": ["B", "A"],
    }
