"""A small interleaved stream (fixed seed) and its credit computed the plain way, for the
engine, replay and statistics tests of interleaving."""

from __future__ import annotations

import itertools
import json
import random
from collections import defaultdict
from typing import Any

from evald.interleaving.draft import multileave, team_draft

T0 = 1_700_000_000_000
WINDOW = 60_000  # the attribution window (ms)
INTERLEAVING_WINDOW = 600_000

CONFIG: dict[str, Any] = {
    "min_event_time": 0,
    "max_event_lead": None,
    "window": "1m",
    "lateness": "0s",
    "watermark_quorum": 1,
    "measures": "RR",
    "label_keys": ["surface"],
    "interleaving": {"window": "10m", "min_n": 30, "teams": ["A", "B", "C"]},
}


def events(
    seed: int = 29, n: int = 3000, multi: bool = False, same: bool = False
) -> list[dict[str, Any]]:
    """Impressions (most interleaved, some plain) every 400 ms, clicks within the window;
    ranker A puts relevant items higher than B (``same``: B ranks as well as A, an A/A)."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        ts = T0 + 400 * i
        pool = [f"d{j}" for j in range(12)]
        relevant = set(rng.sample(pool, 3))
        good = sorted(pool, key=lambda d: (d not in relevant, rng.random()))
        noisy = rng.sample(pool, len(pool))
        if same:
            noisy = sorted(pool, key=lambda d: (d not in relevant, rng.random()))
        body: dict[str, Any] = {
            "request_id": f"r{i}",
            "ts": ts,
            "user_id": f"u{rng.randrange(150)}",
        }
        if i % 10 == 9:
            body["items"] = good[:6]  # not interleaved
        elif multi:
            lists = {"A": good, "B": noisy, "C": rng.sample(pool, len(pool))}
            body["items"], body["teams"] = multileave(lists, 6, lambda t: rng.sample(t, len(t)))
            body["interleaving"] = "team_draft_multileave"
        else:
            body["items"], body["teams"] = team_draft(good, noisy, 6, lambda: rng.random() < 0.5)
            body["interleaving"] = "team_draft"
        body["labels"] = {"surface": rng.choice(["web", "app"])}
        out.append(body)
        for rank, item in enumerate(body["items"]):
            p = (0.5 if item in relevant else 0.05) / (rank + 1)
            if rng.random() < p:
                action = rng.choice(["click", "click", "purchase"])
                out.append(
                    {
                        "request_id": body["request_id"],
                        "ts": ts + rng.randrange(50_000),
                        "item": item,
                        "action": action,
                    }
                )
    out.sort(key=lambda e: e["ts"])
    return out


def lines(stream: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(e).encode() for e in stream]


GRADES = {"click": 1.0, "purchase": 3.0}


def plain_credit(
    stream: list[dict[str, Any]], credit: str = "clicks"
) -> dict[str, dict[str, float]]:
    """request id -> team -> credit: the max grade per clicked item within the window, summed
    per team (team draft and multileaving)."""
    imps = {e["request_id"]: e for e in stream if "items" in e and "teams" in e}
    grade: dict[tuple[str, str], float] = defaultdict(float)
    for e in stream:
        if "item" in e and e["request_id"] in imps:
            imp = imps[e["request_id"]]
            if imp["ts"] <= e["ts"] <= imp["ts"] + WINDOW:
                key = (e["request_id"], e["item"])
                grade[key] = max(grade[key], GRADES[e["action"]])
    out: dict[str, dict[str, float]] = {}
    for rid, imp in imps.items():
        teams = dict.fromkeys(sorted(set(imp["teams"])), 0.0)
        seen = set()
        for item, team in zip(imp["items"], imp["teams"], strict=True):
            g = grade.get((rid, item), 0.0)
            if g > 0 and item not in seen:
                teams[team] += 1.0 if credit == "clicks" else g
            seen.add(item)
        out[rid] = teams
    return out


def plain_pairs(
    stream: list[dict[str, Any]], credit: str = "clicks"
) -> dict[tuple, dict[str, int]]:
    """(segment, a, b) -> lists, lead_a, wins_a, wins_b, ties over the whole stream."""
    credits = plain_credit(stream, credit)
    imps = {e["request_id"]: e for e in stream if "items" in e and "teams" in e}
    out: dict[tuple, dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(("lists", "lead_a", "wins_a", "wins_b", "ties"), 0)
    )
    for rid, per_team in credits.items():
        imp = imps[rid]
        for a, b in itertools.combinations(sorted(per_team), 2):
            cell = out[((imp["labels"]["surface"],), a, b)]
            cell["lists"] += 1
            cell["lead_a"] += imp["teams"].index(a) < imp["teams"].index(b)
            ca, cb = per_team[a], per_team[b]
            if ca or cb:
                cell["wins_a" if ca > cb else "wins_b" if cb > ca else "ties"] += 1
    return dict(out)
