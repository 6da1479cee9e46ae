"""Settings of `evald run`: one pydantic model fed from a YAML file, `EVALD_*` variables and flags.

Precedence is flags > environment > file > defaults, merged key by key (a flag that sets
``kafka.bootstrap_servers`` leaves the file's ``kafka.sasl_username`` alone).

Environment mapping: ``EVALD_<SECTION>__<FIELD>`` (double underscore between levels, case
insensitive), e.g. ``EVALD_KAFKA__BOOTSTRAP_SERVERS=k1:9092,k2:9092``,
``EVALD_KAFKA__SASL_PASSWORD=...``, ``EVALD_TOPICS__RESULTS=evald.results``,
``EVALD_ENGINE__WINDOW=30m``. Values are read as YAML scalars, so ``true``/``10``/``[a, b]`` work.
``EVALD_CONFIG`` names the YAML file when ``--config`` is not given; ``EVALD_LOG_LEVEL`` is the
log level, not a setting. Any other ``EVALD_*`` name without ``__`` is not a setting either and is
ignored (logged once at debug): Kubernetes injects ``EVALD_PORT=tcp://...`` and
``EVALD_SERVICE_HOST`` for a Service named ``evald``, and pods must still start.

The ``engine`` section is validated by :class:`evald.config.EngineConfig`; errors name the field
with its full dotted path (``engine.window: ...``) so a bad deployment is fixed in one look.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from evald.config import ConfigError, read_mapping_file
from evald.daemon.names import checkpoint_topic, internal_topic, transactional_id
from evald.settings_file import RepeatedKey, yaml_value
from evald.settings_section import Section

__all__ = [
    "DaemonSettings",
    "KafkaSettings",
    "Settings",
    "SettingsError",
    "TopicSettings",
    "env_overrides",
    "host_port",
    "load_settings",
    "masked",
    "merge",
]

log = logging.getLogger(__name__)

ENV_PREFIX = "EVALD_"
MASK = "********"


class SettingsError(ValueError):
    """An invalid setting; the message starts with the dotted field name and says why."""


def host_port(server: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as kafka-python reads a bootstrap address; a
    ValueError for anything else."""
    host, sep, port = server.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{server!r} is not HOST:PORT (e.g. kafka-1:9092)")
    return host.strip("[]"), int(port)


class _Strict(Section):
    # an infinite stall_timeout_s kept /readyz green forever, an infinite shutdown wait was
    # an OverflowError at the stop: no setting here means anything infinite
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: the Kafka protocol's INT32: a timeout or partition count past it cannot be sent (10**400
#: passed validation and failed at the first request)
INT32_MAX = 2**31 - 1
#: a day: the longest wait or interval the consumer loop takes
DAY_MS = 86_400_000


class KafkaSettings(_Strict):
    """Connection and security options passed through to kafka-python's clients."""

    bootstrap_servers: list[str] = Field(default_factory=lambda: ["localhost:9092"], min_length=1)
    client_id: str = "evald"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    session_timeout_ms: int = Field(10_000, ge=1_000, le=INT32_MAX)
    heartbeat_interval_ms: int = Field(3_000, ge=100, le=INT32_MAX)
    max_poll_interval_ms: int = Field(300_000, ge=1_000, le=INT32_MAX)
    request_timeout_ms: int = Field(30_000, ge=1_000, le=INT32_MAX)
    transaction_timeout_ms: int = Field(60_000, ge=1_000, le=INT32_MAX)

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_port(cls, value: list[str]) -> list[str]:
        for server in value:
            host_port(server)
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> KafkaSettings:
        """Cross-field rules kafka-python would otherwise only report at connect time."""
        sasl = self.security_protocol.startswith("SASL")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(
                "sasl_mechanism is required with security_protocol " + self.security_protocol
            )
        if sasl and (not self.sasl_username or self.sasl_password is None):
            raise ValueError("sasl_username and sasl_password are required with SASL")
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError("sasl_mechanism needs security_protocol SASL_PLAINTEXT or SASL_SSL")
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be at most a third of session_timeout_ms")
        return self

    def client_config(self, kafka_client: Callable[..., Any] | None = None) -> dict[str, Any]:
        """Keyword arguments shared by kafka-python's consumer, producer and admin client;
        ``kafka_client`` (default ``net_client``) builds their network client (a session's
        ``StopEvent.client``, so that its stop ends their bootstraps and its end closes them)."""
        from evald.daemon.kafka_compat import net_client

        config: dict[str, Any] = {
            "kafka_client": kafka_client if kafka_client is not None else net_client,
            "bootstrap_servers": list(self.bootstrap_servers),
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if self.sasl_mechanism is not None:
            config["sasl_mechanism"] = self.sasl_mechanism
            config["sasl_plain_username"] = self.sasl_username
            assert self.sasl_password is not None  # enforced in model_post_init
            config["sasl_plain_password"] = self.sasl_password.get_secret_value()
        if self.security_protocol.endswith("SSL"):
            config["ssl_check_hostname"] = self.ssl_check_hostname
            for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, key) is not None:
                    config[key] = getattr(self, key)
            if self.ssl_password is not None:
                config["ssl_password"] = self.ssl_password.get_secret_value()
        return config


