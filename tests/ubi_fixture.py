"""A UBI fixture the project owns: searches, the records UBI writers make of them in each shape,
and the oracle of what those records mean.

Shapes (docs/mapping.md, "The UBI preset"), as OpenSearch's UBI tools and a web shop logging
UBI write them (no third-party file is copied; the records are generated here):

``hits``    one query record with ``query_response_hit_ids`` (per-item impression events of
            some of its items may follow: the hits stay the list)
``triple``  three query records of one search, same ``query_id`` and millisecond, different
            ``query_response_id``; one has the hits, the others none (``[]`` or absent)
``shown``   a query record without hits, the list written as per-item ``impression`` events
            (``event_attributes.position.ordinal``), in any order, some seconds later
``events``  the per-item ``impression`` events only, no query record

Times are spelt per record: RFC 3339 with ``Z``, with ``+HH:MM`` or ``+HHMM`` offsets, or
integer epoch milliseconds. The records can be written plain, as an OpenSearch ``_bulk`` file
(an action line before each document) or as search-hit dumps (``_index``, ``_id``,
``_source``), queries first and each block shuffled, as exports come.

The oracle knows each search's served list, time and feedback from the generator, not from the
records: a list's relevance per item is the highest grade of its feedback (click 1,
add_to_cart 2, purchase 3) within ``[time, time + window]``; it scores with ir_measures (a list
with no positive grade scores 0 everywhere, evald's documented rule).
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

START = 1_717_243_200_000  # 2024-06-01T12:00:00Z
SHAPES = ("hits", "triple", "shown", "events")
GRADES = {"click": 1, "add_to_cart": 2, "purchase": 3}
#: measures evald and ir_measures spell and compute alike (tests/metrics/test_reference.py)
MEASURES = ("nDCG@10", "RR", "P@10", "R@10", "AP@10", "Success@10")
QUERIES, EVENTS = "ubi_queries", "ubi_events"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass
class Search:
    """One search as it happened: what was served, when, and what the user did."""

    query_id: str
    ts: int  # epoch ms
    items: list[str]
    shape: str
    attributes: dict[str, str]
    client: str
    #: (action, object id, epoch ms); actions that judge nothing included
    actions: list[tuple[str, str, int]] = field(default_factory=list)
    #: ms after ``ts`` each item was shown (its impression event), by position
    shown_after: list[int] = field(default_factory=list)

    def labels(self) -> dict[str, str]:
        """The labels the query record gives (UBI: query_attributes and application)."""
        if self.shape == "events":
            return {}
        return {**self.attributes, "application": "shop"}


def searches(
    seed: int, count: int, *, start: int = START, gap_ms: int = 40_000, scroll_ms: int = 8_000
) -> list[Search]:
    """``count`` searches about ``gap_ms`` apart, shapes in turn, feedback drawn per item; an
    item after the first is shown at once or up to ``scroll_ms`` later."""
    rng = random.Random(seed)
    out = []
    ts = start
    for n in range(count):
        ts += rng.randint(gap_ms // 2, gap_ms * 3 // 2)
        items = [f"sku-{k}" for k in rng.sample(range(60), rng.randint(1, 12))]
        search = Search(
            query_id=f"q-{seed}-{n}",
            ts=ts,
            items=items,
            shape=SHAPES[n % len(SHAPES)],
            attributes={"model": rng.choice(["bm25", "ltr"]), "page": str(rng.randint(1, 2))},
            client=f"c-{rng.randint(0, 30)}",
            shown_after=[0] + [rng.choice([0, 0, rng.randint(1, scroll_ms)]) for _ in items[1:]],
        )
        for _ in range(rng.randint(0, 4)):
            action = rng.choice(["click", "click", "add_to_cart", "purchase", "product_hover"])
            item = rng.choice(items) if rng.random() < 0.9 else "sku-never-served"
            delay = rng.choice([rng.randint(9_000, 600_000), rng.randint(9_000, 20_000)])
            if rng.random() < 0.05:
                delay = 31 * 60_000 + rng.randint(0, 60_000)  # after the 30m window: not counted
            search.actions.append((action, item, ts + delay))
        out.append(search)
    return out


def spell_time(ms: int, rng: random.Random) -> str | int:
    """``ms`` as UBI writers spell it: RFC 3339 with Z, +HH:MM or +HHMM, or epoch ms."""
    form = rng.randrange(4)
    if form == 3:
        return ms
    minutes = 0 if form == 0 else rng.choice([0, 120, -300, 330])
    local = datetime.fromtimestamp(ms / 1000, timezone(timedelta(minutes=minutes)))
    text = local.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}"
    offset = local.strftime("%z")  # +HHMM
    if form == 0:
        return text + "Z"
    return text + (f"{offset[:3]}:{offset[3:]}" if form == 1 else offset)


def _event(
    search: Search, action: str, item: str, ts: int, ordinal: int | None, rng: random.Random
) -> dict[str, Any]:
    attributes: dict[str, Any] = {"object": {"object_id": item, "object_id_field": "product_id"}}
    if ordinal is not None:
        attributes["position"] = {"ordinal": ordinal}
    return {
        "application": "shop",
        "action_name": action,
        "query_id": search.query_id,
        "session_id": f"s-{search.client}",
        "client_id": search.client,
        "timestamp": spell_time(ts, rng),
        "message_type": None,
        "event_attributes": attributes,
    }


def _query(
    search: Search, hits: list[str] | None, response: int, rng: random.Random
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "application": "shop",
        "query_id": search.query_id,
        "query_response_id": f"{search.query_id}-r{response}",
        "client_id": search.client,
        "user_query": USER_QUERIES[int(search.query_id.rsplit("-", 1)[1]) % len(USER_QUERIES)],
        "timestamp": spell_time(search.ts, rng),
        "query_attributes": search.attributes,
    }
    if hits is not None:
        record["query_response_hit_ids"] = hits
    return record


#: how searchers spell one query: all normalise to ``QUERY`` (evald/query.py)
USER_QUERIES = ("red shoes", " Red  Shoes", "RED\tSHOES\u200b")
QUERY = "red shoes"


def records(search: Search, rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """(index, document) of every record the search's writer makes, in its shape."""
    out: list[tuple[str, dict[str, Any]]] = []
    if search.shape == "hits":
        out.append((QUERIES, _query(search, search.items, 0, rng)))
    elif search.shape == "triple":
        with_hits = rng.randrange(3)
        for n in range(3):
            hits = search.items if n == with_hits else rng.choice([[], None])
            out.append((QUERIES, _query(search, hits, n, rng)))
    elif search.shape == "shown":
        out.append((QUERIES, _query(search, rng.choice([[], None]), 0, rng)))
    if search.shape in ("shown", "events") or (search.shape == "hits" and rng.random() < 0.5):
        shown = list(enumerate(search.items))
        if search.shape == "hits":  # impression events of some hits: the hits stay the list
            shown = rng.sample(shown, rng.randint(1, len(shown)))
        rng.shuffle(shown)
        for ordinal, item in shown:
            ts = search.ts + search.shown_after[ordinal]
            out.append((EVENTS, _event(search, "impression", item, ts, ordinal, rng)))
    for action, item, ts in search.actions:
        ordinal = search.items.index(item) if item in search.items else 0
        out.append((EVENTS, _event(search, action, item, ts, ordinal, rng)))
    if rng.random() < 0.3:
        out.append((EVENTS, _event(search, "on_search", "", search.ts, None, rng)))
    return out


