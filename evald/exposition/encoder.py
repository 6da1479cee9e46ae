"""The text-format encoder: renders collected families as prometheus_client does, faster.

Why an own encoder: prometheus_client's encoders re-sort and re-escape every label set of every
sample on every scrape, which at 10k series is most of a 100 ms budget. :class:`Encoder` writes
the same bytes (text 0.0.4 and OpenMetrics 1.0.0, checked byte for byte in the tests) but caches
each series' rendered name-and-labels prefix across scrapes; anything it does not handle
(exemplars, native histograms, UTF-8 names, other escapings) falls back to prometheus_client.
Label sets handed out as :class:`FrozenLabels` are cached by identity, any other by content.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Protocol

from prometheus_client.exposition import choose_encoder
from prometheus_client.exposition import generate_latest as _text_generate
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as _om
from prometheus_client.utils import floatToGoString

from evald.exposition.shared import SingleFlight

__all__ = ["Collector", "Encoder", "FrozenLabels"]


class Collector(Protocol):
    """Anything a CollectorRegistry can hold (prometheus_client's protocol, restated for typing)."""

    def collect(self) -> Iterable[Metric]: ...


_LEGACY_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TEXT_TYPE = {
    "counter": "counter",
    "info": "gauge",
    "stateset": "gauge",
    "gaugehistogram": "histogram",
    "unknown": "untyped",
}
_TEXT_SUFFIX = {"counter": "_total", "info": "_info"}
# Samples prometheus_client's text encoder moves into a separate gauge family after their parent.
_TEXT_SPLIT_SUFFIXES = ("_created", "_gsum", "_gcount")


class _Fallback(Exception):
    """The fast path cannot render this output identically; use prometheus_client's encoder."""


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Encoder:
    """Render a registry like prometheus_client does, with a per-series prefix cache.

    Thread-safe for concurrent scrapes: concurrent requests for the same output (registry,
    format, ``names``) share one rendering (:class:`SingleFlight`); the prefix cache is a dict
    only ever filled with identical values, cleared when it exceeds ``max_cached`` entries, so
    label churn cannot grow it without bound.
    """

    def __init__(self, max_cached: int = 200_000) -> None:
        self.max_cached = max_cached
        self.shared: SingleFlight[bytes] = SingleFlight()
        #: renderings made (shared ones count once); for tests and benchmarks
        self.renders = 0
        # ``name{labels} `` per series; both formats write it alike. Label sets the engine
        # collector hands out as FrozenLabels are keyed by identity (the entry keeps the dict
        # alive, so its id cannot be reused); any other dict by content.
        self._by_identity: dict[tuple[str, int], tuple[FrozenLabels, str]] = {}
        self._by_content: dict[tuple, str] = {}

    def _prefix_of(self, sname: str, labels: dict[str, str]) -> str:
        if labels.__class__ is FrozenLabels:
            entry = self._by_identity.get((sname, id(labels)))
            if entry is not None and entry[0] is labels:
                return entry[1]
            prefix = _prefix(_legacy(sname), labels)
            self._by_identity[(sname, id(labels))] = (labels, prefix)
            return prefix
        key = (sname, *labels.items())
        known = self._by_content.get(key)
        if known is None:
            known = self._by_content[key] = _prefix(_legacy(sname), labels)
        return known

    def _trim(self) -> None:
        if len(self._by_identity) + len(self._by_content) > self.max_cached:
            self._by_identity.clear()
            self._by_content.clear()

    def encode(
        self,
        registry: Collector,
        accept: str | None = None,
        *,
        names: Sequence[str] | None = None,
    ) -> tuple[bytes, str]:
        """Body and Content-Type for a scrape with this ``Accept`` header.

        ``names`` restricts the output to those sample names (Prometheus' ``name[]`` query
        parameter), as prometheus_client's own handler does.
        """
        library_encoder, content_type = choose_encoder(accept or "")
        key = (registry, content_type, tuple(names or ()))
        body = self.shared.run(key, lambda: self._render(registry, library_encoder, names))
        return body, content_type

    def _render(
        self,
        registry: Collector,
        library_encoder: Callable[[Any], bytes],
        names: Sequence[str] | None,
    ) -> bytes:
        self.renders += 1
        if names:
            registry = registry.restricted_registry(names)  # type: ignore[attr-defined]
        families = list(registry.collect())
        fixed = _Fixed(families)
        try:
            if library_encoder is _text_generate or _is_partial(
                library_encoder, _text_generate, escaping=_om.UNDERSCORES
            ):
                return self.text(families)
            if _is_partial(
                library_encoder, _om.generate_latest, escaping=_om.UNDERSCORES, version="1.0.0"
            ):
                return self.openmetrics(families)
        except _Fallback:
            pass
        return library_encoder(fixed)

    def text(self, families: Iterable[Metric]) -> bytes:
        """Prometheus text format 0.0.4, byte-identical to ``prometheus_client.generate_latest``."""
        self._trim()
        prefix_of = self._prefix_of
        out: list[str] = []
        append = out.append
        for metric in families:
            name = _legacy(metric.name)
            kind = metric.type
            exposed = name + _TEXT_SUFFIX.get(kind, "")
            doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            append(f"# HELP {exposed} {doc}\n# TYPE {exposed} {_TEXT_TYPE.get(kind, kind)}\n")
            split: dict[str, list[str]] = {}
            for sample in metric.samples:
                sname, labels, value, timestamp, _exemplar, native = sample
                if native is not None:
                    raise _Fallback
                line = prefix_of(sname, labels) + _go_float(value)
                if timestamp is not None:
                    line += f" {int(float(timestamp) * 1000):d}"
                line += "\n"
                if sname.endswith(_TEXT_SPLIT_SUFFIXES) and sname[len(name) :] in (
                    _TEXT_SPLIT_SUFFIXES
                ):
                    split.setdefault(sname[len(name) :], []).append(line)
                else:
                    append(line)
            for suffix, lines in sorted(split.items()):
                append(f"# HELP {name}{suffix} {doc}\n# TYPE {name}{suffix} gauge\n")
                out.extend(lines)
        return "".join(out).encode("utf-8")

    def openmetrics(self, families: Iterable[Metric]) -> bytes:
        """OpenMetrics 1.0.0 text, byte-identical to prometheus_client's OpenMetrics encoder."""
        self._trim()
        prefix_of = self._prefix_of
        out: list[str] = []
        append = out.append
        for metric in families:
            name = _legacy(metric.name)
            append(
                f"# HELP {name} {_escape_value(metric.documentation)}\n"
                f"# TYPE {name} {metric.type}\n"
            )
            if metric.unit:
                append(f"# UNIT {name} {metric.unit}\n")
            for sample in metric.samples:
                sname, labels, value, timestamp, exemplar, native = sample
                if native is not None or exemplar:
                    raise _Fallback
                prefix = prefix_of(sname, labels)
                line = prefix if value is None else prefix + _go_float(value)
                if timestamp is not None:
                    line += f" {timestamp}"
                append(line + "\n")
        append("# EOF\n")
        return "".join(out).encode("utf-8")


class FrozenLabels(dict[str, str]):
    """A label set that never changes after construction, so encoders may cache by identity.

    The engine collector builds one per series and reuses it across scrapes.
    """

    __slots__ = ()

    def _frozen(self, *args: object, **kwargs: object) -> None:
        raise TypeError("FrozenLabels cannot be changed")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _frozen  # type: ignore[assignment]
    __ior__ = _frozen  # type: ignore[assignment]


_INF = math.inf


def _go_float(value: float) -> str:
    """Same string as prometheus_client's ``floatToGoString``, without its work for the
    common case: a finite number below 1e6 is exactly ``repr(float(value))``."""
    cls = value.__class__
    if cls is float:
        if -_INF < value < 1e6:  # NaN fails both comparisons
            return repr(value)
    elif cls is int and -(2**53) < value < 1_000_000:
        return repr(float(value))
    return floatToGoString(value)


_KNOWN_LEGACY: set[str] = set()


def _legacy(name: str) -> str:
    """Names the fast path can write verbatim; anything else goes to the library encoder."""
    if name in _KNOWN_LEGACY:
        return name
    if _LEGACY_NAME.match(name) is None:
        raise _Fallback
    if len(_KNOWN_LEGACY) < 10_000:  # names are few; never let odd input grow it unbounded
        _KNOWN_LEGACY.add(name)
    return name


def _prefix(sample_name: str, labels: dict[str, str]) -> str:
    """``name{a="x",b="y"} `` with labels sorted and values escaped, as both formats write it."""
    if not labels:
        return sample_name + " "
    parts = []
    for key, value in sorted(labels.items()):
        parts.append(f'{_legacy(key)}="{_escape_value(value)}"')
    return sample_name + "{" + ",".join(parts) + "} "


def _is_partial(fn: object, func: object, **keywords: str) -> bool:
    return (
        isinstance(fn, partial)
        and fn.func is func
        and not fn.args
        and all(fn.keywords.get(k) == v for k, v in keywords.items())
        and set(fn.keywords) <= set(keywords)
    )


class _Fixed:
    """Already collected families, so a fallback does not scrape the collectors twice."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return iter(self._families)