class TopicSettings(_Strict):
    """Topic names. ``checkpoints`` defaults to ``<results>.checkpoints`` (see docs/design.md)."""

    impressions: str = "evald.impressions"
    feedback: str = "evald.feedback"
    results: str = "evald.results"
    dlq: str = "evald.dlq"
    checkpoints: str | None = None

    @field_validator("impressions", "feedback", "results", "dlq", "checkpoints")
    @classmethod
    def _topic_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value or len(value) > 249 or value in {".", ".."}:
            raise ValueError("a topic name is 1-249 characters and not '.' or '..'")
        bad = sorted({ch for ch in value if not (ch.isascii() and (ch.isalnum() or ch in "._-"))})
        if bad:
            raise ValueError(f"characters {''.join(bad)!r} are not allowed (use a-z A-Z 0-9 . _ -)")
        return value

    @property
    def checkpoint_topic(self) -> str:
        """The effective checkpoint topic name (names.py)."""
        return checkpoint_topic(self.results, self.checkpoints)

    @model_validator(mode="after")
    def _distinct(self) -> TopicSettings:
        names = [self.impressions, self.feedback, self.results, self.dlq, self.checkpoint_topic]
        if len(set(names)) != len(names):
            raise ValueError("impressions, feedback, results, dlq and checkpoints must differ")
        return self


class DaemonSettings(_Strict):
    """The consumer loop: group membership, commit cadence, backpressure, shutdown, retries."""

    group_id: str = Field("evald", min_length=1)
    instance_id: str = Field(default_factory=socket.gethostname, min_length=1)
    metrics_address: str = "127.0.0.1:9464"
    commit_interval_ms: int = Field(1_000, ge=10, le=DAY_MS)
    commit_max_records: int = Field(10_000, ge=1)
    poll_timeout_ms: int = Field(200, ge=1, le=10_000)
    max_poll_records: int = Field(2_000, ge=1)
    pause_at: float = Field(0.9, gt=0, le=1, description="pause at this fraction of max_pending")
    resume_at: float = Field(0.6, gt=0, lt=1, description="resume under this fraction")
    shutdown_timeout_s: float = Field(30.0, gt=0, le=DAY_MS / 1000)
    stall_timeout_s: float = Field(
        300.0,
        gt=0,
        le=DAY_MS / 1000,
        description="/readyz turns red when lag exists and nothing was fed this long",
    )
    retry_backoff_initial_ms: int = Field(200, ge=1, le=DAY_MS)
    retry_backoff_max_ms: int = Field(10_000, ge=1, le=DAY_MS)
    static_membership: bool = Field(
        False,
        description="join as a static member (group.instance.id = instance_id): a "
        "restarted instance gets its partitions back without waiting for the session timeout",
    )
    windows_file: str | None = Field(
        None,
        description="on a clean stop, write every window aggregate in retention here "
        "(the `evald replay --windows` JSONL schema)",
    )
    web_config_file: str | None = Field(
        None,
        description="TLS and basic auth for the metrics endpoint, in the Prometheus exporter "
        "web config format (docs/security.md)",
    )

    def transactional_id(self, *, repartition: bool = False) -> str:
        """This instance's producer id, of the main or the repartition stage (one scheme for
        both, unambiguous across groups: names.py)."""
        return transactional_id(self.group_id, self.instance_id, repartition=repartition)

    @field_validator("windows_file")
    @classmethod
    def _writable(cls, value: str | None) -> str | None:
        """Written only at the stop: a path that cannot be written must fail the start."""
        if value is not None:
            _probe_writable(value)
        return value

    @field_validator("web_config_file")
    @classmethod
    def _web_config(cls, value: str | None) -> str | None:
        from evald.webconfig import WebConfigError, load_web_config

        if value is not None:
            try:
                load_web_config(value)
            except WebConfigError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("metrics_address")
    @classmethod
    def _address(cls, value: str) -> str:
        from evald.http import parse_address

        parse_address(value)
        return value

    @model_validator(mode="after")
    def _ordered(self) -> DaemonSettings:
        if self.resume_at >= self.pause_at:
            raise ValueError("resume_at must be below pause_at")
        if self.retry_backoff_initial_ms > self.retry_backoff_max_ms:
            raise ValueError("retry_backoff_initial_ms must not exceed retry_backoff_max_ms")
        return self


