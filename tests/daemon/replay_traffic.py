"""Traffic that makes a restore's replay matter: per partition, impressions that close out of
offset order (event times trailing arrival by up to 40 s), late ones (closed on arrival),
malformed records, and clicks, some on items that were not served. A restore that took the
replay for new records would emit, dead-letter and count some of them again."""

from __future__ import annotations

import heapq
import json
import random

#: one partition's records: (kind, record timestamp ms, value), in arrival order
Rows = list[tuple[str, int, bytes]]
#: partition -> its rows
Records = dict[int, Rows]

MALFORMED = b'{"request_id": "broken", "ts":'


def traffic(
    seed: int, partition: int, n: int, base: int, *, repeats: float = 0.0, orphans: float = 0.0
) -> Rows:
    """``n`` impressions arriving from ``base`` (ms) 0.1-0.9 s apart: event time trailing
    arrival by up to 40 s (so later offsets close before earlier ones), 5% late by 5 minutes,
    3% preceded by a malformed record, clicks on half of them 0.2-20 s later, 5% of those on
    an item that was not served. ``repeats``: the share of impressions repeated right after
    (same request id, 5-30 s later in event time: ignored, the first is pending);
    ``orphans``: the share followed by a click for a request id never served (held until it
    expires). Both draw from a random stream of their own: without them the traffic is the
    same."""
    rng = random.Random(seed * 100 + partition)
    more = random.Random(seed * 100 + partition + 50)
    out: Rows = []
    clicks: list[tuple[int, int, bytes]] = []
    arrival = base
    for i in range(n):
        arrival += rng.randint(100, 900)
        while clicks and clicks[0][0] <= arrival:
            at, _, value = heapq.heappop(clicks)
            out.append(("feedback", at, value))
        if rng.random() < 0.03:
            out.append(("impression", arrival, MALFORMED))
        rid = f"p{partition}-r{i}"
        ts = arrival - (300_000 if rng.random() < 0.05 else rng.randint(0, 40_000))
        items = [f"i{rng.randrange(30)}" for _ in range(5)]
        body = {"request_id": rid, "ts": ts, "items": items, "labels": {"arm": f"a{i % 2}"}}
        out.append(("impression", arrival, json.dumps(body).encode()))
        if more.random() < repeats:
            again = {**body, "ts": ts + more.randint(5_000, 30_000), "items": items[::-1]}
            out.append(("impression", arrival, json.dumps(again).encode()))
        if more.random() < orphans:
            nobody = {"request_id": f"{rid}-x", "ts": ts, "item": items[0], "action": "click"}
            out.append(("feedback", arrival, json.dumps(nobody).encode()))
        if rng.random() < 0.5:
            delay = rng.randint(200, 20_000)
            item = "ghost" if rng.random() < 0.05 else rng.choice(items)
            click = {"request_id": rid, "ts": ts + delay, "item": item, "action": "click"}
            heapq.heappush(clicks, (arrival + delay, i, json.dumps(click).encode()))
    out += [("feedback", at, value) for at, _, value in sorted(clicks)]
    return out


def split(records: Records, share: float) -> tuple[Records, Records]:
    """The first ``share`` of each partition's records, and the rest (written later)."""
    cut = {p: int(len(rows) * share) for p, rows in records.items()}
    return (
        {p: rows[: cut[p]] for p, rows in records.items()},
        {p: rows[cut[p] :] for p, rows in records.items()},
    )
