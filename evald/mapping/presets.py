"""Built-in mappings, by name: ``evald`` (the native schema, read by the native decoder) and
``ubi`` (OpenSearch User Behavior Insights query and event records; docs/mapping.md)."""

from __future__ import annotations

from typing import Any

#: the native schema (docs/semantics.md section 1): the fast native decoder, no mapping
NATIVE = "evald"

#: UBI 1.x as its writers write it (docs/mapping.md, "The UBI preset"): query records are lists,
#: event records feedback. In a mixed file an event is told by its ``action_name``, in an
#: OpenSearch export by its index. A search may write several query records (one with the
#: hits); a list without hits is built from its per-item ``impression`` events; times are RFC
#: 3339 text or epoch milliseconds, value by value. click / add_to_cart / purchase count
#: (grades 1 / 2 / 3), every other action (on_search, product_hover, ...) is skipped and counted.
UBI: dict[str, Any] = {
    "description": "OpenSearch User Behavior Insights (UBI) queries and events",
    "kind": {"present": "/action_name", "means": "feedback"},
    "indices": {"ubi_queries": "impression", "ubi_events": "feedback"},
    "impression": {
        "request_id": "/query_id",
        "time": {"path": "/timestamp", "format": ["rfc3339", "epoch_ms"]},
        "items": "/query_response_hit_ids",
        "labels": [{"path": "/query_attributes"}, {"path": "/application", "name": "application"}],
        "user_id": ["/user_id", "/client_id"],
        "query": "/user_query",
        "repeats": "merge",
    },
    "feedback": {
        "request_id": "/query_id",
        "time": {"path": "/timestamp", "format": ["rfc3339", "epoch_ms"]},
        "item": "/event_attributes/object/object_id",
        "position": "/event_attributes/position/ordinal",
        "action": "/action_name",
        "actions": {"click": 1, "add_to_cart": 2, "purchase": 3},
        "shown_actions": ["impression"],
    },
}

BUILTIN: dict[str, dict[str, Any]] = {"ubi": UBI}
