import itertools
import random

import pytest

from evald.interleaving.credit import balanced_credits, credit_list, gains, team_credits
from evald.interleaving.draft import balanced, multileave, team_draft
from evald.interleaving.teams import BALANCED, MULTILEAVE, TEAM_DRAFT, Teams, teams_of


def test_team_draft_credits_each_team_its_clicked_items():
    teams = Teams(TEAM_DRAFT, ("B", "A", "A", "B"))
    got = credit_list(teams, [1.0, 0.0, 3.0, 2.0], "clicks")
    # B placed ranks 0 and 3 (2 clicks), A ranks 1 and 2 (1 click); B's item comes first
    assert [(o.team_a, o.team_b, o.d, o.compared, o.lead) for o in got] == [
        ("A", "B", -1, True, False)
    ]
    assert team_credits(teams, gains([1.0, 0.0, 3.0, 2.0], "clicks")) == {"A": 1.0, "B": 2.0}
    # graded: A earns 3, B 1 + 2 = 3: a tie
    graded = credit_list(teams, [1.0, 0.0, 3.0, 2.0], "grades")
    assert graded[0].d == 0 and graded[0].compared


def test_a_list_nobody_clicked_compares_nothing():
    (got,) = credit_list(Teams(TEAM_DRAFT, ("A", "B")), [0.0, 0.0], "clicks")
    assert (got.d, got.compared, got.lead) == (0, False, True)


def test_balanced_credit_follows_the_lowest_click():
    # A = (a, b, c, d), B = (b, e, a, f), A's coin: a (A), b (B), A's b is in, e (B), c (A)
    a, b = ["a", "b", "c", "d"], ["b", "e", "a", "f"]
    items, names = balanced(a, b, 4, a_first=True)
    assert items == ["a", "b", "e", "c"]
    teams = teams_of(items, names, BALANCED, {"A": a, "B": b})
    # a click on e (rank 2 of B, not in A): k = 2, A's top 2 = {a, b}, B's = {b, e}
    assert balanced_credits(teams, [0, 0, 1, 0]) == {"A": 0.0, "B": 1.0}
    # clicks on a and c: lowest is c (rank 3 in A, absent in B): k = 3;
    # A's top 3 holds a and c, B's top 3 (b, e, a) holds a
    assert balanced_credits(teams, [1, 0, 0, 1]) == {"A": 2.0, "B": 1.0}
    # a click on b: rank 2 in A, 1 in B: k = 1: only B's top 1 holds it
    assert balanced_credits(teams, [0, 1, 0, 0]) == {"A": 0.0, "B": 1.0}


def reference_outcomes(method, items, names, rankings, grades, credit):
    """A second, plain computation of the outcomes (the rules of docs/semantics.md §9)."""
    gain = [(g if credit == "grades" else 1.0) if g > 0 else 0.0 for g in grades]
    distinct = sorted(set(names))
    score = {t: 0.0 for t in distinct}
    if method == BALANCED:
        clicked = [i for i, g in enumerate(gain) if g > 0]
        if clicked:
            low = items[clicked[-1]]
            k = min(rankings[t].index(low) + 1 for t in distinct if low in rankings[t])
            for t in distinct:
                top = rankings[t][:k]
                score[t] = sum(gain[i] for i in clicked if items[i] in top)
    else:
        for name, g in zip(names, gain, strict=True):
            score[name] += g
    out = []
    for x, y in itertools.combinations(distinct, 2):
        d = 1 if score[x] > score[y] else -1 if score[x] < score[y] else 0
        lead = names.index(x) < names.index(y)
        out.append((x, y, d, score[x] > 0 or score[y] > 0, lead))
    return out


@pytest.mark.parametrize("method", [TEAM_DRAFT, BALANCED, MULTILEAVE])
@pytest.mark.parametrize("credit", ["clicks", "grades"])
def test_credit_equals_a_plain_computation_on_random_lists(method, credit):
    rng = random.Random(29)
    for _ in range(400):
        pool = [f"d{i}" for i in range(12)]
        rankers = ["A", "B"] if method != MULTILEAVE else ["A", "B", "C", "D"][: rng.randint(2, 4)]
        rankings = {t: rng.sample(pool, rng.randint(3, 8)) for t in rankers}
        length = rng.randint(1, 8)
        if method == TEAM_DRAFT:
            items, names = team_draft(
                rankings["A"], rankings["B"], length, lambda: rng.random() < 0.5
            )
        elif method == BALANCED:
            items, names = balanced(rankings["A"], rankings["B"], length, rng.random() < 0.5)
        else:
            items, names = multileave(rankings, length, lambda t: rng.sample(t, len(t)))
        if len(set(names)) < 2:
            continue
        grades = [rng.choice([0, 0, 0, 1, 2, 3]) for _ in items]
        used = {t: rankings[t] for t in sorted(set(names))}
        teams = teams_of(items, names, method, used if method == BALANCED else None)
        got = [
            (o.team_a, o.team_b, o.d, o.compared, o.lead)
            for o in credit_list(teams, grades, credit)
        ]
        assert got == reference_outcomes(method, items, names, used, grades, credit)


def test_team_draft_gives_each_round_one_pick_per_ranker():
    rng = random.Random(3)
    for _ in range(200):
        a = rng.sample(range(20), 10)
        b = rng.sample(range(20), 10)
        items, names = team_draft(
            [str(x) for x in a], [str(x) for x in b], 10, lambda: rng.random() < 0.5
        )
        assert len(set(items)) == len(items) == 10
        for pair in range(0, 10, 2):
            assert sorted(names[pair : pair + 2]) == ["A", "B"]
