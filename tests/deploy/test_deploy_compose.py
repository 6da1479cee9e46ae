"""docker-compose.yml, checked offline (no Docker engine here): structure, references, mounts,
ports, and that every evald command line is accepted by evald's own parser."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from deploy_support import DEPLOY, REPO, load_yaml

from deploy.generator.spec import Spec

COMPOSE = REPO / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _depends(service: dict[str, Any]) -> dict[str, dict[str, str]]:
    deps = service.get("depends_on", {})
    return {name: {} for name in deps} if isinstance(deps, list) else deps


def test_the_expected_services_exist(compose: dict[str, Any]) -> None:
    assert set(services(compose)) == {
        "kafka",
        "kafka-init",
        "evald",
        "producer",
        "prometheus",
        "grafana",
    }


def test_depends_on_names_services_with_valid_conditions(compose: dict[str, Any]) -> None:
    svc = services(compose)
    allowed = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, service in svc.items():
        for dep, options in _depends(service).items():
            assert dep in svc, f"{name} depends on unknown service {dep}"
            assert dep != name
            condition = options.get("condition", "service_started")
            assert condition in allowed
            if condition == "service_healthy":
                # a service waited on for health must define (or inherit from the image) one
                dep_svc = svc[dep]
                assert "healthcheck" in dep_svc or dep_svc.get("build"), dep


def test_dependency_graph_is_acyclic(compose: dict[str, Any]) -> None:
    svc = services(compose)
    state: dict[str, int] = {}

    def visit(name: str) -> None:
        assert state.get(name) != 1, f"dependency cycle through {name}"
        if state.get(name) == 2:
            return
        state[name] = 1
        for dep in _depends(svc[name]):
            visit(dep)
        state[name] = 2

    for name in svc:
        visit(name)


def _bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


def test_every_mounted_host_path_exists(compose: dict[str, Any]) -> None:
    named = set(compose.get("volumes", {}))
    mounted = 0
    for name, service in services(compose).items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (REPO / source).resolve().exists(), f"{name}: {source} does not exist"
                mounted += 1
            else:
                assert source in named, f"{name}: named volume {source} not declared"
    assert mounted >= 3


def test_published_ports_do_not_collide(compose: dict[str, Any]) -> None:
    published: dict[str, str] = {}
    for name, service in services(compose).items():
        for port in service.get("ports", []):
            host = str(port).split(":")[0]
            assert host not in published, f"{name} and {published[host]} both publish {host}"
            published[host] = name
    assert published == {"29092": "kafka", "9464": "evald", "9090": "prometheus", "3000": "grafana"}


def _flag(command: list[str], name: str) -> str:
    for i, arg in enumerate(command):
        if arg == name:
            return command[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {command}")


def test_prometheus_scrapes_the_evald_service_on_its_metrics_port(
    compose: dict[str, Any],
) -> None:
    svc = services(compose)
    evald = svc["evald"]
    address = _flag(evald["command"], "--metrics-address")
    port = int(address.rsplit(":", 1)[1])
    assert address.startswith("0.0.0.0:")  # reachable from the other containers
    assert port == Spec().metrics_port
    assert f"{port}:{port}" in evald["ports"]
    config = load_yaml(DEPLOY / "prometheus/prometheus.yml")
    (job,) = config["scrape_configs"]
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"evald:{port}"]


def test_prometheus_mounts_the_rules_its_config_loads(compose: dict[str, Any]) -> None:
    prom = services(compose)["prometheus"]
    mounts = dict(_bind_mounts(prom))
    assert mounts["./deploy/prometheus"] == "/etc/prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    config = load_yaml(DEPLOY / "prometheus/prometheus.yml")
    for pattern in config["rule_files"]:
        assert list((DEPLOY / "prometheus").glob(pattern)), pattern


def test_grafana_datasource_and_dashboards_match_the_stack(compose: dict[str, Any]) -> None:
    svc = services(compose)
    grafana = svc["grafana"]
    mounts = dict(_bind_mounts(grafana))
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    datasources = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")
    url = datasources["datasources"][0]["url"]
    host, port = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", url).groups()
    assert host == "prometheus" and host in svc
    assert any(str(p).endswith(f":{port}") for p in svc["prometheus"]["ports"])
    provider = load_yaml(DEPLOY / "grafana/provisioning/dashboards/evald.yml")["providers"][0]
    dashboards_dir = provider["options"]["path"]
    host_dir = {target: source for source, target in mounts.items()}[dashboards_dir]
    assert (REPO / host_dir / "evald.json").exists()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent.as_posix() == dashboards_dir


def test_topics_are_created_co_partitioned_and_match_the_evald_flags(
    compose: dict[str, Any],
) -> None:
    svc = services(compose)
    init = svc["kafka-init"]
    env = init["environment"]
    script = "\n".join(init["command"])
    for var in ("IMPRESSIONS_TOPIC", "FEEDBACK_TOPIC", "RESULTS_TOPIC", "DLQ_TOPIC"):
        assert f'"$${var}"' in script, var  # $$ escapes compose interpolation
    assert '--partitions "$$PARTITIONS"' in script  # one count for every topic
    assert int(env["PARTITIONS"]) >= 1
    evald = svc["evald"]["command"]
    producer = svc["producer"]["command"]
    assert _flag(evald, "--impressions-topic") == env["IMPRESSIONS_TOPIC"]
    assert _flag(evald, "--feedback-topic") == env["FEEDBACK_TOPIC"]
    assert _flag(evald, "--results-topic") == env["RESULTS_TOPIC"]
    assert _flag(evald, "--dlq-topic") == env["DLQ_TOPIC"]
    assert _flag(producer, "--impressions-topic") == env["IMPRESSIONS_TOPIC"]
    assert _flag(producer, "--feedback-topic") == env["FEEDBACK_TOPIC"]
    bootstrap = env["BOOTSTRAP"]
    assert (
        _flag(evald, "--bootstrap-servers") == bootstrap == _flag(producer, "--bootstrap-servers")
    )
    assert bootstrap.split(":")[0] in svc


def test_kafka_is_single_node_kraft_with_an_in_network_listener(compose: dict[str, Any]) -> None:
    kafka = services(compose)["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{node}@kafka:")
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert advertised["PLAINTEXT"] == "kafka:9092"  # what evald and the producer dial
    listeners = {item.split("://")[0] for item in env["KAFKA_LISTENERS"].split(",")}
    protocol_map = dict(
        item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    assert listeners <= set(protocol_map)
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    # transactions (exactly-once results) need these internal topics on a single broker
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 1


def test_evald_and_producer_use_the_locally_built_image(compose: dict[str, Any]) -> None:
    svc = services(compose)
    assert svc["evald"]["build"] == "."
    assert svc["producer"]["image"] == svc["evald"]["image"]
    assert svc["evald"]["command"][0] == "run"
    assert svc["producer"]["command"][0] == "produce"


@pytest.mark.parametrize("service", ["evald", "producer"])
def test_evald_command_lines_parse_with_evald(compose: dict[str, Any], service: str) -> None:
    """The exact argv compose passes is accepted by evald's CLI and yields valid settings."""
    from evald.cli import build_parser
    from evald.daemon.options import settings_from_args

    argv = services(compose)[service]["command"]
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    assert settings.kafka.bootstrap_servers == ["kafka:9092"]
    if service == "evald":
        assert settings.daemon.metrics_address == "0.0.0.0:9464"
        settings.engine_config()  # the --set engine.* overrides validate


