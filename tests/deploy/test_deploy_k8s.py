"""Kubernetes manifests: parse, and cross-reference ports, probes, labels and selectors."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from deploy_support import DEPLOY, load_all_yaml, load_yaml

from deploy.generator.k8s import LIVENESS_PATH, READINESS_PATH
from deploy.generator.spec import Spec

K8S = DEPLOY / "k8s"


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    out = {}
    for name in kustomization["resources"]:
        (doc,) = load_all_yaml(K8S / name)
        out[doc["kind"]] = doc
    return out


def test_kustomization_lists_every_manifest_once() -> None:
    listed = load_yaml(K8S / "kustomization.yaml")["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)


def test_required_kinds_are_present(manifests: dict[str, dict[str, Any]]) -> None:
    required = {
        "Namespace",
        "StatefulSet",
        "PodDisruptionBudget",
        "Service",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
    }
    assert required <= set(manifests)
    kinds = [load_all_yaml(p)[0]["kind"] for p in K8S.glob("*.yaml")]
    assert kinds.count("ConfigMap") == 2  # settings + dashboards


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_deployment_probes_hit_healthz_and_readyz_on_the_metrics_port(
    manifests: dict[str, dict[str, Any]],
) -> None:
    container = _container(manifests["StatefulSet"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": Spec().metrics_port}
    assert container["livenessProbe"]["httpGet"] == {
        "path": LIVENESS_PATH,
        "port": "metrics",
        "scheme": "HTTP",
    }
    assert container["readinessProbe"]["httpGet"]["path"] == READINESS_PATH
    assert (LIVENESS_PATH, READINESS_PATH) == ("/healthz", "/readyz")


def test_selectors_match_pod_labels(manifests: dict[str, dict[str, Any]]) -> None:
    deployment = manifests["StatefulSet"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert manifests["Service"]["spec"]["selector"].items() <= pod_labels.items()
    monitor = manifests["PodMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= pod_labels.items()


def test_the_pod_monitor_scrapes_under_the_job_the_rules_select(
    manifests: dict[str, dict[str, Any]],
) -> None:
    """The operator's default job is <namespace>/<PodMonitor name>; the rules and the dashboard
    select job="evald" (EvaldDown, EvaldAbsent, the $job variable)."""
    pod_labels = manifests["StatefulSet"]["spec"]["template"]["metadata"]["labels"]
    job_label = manifests["PodMonitor"]["spec"]["jobLabel"]
    assert pod_labels[job_label] == Spec().app
    alerts = (DEPLOY / "prometheus/rules/evald-alerts.rules.yml").read_text(encoding="utf-8")
    assert f'up{{job="{Spec().app}"}}' in alerts


def test_service_and_pod_monitor_use_the_named_container_port(
    manifests: dict[str, dict[str, Any]],
) -> None:
    names = {p["name"] for p in _container(manifests["StatefulSet"])["ports"]}
    (svc_port,) = manifests["Service"]["spec"]["ports"]
    assert svc_port["targetPort"] in names and svc_port["port"] == Spec().metrics_port
    (endpoint,) = manifests["PodMonitor"]["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in names and endpoint["path"] == "/metrics"


def test_settings_configmap_is_mounted_and_binds_the_metrics_port(
    manifests: dict[str, dict[str, Any]],
) -> None:
    deployment = manifests["StatefulSet"]
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_path = container["args"][container["args"].index("--config") + 1]
    (mount,) = [m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"])]
    configmap_name = volumes[mount["name"]]["configMap"]["name"]
    settings_cm = next(
        doc
        for p in K8S.glob("*.yaml")
        for doc in load_all_yaml(p)
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == configmap_name
    )
    file_name = config_path.rsplit("/", 1)[1]
    settings = yaml.safe_load(settings_cm["data"][file_name])
    port = int(settings["daemon"]["metrics_address"].rsplit(":", 1)[1])
    assert port == Spec().metrics_port
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > settings["daemon"]["shutdown_timeout_s"]


def test_settings_in_the_configmap_are_valid_evald_settings(tmp_path) -> None:
    """The settings file the Deployment mounts is accepted by `evald run`'s loader."""
    from evald.daemon.settings import load_settings

    cm = load_yaml(K8S / "settings-configmap.yaml")
    path = tmp_path / "evald.yaml"
    path.write_text(cm["data"]["evald.yaml"])
    settings = load_settings(file=str(path), flags={}, environ={})
    assert settings.daemon.metrics_address.endswith(f":{Spec().metrics_port}")
    settings.engine_config()


def test_the_configmap_compares_the_arms_as_compose_and_the_rules_do(tmp_path) -> None:
    """The comparison alerts read evald_comparison_* / evald_cusum_*, exported only for a
    configured comparison: the pods compare the arms the rules were rendered for, with
    compose's comparison (its statistics window apart: compose runs event time 60x faster)."""
    from evald.cli import build_parser
    from evald.daemon.options import settings_from_args
    from evald.daemon.settings import load_settings

    cm = load_yaml(K8S / "settings-configmap.yaml")
    path = tmp_path / "evald.yaml"
    path.write_text(cm["data"]["evald.yaml"])
    config = load_settings(file=str(path), environ={}).engine_config()
    (comparison,) = config.statistics.comparisons
    spec = Spec()
    assert (comparison.label, comparison.control) == (spec.arm_label, spec.control)
    assert comparison.treatments == [spec.treatment]
    assert comparison.arm_scoped_labels == list(spec.arm_scoped_labels)
    assert config.measures == list(spec.measures)
    compose = load_yaml(DEPLOY.parent / "docker-compose.yml")
    argv = compose["services"]["evald"]["command"]
    composed_config = settings_from_args(build_parser().parse_args(argv)).engine_config()
    (composed,) = composed_config.statistics.comparisons
    assert comparison.model_dump() == composed.model_dump()
    assert comparison.min_effect and set(comparison.min_effect) <= set(config.measures)


def test_deployment_environment_is_accepted_by_evald_settings(
    manifests: dict[str, dict[str, Any]], tmp_path
) -> None:
    """EVALD_* variables are settings; those the pod sets (downward API values stood in for by
    a StatefulSet pod name) must load together with the mounted settings file."""
    from evald.daemon.settings import load_settings

    env = {
        item["name"]: item.get("value", "evald-1")
        for item in _container(manifests["StatefulSet"]).get("env", [])
    }
    assert env
    cm = load_yaml(K8S / "settings-configmap.yaml")
    path = tmp_path / "evald.yaml"
    path.write_text(cm["data"]["evald.yaml"])
    settings = load_settings(file=str(path), environ=env)
    assert settings.daemon.instance_id == "evald-1"


def test_pod_runs_as_non_root_with_a_read_only_root(manifests: dict[str, dict[str, Any]]) -> None:
    pod = manifests["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    container = _container(manifests["StatefulSet"])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_every_manifest_is_namespaced_consistently() -> None:
    namespaces = set()
    for path in K8S.glob("*.yaml"):
        for doc in load_all_yaml(path):
            if doc["kind"] in {"Namespace", "Kustomization"}:
                continue
            namespaces.add(doc["metadata"]["namespace"])
    (ns,) = load_all_yaml(K8S / "namespace.yaml")
    assert namespaces == {ns["metadata"]["name"]}


def test_dashboard_configmap_is_picked_up_by_the_grafana_sidecar(
    manifests: dict[str, dict[str, Any]],
) -> None:
    cm = load_yaml(K8S / "dashboard-configmap.yaml")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert list(cm["data"]) == ["evald.json"]


def test_instance_id_is_the_statefulset_pod_name_so_it_survives_restarts(
    manifests: dict[str, dict[str, Any]],
) -> None:
    """A StatefulSet pod keeps its name (<name>-<ordinal>) across restarts; as the instance id
    it names the transactional producer, so a restarted pod fences its predecessor."""
    env = {e["name"]: e for e in _container(manifests["StatefulSet"])["env"]}
    assert env["EVALD_DAEMON__INSTANCE_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    assert "Deployment" not in manifests


def test_service_links_are_off_so_they_cannot_collide_with_evald_settings(
    manifests: dict[str, dict[str, Any]],
) -> None:
    """Service links would inject EVALD_PORT, EVALD_SERVICE_HOST, ... (the Service is named
    evald), and every EVALD_* variable is read as a setting."""
    assert manifests["Service"]["metadata"]["name"].upper() == "EVALD"
    assert manifests["StatefulSet"]["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_disruption_budget_covers_the_pods_and_keeps_all_but_one(
    manifests: dict[str, dict[str, Any]],
) -> None:
    budget = manifests["PodDisruptionBudget"]["spec"]
    pod_labels = manifests["StatefulSet"]["spec"]["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items()
    assert budget["maxUnavailable"] == 1 < manifests["StatefulSet"]["spec"]["replicas"]


def test_image_is_the_one_the_documented_build_produces(
    manifests: dict[str, dict[str, Any]],
) -> None:
    compose = load_yaml(DEPLOY.parent / "docker-compose.yml")
    image = _container(manifests["StatefulSet"])["image"]
    assert image == compose["services"]["evald"]["image"]
    assert f"docker build -t {image} ." in (DEPLOY / "README.md").read_text()
    assert f"docker build -t {image} ." in (DEPLOY.parent / "Dockerfile").read_text()


CORE_KINDS = {"Namespace", "ConfigMap", "StatefulSet", "PodDisruptionBudget", "Service"}


@pytest.mark.parametrize("kind", sorted(CORE_KINDS))
def test_core_objects_validate_against_the_kubernetes_schema(
    kind: str, manifests: dict[str, dict[str, Any]]
) -> None:
    import kubernetes_validate

    docs = [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        for doc in load_all_yaml(path)
        if doc["kind"] == kind
    ]
    assert docs
    for doc in docs:
        # strict: a misspelt or misplaced field is an error, not silently ignored
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