def _probe_writable(path: str) -> None:
    """Create and remove ``<path>.tmp`` (the file the stop writes first), so a missing
    directory, a directory in the way or a read-only disk is reported now."""
    if not path.strip():
        raise ValueError("must be a file path")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory; name a file in it")
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8"):
            pass
        os.unlink(tmp)
    except OSError as exc:
        raise ValueError(f"cannot write {tmp}: {exc.strerror or exc}") from None


class InputSettings(_Strict):
    """How input records are read (docs/mapping.md)."""

    mapping: str = Field(
        "evald",
        min_length=1,
        description="a built-in mapping (evald: the native schema; ubi: OpenSearch User "
        "Behavior Insights) or a YAML/JSON mapping file",
    )
    repartition: bool = Field(
        False,
        description="the input topics are keyed any way (or not co-partitioned): re-key them "
        "by request id through internal topics <group_id>.<topic>.evald-repartition, exactly once "
        '(docs/design.md, "Topics keyed any way")',
    )
    repartition_partitions: int | None = Field(
        None,
        ge=1,
        le=INT32_MAX,
        description="partitions of the internal topics when evald creates them (default: "
        "those of existing internal topics, else of the impressions topic)",
    )

    @field_validator("mapping")
    @classmethod
    def _loads(cls, value: str) -> str:
        """Read now: a mapping that cannot be used fails the start, naming its key."""
        from evald.mapping import MappingError, load_spec

        try:
            load_spec(value)
        except MappingError as exc:
            raise ValueError(str(exc)) from None
        return value


class Settings(_Strict):
    """Everything `evald run` needs. ``engine`` is checked by EngineConfig (see load_settings)."""

    # model_validate({}): the defaults, typed (a type checker without pydantic's plugin reads
    # the bare classes as needing every field)
    kafka: KafkaSettings = Field(default_factory=lambda: KafkaSettings.model_validate({}))
    topics: TopicSettings = Field(default_factory=TopicSettings)
    daemon: DaemonSettings = Field(default_factory=lambda: DaemonSettings.model_validate({}))
    input: InputSettings = Field(default_factory=lambda: InputSettings.model_validate({}))
    engine: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _internal_topics(self) -> Settings:
        """With ``input.repartition``, the internal topic names must be valid and distinct."""
        if not self.input.repartition:
            return self
        topics, group = self.topics, self.daemon.group_id
        bad = sorted({ch for ch in group if not (ch.isascii() and (ch.isalnum() or ch in "._-"))})
        if bad:
            raise ValueError(
                f"daemon: group_id {group!r} names the internal topics of input.repartition "
                f"(<group_id>.<topic>.evald-repartition): characters {''.join(bad)!r} are not "
                "allowed in a topic name (use a-z A-Z 0-9 . _ -)"
            )
        for name in (topics.impressions, topics.feedback):
            internal = internal_topic(group, name)
            if len(internal) > 249:
                raise ValueError(
                    f"topics: {name} is too long for input.repartition: its internal topic "
                    f"{internal} would be over 249 characters"
                )
            if internal in (topics.results, topics.dlq, topics.checkpoint_topic):
                raise ValueError(
                    f"topics: {internal} is the internal topic of {name} with "
                    "input.repartition; name the results, dlq and checkpoints topics otherwise"
                )
        return self

    def engine_config(self) -> Any:
        """The validated ``evald.config.EngineConfig``."""
        from evald.config import load_config

        return load_config(self.engine)


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge two nested mappings; ``override`` wins key by key."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SettingsError(f"{'.'.join(path)}: {part} is not a section")
    node[path[-1]] = value


def _scalar(text: str, where: str) -> Any:
    """A value from the environment or ``--set`` (``where`` names it), read as a YAML
    scalar/flow value; a mapping giving one key twice is refused, as in a settings file."""
    try:
        return yaml_value(text) if text.strip() else text
    except RepeatedKey as exc:
        raise SettingsError(f"{where}: {exc}") from None
    except yaml.YAMLError:
        return text


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """The nested settings named by ``EVALD_SECTION__FIELD`` variables.

    Only names of that form are settings; other ``EVALD_*`` names (Kubernetes service links
    such as ``EVALD_PORT``, ``EVALD_SERVICE_HOST``) are ignored and logged once at debug.
    """
    tree: dict[str, Any] = {}
    for name, text in sorted(environ.items()):
        if not name.upper().startswith(ENV_PREFIX) or name.upper() in _PROCESS_VARIABLES:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        if len(path) < 2 or not all(path):
            if name not in _IGNORED_LOGGED:
                _IGNORED_LOGGED.add(name)
                log.debug("%s is not a setting (EVALD_<SECTION>__<FIELD>): ignored", name)
            continue
        value: Any = text if path[-1] in _STRING_FIELDS else _scalar(text, name)
        _set_path(tree, path, value)
    return tree


