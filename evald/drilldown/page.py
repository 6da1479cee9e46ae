"""``GET /queries``: the queries report (and the attribution of the comparisons' drops) of the
engine a process serves, as JSON on the metrics port (same TLS and auth as ``/metrics``).

Filters are query parameters: ``window`` (one of the configured widths, e.g. ``5m``),
``measure`` (a configured measure name), ``k`` (queries per list, 1 to 1000; default
``drilldown.top``) and any segment label key (``arm=treatment``). Anything else is a 400 that
names the parameter and the valid ones. The engine is read under the lock a scrape takes; a
loop holding it too long is a 503, as for ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from evald.drilldown.outputs import served_attribution
from evald.drilldown.report import Scope, query_report
from evald.durations import format_duration

if TYPE_CHECKING:
    from evald.engine import Engine

__all__ = ["QueriesPage"]


class QueriesPage:
    """The ``/queries`` page (a ``MetricsServer`` page): ``engine()`` is the engine being
    served (None while none is), read while holding ``lock``."""

    def __init__(
        self, engine: Callable[[], Engine | None], lock: AbstractContextManager[Any]
    ) -> None:
        self._engine = engine
        self._lock = lock

    def __call__(self, params: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        try:
            with self._lock:
                engine = self._engine()
                if engine is None:
                    return 503, {"error": "no engine is served yet (starting or restoring)"}
                try:
                    filters = _filters(engine, params)
                except ValueError as exc:
                    return 400, {"error": str(exc)}
                return 200, _document(engine, **filters)
        except TimeoutError as exc:  # the scrape lock's EngineBusy
            return 503, {"error": str(exc)}


def _filters(engine: Engine, params: dict[str, list[str]]) -> dict[str, Any]:
    """The report's filters from the query parameters; ValueError names a bad one."""
    config = engine.config
    widths = {format_duration(w): w for w in config.windows}
    out: dict[str, Any] = {"k": config.drilldown.top, "segment": {}}
    for name, values in params.items():
        value = values[-1]
        if name == "window":
            if value not in widths:
                raise ValueError(f"window: {value!r} is not one of {sorted(widths)}")
            out["width"] = widths[value]
        elif name == "measure":
            if value not in engine.measure_names:
                raise ValueError(f"measure: {value!r} is not one of {engine.measure_names}")
            out["measure"] = value
        elif name == "k":
            # isdigit alone takes '²', which int() refuses: the 400 would not name `k`
            if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 1000:
                raise ValueError(f"k: {value!r} is not a whole number from 1 to 1000")
            out["k"] = int(value)
        elif name in config.label_keys:
            out["segment"][name] = value
        else:
            valid = ["window", "measure", "k", *config.label_keys]
            raise ValueError(f"unknown parameter {name!r}; valid: {valid}")
    return out


def _document(engine: Engine, **filters: Any) -> dict[str, Any]:
    if engine.aggregates.queries is None:
        return {"queries": [], "note": "no query summaries are kept (drilldown.capacity is 0)"}
    scope = Scope(engine.aggregates)
    before = engine.complete_before()
    doc: dict[str, Any] = {"queries": query_report(scope, before, **filters)}
    if engine.statistics is not None:
        doc["attribution"] = served_attribution(engine)
    return doc
