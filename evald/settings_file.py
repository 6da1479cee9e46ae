"""Reading a YAML (or JSON) file a person wrote: settings, a mapping, a web config.

Why one reader: each of them used to catch a different subset of what can go wrong, and the
rest ended the command with a traceback (a file saved as Latin-1, brackets nested thousands
deep). Here every failure is :class:`SettingsFileError`, whose message starts with the path and
says what to do, so each command exits 2 with it.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from evald.input_rule import repeated_key

__all__ = ["MAX_BYTES", "RepeatedKey", "SettingsFileError", "read_settings_file", "yaml_value"]

#: a settings file larger than this is refused unread (``/dev/zero`` would never end)
MAX_BYTES = 16 * 1024 * 1024


class SettingsFileError(ValueError):
    """A file that cannot be read as YAML or JSON; the message starts with its path."""


class RepeatedKey(ValueError):
    """A mapping that gives one key twice: YAML and JSON parsers keep the last value, so one of
    the two a person wrote would be dropped without a word."""


def yaml_value(text: str) -> Any:
    """``text`` parsed as YAML (safely), refusing a key given twice in one mapping
    (:class:`RepeatedKey`): the files' rule, for values given inline too (``--set``, the
    environment)."""
    import yaml

    return yaml.load(text, Loader=_unique_key_loader())  # a SafeLoader


def read_settings_file(path: str | os.PathLike[str], *, json_text: bool = False) -> Any:
    """The parsed document (None for an empty YAML file); ``json_text`` parses JSON instead.

    Raises :class:`SettingsFileError` for a file that is missing, a directory, unreadable,
    larger than :data:`MAX_BYTES`, not UTF-8, not valid YAML/JSON, nested too deeply to parse
    or holding one key twice in a mapping.
    """
    import yaml

    where = os.fspath(path)
    try:
        with open(where, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SettingsFileError(f"{where}: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        limit = MAX_BYTES // 2**20
        raise SettingsFileError(f"{where}: larger than {limit} MiB: not a settings file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsFileError(
            f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
        ) from None
    kind = "JSON" if json_text else "YAML"
    try:
        if json_text:
            return json.loads(text, object_pairs_hook=_unique_object)
        return yaml_value(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SettingsFileError(f"{where}: not valid {kind}: {exc}") from None
    except RecursionError:
        raise SettingsFileError(
            f"{where}: not valid {kind}: nested too deeply for the parser"
        ) from None


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct (:class:`RepeatedKey`)."""
    key = repeated_key(pairs)
    if key is not None:
        raise RepeatedKey(f"key {key!r} appears twice in one object: keep one")
    return dict(pairs)


@functools.cache
def _unique_key_loader() -> type:
    """PyYAML's SafeLoader refusing a key given twice in one mapping (YAML forbids it; PyYAML
    keeps the last value). Keys a ``<<`` merge brings in may still be overridden."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = lines.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    continue
                lines[key] = line
                if first is not None:
                    at = f"lines {first} and {line}" if first != line else f"line {line}"
                    raise RepeatedKey(f"key {key!r} appears twice in one mapping ({at}): keep one")
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader
