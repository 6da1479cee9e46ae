"""Every measure family in one place, the ir_measures way: what its name accepts, its kernel,
how its per-list values are averaged, and what they can be.

A family's formula is in its kernel's docstring (kernels.py); its entry here says how the engine
and ``evald score`` treat the values: the mean of the lists (``MEAN``), a mean weighted per list
(``WEIGHTED``: GAUC, each list weighted by its pairs) or the exponential of the mean log
(``GEOMETRIC``: GMAP). Parsing (names.py), evaluation and means (``evald.metrics``), the config's
check of what the engine's window sums can hold and ``evald score``'s rows and integer counts all
read this table; a new family is one entry here and, if new, one kernel in kernels.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from evald.metrics import kernels

if TYPE_CHECKING:
    from evald.metrics.batch import Batch
    from evald.metrics.names import Measure

__all__ = [
    "FAMILIES",
    "GEOMETRIC",
    "MEAN",
    "NONE",
    "OPTIONAL",
    "REQUIRED",
    "WEIGHTED",
    "Family",
    "Kernel",
]

#: a family's values for every list of a batch: float64 (n,)
Kernel = Callable[["Measure", "Batch"], np.ndarray]

# _Param and Family are named tuples: immutable like a frozen dataclass, and about 0.35 ms
# cheaper each to build at import (this module is on every `evald score` start-up).


class _Param(NamedTuple):
    """One parameter a family accepts: its default and a validator/normaliser."""

    default: Any
    check: Callable[[Any], Any]  # returns the normalised value or raises ValueError(reason)


def _positive_number(value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a number")
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a finite number > 0")
    return int(value) if float(value).is_integer() else float(value)


def _probability(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a number")
    if not 0 < value < 1:
        raise ValueError("must be strictly between 0 and 1")
    return float(value)


def _choice(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise ValueError("must be one of " + ", ".join(repr(o) for o in options))
        return str(value)

    return check


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be True or False")
    return value


def _grade_cap(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 30:
        raise ValueError("must be an integer between 1 and 30")
    return value


#: the largest gain of a gain map, that of grade 100 (the largest a stream gives) under
#: ``dcg='exp-log2'``: a DCG's sum of 1e308 gains overflowed (a numpy warning, NaN nDCG)
MAX_GAIN = 2.0**100


def _gain_map(value: Any) -> tuple[tuple[int, float | int], ...] | None:
    """trec_eval's ``ndcg.1=3,2=9``: relevance level (an integer ≥ 0) → gain (a finite number
    of magnitude at most ``MAX_GAIN``)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ValueError("must be a non-empty map of grade to gain, e.g. {0:0,1:1,2:3}")
    pairs = []
    for level, gain in value.items():
        if isinstance(level, bool) or not isinstance(level, int) or level < 0:
            raise ValueError(f"has level {level!r}: levels are integers ≥ 0")
        number = isinstance(gain, (int, float)) and not isinstance(gain, bool)
        if not number or not abs(gain) <= MAX_GAIN:
            raise ValueError(
                f"has gain {gain!r} for level {level}: gains are numbers from -2^100 to 2^100"
            )
        pairs.append((level, int(gain) if float(gain).is_integer() else float(gain)))
    return tuple(sorted(pairs))