def test_evald_compares_the_producers_arms_as_the_rules_and_dashboard_expect(
    compose: dict[str, Any],
) -> None:
    """The quality alerts read evald_comparison_* / evald_cusum_*, which `evald run` exports
    only for a configured comparison: compose's must compare the arms `evald produce` writes,
    with the arm values and arm-scoped labels the generated rules were rendered for."""
    from evald.cli import build_parser
    from evald.daemon.options import settings_from_args
    from evald.demo.simulator import ARMS, SURFACES

    svc = services(compose)
    settings = settings_from_args(build_parser().parse_args(svc["evald"]["command"]))
    config = settings.engine_config()
    (comparison,) = config.statistics.comparisons
    spec = Spec()
    assert comparison.label == spec.arm_label
    assert comparison.control == spec.control == ARMS[0][0]
    assert comparison.treatments == [spec.treatment] == [arm for arm, _ in ARMS[1:]]
    assert comparison.arm_scoped_labels == list(spec.arm_scoped_labels) == ["model"]
    assert len({model for _, model in ARMS}) == len(ARMS)  # each arm serves one model
    assert comparison.start == 0  # from the first window of a fresh stack
    assert comparison.min_effect and set(comparison.min_effect) <= set(config.measures)
    assert set(spec.comparison_labels) == {"surface"} and len(SURFACES) == 2
    # the story the README tells: the treatment regresses 15 minutes in
    assert "--regress-at=900" in svc["producer"]["command"]


def test_third_party_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, service in services(compose).items():
        image = service.get("image", "")
        if service.get("build") or image == "evald:local":
            continue
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: pin {image!r} to a version"


def test_healthchecks_do_not_start_a_jvm(compose: dict[str, Any]) -> None:
    """Docker runs a healthcheck every few seconds; Kafka's CLI scripts each start a JVM
    (seconds of CPU and hundreds of MB per probe)."""
    for name, service in services(compose).items():
        test = service.get("healthcheck", {}).get("test", [])
        command = " ".join(test) if isinstance(test, list) else str(test)
        assert "/opt/kafka/bin/" not in command and "java" not in command, (name, command)
    kafka = services(compose)["kafka"]["healthcheck"]["test"]
    assert kafka[:3] == ["CMD", "bash", "-c"] and "/dev/tcp/127.0.0.1/9092" in kafka[3]
