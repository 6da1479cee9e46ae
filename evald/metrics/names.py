"""Measure names: ir_measures-style parsing into hashable specs (the families: families.py).

A name is ``Family``, optionally ``(key=value,...)`` and optionally ``@cutoff``, e.g.
``nDCG@10``, ``P(rel=2)@5``, ``RBP(p=0.9)``, ``nDCG(dcg='exp-log2')@10``. ``str(measure)`` is the
canonical spelling (parameters in a fixed order, defaults left out except RBP's ``p``), so
equal measures always print the same and the name is safe to use as an output key and a
Prometheus label value.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from evald.metrics.families import FAMILIES, NO_RANKS, NONE, REQUIRED, WHOLE_LIST

DEFAULT_MEASURES = "nDCG@10,RR,Success@10,RBP(p=0.8),P@10,R@10,AP@10"


class MeasureError(ValueError):
    """An unknown or malformed measure name; the message lists the valid forms."""


ALIASES: dict[str, str] = {
    "Hit": "Success",
    "MAP": "AP",
    "MRR": "RR",
    "NDCG": "nDCG",
    "Precision": "P",
    "Recall": "R",
    "BPref": "Bpref",
    "RPrec": "Rprec",
}


def valid_forms() -> str:
    """Every accepted spelling, for error messages and ``--help`` texts."""
    forms = [form for family in FAMILIES.values() for form in family.forms]
    return ", ".join(forms) + " (k a positive integer; rel=N means relevant iff grade >= N)"


@dataclass(frozen=True)
class Measure:
    """A parsed measure: family, canonical non-default parameters and cutoff (None = full list)."""

    family: str
    params: tuple[tuple[str, Any], ...] = ()
    cutoff: int | None = None

    def __str__(self) -> str:
        name = self.family
        shown = [(k, v) for k, v in self.params if not (self.family == "IPrec" and k == "recall")]
        if shown:
            name += "(" + ",".join(f"{k}={_text(k, v)}" for k, v in shown) + ")"
        if self.family == "IPrec":
            name += f"@{self['recall']!r}"
        elif self.cutoff is not None:
            name += f"@{self.cutoff}"
        return name

    def __getitem__(self, key: str) -> Any:
        """Parameter value, falling back to the family default."""
        for k, v in self.params:
            if k == key:
                return v
        return FAMILIES[self.family].params[key].default


def _text(key: str, value: Any) -> str:
    """A parameter value as ir_measures writes it (a gain map as ``{0:0,1:1,2:3}``)."""
    if key == "gains":
        return "{" + ",".join(f"{level}:{gain!r}" for level, gain in value) + "}"
    return repr(value)


def make_measure(family: str, cutoff: int | None = None, **params: Any) -> Measure:
    """Build a validated measure in canonical form (used by the parser and by code)."""
    spec = FAMILIES.get(ALIASES.get(family, family))
    if spec is None:
        raise MeasureError(f"unknown measure family {family!r}; valid forms: {valid_forms()}")
    label = family + (f"@{cutoff}" if cutoff is not None else "")
    if spec.cutoff == REQUIRED and cutoff is None:
        raise MeasureError(f"{label}: needs a cutoff; valid forms: {', '.join(spec.forms)}")
    if spec.cutoff == NONE and cutoff is not None:
        raise MeasureError(f"{label}: takes no cutoff; valid forms: {', '.join(spec.forms)}")
    if cutoff is not None and (
        isinstance(cutoff, bool) or not isinstance(cutoff, int) or cutoff < 1
    ):
        raise MeasureError(f"{label}: the cutoff must be a positive integer")
    values: dict[str, Any] = {}
    for key, value in params.items():
        param = spec.params.get(key)
        if param is None:
            allowed = ", ".join(spec.params) or "none"
            raise MeasureError(
                f"{spec.name}: unknown parameter {key!r} (allowed: {allowed}); "
                f"valid forms: {', '.join(spec.forms)}"
            )
        try:
            values[key] = param.check(value)
        except ValueError as exc:
            raise MeasureError(f"{spec.name}: parameter {key}={value!r} {exc}") from None
    if spec.name == "IPrec" and "recall" not in values:
        raise MeasureError("IPrec: needs a recall level, e.g. IPrec@0.5")
    if values.get("gains") is not None and values.get("dcg", "log2") != "log2":
        raise MeasureError(f"{spec.name}: gains= replaces the gain function; drop dcg=")
    if spec.name == "RBP" and values.get("graded") and "rel" in values:
        raise MeasureError("RBP: graded=True uses grades as gains and takes no rel threshold")
    canonical = tuple(
        (key, values.get(key, param.default))
        for key, param in spec.params.items()
        if key in spec.always_shown or (key in values and values[key] != param.default)
    )
    return Measure(spec.name, canonical, cutoff)


_NAME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*(?:@\s*(\S+))?\s*$", re.S)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_measure(text: str) -> Measure:
    """Parse one name such as ``P(rel=2)@5``."""
    match = _NAME.match(text)
    if match is None:
        raise MeasureError(f"malformed measure {text.strip()!r}; valid forms: {valid_forms()}")
    family, args, cutoff_text = match.groups()
    cutoff: int | None = None
    params: dict[str, Any] = {}
    if family == "IPrec" and cutoff_text is not None:  # ir_measures: IPrec@0.5, a recall level
        try:
            params["recall"] = float(cutoff_text)
        except ValueError:
            raise MeasureError(
                f"{text.strip()!r}: IPrec@r needs a recall level r in [0, 1]"
            ) from None
        cutoff_text = None
    if cutoff_text is not None:
        if not cutoff_text.isdigit():
            raise MeasureError(
                f"{text.strip()!r}: the cutoff after '@' must be a positive integer; "
                f"valid forms: {valid_forms()}"
            )
        cutoff = int(cutoff_text)
    if args is not None and args.strip():
        for item in _split_top_level(args):
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or not key.isidentifier():
                raise MeasureError(
                    f"{text.strip()!r}: parameters are written key=value, e.g. P(rel=2)@5"
                )
            try:
                params[key] = ast.literal_eval(raw.strip())
            except (ValueError, SyntaxError):
                raise MeasureError(
                    f"{text.strip()!r}: cannot read the value of {key!r} "
                    "(numbers as 0.8 or 2, strings quoted as 'exp-log2', True/False)"
                ) from None
    return make_measure(family, cutoff, **params)


def parse_measures(text: str | Sequence[str]) -> list[Measure]:
    """Parse a comma-separated string (or a sequence of them); duplicates are dropped.

    trec_eval's names are read as aliases (``P.5,10`` is ``P@5,P@10``; see trec_names.py).
    """
    from evald.metrics.trec_names import expand  # trec_eval's spellings, as aliases

    items: Iterable[str] = [text] if isinstance(text, str) else text
    parts = [part for item in items for part in _split_top_level(item) if part.strip()]
    names = expand(parts)
    if not names:
        raise MeasureError(f"no measure given; valid forms: {valid_forms()}")
    return list(dict.fromkeys(parse_measure(name) for name in names))


def labelled_measures(text: str | Sequence[str]) -> dict[Measure, str]:
    """``parse_measures``, each measure with the name to show it by: the user's spelling where
    one part names it alone (``map``, ``ndcg_cut.10``, ``MRR``), else trec_eval's output name
    (``P.5,10`` gives ``P_5`` and ``P_10``) or the canonical one. A measure named twice keeps
    its first spelling."""
    from evald.metrics.trec_names import expand_labelled, trec_name

    items: Iterable[str] = [text] if isinstance(text, str) else text
    parts = [part for item in items for part in _split_top_level(item) if part.strip()]
    pairs = expand_labelled(parts)
    if not pairs:
        raise MeasureError(f"no measure given; valid forms: {valid_forms()}")
    out: dict[Measure, str] = {}
    for label, name in pairs:
        measure = parse_measure(name)
        out.setdefault(measure, label or trec_name(measure) or str(measure))
    return out


def required_depth(measures: Iterable[Measure]) -> int | None:
    """Deepest rank any measure reads; None if one needs the whole served list."""
    depth = 0
    for measure in measures:
        reads = FAMILIES[measure.family].reads
        if reads == NO_RANKS:
            continue
        if measure.cutoff is None or reads == WHOLE_LIST:
            return None
        depth = max(depth, measure.cutoff)
    return depth
