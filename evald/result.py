"""The result record, one home for it: what one finalized impression is (:class:`Result`), its
JSON document (written by ``Result.to_json`` for ``evald replay --results`` and by the daemon's
fast encoder for the results topic), the reader a restart reads it back with
(:func:`read_result`, behind ``Engine.absorb_results``) and the codec of its ``"cluster"``
field. Writer and reader side by side, so a field added to one is seen missing from the other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from evald.events import format_timestamp, parse_timestamp

__all__ = ["ReadResult", "Result", "document", "format_cluster", "parse_cluster", "read_result"]

_CLUSTER = re.compile("[0-9a-f]{16}")


@dataclass(slots=True)
class Result:
    """One finalized impression: what ``--results`` and the results topic carry."""

    request_id: str
    ts: int  # epoch ms
    labels: dict[str, str]
    measures: dict[str, float]
    partition: int = 0
    reason: str = "window"  # what closed it: window / late / cap / drain
    abandoned: bool = False  # no positive feedback: every measure is 0
    #: the user's bootstrap cluster key (``user_cluster``); 0: no user id, or not kept
    #: (``bootstrap_replicates`` 0)
    cluster: int = 0
    #: an interleaved list's credit (``interleaving.component.result_field``); None: none
    interleaving: dict[str, Any] | None = None
    #: the impression's query, normalised (evald.query); "": none
    query: str = ""
    #: the list's zero-feedback values (``zerofeedback.component.result_field``); None: off
    zero_feedback: dict[str, float | None] | None = None

    def to_json(self) -> dict[str, Any]:
        """The record's document (:func:`document`), its time formatted here."""
        return document(self, format_timestamp(self.ts))


def document(result: Result, ts: str) -> dict[str, Any]:
    """``{"request_id", "ts" (``ts``: RFC 3339 UTC, ms), "labels", "measures"}``, ``"cluster"``
    (``format_cluster``) when the impression had a user id, ``"interleaving"`` when it was a
    credited interleaved list (docs/semantics.md §9), ``"query"`` (normalised) when it had a
    query and ``"zero_feedback"`` with those signals on (docs/drilldown.md). The time comes
    formatted: the daemon's encoder formats it faster, per hour."""
    doc: dict[str, Any] = {
        "request_id": result.request_id,
        "ts": ts,
        "labels": result.labels,
        "measures": result.measures,
    }
    if result.cluster:
        doc["cluster"] = format_cluster(result.cluster)
    if result.interleaving is not None:
        doc["interleaving"] = result.interleaving
    if result.query:
        doc["query"] = result.query
    if result.zero_feedback is not None:
        doc["zero_feedback"] = result.zero_feedback
    return doc


def format_cluster(key: int) -> str:
    """A cluster key as the result's ``"cluster"`` field: 16 lowercase hex digits. A restart
    reads it back (``Engine.absorb_result``) so the user's lists keep their bootstrap weights."""
    return f"{key:016x}"


def parse_cluster(field: object) -> int:
    """The key of a result's ``"cluster"`` field (``format_cluster``); ValueError otherwise."""
    if not isinstance(field, str) or _CLUSTER.fullmatch(field) is None:
        raise ValueError(f"cluster must be 16 lowercase hex digits, got {field!r}")
    key = int(field, 16)
    if key == 0:
        raise ValueError("cluster 0000000000000000 is not a user's key")
    return key


class ReadResult(NamedTuple):
    """What a restart takes from a result record read back."""

    ts: int  # epoch ms
    labels: dict[str, str]
    row: list[float]  # the measures in the asked order, NaN where one is missing
    cluster: int | None  # None: no ``"cluster"`` (no user id, or written before the field)
    request_id: str
    query: str
    #: the ``"zero_feedback"`` field as written (None: none); its reader checks it
    zero_feedback: Any


def read_result(doc: Any, measure_names: Sequence[str]) -> ReadResult | None:
    """A document :func:`document` wrote, read back; None for a record that is not a result
    (bad ``ts``, labels, measures, cluster or query): read-back data must not crash a restart."""
    try:
        ts_ms = parse_timestamp(doc["ts"])
        labels = dict(doc.get("labels") or {})
        measures = doc.get("measures") or {}
        row = [float(measures.get(name, float("nan"))) for name in measure_names]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TypeError("labels must map strings to strings")
        cluster = doc.get("cluster")
        key = None if cluster is None else parse_cluster(cluster)
        query = doc.get("query") or ""
        if not isinstance(query, str):
            raise TypeError("query must be a string")
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    rid = str(doc.get("request_id", ""))
    return ReadResult(ts_ms, labels, row, key, rid, query, doc.get("zero_feedback"))
