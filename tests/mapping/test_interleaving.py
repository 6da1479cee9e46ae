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
from evald.mapping import MappingDecoder, MappingSpec, decoder_for

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


# -- the ubi_ab_test preset: OpenSearch's A/B test search hits in a UBI query record ----------

CONFIG_A = "0b3f6a4e-6f5d-4c1e-9a57-3c2e8d1f7b10"  # the ids OpenSearch gives the two search
CONFIG_B = "d94c2e71-1a0b-4f3e-8c6d-5e7f9a2b4c83"  # configurations of an A/B test


def hit(doc_id: str, team: str | None, score: float) -> dict[str, Any]:
    """A hit as the A/B test search answers it (docs/mapping.md, "The ubi_ab_test preset")."""
    out: dict[str, Any] = {"_index": "products", "_id": doc_id, "_score": score,
                           "_source": {"title": f"item {doc_id}"}}  # fmt: skip
    if team is not None:
        out["_search_configuration_id"] = team
    return out


def ab_query(teams: list[str | None], **extra: Any) -> bytes:
    """The caller's UBI query record with the A/B test search response's test_id and hits."""
    doc = {
        "query_id": "q-7",
        "timestamp": "2024-05-01T12:00:00.000Z",
        "client_id": "c-42",
        "user_query": "usb c hub",
        "application": "shop",
        "query_attributes": {"surface": "web"},
        "test_id": "t-1",
        "hits": [hit(f"p{i}", t, 9.0 - i) for i, t in enumerate(teams)],
        **extra,
    }
    return json.dumps(doc).encode()


def ab_decoder(config: Any = None) -> MappingDecoder:
    found = decoder_for("ubi_ab_test", config or load_config({"min_event_time": 0}))
    assert found is not None
    return found


def test_the_ab_test_preset_reads_the_hits_and_their_search_configuration() -> None:
    got = ab_decoder().decode(ab_query([CONFIG_B, CONFIG_A, CONFIG_A, CONFIG_B]), None, NOW)
    assert isinstance(got, Impression)
    assert got.items == ["p0", "p1", "p2", "p3"]
    assert got.teams == [CONFIG_B, CONFIG_A, CONFIG_A, CONFIG_B]
    assert got.interleaving == "team_draft"
    assert got.labels == {"surface": "web", "application": "shop", "ab_test": "t-1"}
    assert (got.ts, got.user_id, got.query) == (NOW, "c-42", "usb c hub")


@pytest.mark.parametrize(
    ("record", "reason", "detail"),
    [
        # a test disabled in OpenSearch serves configuration A alone, each hit with A's id
        (ab_query([CONFIG_A, CONFIG_A]), "bad_teams", "a team is missing"),
        (ab_query([CONFIG_A, None]), "missing_field", "/hits/1/_search_configuration_id: missing"),
        # a number is not a team name (named by its place in the teams, as an item id's is)
        (ab_query([CONFIG_A, 7]), "wrong_type", "teams/1: Input should be a valid string"),  # type: ignore[list-item]
        (ab_query([CONFIG_A, ""]), "bad_teams", "teams/1: empty team name"),
        (  # null is absent (OpenSearch writes the test's config_b_uuid unchecked)
            ab_query(
                [],
                hits=[
                    hit("p0", CONFIG_A, 1.0),
                    {**hit("p1", None, 0.5), "_search_configuration_id": None},
                ],
            ),
            "missing_field",
            "/hits/1/_search_configuration_id: missing",
        ),
    ],
)
def test_the_ab_test_preset_rejects_bad_team_data_with_reasons(
    record: bytes, reason: str, detail: str
) -> None:
    got = ab_decoder().decode(record, None, NOW)
    assert isinstance(got, Rejection) and got.reason == reason and detail in got.detail, got


def test_a_ubi_query_record_without_hits_adds_nothing_under_the_ab_test_preset() -> None:
    """A search outside the test (plain UBI ``query_response_hit_ids``): a record of the list
    with no items, as the ubi preset reads a record without hits; no team data is asked."""
    doc = {"query_id": "q-8", "timestamp": "2024-05-01T12:00:00Z", "query_response_hit_ids": ["x"]}
    got = ab_decoder().decode(json.dumps(doc).encode(), None, NOW)
    assert isinstance(got, Impression) and got.items == [] and got.teams is None


def test_the_credit_of_an_ab_test_list_goes_to_the_search_configuration_of_the_clicked_hit() -> (
    None
):
    config = load_config({"min_event_time": 0, "max_event_lead": None,
                          "interleaving": {"teams": [CONFIG_A, CONFIG_B]}})  # fmt: skip
    results: list[Result] = []
    engine = Engine(config, clock=lambda: 0.0, decoder=ab_decoder(config), on_result=results.append)
    attributes = {"object": {"object_id": "p2"}, "position": {"ordinal": 2}}
    click = {"action_name": "click", "query_id": "q-7", "timestamp": "2024-05-01T12:00:05Z",
             "event_attributes": attributes}  # fmt: skip
    records = [ab_query([CONFIG_B, CONFIG_A, CONFIG_A, CONFIG_B]), json.dumps(click).encode()]
    assert engine.feed_batch(records) == []
    engine.drain()
    (result,) = results
    assert result.interleaving == {
        "method": "team_draft",
        "credit": {CONFIG_A: 1.0, CONFIG_B: 0.0},
        "order": [CONFIG_B, CONFIG_A],
    }