_IGNORED_LOGGED: set[str] = set()  # names already logged as ignored (once per process)


# Variables for the process, not settings: the settings file's name and the log level.
_PROCESS_VARIABLES = frozenset({"EVALD_CONFIG", "EVALD_LOG_LEVEL"})

# Secrets and names are taken verbatim: YAML would turn "0123" into 123 or "yes" into True.
_STRING_FIELDS = frozenset(
    {"sasl_password", "ssl_password", "sasl_username", "group_id", "instance_id", "client_id"}
)


def set_overrides(items: list[str]) -> dict[str, Any]:
    """The nested settings named by ``--set section.field=value`` items."""
    tree: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        path = [part.strip() for part in key.split(".")]
        if not sep or len(path) < 2 or not all(path):
            raise SettingsError(f"--set {item!r}: use SECTION.FIELD=VALUE, e.g. engine.window=30m")
        value = text if path[-1] in _STRING_FIELDS else _scalar(text, f"--set {key.strip()}")
        _set_path(tree, path, value)
    return tree


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The YAML settings file as a mapping of sections (empty file = no settings)."""
    try:
        return read_mapping_file(path)
    except ConfigError as exc:
        raise SettingsError(f"config file {exc}") from None


def _describe(
    error: ValidationError, model: type[BaseModel] | None = None, prefix: str = ""
) -> str:
    """One ``dotted.field: reason`` line per error; an unknown key gets a "did you mean"."""
    model = model or Settings
    lines = []
    for item in error.errors(include_url=False):
        parts = [str(part) for part in item["loc"] if part != "__root__"]
        loc = prefix + ".".join(parts) if parts else prefix.rstrip(".") or "settings"
        message = item["msg"].removeprefix("Value error, ")
        field, sep, rest = message.partition(": ")
        if not parts and sep and field.split(".")[0] in model.model_fields:
            # a cross-field check names its field first (maybe nested, ``statistics.window``):
            # show it as a dotted path too
            loc, message = prefix + field, rest
        if item["type"] == "extra_forbidden":
            message = "unknown setting" + _did_you_mean(model, parts, prefix)
        lines.append(f"{loc}: {message}")
    return "\n".join(lines)


def _did_you_mean(model: type[BaseModel], path: list[str], prefix: str) -> str:
    """`` (did you mean topics.feedback?)`` for a misspelt key, a key of the settings that
    belongs in another section (``statistics`` -> ``engine.statistics``), else ``""``."""
    from evald.config import EngineConfig
    from evald.suggest import did_you_mean

    also = () if model is EngineConfig else ((EngineConfig, "engine."),)
    return did_you_mean(model, path, prefix, also)


def load_settings(
    *,
    file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    validate_engine: bool = True,
) -> Settings:
    """Merge file, environment and flag settings (in rising precedence) and validate them.

    Raises SettingsError whose message names each bad field by its dotted path.
    """
    environ = os.environ if environ is None else environ
    file = file if file is not None else environ.get("EVALD_CONFIG") or None
    tree: dict[str, Any] = read_file(file) if file else {}
    tree = merge(tree, env_overrides(environ))
    tree = merge(tree, dict(flags or {}))
    # every error at once: a deployment is fixed in one round, not one field per attempt
    errors: list[str] = []
    for section in ("kafka", "topics", "daemon", "input"):
        if section in tree and tree[section] is not None and not isinstance(tree[section], dict):
            errors.append(f"{section}: must be a mapping of fields")
            tree = {key: value for key, value in tree.items() if key != section}
    settings: Settings | None = None
    try:
        settings = Settings.model_validate(tree)
    except ValidationError as exc:
        errors.append(_describe(exc))
    engine = tree.get("engine")
    if validate_engine and (engine is None or isinstance(engine, Mapping)):
        errors.extend(_engine_errors(engine or {}))
    if errors or settings is None:
        raise SettingsError("\n".join(errors))
    return settings


def _engine_errors(engine: Mapping[str, Any]) -> list[str]:
    """``engine.*`` errors as lines, unknown keys with a "did you mean"; valid settings whose
    worst case is over ``max_series`` give the series budget's line."""
    from evald.config import ConfigError, EngineConfig
    from evald.exposition.budget import check_series_budget

    try:
        check_series_budget(EngineConfig.model_validate(dict(engine)))
    except ValidationError as exc:
        return [_describe(exc, EngineConfig, "engine.")]
    except ConfigError as exc:  # "max_segments: ...", a field of the engine section
        return [f"engine.{exc}"]
    return []


def masked(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data with every secret replaced by a mask."""
    data = settings.model_dump(mode="json")
    for key in ("sasl_password", "ssl_password"):
        if data["kafka"].get(key) is not None:
            data["kafka"][key] = MASK
    data["topics"]["checkpoints"] = settings.topics.checkpoint_topic
    return data
