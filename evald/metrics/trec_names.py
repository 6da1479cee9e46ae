"""trec_eval's measure names (``-m P.5,10``, ``ndcg_cut_10``, ``map``) as aliases of evald's.

``expand`` turns the comma-separated parts of a ``--measures`` value into evald names, reading
trec_eval's spellings where it finds them; ``trec_name`` gives a measure's trec_eval output name
(``P_5``, ``ndcg_cut_10``) for ``--format trec``, or None when trec_eval has none. trec_eval's
relevance level is a global flag (``-l``), so a measure with ``rel=N`` has no trec_eval name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from evald.metrics.names import Measure

#: trec_eval's default cutoffs when a family is named without parameters
_CUTOFFS = (5, 10, 15, 20, 30, 100, 200, 500, 1000)
_LEVELS = ("0.0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1.0")

#: trec_eval family -> (evald family, default parameters)
_CUTOFF_FAMILIES = {
    "P": ("P", _CUTOFFS),
    "recall": ("R", _CUTOFFS),
    "map_cut": ("AP", _CUTOFFS),
    "ndcg_cut": ("nDCG", _CUTOFFS),
    "success": ("Success", (1, 5, 10)),
}
_PLAIN = {
    "map": "AP",
    "gm_map": "GMAP",
    "Rprec": "Rprec",
    "bpref": "Bpref",
    "recip_rank": "RR",
    "infAP": "infAP",
    "num_ret": "NumRet",
    "num_rel": "NumRel",
    "num_rel_ret": "NumRelRet",
    "set_P": "SetP",
    "set_recall": "SetR",
    "set_F": "SetF",
    "11pt_avg": "IPrec11pt",
    "ndcg": "nDCG",
    "iprec_at_recall": "IPrec",
}
#: bare names that are evald's own family names too, read as evald's (``P`` needs a cutoff)
_OURS = frozenset({"P", "Rprec", "infAP"})
_WITH_PARAMS = re.compile(r"([A-Za-z0-9_]+)\.(.+)")
_OUTPUT_KEY = re.compile(r"(P|recall|map_cut|ndcg_cut|success|iprec_at_recall)_(\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"\d*\.?\d+")
_GAIN = re.compile(r"\d+=[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def expand(parts: Iterable[str]) -> list[str]:
    """evald names for the parts of a measure list; parts that are not trec_eval's pass as is.

    trec_eval writes parameters after a dot, comma-separated (``P.5,10``, ``ndcg.1=3,2=9``), so
    the numbers that follow such a part belong to it.
    """
    return [name for _, name in expand_labelled(parts)]


def expand_labelled(parts: Iterable[str]) -> list[tuple[str | None, str]]:
    """``expand``, each evald name with the user's own spelling of it: the part itself when it
    names one measure (``map``, ``ndcg_cut.10``, ``MRR``), None when one trec_eval part names
    several (``P.5,10``, ``recall``: no single spelling is the user's)."""
    out: list[tuple[str | None, str]] = []
    params: list[str] | None = None  # the open trec_eval part's parameters
    family, spelled = "", ""

    def close() -> None:
        assert params is not None
        names = _names(family, params)
        label = spelled + "," + ",".join(params[1:]) if params[1:] else spelled
        out.extend((label if len(names) == 1 else None, name) for name in names)

    for raw in parts:
        part = raw.strip()
        if params is not None and (_NUMBER.fullmatch(part) or _GAIN.fullmatch(part)):
            params.append(part)
            continue
        if params is not None:
            close()
            params = None
        match = _WITH_PARAMS.fullmatch(part)
        if match and (match[1] in _CUTOFF_FAMILIES or match[1] in _PLAIN):
            family, params, spelled = match[1], [match[2]], part
            continue
        key = _OUTPUT_KEY.fullmatch(part)
        if key:
            found = _names(key[1], [key[2]])
        elif (part in _CUTOFF_FAMILIES or part in _PLAIN) and part not in _OURS:
            found = _names(part, [])
        else:
            found = [raw]
        out.extend((part if len(found) == 1 else None, name) for name in found)
    if params is not None:
        close()
    return out


def _names(family: str, params: list[str]) -> list[str]:
    if family in _CUTOFF_FAMILIES:
        name, defaults = _CUTOFF_FAMILIES[family]
        return [f"{name}@{k}" for k in (params or defaults)]
    if family == "iprec_at_recall":
        return [f"IPrec@{float(r)!r}" for r in (params or _LEVELS)]
    name = _PLAIN[family]
    if not params:
        return [name]
    if family == "set_F":
        return [f"SetF(beta={params[0]})"]
    if family == "ndcg":
        return ["nDCG(gains={" + ",".join(p.replace("=", ":") for p in params) + "})"]
    return [f"{family}.{','.join(params)}"]  # takes no parameters: the parser says so


_TREC_PLAIN = {evald: trec for trec, evald in _PLAIN.items() if evald != "IPrec"}
_TREC_CUTOFF = {evald: trec for trec, (evald, _) in _CUTOFF_FAMILIES.items()}


def trec_name(measure: Measure) -> str | None:
    """trec_eval's output name of a measure (``P_5``, ``map``), or None if it has none."""
    params = dict(measure.params)
    if "rel" in params or "dcg" in params or "denom" in params:
        return None
    if measure.family == "IPrec":
        return f"iprec_at_recall_{params['recall']:.2f}"
    if measure.family == "SetF":
        return "set_F" if "beta" not in params else None
    if measure.family == "nDCG" and measure.cutoff is None:
        return "ndcg"
    if "gains" in params:
        return None
    if measure.cutoff is not None:
        trec = _TREC_CUTOFF.get(measure.family)
        return None if trec is None else f"{trec}_{measure.cutoff}"
    return _TREC_PLAIN.get(measure.family)
