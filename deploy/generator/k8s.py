"""Kubernetes manifests for `evald run`, rendered from a :class:`Spec` and the rule/dashboard text.

The PrometheusRule and the dashboard ConfigMap embed the very files compose mounts (parsed
rule groups; the dashboard JSON verbatim), so there is one source of truth and nothing drifts.
Ports, probe paths and labels come from the spec, so the StatefulSet, Service and PodMonitor
cannot disagree either.

evald runs as a StatefulSet, not a Deployment: the pod name (``evald-0``, ``evald-1``, …) is its
instance id, and it survives a restart or a reschedule. The instance id names the transactional
producer, so a restarted pod fences whatever its predecessor left open and aborts it at once;
a pod name that changed on every restart (a Deployment's) left that transaction to the broker's
transaction timeout, blocking ``read_committed`` readers and the partitions' new owner meanwhile
(docs/design.md).
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from deploy.generator.spec import Spec
from deploy.generator.yamlout import dump, generated_header

PORT_NAME = "metrics"
LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"
SETTINGS_FILE = "evald.yaml"
SETTINGS_DIR = "/etc/evald"
SHUTDOWN_TIMEOUT_S = 30
PARTITIONS = 6  # per input topic; replicas beyond this would sit idle
REPLICAS = 2

Manifest = dict[str, Any]


NAME_LABEL = "app.kubernetes.io/name"


def _labels(spec: Spec) -> dict[str, str]:
    return {NAME_LABEL: spec.app, "app.kubernetes.io/component": "daemon"}


def _meta(spec: Spec, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": _labels(spec), **extra}


#: the minimum effect the treatment-below-control alert waits for, on the first two measures
#: (nDCG@10 and RR by default), as docker-compose.yml's comparison
MIN_EFFECT = 0.01
ALERTING_MEASURES = 2


def comparison(spec: Spec) -> dict[str, Any]:
    """The comparison `evald run` exports evald_comparison_* / evald_cusum_* for: the arms the
    rules and dashboard were rendered for, from the first window (``start``: set it to the
    experiment's start, docs/statistics.md)."""
    return {
        "name": "ab",
        "label": spec.arm_label,
        "control": spec.control,
        "treatments": [spec.treatment],
        "start": 0,
        "arm_scoped_labels": list(spec.arm_scoped_labels),
        "min_effect": dict.fromkeys(spec.measures[:ALERTING_MEASURES], MIN_EFFECT),
    }


def settings_text(spec: Spec) -> str:
    """The `evald run` settings file (see docs/daemon.md); secrets belong in a Secret/env."""
    settings = {
        "kafka": {"bootstrap_servers": ["kafka-bootstrap:9092"], "client_id": spec.app},
        "topics": {
            "impressions": "evald.impressions",
            "feedback": "evald.feedback",
            "results": "evald.results",
            "dlq": "evald.dlq",
        },
        "daemon": {
            "group_id": spec.app,
            "metrics_address": f"0.0.0.0:{spec.metrics_port}",
            "shutdown_timeout_s": SHUTDOWN_TIMEOUT_S,
        },
        "engine": {
            "window": "30m",
            "lateness": "2m",
            "label_keys": list(spec.segment_labels),
            # the measures the rules and dashboard were rendered for
            "measures": list(spec.measures),
            "statistics": {"comparisons": [comparison(spec)]},
        },
    }
    return yaml.safe_dump(settings, sort_keys=False)


def settings_configmap(spec: Spec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(spec, f"{spec.app}-settings"),
        "data": {SETTINGS_FILE: settings_text(spec)},
    }


def statefulset(spec: Spec) -> Manifest:
    probe = {"port": PORT_NAME, "scheme": "HTTP"}
    checksum = hashlib.sha256(settings_text(spec).encode()).hexdigest()
    container = {
        "name": spec.app,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["run", "--config", f"{SETTINGS_DIR}/{SETTINGS_FILE}"],
        "env": [
            # the pod name, <statefulset>-<ordinal>: a unique instance id that stays the same
            # when the pod restarts, so the new incarnation fences the old one's transaction
            {
                "name": "EVALD_DAEMON__INSTANCE_ID",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
            },
        ],
        "ports": [{"name": PORT_NAME, "containerPort": spec.metrics_port, "protocol": "TCP"}],
        "livenessProbe": {
            "httpGet": {"path": LIVENESS_PATH, **probe},
            "periodSeconds": 10,
            "timeoutSeconds": 3,
            "failureThreshold": 6,
        },
        "readinessProbe": {
            # not ready while restoring state or while the broker is unreachable
            "httpGet": {"path": READINESS_PATH, **probe},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        "startupProbe": {
            "httpGet": {"path": LIVENESS_PATH, **probe},
            "periodSeconds": 2,
            "failureThreshold": 30,
        },
        "resources": {
            "requests": {"cpu": "500m", "memory": "512Mi"},
            "limits": {"memory": "1Gi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "settings", "mountPath": SETTINGS_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(spec, spec.app),
        "spec": {
            "replicas": REPLICAS,
            "serviceName": spec.app,
            # instances are peers in one consumer group: no reason to start them one by one
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _labels(spec)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {
                    "labels": _labels(spec),
                    "annotations": {"checksum/settings": checksum},
                },
                "spec": {
                    # evald drains, commits and leaves the group within shutdown_timeout_s
                    "terminationGracePeriodSeconds": SHUTDOWN_TIMEOUT_S + 15,
                    # service links would put EVALD_PORT, EVALD_SERVICE_HOST, … into the
                    # environment, where every EVALD_* variable is read as a setting
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [
                        {"name": "settings", "configMap": {"name": f"{spec.app}-settings"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def pod_disruption_budget(spec: Spec) -> Manifest:
    """At most one instance evicted at a time (node drains): its partitions move to the others,
    which then wait for its transaction to be aborted before reading them."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(spec, spec.app),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _labels(spec)}},
    }


def service(spec: Spec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, spec.app),
        "spec": {
            "selector": _labels(spec),
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": spec.metrics_port,
                    "targetPort": PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def pod_monitor(spec: Spec) -> Manifest:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(spec, spec.app),
        "spec": {
            # job = the pod's app.kubernetes.io/name (spec.app), the job the rules and the
            # dashboard select; without it the operator's default, <namespace>/<name>, matches
            # neither (EvaldAbsent would fire on a healthy deployment)
            "jobLabel": NAME_LABEL,
            "selector": {"matchLabels": _labels(spec)},
            "podMetricsEndpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": "15s"}],
        },
    }


def prometheus_rule(spec: Spec, rule_files: dict[str, str]) -> Manifest:
    groups: list[Any] = []
    for text in rule_files.values():
        groups.extend(yaml.safe_load(text)["groups"])
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta(spec, spec.app),
        "spec": {"groups": groups},
    }


def dashboard_configmap(spec: Spec, dashboards: dict[str, str]) -> Manifest:
    meta = _meta(spec, f"{spec.app}-dashboards")
    # the Grafana sidecar (kube-prometheus-stack) loads ConfigMaps with this label
    meta["labels"] = {**meta["labels"], "grafana_dashboard": "1"}
    meta["annotations"] = {"grafana_folder": spec.app}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(dashboards)}


def namespace(spec: Spec) -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.namespace}}


def render(spec: Spec, rule_files: dict[str, str], dashboards: dict[str, str]) -> dict[str, str]:
    """``{path relative to deploy/: YAML text}`` for every manifest and the kustomization."""
    header = generated_header("deploy/prometheus/rules, deploy/grafana/dashboards")
    manifests = {
        "namespace.yaml": namespace(spec),
        "settings-configmap.yaml": settings_configmap(spec),
        "statefulset.yaml": statefulset(spec),
        "poddisruptionbudget.yaml": pod_disruption_budget(spec),
        "service.yaml": service(spec),
        "podmonitor.yaml": pod_monitor(spec),
        "prometheusrule.yaml": prometheus_rule(spec, rule_files),
        "dashboard-configmap.yaml": dashboard_configmap(spec, dashboards),
    }
    out = {f"k8s/{name}": dump(doc, header=header) for name, doc in manifests.items()}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(manifests),
    }
    out["k8s/kustomization.yaml"] = dump(kustomization, header=header)
    return out
