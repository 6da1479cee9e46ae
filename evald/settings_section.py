"""``Section``: the base of every settings model, refusing a boolean where a number goes.

Why: pydantic's lax mode reads ``true`` as 1 and ``false`` as 0, and YAML reads yes/no and
on/off as booleans, so ``batch_size: true`` was a batch of one and ``action_grades: {click:
yes}`` a grade of 1, without a word. Numbers inside a mapping or a list are checked too.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ValidationInfo, field_validator

__all__ = ["Section"]


class Section(BaseModel):
    """A section of settings: ``true`` or ``false`` where a number goes is refused."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name
        if name is not None and _has_boolean(value) and _numeric(cls.model_fields[name].annotation):
            what = str(value).lower() if isinstance(value, bool) else "true or false"
            raise ValueError(
                f"a number, not {what} (YAML reads true/false, yes/no and on/off as booleans)"
            )
        return value


def _numeric(annotation: Any) -> bool:
    """Whether a number goes somewhere in ``annotation`` (itself, a union's member, a mapping's
    values or a list's items)."""
    if annotation in (int, float):
        return True
    return any(_numeric(arg) for arg in get_args(annotation) if not isinstance(arg, str | bool))


def _has_boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, dict):
        return any(_has_boolean(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_has_boolean(item) for item in value)
    return False
