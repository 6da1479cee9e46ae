"""Command-line flags shared by `evald run` and `evald check-config`, mapped onto settings paths."""

from __future__ import annotations

import argparse
from typing import Any

from evald.daemon.settings import Settings, load_settings, merge, set_overrides

__all__ = ["add_settings_flags", "flag_overrides", "settings_from_args"]

# flag dest -> dotted settings path
FLAG_PATHS: dict[str, str] = {
    "bootstrap_servers": "kafka.bootstrap_servers",
    "security_protocol": "kafka.security_protocol",
    "sasl_mechanism": "kafka.sasl_mechanism",
    "sasl_username": "kafka.sasl_username",
    "impressions_topic": "topics.impressions",
    "feedback_topic": "topics.feedback",
    "results_topic": "topics.results",
    "dlq_topic": "topics.dlq",
    "checkpoint_topic": "topics.checkpoints",
    "group_id": "daemon.group_id",
    "instance_id": "daemon.instance_id",
    "metrics_address": "daemon.metrics_address",
    "web_config_file": "daemon.web_config_file",
    "mapping": "input.mapping",
}


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that override the file and the environment (secrets only via file or env)."""
    parser.add_argument(
        "--config", metavar="FILE", help="YAML settings file (default: $EVALD_CONFIG)"
    )
    group = parser.add_argument_group("kafka")
    group.add_argument("--bootstrap-servers", metavar="HOST:PORT[,...]")
    group.add_argument(
        "--security-protocol", choices=["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
    )
    group.add_argument("--sasl-mechanism", choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
    group.add_argument(
        "--sasl-username",
        metavar="NAME",
        help="the password comes from EVALD_KAFKA__SASL_PASSWORD or the file",
    )
    topics = parser.add_argument_group("topics")
    topics.add_argument("--impressions-topic", metavar="TOPIC")
    topics.add_argument("--feedback-topic", metavar="TOPIC")
    topics.add_argument("--results-topic", metavar="TOPIC")
    topics.add_argument("--dlq-topic", metavar="TOPIC")
    topics.add_argument(
        "--checkpoint-topic",
        metavar="TOPIC",
        help="transactional checkpoints (default: RESULTS.checkpoints)",
    )
    daemon = parser.add_argument_group("daemon")
    daemon.add_argument("--group-id", metavar="GROUP")
    daemon.add_argument(
        "--instance-id",
        metavar="ID",
        help="stable per instance; names the transactional producer (default: hostname)",
    )
    daemon.add_argument(
        "--metrics-address", metavar="HOST:PORT", help="where /metrics, /healthz and /readyz listen"
    )
    daemon.add_argument(
        "--web-config-file",
        metavar="FILE",
        help="TLS and basic auth for that endpoint (Prometheus exporter web config format)",
    )
    parser.add_argument(
        "--mapping",
        metavar="NAME|FILE",
        help="how input records are read: evald (native, default), ubi, or a mapping file "
        "(docs/mapping.md)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="any other setting, e.g. --set engine.window=30m (repeatable)",
    )


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The nested settings given on the command line (``--set`` first, named flags win)."""
    tree = set_overrides(list(getattr(args, "set", []) or []))
    named: dict[str, Any] = {}
    for dest, path in FLAG_PATHS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        section, field = path.split(".")
        named.setdefault(section, {})[field] = value
    return merge(tree, named)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Load and validate settings for a parsed command line (raises SettingsError)."""
    return load_settings(file=getattr(args, "config", None), flags=flag_overrides(args))
