"""The drill-down's part of a summary document: ``"queries"`` (per window and segment) and
``"attribution"`` (per comparison record that flags a drop), for ``evald replay --format json``
and ``GET /queries``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from evald.drilldown.drops import attribute, attribute_baseline, baseline_drops, flags_drop
from evald.drilldown.report import Scope, query_report
from evald.events import format_timestamp, parse_timestamp

if TYPE_CHECKING:
    from evald.engine import Engine

__all__ = ["attribution_records", "document", "every_window", "served_attribution"]


def document(
    engine: Engine, records: Sequence[Mapping[str, Any]] | None, *, final: bool
) -> dict[str, Any]:
    """``{"queries": [...], "attribution": [...]}`` (attribution only with comparisons); empty
    when no summaries are kept. ``final``: every window holding data counts as complete."""
    if engine.aggregates.queries is None:
        return {}
    scope = Scope(engine.aggregates)
    before = None if final else engine.complete_before()
    out: dict[str, Any] = {
        "queries": query_report(scope, before, final=final, k=engine.config.drilldown.top)
    }
    if records is not None:
        out["attribution"] = attribution_records(engine, scope, records, before)
    return out


def every_window(engine: Engine) -> list[dict[str, Any]]:
    """``replay --queries``: the report of every window still held (all data in), in order of
    width then time; empty when no summaries are kept."""
    if engine.aggregates.queries is None:
        return []
    k = engine.config.drilldown.top
    return query_report(Scope(engine.aggregates), None, final=True, last_only=False, k=k)


def attribution_records(
    engine: Engine,
    scope: Scope,
    records: Sequence[Mapping[str, Any]],
    complete_before: int | None,
) -> list[dict[str, Any]]:
    """One record per comparison record that flags a drop (``"against": "control"``), its
    explanations best first, over the comparison's windows ending by ``complete_before`` (None:
    every one held); then one per arm, comparison segment and measure whose CUSUM against its
    own trailing baseline crossed (``"against": "baseline"``): the window where it crossed
    against the baseline windows before it."""
    settings = engine.config.statistics
    comparisons = {c.name: c for c in settings.comparisons}
    out = []
    for record in records:
        if not flags_drop(record):
            continue
        explanations = attribute(
            scope,
            comparisons[record["comparison"]],
            record["treatment"],
            record["segment"],
            record["measure"],
            settings.window,
            complete_before,
            _since(record, settings.window),
        )
        out.append(
            {
                "comparison": record["comparison"],
                "treatment": record["treatment"],
                "segment": record["segment"],
                "measure": record["measure"],
                "against": "control",
                "arm": record["treatment"],
                "explanations": [e.to_json() for e in explanations],
            }
        )
    return out + _baseline_records(engine, scope, records)


def _baseline_records(
    engine: Engine, scope: Scope, records: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The ``"against": "baseline"`` records: an arm's baseline CUSUM is in the comparison
    record of every treatment, so each (comparison, arm, segment, measure) is listed once."""
    settings = engine.config.statistics
    comparisons = {c.name: c for c in settings.comparisons}
    width = settings.window
    seen: set[tuple[str, str, tuple[tuple[str, str], ...], str]] = set()
    out = []
    for record in records:
        for arm, (end, windows) in baseline_drops(record).items():
            segment = record["segment"]
            key = (record["comparison"], arm, tuple(sorted(segment.items())), record["measure"])
            if key in seen:
                continue
            seen.add(key)
            comparison = comparisons[record["comparison"]]
            explanations = attribute_baseline(
                scope,
                comparison,
                arm,
                segment,
                record["measure"],
                width,
                (end, windows),
                settings.baseline_windows,
            )
            out.append(
                {
                    "comparison": record["comparison"],
                    "treatment": arm,
                    "segment": segment,
                    "measure": record["measure"],
                    "against": "baseline",
                    "arm": arm,
                    "window_start": format_timestamp(end - windows * width),
                    "window_end": format_timestamp(end),
                    "explanations": [e.to_json() for e in explanations],
                }
            )
    return out


def _since(record: Mapping[str, Any], width: int) -> int | None:
    """Where the drop a record flags starts: a band below 0 or the minimum effect is a drop
    since the comparison's start (None); a drop flagged by the CUSUM alone is the one its
    current run saw, its last ``cusum_run_windows`` windows (before them a treatment better at
    first would hide it); once the run ended, since the start again. The run ends at
    ``end_ms`` (a record without it, from before it was written, at its RFC 3339 ``end``)."""
    upper = record.get("upper")
    run = record.get("cusum_run_windows") or 0
    if (upper is not None and upper < 0) or record.get("below_min_effect") or not run:
        return None
    end = record.get("end_ms")
    return (parse_timestamp(record["end"]) if end is None else int(end)) - run * width


def served_attribution(engine: Engine) -> list[dict[str, Any]]:
    """The attribution a running engine serves (``GET /queries``, ``evald_drop_contributor``):
    the folded comparisons' drops over the last complete windows; empty without comparisons,
    query summaries or a complete window. Read under the scrape lock."""
    live = engine.statistics
    before = engine.complete_before()
    if live is None or engine.aggregates.queries is None or before is None:
        return []
    from evald.statistics.live import summary

    alpha = live.settings.alpha
    records = [rec for view in live.views() for rec in summary(view, alpha)]
    return attribution_records(engine, Scope(engine.aggregates), records, before)
