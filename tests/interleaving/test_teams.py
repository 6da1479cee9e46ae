import json

import pytest

from evald.decode import Decoder, Rejection
from evald.events import Impression, Limits
from evald.interleaving.teams import BALANCED, TEAM_DRAFT, Teams, problem, teams_of


@pytest.fixture
def decoder() -> Decoder:
    return Decoder(Limits(max_items=6), {"click": 1.0}, min_ts=0, max_lead=None)


def imp(**kw) -> bytes:
    body = {"request_id": "r1", "ts": 1000, "items": ["a", "b", "c"], **kw}
    return json.dumps(body).encode()


GOOD = [
    imp(teams=["A", "B", "B"], interleaving="team_draft"),
    imp(teams=["B", "A", "C"], interleaving="team_draft_multileave"),
    imp(
        teams=["A", "B", "A"],
        interleaving="balanced",
        rankings={"A": ["a", "c", "x"], "B": ["b", "a"]},
    ),
    imp(items=["a"], teams=["A"], interleaving="team_draft"),  # one item: one pick
    imp(),  # not interleaved
]

BAD = [
    (imp(teams=["A", "B"], interleaving="team_draft"), "bad_teams", "2 teams for 3 items"),
    (imp(teams=["A", "B", "B"], interleaving="coin"), "unknown_interleaving", "'coin'"),
    (imp(teams=["A", "A", "A"], interleaving="team_draft"), "bad_teams", "a team is missing"),
    (imp(teams=["A", "B", "C"], interleaving="team_draft"), "bad_teams", "two rankers"),
    (imp(teams=["A", "", "B"], interleaving="team_draft"), "bad_teams", "teams/1: empty"),
    (imp(teams=["A", "B", "B"]), "missing_field", "interleaving: missing"),
    (imp(interleaving="team_draft"), "missing_field", "teams: missing"),
    (imp(teams=["A", "B", "A"], interleaving="balanced"), "missing_field", "rankings"),
    (
        imp(teams=["A", "B", "A"], interleaving="balanced", rankings={"A": ["a", "c"]}),
        "bad_teams",
        "one list per team",
    ),
    (
        imp(
            teams=["A", "B", "A"],
            interleaving="balanced",
            rankings={"A": ["a", "x"], "B": ["b"]},
        ),
        "bad_teams",
        "items/2: 'c' is not in team 'A'",
    ),
    (  # a ranker's blank id is an id as a served one is: before, it shifted the ranks
        imp(
            teams=["A", "B", "A"],
            interleaving="balanced",
            rankings={"A": ["a", " ", "c"], "B": ["b"]},
        ),
        "empty_id",
        "an id is empty or only white space",
    ),
    (imp(teams=["A", 3, "B"], interleaving="team_draft"), "wrong_type", "teams"),
    (imp(teams=["A", "B", "A", "B", "A", "B", "A"], interleaving="team_draft"), None, None),
]


@pytest.mark.parametrize("raw", GOOD)
def test_good_team_data_is_accepted_by_both_paths(decoder, raw):
    assert isinstance(decoder.decode(raw), Impression)
    rejections: list = []
    got = [e for _, e in decoder.decode_many([raw], None, rejections)]
    assert len(got) == 1 and isinstance(got[0], Impression)
    assert rejections == []


@pytest.mark.parametrize(("raw", "reason", "detail"), BAD)
def test_bad_team_data_is_rejected_with_its_reason_by_both_paths(decoder, raw, reason, detail):
    got = decoder.decode(raw)
    assert isinstance(got, Rejection)
    if reason is None:  # more teams than max_items: the items' own limit
        assert got.reason == "too_many_items"
        return
    assert got.reason == reason and detail in got.detail, got.detail
    rejections: list = []
    assert list(decoder.decode_many([raw], None, rejections)) == []
    assert [(p, r.reason, r.detail) for p, r in rejections] == [(0, reason, got.detail)]


def test_problem_without_team_data_is_none():
    assert problem(["a"], None, None) is None


def test_teams_of_balanced_keeps_each_teams_ranks():
    got = teams_of(["a", "b", "c"], ["A", "B", "A"], BALANCED, {"A": ["a", "c"], "B": ["b", "a"]})
    assert got == Teams(BALANCED, ("A", "B", "A"), ((1, 0, 2), (2, 1, 0)))
    assert got.order == ("A", "B")
    assert teams_of(["a", "b"], ["B", "A"], TEAM_DRAFT) == Teams(TEAM_DRAFT, ("B", "A"))
