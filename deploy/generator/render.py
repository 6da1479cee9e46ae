"""Render every generated deployment file from one :class:`Spec` into ``{path: text}``."""

from __future__ import annotations

from collections.abc import Callable

from deploy.generator import dashboard, k8s, rule_tests, rules
from deploy.generator.spec import Spec
from deploy.generator.yamlout import dump, generated_header

RECORDING_RULES = "prometheus/rules/evald-recording.rules.yml"
ALERT_RULES = "prometheus/rules/evald-alerts.rules.yml"
ALERT_TESTS = "prometheus/tests/evald-alerts.test.yml"
DASHBOARD = "grafana/dashboards/evald.json"

SOURCE = "deploy/generator"


def render_sources(spec: Spec) -> dict[str, str]:
    """Rules, rule tests and the dashboard: the sources the k8s manifests are built from."""
    header = generated_header(SOURCE)
    return {
        RECORDING_RULES: dump({"groups": rules.recording_groups(spec)}, header=header),
        ALERT_RULES: dump({"groups": rules.alert_groups(spec)}, header=header),
        ALERT_TESTS: dump(rule_tests.build(spec), header=header),
        DASHBOARD: dashboard.render(spec),
    }


def render_all(spec: Spec, read: Callable[[str], str] | None = None) -> dict[str, str]:
    """Every generated file, paths relative to ``deploy/``.

    The k8s PrometheusRule and dashboard ConfigMap are built from the rendered rule and
    dashboard TEXT (``read`` fetches it; by default the freshly rendered text), so the manifests
    are exact copies of the files Prometheus and Grafana load in compose.
    """
    sources = render_sources(spec)
    fetch = read or sources.__getitem__
    manifests = k8s.render(
        spec,
        rule_files={name: fetch(name) for name in (RECORDING_RULES, ALERT_RULES)},
        dashboards={DASHBOARD.rsplit("/", 1)[1]: fetch(DASHBOARD)},
    )
    return {**sources, **manifests}
