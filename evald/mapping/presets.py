"""Built-in mappings, by name: ``evald`` (the native schema, read by the native decoder),
``ubi`` (OpenSearch User Behavior Insights query and event records) and ``ubi_ab_test`` (UBI
query records that carry the hits of OpenSearch's team-draft interleaved A/B test search;
docs/mapping.md)."""

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

#: OpenSearch's A/B test search (the Search Relevance Workbench's ``POST
#: /_plugins/_search_relevance/ab_tests/{id}/_search``, opensearch-project/search-relevance pull
#: request 511; its ABTestSearchTransportAction.mapHit and ABTestSearchResponse at commit
#: ef610192ed27) answers ``{"test_id", "hits": [{"_index", "_id", "_score", "_source",
#: "_search_configuration_id"}, ...]}``: the team-draft list, each hit with the id that stands
#: for the search configuration (the team) that drafted it. OpenSearch logs no served list (its
#: RFC, search-relevance issue 489: the caller attributes), so the caller writes its UBI query
#: record with that response's ``hits`` and ``test_id`` beside the UBI fields; the list is the
#: hits, a hit's team its ``_search_configuration_id``. Events are read as by ``ubi``.
UBI_AB_TEST: dict[str, Any] = {
    **UBI,
    "description": "UBI query records carrying the hits of OpenSearch's A/B test search "
    "(team-draft interleaving), and UBI events",
    "impression": {
        **UBI["impression"],
        "items": {"path": "/hits", "id": "/_id"},
        "labels": [*UBI["impression"]["labels"], {"path": "/test_id", "name": "ab_test"}],
        "teams": {"path": "/hits", "id": "/_search_configuration_id"},
        "interleaving": "team_draft",
    },
}

BUILTIN: dict[str, dict[str, Any]] = {"ubi": UBI, "ubi_ab_test": UBI_AB_TEST}
