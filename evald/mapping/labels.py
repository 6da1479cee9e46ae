"""Label values a mapping reads: objects flattened into segment labels, scalars as JSON spells
them. Shared by the mapping decoder's exact path (which words what is wrong) and its fast path
(which only needs to know that something is)."""

from __future__ import annotations

import json
import math
from typing import Any


def flatten(
    labels: dict[str, str], value: dict[str, Any], prefix: str
) -> tuple[tuple[str, ...], Any] | None:
    """Adds the object ``value`` to ``labels``, nested keys joined by '_' (so they can be
    segment label names) under ``prefix``; null values are left out. Returns None, or the keys
    leading to the first value that cannot be a label and that value (``labels`` then holds
    what came before it)."""
    for key, item in value.items():
        if type(item) is str:
            labels[prefix + key] = item
        elif type(item) is dict:
            bad = flatten(labels, item, f"{prefix}{key}_")
            if bad is not None:
                return (key, *bad[0]), bad[1]
        elif item is not None:
            text = label_text(item)
            if text is None:
                return (key,), item
            labels[prefix + key] = text
    return None


def label_text(value: Any) -> str | None:
    """A scalar as label text (JSON's spelling); None: not a label value."""
    kind = type(value)
    if kind is str:
        return value
    if kind is bool:
        return "true" if value else "false"
    if kind is int or (kind is float and math.isfinite(value)):
        return json.dumps(value)
    return None


def not_a_label(value: Any) -> str:
    """Why ``value`` (not a label value) is not one, in words."""
    if type(value) is float:
        return f"{value} is not a finite number"
    return "a list cannot be a label value"
