"""The encoder writes exactly what prometheus_client writes, in both formats, and lints clean."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, Info
from prometheus_client import Counter as PromCounter
from prometheus_client.exposition import generate_latest as library_text
from prometheus_client.openmetrics.exposition import generate_latest as library_om
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.utils import floatToGoString

from evald.exposition import (
    ENGINE_FAMILIES,
    Encoder,
    EngineCollector,
    FrozenLabels,
    build_registry,
)
from evald.exposition.encoder import _go_float

from .support import (
    OPENMETRICS,
    engine_registry,
    scrape,
)

# --------------------------------------------------------------------------------------------
# Formats, promtool, registry composition
# --------------------------------------------------------------------------------------------


def test_openmetrics_and_text_carry_the_same_values(drained) -> None:
    engine, _ = drained
    registry = engine_registry(engine)
    text = scrape(registry)
    om = scrape(registry, OPENMETRICS)
    assert om == text
    types = {f.name: f.type for f in parse_om(Encoder().encode(registry, OPENMETRICS)[0].decode())}
    assert types == dict(ENGINE_FAMILIES)


def test_encoder_writes_exactly_what_prometheus_client_writes(drained) -> None:
    engine, _ = drained
    registry, _ = build_registry(engine, ready=lambda: True)
    PromCounter("evald_probe", "with _created", ["kind"], registry=registry).labels("a").inc()
    Info("evald_build", "info family", registry=registry).info({"version": "1"})

    families = list(registry.collect())  # once: process metrics move between calls

    class Frozen:
        def collect(self):
            return iter(families)

    encoder = Encoder()
    for _ in range(2):  # cold and warm cache
        assert encoder.text(families) == library_text(Frozen())
        assert encoder.openmetrics(families) == library_om(Frozen())


def test_encoder_falls_back_to_prometheus_client_where_it_has_no_fast_path() -> None:
    registry = CollectorRegistry()
    Gauge("evald.dotted", "a UTF-8 era name", registry=registry).set(2)
    hits = PromCounter("evald_hits", "with an exemplar", registry=registry)
    hits.inc(1, exemplar={"trace_id": "abc"})
    encoder = Encoder()
    body, content_type = encoder.encode(registry, OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert b'# {trace_id="abc"}' in body
    assert b"evald_dotted 2.0" in body
    body, content_type = encoder.encode(registry, "text/plain;version=1.0.0;escaping=allow-utf-8")
    assert "escaping=allow-utf-8" in content_type
    assert b'{"evald.dotted"} 2.0' in body


def test_name_filter_restricts_the_output(drained) -> None:
    engine, _ = drained
    body, _ = Encoder().encode(engine_registry(engine), names=["evald_pending_impressions"])
    assert body.decode().splitlines()[-1] == "evald_pending_impressions 0.0"
    assert b"evald_measure" not in body


@pytest.mark.prometheus
def test_promtool_check_metrics_is_clean(drained) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; `make test` installs it)")
    engine, _ = drained
    registry, _ = build_registry(engine, ready=lambda: True)
    body, _ = Encoder().encode(registry)
    assert b"evald_window_count" in body and b"process_cpu_seconds_total" in body
    done = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


# --------------------------------------------------------------------------------------------
# Encoder internals that the byte-equality tests may not reach
# --------------------------------------------------------------------------------------------


@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**60), max_value=2**60),
        st.sampled_from([0.0, -0.0, 999_999.9999, 1e6, 1_234_567.0, 1e-7, 2**53, -(2**53)]),
    )
)
def test_value_formatting_matches_prometheus_client(value: float) -> None:
    assert _go_float(value) == floatToGoString(value)


def test_frozen_labels_refuse_changes_so_identity_caching_is_safe() -> None:
    labels = FrozenLabels({"arm": "a"}, measure="RR")
    for change in (
        lambda: labels.__setitem__("arm", "b"),
        lambda: labels.update(arm="b"),
        lambda: labels.pop("arm"),
        lambda: labels.clear(),
        lambda: labels.setdefault("x", "y"),
        lambda: labels.popitem(),
        lambda: labels.__delitem__("arm"),
    ):
        with pytest.raises(TypeError):
            change()
    assert labels == {"arm": "a", "measure": "RR"}


def test_encoder_cache_is_bounded_and_still_correct_after_clearing(drained) -> None:
    """Fresh collectors hand out fresh label sets (as after an engine swap): the identity cache
    would keep every generation; max_cached clears it instead."""
    engine, _ = drained

    def scrape_with(encoder: Encoder) -> tuple[int, int]:
        families = list(EngineCollector(engine).collect())

        class Frozen:
            def collect(self):
                return iter(families)

        assert encoder.text(families) == library_text(Frozen())
        samples = [s for f in families for s in f.samples]
        frozen = sum(1 for s in samples if isinstance(s.labels, FrozenLabels))
        return frozen, len(samples) - frozen

    unbounded, bounded = Encoder(), Encoder(max_cached=100)
    for generation in range(1, 4):
        frozen, other = scrape_with(unbounded)
        assert frozen > 100
        assert len(unbounded._by_identity) == generation * frozen
        assert len(unbounded._by_content) == other
        scrape_with(bounded)
        assert len(bounded._by_identity) + len(bounded._by_content) == frozen + other
