"""``evald_drop_contributor``: the top three explanations of each flagged drop as series, for
the drop alerts' annotations and the dashboard's worst-queries table.

Why series and not the ``/queries`` JSON: Alertmanager receivers and Grafana read Prometheus
(an alert's annotation can query it; Grafana needs a plugin for JSON), and three series per
comparison x arm x measure x comparison segment x kind of drop is a bound the series budget
can count, so a query's text becomes a label only inside this top three (issue 27's rule for
query labels).

Each kind of drop (``against``: ``control``, a treatment against the control, what
EvaldTreatmentBelowControl and EvaldTreatmentDropDetected fire on; ``baseline``, an arm against
its own trailing baseline, what EvaldArmDropDetected fires on) has its own top three: a
treatment flagged both ways has two explanations over different windows, and each alert must
name the one of the drop it fires on.

Derived at scrape time from what the engine serves (the attribution of ``GET /queries``: the
folded comparisons and the window sums and query summaries, all restored exactly after a
restart), so it holds no state of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from evald.drilldown.outputs import served_attribution

if TYPE_CHECKING:
    from evald.config import EngineConfig
    from evald.engine import Engine

__all__ = ["TOP", "contributor_rows", "contributors", "per_segment"]

#: contributors exported per drop
TOP = 3

#: ``(comparison, measure, against, segment label values..., rank, dimension, value)`` and
#: the share
Contributor = tuple[tuple[str, ...], float]


def contributors(engine: Engine) -> list[Contributor]:
    """Read under the scrape lock: the top ``TOP`` explanations of each drop the served
    attribution lists, ranked ``"1"`` (best) to ``"3"``, valued by their share of the drop
    (explanatory power). One drop per comparison, measure, kind (``against``), arm and
    comparison segment, as the attribution lists them; a repeat would be a duplicate series,
    so only the first is kept."""
    keys = list(engine.config.label_keys)
    settings = engine.config.statistics
    labels_of = {c.name: c.label for c in settings.comparisons}
    out: list[Contributor] = []
    seen: set[tuple[str, ...]] = set()
    for record in served_attribution(engine):
        values = dict(record["segment"])
        values[labels_of[record["comparison"]]] = record["arm"]
        head = (
            record["comparison"],
            record["measure"],
            record["against"],
            *(values.get(k, "") for k in keys),
        )
        if head in seen:
            continue
        seen.add(head)
        for rank, explanation in enumerate(record["explanations"][:TOP], 1):
            tail = (str(rank), explanation["dimension"], explanation["value"])
            out.append(((*head, *tail), float(explanation["explanatory_power"])))
    return out


def contributor_rows(state: list[Contributor]) -> Iterable[Contributor]:
    return state


def per_segment(config: EngineConfig) -> int:
    """At worst ``TOP`` per drop and measure of each comparison, per comparison segment: each
    treatment against the control, and each arm (the control too) against its own baseline;
    none without query summaries."""
    if not config.drilldown.capacity:
        return 0
    drops = sum(len(c.treatments) + 1 + len(c.treatments) for c in config.statistics.comparisons)
    return TOP * drops * len(config.measures)
