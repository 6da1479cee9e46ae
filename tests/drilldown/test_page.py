"""GET /queries on the metrics port: the report with its filters, clear 400s, the same auth as
/metrics, and a 503 while the loop holds the engine too long."""

from __future__ import annotations

import base64
import http.client
import json
import threading
from typing import Any

import bcrypt
import pytest

from evald.config import load_config
from evald.drilldown.page import QueriesPage
from evald.engine import Engine
from evald.http import MetricsServer
from evald.webconfig import BasicAuth, WebConfig

MIN = 60_000


def fed_engine() -> Engine:
    config = load_config(
        {
            "min_event_time": 0,
            "max_event_lead": None,
            "window": "1m",
            "lateness": "30s",
            "watermark_quorum": 1,  # the last impression confirms its own time
            "measures": "RR,P@2",
            "windows": ["5m", "1h"],
            "label_keys": ["arm"],
            "statistics": {"bootstrap_replicates": 0},
        }
    )
    engine = Engine(config, clock=lambda: 0.0)
    for k in range(1_200):
        ts = k * 500
        body = {
            "request_id": f"r{k}",
            "ts": ts,
            "items": ["a", "b"],
            "query": f"Q{k % 7}",
            "labels": {"arm": "t" if k % 2 else "c"},
        }
        engine.feed(json.dumps(body).encode())
        if k % 3:
            click = {"request_id": f"r{k}", "ts": ts + 10, "item": "a", "action": "click"}
            engine.feed(json.dumps(click).encode())
    engine.feed(json.dumps({"request_id": "end", "ts": 30 * MIN, "items": ["a"]}).encode())
    engine.tick()
    return engine


@pytest.fixture(scope="module")
def engine() -> Engine:
    return fed_engine()


def get(server: MetricsServer, path: str, auth: str | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    headers = (
        {}
        if auth is None
        else {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}
    )
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        kind = response.getheader("content-type", "")
        return response.status, json.loads(body) if kind == "application/json" else body
    finally:
        conn.close()


def test_the_page_answers_the_report_with_its_filters(engine: Engine) -> None:
    lock = threading.Lock()
    with MetricsServer(
        "127.0.0.1:0", pages={"/queries": QueriesPage(lambda: engine, lock)}
    ) as server:
        status, doc = get(server, "/queries")
        assert status == 200
        rows = doc["queries"]
        assert {r["window"] for r in rows} == {"5m"}  # the first hour is not complete yet
        assert {r["labels"]["arm"] for r in rows} == {"c", "t"}
        status, doc = get(server, "/queries?window=5m&arm=t&measure=RR&k=2")
        assert status == 200
        (row,) = doc["queries"]
        assert (row["window"], row["labels"]) == ("5m", {"arm": "t"})
        assert len(row["top"]) == 2 and set(row["fallen"]) == {"RR"}
        assert row["end"] == "1970-01-01T00:10:00.000Z"  # the last complete 5m window
        for path, says in [
            ("/queries?window=7m", "window: '7m' is not one of"),
            ("/queries?measure=nDCG", "measure: 'nDCG' is not one of"),
            ("/queries?k=0", "k: '0' is not a whole number"),
            ("/queries?k=%C2%B2", "k: '\u00b2' is not a whole number"),  # a digit to isdigit
            ("/queries?color=red", "unknown parameter 'color'"),
        ]:
            status, doc = get(server, path)
            assert status == 400 and doc["error"].startswith(says), path


def test_the_page_is_behind_the_same_auth_as_metrics(engine: Engine) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = WebConfig(auth=BasicAuth({"u": hashed}))
    page = QueriesPage(lambda: engine, threading.Lock())
    with MetricsServer("127.0.0.1:0", web=web, pages={"/queries": page}) as server:
        assert get(server, "/queries")[0] == 401
        assert get(server, "/queries", auth="u:wrong")[0] == 401
        assert get(server, "/queries", auth="u:pw")[0] == 200


def test_no_engine_or_a_busy_one_is_a_503() -> None:
    assert QueriesPage(lambda: None, threading.Lock())({})[0] == 503

    class Busy:
        def __enter__(self) -> None:
            raise TimeoutError("the poll loop held the engine for over 1s")

        def __exit__(self, *exc: object) -> None:
            pass

    status, doc = QueriesPage(fed_engine, Busy())({})
    assert status == 503 and "held the engine" in doc["error"]
