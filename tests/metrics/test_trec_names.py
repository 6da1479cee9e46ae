"""trec_eval's measure names read as aliases, and written back for ``--format trec``."""

from __future__ import annotations

import pytest

from evald.metrics import MeasureError, parse_measures
from evald.metrics.trec_names import trec_name


@pytest.mark.parametrize(
    ("trec", "ours"),
    [
        ("P.5,10", ["P@5", "P@10"]),
        ("P.5,10,map,ndcg_cut.5,10", ["P@5", "P@10", "AP", "nDCG@5", "nDCG@10"]),
        ("ndcg_cut_10,recip_rank", ["nDCG@10", "RR"]),
        ("success", ["Success@1", "Success@5", "Success@10"]),
        ("recall.100", ["R@100"]),
        ("map_cut.5", ["AP@5"]),
        ("iprec_at_recall.0.1,.5", ["IPrec@0.1", "IPrec@0.5"]),
        ("iprec_at_recall_0.20", ["IPrec@0.2"]),
        ("ndcg.1=3,2=9", ["nDCG(gains={1:3,2:9})"]),
        ("set_F.0.5,set_P,set_recall", ["SetF(beta=0.5)", "SetP", "SetR"]),
        ("11pt_avg,gm_map,bpref,Rprec,infAP", ["IPrec11pt", "GMAP", "Bpref", "Rprec", "infAP"]),
        ("num_ret,num_rel,num_rel_ret", ["NumRet", "NumRel", "NumRelRet"]),
        ("P.5,nDCG@10,P(rel=2)@3", ["P@5", "nDCG@10", "P(rel=2)@3"]),
    ],
)
def test_trec_eval_names_are_aliases(trec: str, ours: list[str]) -> None:
    assert [str(m) for m in parse_measures(trec)] == ours


def test_bare_cutoff_families_take_trec_evals_default_cutoffs() -> None:
    assert [str(m) for m in parse_measures("recall")] == [
        f"R@{k}" for k in (5, 10, 15, 20, 30, 100, 200, 500, 1000)
    ]
    with pytest.raises(MeasureError, match="needs a cutoff"):  # evald's own P, as before
        parse_measures("P")
    assert len(parse_measures("iprec_at_recall")) == 11


def test_a_trec_family_without_parameters_is_refused_with_its_name() -> None:
    with pytest.raises(MeasureError, match=r"'map\.5'"):
        parse_measures("map.5")


@pytest.mark.parametrize(
    ("ours", "trec"),
    [
        ("P@5", "P_5"),
        ("R@10", "recall_10"),
        ("AP", "map"),
        ("AP@5", "map_cut_5"),
        ("nDCG@10", "ndcg_cut_10"),
        ("nDCG", "ndcg"),
        ("RR", "recip_rank"),
        ("Success@1", "success_1"),
        ("IPrec@0.1", "iprec_at_recall_0.10"),
        ("IPrec11pt", "11pt_avg"),
        ("GMAP", "gm_map"),
        ("NumRelRet", "num_rel_ret"),
        ("SetF", "set_F"),
        ("P(rel=2)@5", None),
        ("nDCG(dcg='exp-log2')@5", None),
        ("RBP(p=0.8)", None),
        ("RR@5", None),
    ],
)
def test_trec_output_names(ours: str, trec: str | None) -> None:
    (measure,) = parse_measures(ours)
    assert trec_name(measure) == trec
    if trec is not None:  # and the trec_eval name reads back as the same measure
        assert parse_measures(trec) == [measure]
