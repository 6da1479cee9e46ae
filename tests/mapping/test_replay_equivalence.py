"""Property: a native stream and its rewrites (UBI; a custom nested schema with epoch-second
times) give identical results and windows through ``evald replay``, for several fixed seeds.

The UBI rewrite also carries actions UBI trackers send that judge nothing (``on_search``,
``product_hover``): skipped and counted, they change no result.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from evald.cli import main
from evald.events import format_timestamp

START = 1_714_564_800_000  # 2024-05-01T12:00:00Z
ACTIONS = ("click", "add_to_cart", "purchase")
CONFIG = {"window": "10m", "lateness": "1m", "label_keys": ["model", "exp_arm", "bucket"]}

#: the custom schema of docs/mapping.md: nested fields, epoch-second times, typed labels
NESTED_MAPPING: dict[str, Any] = {
    "kind": {"field": "/type", "impression": "serve", "feedback": "act"},
    "impression": {
        "request_id": "/ctx/request",
        "time": {"path": "/at", "format": "epoch_s"},
        "user_id": "/ctx/user",
        "items": {"path": "/results", "id": "/doc/id"},
        "labels": [
            {"path": "/experiment"},
            {"path": "/ctx/model", "name": "model"},
            {"path": "/app", "name": "application"},
        ],
    },
    "feedback": {
        "request_id": "/ctx/request",
        "time": {"path": "/at", "format": "epoch_s"},
        "item": "/doc/id",
        "action": "/event",
        "actions": {"click": 1, "add_to_cart": 2, "purchase": 3},
        "position": "/rank",
    },
}


def native_stream(seed: int) -> list[dict[str, Any]]:
    """Impressions and their feedback, slightly out of order; some feedback late, some for
    items never served, some before its impression."""
    rng = random.Random(seed)
    events: list[tuple[int, dict[str, Any]]] = []
    t = START
    for n in range(200):
        t += rng.randint(0, 20_000)
        items = [f"i{k}" for k in rng.sample(range(40), rng.randint(1, 8))]
        labels = {
            "model": rng.choice(["v1", "v2"]),
            "exp_arm": rng.choice(["A", "B"]),
            "bucket": str(rng.randint(0, 3)),
            "application": "shop",  # UBI's application field (the preset's label)
        }
        rid = f"r{n}"
        impression = {"request_id": rid, "ts": t, "items": items, "labels": labels}
        if n % 5:  # every fifth list has no user: its own cluster, no "cluster" in its result
            impression["user_id"] = f"u{rng.randint(0, 20)}"
        events.append((t, impression))
        for _ in range(rng.randint(0, 3)):
            position = rng.randrange(len(items))
            item = items[position] if rng.random() < 0.9 else "never-served"
            ts = t + rng.randint(-2_000, 12 * 60_000)
            action = rng.choice(ACTIONS)
            body = {"request_id": rid, "ts": ts, "item": item, "action": action}
            events.append((ts, {**body, "position": position}))
    events.sort(key=lambda pair: pair[0] + rng.randint(-30_000, 30_000))
    return [event for _, event in events]


def ubi(event: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    when = format_timestamp(event["ts"])
    if "items" in event:
        attributes = {k: v for k, v in event["labels"].items() if k != "application"}
        query = {
            "application": event["labels"]["application"],
            "query_id": event["request_id"],
            "timestamp": when,
            "query_response_hit_ids": event["items"],
            "query_attributes": attributes,
        }
        if "user_id" in event:
            query["client_id"] = event["user_id"]
        return [query]
    noise = {"query_id": event["request_id"], "timestamp": when, "client_id": "c1"}
    feedback = {
        "action_name": event["action"],
        "query_id": event["request_id"],
        "timestamp": when,
        "event_attributes": {
            "object": {"object_id": event["item"], "object_id_field": "sku"},
            "position": {"ordinal": event["position"]},
        },
    }
    extra = [{**noise, "action_name": rng.choice(["on_search", "product_hover"])}]
    return [feedback, *extra] if rng.random() < 0.5 else [feedback]


def nested(event: dict[str, Any]) -> list[dict[str, Any]]:
    at = event["ts"] / 1000  # epoch seconds, with milliseconds as the fraction
    if "items" in event:
        labels = event["labels"]
        return [
            {
                "type": "serve",
                "at": at,
                "app": labels["application"],
                "ctx": {
                    "request": event["request_id"],
                    "model": labels["model"],
                    **({"user": event["user_id"]} if "user_id" in event else {}),
                },
                "results": [{"doc": {"id": item}, "score": 1.0} for item in event["items"]],
                "experiment": {
                    "exp": {"arm": labels["exp_arm"]},
                    "bucket": int(labels["bucket"]),
                },
            }
        ]
    return [
        {
            "type": "act",
            "at": at,
            "ctx": {"request": event["request_id"]},
            "doc": {"id": event["item"]},
            "event": event["action"],
            "rank": event["position"],
        }
    ]


def replay(tmp_path: Path, name: str, records: list[dict[str, Any]], *mapping: str) -> dict:
    events = tmp_path / f"{name}.jsonl"
    events.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    results, windows = (tmp_path / f"{name}.{part}" for part in ("res", "win"))
    argv = ["replay", str(events), "--config", str(config), "--results", str(results)]
    argv += ["--windows", str(windows), "--format", "json", "--progress", "never", *mapping]
    code = main(argv)
    assert code == 0
    return {"results": _canonical(results), "windows": _canonical(windows)}


def _canonical(path: Path) -> list[str]:
    """The lines of a JSONL output as a sorted list of key-sorted JSON (label order is the
    order the record spelt them)."""
    return sorted(json.dumps(json.loads(line), sort_keys=True) for line in path.open())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_native_ubi_and_nested_rewrites_give_identical_results(
    seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = native_stream(seed)
    rng = random.Random(seed)
    native = replay(tmp_path, "native", stream)
    assert len(native["results"]) == 200
    assert 0 < sum('"cluster"' in line for line in native["results"]) < 200
    via_ubi = replay(tmp_path, "ubi", [r for e in stream for r in ubi(e, rng)], "--mapping", "ubi")
    mapping = tmp_path / "nested.yaml"
    mapping.write_text(yaml.safe_dump(NESTED_MAPPING))
    via_nested = replay(
        tmp_path, "nested", [r for e in stream for r in nested(e)], "--mapping", str(mapping)
    )
    assert via_ubi == native
    assert via_nested == native
    summaries = [json.loads(part) for part in _json_documents(capsys.readouterr().out)]
    native_summary, ubi_summary, nested_summary = summaries
    assert native_summary["events"] == ubi_summary["events"] == nested_summary["events"]
    assert native_summary["rejected"] == ubi_summary["rejected"] == {}
    assert sum(ubi_summary["skipped"].values()) > 0 and native_summary["skipped"] == {}


def _json_documents(text: str) -> list[str]:
    """Split concatenated pretty-printed JSON objects (one summary per replay)."""
    decoder, out, index = json.JSONDecoder(), [], 0
    while index < len(text.rstrip()):
        while text[index].isspace():
            index += 1
        _, end = decoder.raw_decode(text, index)
        out.append(text[index:end])
        index = end
    return out
