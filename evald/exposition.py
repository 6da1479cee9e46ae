"""Prometheus exposition: a custom collector over an Engine, a private registry, a fast encoder.

Why a custom collector: the engine keeps plain counters and numpy arrays; building metric
families from them at scrape time costs nothing on the event hot path (no per-event
``.labels()`` lookups, no locks taken per event).

Why an own encoder: prometheus_client's encoders re-sort and re-escape every label set of every
sample on every scrape, which at 10k series is most of a 100 ms budget. :class:`Encoder` writes
the same bytes (text 0.0.4 and OpenMetrics 1.0.0, checked byte for byte in the tests) but caches
each series' rendered name-and-labels prefix across scrapes; anything it does not handle
(exemplars, native histograms, UTF-8 names, other escapings) falls back to prometheus_client.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Protocol

from prometheus_client.exposition import choose_encoder
from prometheus_client.exposition import generate_latest as _text_generate
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as _om
from prometheus_client.utils import floatToGoString

__all__ = ["Collector", "Encoder"]


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

    Thread-safe for concurrent scrapes: the cache is a dict only ever filled with identical
    values. It is cleared when it exceeds ``max_cached`` entries, so label churn cannot grow it
    without bound.
    """

    def __init__(self, max_cached: int = 200_000) -> None:
        self.max_cached = max_cached
        self._text_prefix: dict[tuple, str] = {}
        self._om_prefix: dict[tuple, str] = {}

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
        if names:
            registry = registry.restricted_registry(names)  # type: ignore[attr-defined]
        library_encoder, content_type = choose_encoder(accept or "")
        families = list(registry.collect())
        fixed = _Fixed(families)
        try:
            if library_encoder is _text_generate or _is_partial(
                library_encoder, _text_generate, escaping=_om.UNDERSCORES
            ):
                return self.text(families), content_type
            if _is_partial(
                library_encoder, _om.generate_latest, escaping=_om.UNDERSCORES, version="1.0.0"
            ):
                return self.openmetrics(families), content_type
        except _Fallback:
            pass
        return library_encoder(fixed), content_type

    def text(self, families: Iterable[Metric]) -> bytes:
        """Prometheus text format 0.0.4, byte-identical to ``prometheus_client.generate_latest``."""
        cache = self._text_prefix
        if len(cache) > self.max_cached:
            cache.clear()
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
                key = (sname, *labels.items())
                prefix = cache.get(key)
                if prefix is None:
                    prefix = _prefix(_legacy(sname), labels)
                    cache[key] = prefix
                line = prefix + floatToGoString(value)
                if timestamp is not None:
                    line += f" {int(float(timestamp) * 1000):d}"
                line += "\n"
                suffix = sname[len(name) :] if sname.startswith(name) else ""
                if suffix in _TEXT_SPLIT_SUFFIXES:
                    split.setdefault(suffix, []).append(line)
                else:
                    append(line)
            for suffix, lines in sorted(split.items()):
                append(f"# HELP {name}{suffix} {doc}\n# TYPE {name}{suffix} gauge\n")
                out.extend(lines)
        return "".join(out).encode("utf-8")

    def openmetrics(self, families: Iterable[Metric]) -> bytes:
        """OpenMetrics 1.0.0 text, byte-identical to prometheus_client's OpenMetrics encoder."""
        cache = self._om_prefix
        if len(cache) > self.max_cached:
            cache.clear()
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
                key = (sname, *labels.items())
                prefix = cache.get(key)
                if prefix is None:
                    prefix = _prefix(_legacy(sname), labels)
                    cache[key] = prefix
                line = prefix if value is None else prefix + floatToGoString(value)
                if timestamp is not None:
                    line += f" {timestamp}"
                append(line + "\n")
        append("# EOF\n")
        return "".join(out).encode("utf-8")


def _legacy(name: str) -> str:
    """Names the fast path can write verbatim; anything else goes to the library encoder."""
    if _LEGACY_NAME.match(name) is None:
        raise _Fallback
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