def _recall_level(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError("must be a recall level between 0 and 1")
    return float(value)


_REL = _Param(1, _positive_number)
_P = _Param(0.8, _probability)
_DCG = _Param("log2", _choice("log2", "exp-log2"))

REQUIRED, OPTIONAL, NONE = "required", "optional", "none"


#: how a family's mean over lists is formed (``evald.metrics.mean_of``)
MEAN, WEIGHTED, GEOMETRIC = "mean", "weighted", "geometric"
#: which ranks a family reads (``required_depth``): to its cutoff (the whole list without one),
#: every served rank whatever the cutoff, or none (the served length, the judgments)
TO_CUTOFF, WHOLE_LIST, NO_RANKS = "to cutoff", "whole list", "no ranks"
UNIT = (0.0, 1.0)


class Family(NamedTuple):
    """Everything about one measure family; ``forms`` is shown in error messages."""

    name: str
    params: dict[str, _Param]
    cutoff: str  # REQUIRED, OPTIONAL or NONE
    forms: tuple[str, ...]
    kernel: Kernel
    always_shown: tuple[str, ...] = ()
    aggregation: str = MEAN
    #: ``WEIGHTED``: each list's weight in the mean (sums of ``w * v`` and ``w`` merge)
    weights: Kernel | None = None
    #: an aggregate over lists whose per-list value is that family's (GMAP of AP, GAUC of
    #: AUC): it has no per-query value of its own (trec_eval prints gm_map only in ``all``)
    aggregate_of: str | None = None
    #: the range of the averaged terms (GMAP's are log terms); None: unbounded
    span: tuple[float, float] | None = UNIT
    #: a count: trec_eval prints it as an integer and its ``all`` value is the sum
    is_count: bool = False
    reads: str = TO_CUTOFF


def _k(m: Measure) -> int:
    """The cutoff of a family that requires one (make_measure refuses such a measure without)."""
    assert m.cutoff is not None
    return m.cutoff


def _exp(m: Measure) -> bool:
    return bool(m["dcg"] == "exp-log2")


def _gains(m: Measure, b: Batch) -> tuple[np.ndarray, np.ndarray]:
    return kernels.gain_dcg(b.grades, b.judged, b.ideal, b.judged_total, dict(m["gains"]), m.cutoff)


def _dcg(m: Measure, b: Batch) -> np.ndarray:
    if m["gains"] is not None:
        return _gains(m, b)[0]
    return kernels.dcg(b.grades, m.cutoff, _exp(m))


def _ndcg(m: Measure, b: Batch) -> np.ndarray:
    if m["gains"] is not None:
        found, ideal = _gains(m, b)
        return kernels._ratio(found, ideal)
    return kernels.ndcg(b.grades, b.ideal, m.cutoff, _exp(m))


def _auc(m: Measure, b: Batch) -> np.ndarray:
    return kernels.auc(b.grades, b.judged, m["rel"])[0]


def _auc_weights(m: Measure, b: Batch) -> np.ndarray:
    """GAUC's weight of a list: its (relevant, judged non-relevant) pairs (kernels.auc)."""
    return kernels.auc(b.grades, b.judged, m["rel"])[1]


def _ap(m: Measure, b: Batch) -> np.ndarray:
    return kernels.average_precision(b.grades, b.ideal, m["rel"], m.cutoff, m["denom"] == "min")


def _rbp(m: Measure, b: Batch) -> np.ndarray:
    return kernels.rbp(b.grades, b.ideal, m["p"], None if m["graded"] else m["rel"], m.cutoff)


def _iprec(m: Measure, b: Batch) -> np.ndarray:
    recall = (m["recall"],)
    return kernels.interpolated_precision(b.grades, b.lengths, b.ideal, m["rel"], recall)[0]


#: the range of GMAP's averaged terms, log(max(AP, 0.00001)) (kernels.geometric_terms)
_LOG_TERMS = (math.log(kernels.MIN_GEO_MEAN), 0.0)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "P",
            {"rel": _REL},
            REQUIRED,
            ("P@k", "P(rel=N)@k"),
            lambda m, b: kernels.precision(b.grades, m["rel"], _k(m)),
        ),
        Family(
            "R",
            {"rel": _REL},
            REQUIRED,
            ("R@k", "R(rel=N)@k"),
            lambda m, b: kernels.recall(b.grades, b.ideal, m["rel"], m.cutoff),
        ),
        Family(
            "F1",
            {"rel": _REL},
            REQUIRED,
            ("F1@k", "F1(rel=N)@k"),
            lambda m, b: kernels.f1(b.grades, b.ideal, m["rel"], _k(m)),
        ),
        Family(
            "CG",
            {},
            OPTIONAL,
            ("CG@k", "CG"),
            lambda m, b: kernels.cg(b.grades, m.cutoff),
            span=None,
        ),
        Family(
            "DCG",
            {"dcg": _DCG, "gains": _Param(None, _gain_map)},
            OPTIONAL,
            ("DCG@k", "DCG", "DCG(dcg='exp-log2')@k", "DCG(gains={0:0,1:1,2:3})"),
            _dcg,
            span=None,
        ),
        Family(
            "nDCG",
            {"dcg": _DCG, "gains": _Param(None, _gain_map)},
            OPTIONAL,
            ("nDCG@k", "nDCG", "nDCG(dcg='exp-log2')@k", "nDCG(gains={0:0,1:1,2:3})@k"),
            _ndcg,
        ),
        Family(
            "AP",
            {"rel": _REL, "denom": _Param("R", _choice("R", "min"))},
            OPTIONAL,
            ("AP", "AP@k", "AP(rel=N)@k", "AP(denom='min')@k"),
            _ap,
        ),
        Family(
            "RR",
            {"rel": _REL},
            OPTIONAL,
            ("RR", "RR@k", "RR(rel=N)@k"),
            lambda m, b: kernels.reciprocal_rank(b.grades, m["rel"], m.cutoff),
        ),
        Family(
            "Success",
            {"rel": _REL},
            REQUIRED,
            ("Success@k", "Hit@k", "Success(rel=N)@k"),
            lambda m, b: kernels.success(b.grades, m["rel"], _k(m)),
        ),
        Family(
            "RBP",
            {"p": _P, "rel": _REL, "graded": _Param(False, _boolean)},
            OPTIONAL,
            ("RBP(p=0.8)", "RBP(p=0.8,rel=N)", "RBP(p=0.8,graded=True)", "RBP(p=0.8)@k"),
            _rbp,
            always_shown=("p",),
        ),
        Family(
            "RBPResidual",
            {"p": _P},
            OPTIONAL,
            ("RBPResidual(p=0.8)", "RBPResidual(p=0.8)@k"),
            lambda m, b: kernels.rbp_residual(b.judged, b.lengths, b.ideal, m["p"], m.cutoff),
            always_shown=("p",),
        ),
        Family(
            "ERR",
            {"gmax": _Param(4, _grade_cap)},
            OPTIONAL,
            ("ERR@k", "ERR(gmax=N)@k"),
            lambda m, b: kernels.err(b.grades, m["gmax"], m.cutoff),
        ),
        Family("AUC", {"rel": _REL}, NONE, ("AUC", "AUC(rel=N)"), _auc, reads=WHOLE_LIST),
        Family(
            "GAUC",
            {"rel": _REL},
            NONE,
            ("GAUC", "GAUC(rel=N)"),
            _auc,
            aggregation=WEIGHTED,
            weights=_auc_weights,
            aggregate_of="AUC",
            reads=WHOLE_LIST,
        ),
        Family(
            "KendallTau",
            {},
            NONE,
            ("KendallTau",),
            lambda m, b: kernels.kendall_tau_b(b.grades, b.judged),
            span=(-1.0, 1.0),
            reads=WHOLE_LIST,
        ),
        Family(
            "Rprec",
            {"rel": _REL},
            NONE,
            ("Rprec", "Rprec(rel=N)"),
            lambda m, b: kernels.r_precision(b.grades, b.ideal, m["rel"]),
        ),
        Family(
            "Bpref",
            {"rel": _REL},
            NONE,
            ("Bpref", "Bpref(rel=N)"),
            lambda m, b: kernels.bpref(b.grades, b.judged, b.ideal, b.judged_total, m["rel"]),
        ),
        Family(
            "infAP",
            {"rel": _REL},
            NONE,
            ("infAP", "infAP(rel=N)"),
            lambda m, b: kernels.inferred_ap(b.grades, b.judged, b.ideal, m["rel"]),
        ),
        Family(
            "GMAP",
            {"rel": _REL},
            NONE,
            ("GMAP", "GMAP(rel=N)"),
            lambda m, b: kernels.average_precision(b.grades, b.ideal, m["rel"], None, False),
            aggregation=GEOMETRIC,
            aggregate_of="AP",
            span=_LOG_TERMS,
        ),
        Family(
            "NumRet",
            {},
            NONE,
            ("NumRet",),
            lambda m, b: b.lengths.astype(np.float64),
            span=None,
            is_count=True,
            reads=NO_RANKS,
        ),
        Family(
            "NumRel",
            {"rel": _REL},
            NONE,
            ("NumRel", "NumRel(rel=N)"),
            lambda m, b: kernels.relevant_count(b.ideal, m["rel"]).astype(np.float64),
            span=None,
            is_count=True,
            reads=NO_RANKS,
        ),
        Family(
            "NumRelRet",
            {"rel": _REL},
            NONE,
            ("NumRelRet", "NumRelRet(rel=N)"),
            lambda m, b: kernels.relevant_retrieved(b.grades, m["rel"]),
            span=None,
            is_count=True,
        ),
        Family(
            "SetP",
            {"rel": _REL},
            NONE,
            ("SetP", "SetP(rel=N)"),
            lambda m, b: kernels.set_precision(b.grades, b.lengths, m["rel"]),
        ),
        Family(
            "SetR",
            {"rel": _REL},
            NONE,
            ("SetR", "SetR(rel=N)"),
            lambda m, b: kernels.set_recall(b.grades, b.ideal, m["rel"]),
        ),
        Family(
            "SetF",
            {"rel": _REL, "beta": _Param(1, _positive_number)},
            NONE,
            ("SetF", "SetF(beta=B)", "SetF(rel=N)"),
            lambda m, b: kernels.set_f(b.grades, b.lengths, b.ideal, m["rel"], m["beta"]),
        ),
        Family(
            "Judged",
            {},
            REQUIRED,
            ("Judged@k",),
            lambda m, b: kernels.judged_at(b.judged, _k(m)),
        ),
        Family(
            "IPrec",
            {"rel": _REL, "recall": _Param(None, _recall_level)},
            NONE,
            ("IPrec@r", "IPrec(rel=N)@r"),
            _iprec,
            always_shown=("recall",),
        ),
        Family(
            "IPrec11pt",
            {"rel": _REL},
            NONE,
            ("IPrec11pt", "IPrec11pt(rel=N)"),
            lambda m, b: kernels.eleven_point_average(b.grades, b.lengths, b.ideal, m["rel"]),
        ),
    )
}
