"""Built-in mappings, by name: ``evald`` (the native schema, read by the native decoder) and
``ubi`` (OpenSearch User Behavior Insights query and event records; docs/mapping.md)."""

from __future__ import annotations

from typing import Any

#: the native schema (docs/semantics.md section 1): the fast native decoder, no mapping
NATIVE = "evald"

#: UBI 1.x: query records are impressions, event records are feedback. In a mixed file an
#: event is told by its ``action_name``. click / add_to_cart / purchase count (grades 1 / 2 / 3),
#: every other action (on_search, product_hover, ...) is skipped and counted.
UBI: dict[str, Any] = {
    "description": "OpenSearch User Behavior Insights (UBI) queries and events",
    "kind": {"present": "/action_name", "means": "feedback"},
    "impression": {
        "request_id": "/query_id",
        "time": {"path": "/timestamp", "format": "rfc3339"},
        "items": "/query_response_hit_ids",
        "labels": [{"path": "/query_attributes"}],
        "user_id": ["/user_id", "/client_id"],
        "query": "/user_query",
    },
    "feedback": {
        "request_id": "/query_id",
        "time": {"path": "/timestamp", "format": "rfc3339"},
        "item": "/event_attributes/object/object_id",
        "position": "/event_attributes/position/ordinal",
        "action": "/action_name",
        "actions": {"click": 1, "add_to_cart": 2, "purchase": 3},
    },
}

BUILTIN: dict[str, dict[str, Any]] = {"ubi": UBI}