def all_records(found: list[Search], seed: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    return [record for search in found for record in records(search, rng)]


def exported(recs: list[tuple[str, dict[str, Any]]], seed: int) -> list[tuple[str, dict[str, Any]]]:
    """As an export comes: every query record, then every event, each block shuffled."""
    rng = random.Random(seed)
    queries = [r for r in recs if r[0] == QUERIES]
    events = [r for r in recs if r[0] == EVENTS]
    rng.shuffle(queries)
    rng.shuffle(events)
    return queries + events


def bulk_lines(recs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """An OpenSearch ``_bulk`` body: an ``index`` action line before each document."""
    out = []
    for n, (index, doc) in enumerate(recs):
        out.append(json.dumps({"index": {"_index": index, "_id": f"id-{n}"}}))
        out.append(json.dumps(doc))
    return out


def hit_lines(recs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """A search-hit dump: one ``{"_index", "_id", "_score", "_source"}`` per line."""
    return [
        json.dumps({"_index": index, "_id": f"id-{n}", "_score": 1.0, "_source": doc})
        for n, (index, doc) in enumerate(recs)
    ]


def plain_lines(recs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [json.dumps(doc) for _, doc in recs]


def time_of(doc: dict[str, Any]) -> int:
    """Epoch ms of a record's ``timestamp`` however it is spelt (for ordering a test feed)."""
    value = doc["timestamp"]
    if isinstance(value, int):
        return value
    delta = datetime.fromisoformat(value.replace("Z", "+00:00")) - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000 + delta.microseconds // 1_000


def write(path: Path, lines: list[str]) -> Path:
    """The lines to ``path``, gzip-compressed when it ends in ``.gz``."""
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def relevance(search: Search, window_ms: int) -> dict[str, int]:
    """Item -> grade: the highest grade of its feedback within the list's window."""
    grades: dict[str, int] = {}
    for action, item, ts in search.actions:
        grade = GRADES.get(action)
        if grade and item in search.items and search.ts <= ts <= search.ts + window_ms:
            grades[item] = max(grades.get(item, 0), grade)
    return grades


def oracle(found: list[Search], window_ms: int) -> dict[str, dict[str, float]]:
    """query_id -> measure -> value: ir_measures over each served list and its grades."""
    import ir_measures

    parsed = [ir_measures.parse_measure(name) for name in MEASURES]
    out: dict[str, dict[str, float]] = {}
    qrels, run = [], []
    for search in found:
        grades = relevance(search, window_ms)
        out[search.query_id] = dict.fromkeys(MEASURES, 0.0)  # no positive grade: 0 everywhere
        if not any(grades.values()):
            continue
        size = len(search.items)
        for rank, item in enumerate(search.items):
            qrels.append(ir_measures.Qrel(search.query_id, item, grades.get(item, 0)))
            run.append(ir_measures.ScoredDoc(search.query_id, item, float(size - rank)))
    for metric in ir_measures.iter_calc(parsed, qrels, run):
        out[metric.query_id][str(metric.measure)] = metric.value
    return out
