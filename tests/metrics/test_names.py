"""Measure names: parsing, canonical spelling, errors, required depth."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from evald.metrics import (
    DEFAULT_MEASURES,
    FAMILIES,
    Batch,
    MeasureError,
    evaluate,
    make_measure,
    parse_measure,
    parse_measures,
    required_depth,
    valid_forms,
)


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("nDCG@10", "nDCG@10"),
        ("NDCG@10", "nDCG@10"),
        ("nDCG(dcg='log2')@10", "nDCG@10"),
        ('nDCG(dcg="exp-log2")@5', "nDCG(dcg='exp-log2')@5"),
        ("P(rel=2)@5", "P(rel=2)@5"),
        ("P(rel=2.0)@5", "P(rel=2)@5"),
        ("P(rel=1)@5", "P@5"),
        ("P(rel=0.5)@5", "P(rel=0.5)@5"),
        ("Hit@3", "Success@3"),
        ("MRR", "RR"),
        ("MAP@100", "AP@100"),
        ("RBP", "RBP(p=0.8)"),
        ("RBP(p=0.8)", "RBP(p=0.8)"),
        ("RBP(rel=2, p=0.9)", "RBP(p=0.9,rel=2)"),
        ("RBP(graded=True)", "RBP(p=0.8,graded=True)"),
        ("RBPResidual", "RBPResidual(p=0.8)"),
        ("RBPResidual(p=0.5)@10", "RBPResidual(p=0.5)@10"),
        ("ERR@20", "ERR@20"),
        ("ERR(gmax=4)@20", "ERR@20"),
        ("ERR(gmax=3)@20", "ERR(gmax=3)@20"),
        ("AP(denom='min')@5", "AP(denom='min')@5"),
        (" AUC(rel=2) ", "AUC(rel=2)"),
        ("GAUC", "GAUC"),
        ("KendallTau", "KendallTau"),
        ("F1@3", "F1@3"),
        ("DCG@6", "DCG@6"),
        ("CG@3", "CG@3"),
    ],
)
def test_canonical_names(written: str, canonical: str) -> None:
    measure = parse_measure(written)
    assert str(measure) == canonical
    assert parse_measure(canonical) == measure  # canonical names parse back to themselves


def test_default_measures_parse_and_print_back() -> None:
    measures = parse_measures(DEFAULT_MEASURES)
    assert ",".join(str(m) for m in measures) == DEFAULT_MEASURES


def test_list_input_comma_inside_parentheses_and_duplicates() -> None:
    measures = parse_measures(["RBP(p=0.9,rel=2)@10, P@5", "Hit@5", "Success@5"])
    assert [str(m) for m in measures] == ["RBP(p=0.9,rel=2)@10", "P@5", "Success@5"]


def test_parameter_access_falls_back_to_defaults() -> None:
    measure = parse_measure("RBP(rel=2)")
    assert measure["p"] == 0.8 and measure["rel"] == 2 and measure["graded"] is False
    assert make_measure("P", 5, rel=2) == parse_measure("P(rel=2)@5")


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ("ndcg@10", "unknown measure family 'ndcg'"),
        ("Foo", "unknown measure family"),
        ("P", "needs a cutoff"),
        ("Success", "needs a cutoff"),
        ("P@0", "positive integer"),
        ("P@x", "positive integer"),
        ("P@-3", "positive integer"),
        ("AUC@5", "takes no cutoff"),
        ("P(level=2)@5", "unknown parameter 'level'"),
        ("P(rel=0)@5", "rel=0"),
        ("P(rel='a')@5", "must be a number"),
        ("RBP(p=1.5)", "strictly between 0 and 1"),
        ("RBP(p=0.8,rel=2,graded=True)", "no rel threshold"),
        ("nDCG(dcg='exp')@5", "'log2', 'exp-log2'"),
        ("nDCG(dcg=exp)@5", "cannot read the value"),
        ("ERR(gmax=0)@5", "between 1 and 30"),
        ("P(rel)@5", "key=value"),
        ("P@5)", "valid forms: P@k"),
        ("P(rel=2@5", "malformed"),
        ("2P@5", "malformed"),
        ("", "no measure given"),
        (" , ", "no measure given"),
    ],
)
def test_errors_say_what_is_wrong(bad: str, fragment: str) -> None:
    with pytest.raises(MeasureError) as info:
        parse_measures(bad)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_name_lists_every_valid_form() -> None:
    with pytest.raises(MeasureError) as info:
        parse_measures("nDCG@10,Precision@5,MRR,bogus@3")
    message = str(info.value)
    for family in FAMILIES.values():
        for form in family.forms:
            assert form in message
    assert valid_forms() in message


def test_required_depth() -> None:
    assert required_depth(parse_measures("P@5,nDCG@10,Success@3")) == 10
    assert required_depth(parse_measures(DEFAULT_MEASURES)) is None  # RR reads the whole list
    assert required_depth(parse_measures("RR@10,RBP(p=0.8)@20")) == 20
    assert required_depth(parse_measures("P@5,AUC")) is None
    assert required_depth([]) == 0


def test_every_advertised_form_parses() -> None:
    for family in FAMILIES.values():
        for form in family.forms:
            concrete = (
                (form.replace("@k", "@5").replace("rel=N", "rel=2").replace("gmax=N", "gmax=3"))
                .replace("@r", "@0.5")
                .replace("beta=B", "beta=2")
            )
            assert str(parse_measure(concrete)).startswith(family.name), form


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("IPrec@0.5", "IPrec@0.5"),
        ("IPrec(rel=2)@1", "IPrec(rel=2)@1.0"),
        ("nDCG(gains={2: 9, 1: 3})@10", "nDCG(gains={1:3,2:9})@10"),
        ("DCG(gains={0:0.5})", "DCG(gains={0:0.5})"),
        ("SetF(beta=1)", "SetF"),
        ("BPref", "Bpref"),
        ("NumRelRet(rel=2)", "NumRelRet(rel=2)"),
    ],
)
def test_trec_eval_measures_have_ir_measures_names(text: str, canonical: str) -> None:
    assert str(parse_measure(text)) == canonical
    assert parse_measure(canonical) == parse_measure(text)


@pytest.mark.parametrize(
    "text",
    ["IPrec@1.5", "IPrec@x", "IPrec", "nDCG(gains={-1:2})", "nDCG(gains={1:'a'})", "nDCG(gains={})",
     "nDCG(gains={1:2},dcg='exp-log2')", "Judged", "NumRet@5", "GMAP@10"],
)  # fmt: skip
def test_bad_trec_eval_measure_forms_are_refused(text: str) -> None:
    with pytest.raises(MeasureError):
        parse_measure(text)


def test_a_gain_past_2_to_the_100_is_refused_and_2_to_the_100_scores_finite() -> None:
    """A gain map of 1e308 summed past the largest float in DCG (a numpy warning, nDCG
    NaN): gains are at most 2^100 in magnitude, the exponential gain of grade 100."""
    for text in ["DCG(gains={1:1e308})", "nDCG(gains={1:-1e31})@3", "DCG(gains={1:1e400})"]:
        with pytest.raises(MeasureError, match="gains are numbers from -2\\^100 to 2\\^100"):
            parse_measure(text)
    measures = parse_measures(f"DCG(gains={{1:{2.0**100!r}}}),nDCG(gains={{1:{2**100}}})@5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = evaluate(measures, Batch.from_served_grades([[1.0] * 1000, [0.0, 1.0]]))
    assert all(np.isfinite(v).all() for v in values.values())


def test_counts_read_no_rank_and_whole_list_measures_read_all() -> None:
    assert required_depth(parse_measures("NumRet,NumRel,P@5")) == 5
    assert required_depth(parse_measures("Judged@7,P@5")) == 7
    assert required_depth(parse_measures("Bpref,P@5")) is None
