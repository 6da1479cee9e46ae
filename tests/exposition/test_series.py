"""The series table and docs/metrics-reference.md agree: every family documented, every
documented name real, the PromQL examples parse.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families as parse_text

from evald.exposition import (
    ENGINE_FAMILIES,
    SERIES,
    Encoder,
    EngineCollector,
    Series,
    SeriesShape,
    build_registry,
)
from evald.exposition.series import SEGMENT, SERIES_AGE

from .support import MINUTE, feed_all, make_engine, scrape, series, traffic

# --------------------------------------------------------------------------------------------
# docs/metrics-reference.md stays true to the exposition
# --------------------------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs"


def promql_examples() -> list[str]:
    """Every expression in the reference's promql blocks (blank lines separate them)."""
    text = (DOCS / "metrics-reference.md").read_text()
    out = []
    for block in re.findall(r"```promql\n(.*?)```", text, flags=re.S):
        for chunk in re.split(r"\n\s*\n", block):
            lines = [
                ln for ln in chunk.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
            ]
            if lines:
                out.append("\n".join(lines))
    return out


def test_reference_documents_every_exposed_family_and_only_real_names(drained) -> None:
    engine, _ = drained
    registry, _ = build_registry(engine, ready=lambda: True, process=False)
    exposed = scrape(registry)
    sample_names = {name for name, _ in exposed}
    family_names = {name for name, _ in ENGINE_FAMILIES} | {"evald_ready"}
    # a counter with no sample yet (evald_feedback_skipped under the native schema)
    family_names |= {name + "_total" for name, kind in ENGINE_FAMILIES if kind == "counter"}
    contract = set(re.findall(r"`(evald_[a-z0-9_]+)`", (DOCS / "architecture.md").read_text()))
    reference = (DOCS / "metrics-reference.md").read_text()
    documented = set(re.findall(r"\bevald_[a-z0-9_]*[a-z0-9]\b", reference))  # not evald_window_*
    for name, kind in [*ENGINE_FAMILIES, ("evald_ready", "gauge")]:
        shown = name + "_total" if kind == "counter" else name
        assert f"`{shown}`" in reference, f"{shown} is not in docs/metrics-reference.md"
    unknown = documented - sample_names - family_names - contract
    assert not unknown, f"the reference names series evald does not expose: {sorted(unknown)}"
    assert len(promql_examples()) >= 15


@pytest.mark.prometheus
def test_reference_promql_examples_parse(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; `make test` installs it)")
    rules = [
        {"record": f"docs:example_{i}", "expr": expr} for i, expr in enumerate(promql_examples())
    ]
    path = tmp_path / "examples.rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "docs", "rules": rules}]}))  # JSON is YAML
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout.decode()


# --------------------------------------------------------------------------------------------
# The table is the single source: rendered, described, counted and documented from it
# --------------------------------------------------------------------------------------------

UNTYPED = {"unknown": "untyped"}


def test_every_series_in_the_table_is_rendered_with_its_type_help_and_labels(drained) -> None:
    engine, _ = drained
    registry, _ = build_registry(engine, process=False)
    body, _ = Encoder().encode(registry)
    families = {family.name: family for family in parse_text(body.decode())}
    assert [name for name, _ in ENGINE_FAMILIES] == [entry.name for entry in SERIES] + [SERIES_AGE]
    for entry in SERIES:
        family = families.get(entry.name)
        assert family is not None, f"{entry.name} is not rendered"
        # the native schema skips no action; tests/mapping renders that family with samples;
        # a drained engine has no impression waiting (tests/top renders the oldest one);
        # this one has no drop (tests/drilldown/test_contributors.py renders contributors)
        native_empty = entry.name in (
            "evald_feedback_skipped",
            "evald_oldest_open_impression_timestamp_seconds",
            "evald_drop_contributor",
        )
        assert bool(family.samples) != native_empty, f"{entry.name}: {family.samples}"
        assert family.type == entry.kind, entry.name
        assert family.documentation == entry.help, entry.name
        expected: list[str] = []
        for label in entry.labels:
            expected.extend(engine.segments.keys if label == SEGMENT else [label])
        for sample in family.samples:
            names = set(sample.labels) - ({"le"} if entry.kind == "histogram" else set())
            assert names == set(expected), (entry.name, sample)


def test_every_series_in_the_table_is_documented_with_its_type() -> None:
    reference = (DOCS / "metrics-reference.md").read_text().splitlines()
    for entry in SERIES:
        shown = entry.name + "_total" if entry.kind == "counter" else entry.name
        lines = [line for line in reference if f"`{shown}`" in line]
        assert lines, f"{shown} is not in docs/metrics-reference.md"
        kind = UNTYPED.get(entry.kind, entry.kind)
        assert any(kind in line for line in lines), f"{shown}: its type {kind} is not documented"


def test_a_new_series_is_one_entry_rendered_described_and_counted() -> None:
    """What a contributor adds: one Series. Nothing else needs an edit for it to be exposed,
    refused as a duplicate at register(), and counted in the series budget."""
    extra = Series(
        "evald_test_partitions",
        "gauge",
        "Input partitions with a store.",
        ("kind",),
        lambda engine: len(engine.watermarks()),
        lambda n: [(("all",), n)],
        fixed=lambda config: 1,
    )
    table = (*SERIES, extra)
    engine = make_engine()
    feed_all(engine, traffic(seed=3, n=20, span_ms=MINUTE)[1])
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine, series=table))  # type: ignore[arg-type]
    samples = scrape(registry)
    assert series(samples, "evald_test_partitions", kind="all") == len(engine.watermarks()) == 2
    with pytest.raises(ValueError, match="evald_test_partitions"):
        registry.register(EngineCollector(engine, series=[extra]))  # type: ignore[arg-type]
    before, after = SeriesShape.of(engine.config), SeriesShape.of(engine.config, table)
    assert (after.per_segment, after.fixed) == (before.per_segment, before.fixed + 1)
