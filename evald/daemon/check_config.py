"""`evald check-config`: validate the settings of `evald run` and print them, secrets masked."""

from __future__ import annotations

import argparse
import sys

import yaml

from evald.daemon.options import add_settings_flags, settings_from_args
from evald.daemon.settings import SettingsError, masked

SUMMARY = "validate `evald run` settings and print the effective values (secrets masked)"
EXAMPLES = """\
  evald check-config --config evald.yaml
  EVALD_KAFKA__BOOTSTRAP_SERVERS=k1:9092 evald check-config --group-id evald-prod
  evald check-config --config evald.yaml --set engine.window=30m
exit status: 0 valid, 2 invalid (the message names the field and the reason)
"""


def configure(parser: argparse.ArgumentParser) -> None:
    """Same flags as `evald run`, so one command line can be checked before it is run."""
    add_settings_flags(parser)


def run(args: argparse.Namespace) -> int:
    """Print the effective settings as YAML; exit 2 with a field-named message if invalid."""
    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print(f"evald check-config: invalid settings\n{exc}", file=sys.stderr)
        return 2
    data = masked(settings)
    data["engine"] = settings.engine_config().model_dump(mode="json")
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    return 0
