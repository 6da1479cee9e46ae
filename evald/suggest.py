"""A "did you mean" for an unknown key of a settings tree (pydantic models): the nearest one.

Two mistakes are common and both get an answer: a misspelt key (``statistics.comparisons.0.
treatment`` -> ``treatments``) and a right key in the wrong place (``comparisons`` at the top
of the engine settings instead of under ``statistics``; ``statistics`` at the top of `evald
run`'s settings instead of under ``engine``). Fields of list items are shown with ``[]``
(``statistics.comparisons[].control``).
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator, Sequence

from pydantic import BaseModel

__all__ = ["did_you_mean"]

_CUTOFF = 0.6


def did_you_mean(
    root: type[BaseModel],
    path: Sequence[str],
    prefix: str = "",
    also: Sequence[tuple[type[BaseModel], str]] = (),
) -> str:
    """`` (did you mean statistics.alpha?)`` for the unknown key at ``path`` (the error's
    location below ``root``, shown after ``prefix``; list indices as digits), or ``""`` when
    nothing is near. A key that is a field elsewhere in the tree, or in one of the ``also``
    trees (model, prefix), is pointed there."""
    if not path:
        return ""
    key, parent = path[-1], _model_at(root, path[:-1])
    if parent is not None:
        close = difflib.get_close_matches(key, list(parent.model_fields), n=1, cutoff=_CUTOFF)
        if close:
            return f" (did you mean {prefix}{'.'.join([*path[:-1], close[0]])}?)"
    elsewhere = [
        where + ".".join(p)
        for model, where in ((root, prefix), *also)
        for p in _field_paths(model)
        if p[-1] == key and where + ".".join(p) != prefix + ".".join(path)
    ]
    if elsewhere:
        return f" (did you mean {min(elsewhere, key=len)}? it belongs there)"
    return ""


def _model_at(root: type[BaseModel], path: Sequence[str]) -> type[BaseModel] | None:
    """The model whose fields sit at ``path`` (list indices and mapping keys stepped over)."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None:
            return None
        field = model.model_fields.get(part)
        if field is None:
            if part.isdigit():
                continue  # an index into the list the previous part named
            return None
        model = _inner_model(field.annotation)
    return model


def _inner_model(annotation: object) -> type[BaseModel] | None:
    """The model a field holds, directly, in a list, a mapping's values or an Optional."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _field_paths(model: type[BaseModel], base: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every field path of the tree; a list of models adds ``[]`` to its field's name."""
    for name, field in model.model_fields.items():
        path = (*base, name)
        yield path
        inner = _inner_model(field.annotation)
        if inner is not None and inner is not model:
            listed = typing.get_origin(field.annotation) is list or any(
                typing.get_origin(a) is list for a in typing.get_args(field.annotation)
            )
            yield from _field_paths(inner, (*base, name + ("[]" if listed else "")))
