"""`evald check-config`: validate the settings of `evald run` and print them, secrets masked.

Every error is reported at once (a misspelt key with its likely meaning), engine durations are
printed as durations (``30m``) and instants as RFC 3339, and ``--connect`` asks the brokers
whether `evald run` would start: topics, partition counts, co-partitioning, permissions. The
report of ``--connect`` follows the settings as YAML comments, so stdout stays valid YAML.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, get_args

import yaml

from evald.daemon.options import add_settings_flags, settings_from_args
from evald.daemon.settings import SettingsError, masked

SUMMARY = "validate `evald run` settings and print the effective values (secrets masked)"
EXAMPLES = """\
  evald check-config --config evald.yaml
  EVALD_KAFKA__BOOTSTRAP_SERVERS=k1:9092 evald check-config --group-id evald-prod
  evald check-config --config evald.yaml --set engine.window=30m
  evald check-config --config evald.yaml --connect   # brokers, topics, partitions, permissions
exit status: 0 valid, 1 valid but a problem found (an expired TLS certificate, or by --connect),
2 invalid (every bad field named, with why)
"""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    # at most an hour, a wait no check needs: it is made integer milliseconds for the clients,
    # which 1e308 (infinite, times 1000) ended with an OverflowError traceback
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 3600 seconds, got {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Same flags as `evald run`, so one command line can be checked before it is run."""
    add_settings_flags(parser)
    parser.add_argument(
        "--connect",
        action="store_true",
        help="also check that the brokers answer, the topics exist, are co-partitioned and "
        "that the principal may read and write them",
    )
    parser.add_argument(
        "--connect-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for a broker with --connect (default: %(default)s)",
    )


def engine_as_written(engine: Any) -> dict[str, Any]:
    """The engine section with every duration spelt like the configuration (``30m``) and every
    instant as RFC 3339, the nested blocks (statistics, interleaving, click model) included."""
    return _as_written(engine, engine.model_dump(mode="json"))


def _as_written(model: Any, data: dict[str, Any]) -> dict[str, Any]:
    from pydantic import BaseModel

    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        spell = _spelling(field.annotation, field.metadata)
        if spell is not None and value is not None:
            data[name] = (
                [spell(item) for item in value] if isinstance(value, list) else spell(value)
            )
        elif isinstance(value, BaseModel):
            data[name] = _as_written(value, data[name])
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            data[name] = [
                _as_written(item, out) for item, out in zip(value, data[name], strict=True)
            ]
    return data


def _spelling(annotation: Any, metadata: Any) -> Callable[[int], str] | None:
    """How a field typed ``annotation`` is written: durations as ``30m``, instants as RFC 3339,
    also inside ``X | None`` and ``list[X]``; None for any other field."""
    from evald.config import Duration, Instant
    from evald.durations import format_duration
    from evald.events import format_timestamp

    (duration,) = Duration.__metadata__  # type: ignore[attr-defined]
    instant = Instant.__metadata__[0]  # type: ignore[attr-defined]
    candidates = [metadata, *(getattr(a, "__metadata__", ()) for a in get_args(annotation))]
    for inner in get_args(annotation):  # list[Duration]: the item's metadata
        candidates.extend(getattr(a, "__metadata__", ()) for a in get_args(inner))
    for found in candidates:
        if any(item is duration for item in found):
            return format_duration
        if any(item is instant for item in found):
            return format_timestamp
    return None


def run(args: argparse.Namespace) -> int:
    """Print the effective settings as YAML; exit 2 naming every bad field, 1 if a warning
    (the web config's certificate expired) or --connect found a problem."""
    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"evald check-config: invalid settings\n{exc}", file=sys.stderr)
        return 2
    data = masked(settings)
    data["engine"] = engine_as_written(settings.engine_config())
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    warned = _warnings(settings)
    if not args.connect:
        return 1 if warned else 0
    from evald.daemon.connect_check import FAIL, connect_checks

    checks = connect_checks(settings, args.connect_timeout)
    sys.stdout.write("# --connect\n" + "".join(f"# {check.line()}\n" for check in checks))
    failed = [check for check in checks if check.status == FAIL]
    if failed:
        print(
            f"evald check-config: {len(failed)} connection check(s) failed; `evald run` would "
            "not start or not keep running with these settings",
            file=sys.stderr,
        )
        return 1
    return 1 if warned else 0


def _warnings(settings: Any) -> bool:
    """Say on stderr what would not stop `evald run` but should be fixed; True if anything."""
    from evald.webconfig import WebConfigError, load_web_config

    path = settings.daemon.web_config_file
    if path is None:
        return False
    try:
        warnings = load_web_config(path).warnings
    except WebConfigError:  # checked with the settings a moment ago: changed since
        return False
    for warning in warnings:
        print(f"evald check-config: warning: daemon.web_config_file: {warning}", file=sys.stderr)
    return bool(warnings)
