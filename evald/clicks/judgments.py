"""Judgments from a fitted click model: one per (query, item) pair, as TREC qrels and JSONL.

Pairs are numbered exactly (``Vocabulary``), so the judgments name the query and item ids as
the log spelled them. A pair's grade is the number of ``thresholds`` at or below its relevance
(0.25, 0.5, 0.75 by default: grades 0-3; COEC 0.5, 1, 2). An id with white space cannot be
written in a qrels line; such pairs go to the JSON Lines only, counted in the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from evald.clicks.model import ClickModel
from evald.clicks.quality import quality
from evald.clicks.report import fit_log
from evald.clicks.sessions import Sessions, Vocabulary
from evald.clicks.settings import ClickSettings


def grades(relevance: np.ndarray, thresholds: Sequence[float]) -> np.ndarray:
    """int grade per relevance: how many thresholds it reaches."""
    return np.searchsorted(np.asarray(thresholds), relevance, side="right").astype(np.int64)


def read_sessions(
    rows: Iterable[tuple[str, list[str], set[str]]], depth: int
) -> tuple[Sessions, Vocabulary]:
    vocab = Vocabulary()
    pairs, clicks = [], []
    for query, served, clicked in rows:
        pairs.append([vocab.id((query, item)) for item in served[:depth]])
        clicks.append([item in clicked for item in served[:depth]])
    return Sessions.build(pairs, clicks, depth=depth), vocab


def judge(
    rows: Iterable[tuple[str, list[str], set[str]]],
    args: argparse.Namespace,
    thresholds: Sequence[float],
) -> dict[str, Any]:
    """Fit, write the judgment files, return the summary (parameters and fit quality)."""
    settings = ClickSettings(model=args.model, depth=args.depth, max_pairs=args.max_pairs)
    settings.check()
    sessions, vocab = read_sessions(rows, args.depth)
    if not len(sessions):
        raise ValueError("no session to fit (every line empty or rejected)")
    cut = len(sessions) - round(len(sessions) * args.holdout)
    if not cut:
        raise ValueError(
            f"--holdout {args.holdout:g} leaves none of the {len(sessions)} lists to fit"
        )
    train, test = sessions.take(slice(0, cut)), sessions.take(slice(cut, None))
    model = fit_log(settings, train, [("all",)])
    written = write(model, train, vocab, args, thresholds)
    held = quality(model, test) if len(test) else quality(model, train)
    return {
        "model": model.name,
        "lists": len(train),
        "held_out": len(test),
        **model.parameters(0),
        **written,
        "fit": {"on": "held_out" if len(test) else "train", **held.to_json()},
    }


def write(
    model: ClickModel,
    sessions: Sessions,
    vocab: Vocabulary,
    args: argparse.Namespace,
    thresholds: Sequence[float],
) -> dict[str, int]:
    """The qrels and JSONL files; returns how many judgments each got."""
    size = len(vocab) + 1
    shown = sessions.shown()
    impressions = np.bincount(sessions.pairs[shown], minlength=size)
    clicks = np.bincount(sessions.pairs[shown & sessions.clicks], minlength=size)
    keys = np.flatnonzero(impressions >= max(1, args.min_impressions))
    relevance = model.relevance(model.pairs.lookup(keys))
    kept = model.pairs.lookup(keys) >= 0
    keys, relevance = keys[kept], relevance[kept]
    grade = grades(relevance, thresholds)
    counts = {"judgments": len(keys), "qrels_skipped_whitespace": 0}
    with contextlib.ExitStack() as stack:
        qrels = stack.enter_context(open(args.qrels, "w", encoding="utf-8")) if args.qrels else None
        jsonl = stack.enter_context(open(args.jsonl, "w", encoding="utf-8")) if args.jsonl else None
        for key, rel, g in zip(keys.tolist(), relevance.tolist(), grade.tolist(), strict=True):
            query, item = vocab.values[key]
            if qrels is not None:
                if any(c.isspace() for c in f"{query}{item}"):
                    counts["qrels_skipped_whitespace"] += 1
                else:
                    qrels.write(f"{query} 0 {item} {g}\n")
            if jsonl is not None:
                record = {
                    "qid": query,
                    "docid": item,
                    "grade": g,
                    "relevance": rel,
                    "impressions": int(impressions[key]),
                    "clicks": int(clicks[key]),
                }
                jsonl.write(json.dumps(record, ensure_ascii=False) + "\n")
    return counts
