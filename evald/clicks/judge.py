"""`evald judge`: fit a click model on a session log and write judgments from it.

The log is JSON Lines, one served list per line, in the shape of the public web-search click
logs (a query id, the served ids, the clicked ids, no times)::

    {"query": "q17", "served": ["d3", "d9", "d1"], "clicked": ["d9"]}

(``qid`` for ``query``, ``items`` for ``served`` and ``clicks`` for ``clicked`` are read too).
The judgments are one per (query, item) pair the model keeps, as a TREC qrels file
(``query 0 item grade``, the grade an integer from ``--thresholds``) and as JSON Lines with the
model's relevance and the evidence behind it (impressions, clicks): the same judgments feed
``evald score --qrels``, OpenSearch's Search Relevance Workbench or any trec_eval tool.
docs/click-models.md has the conventions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Iterator
from typing import IO, Any

from evald.input_rule import BOM_TEXT, EMPTY_ID, any_blank, blank, gzipped, repeated_key

SUMMARY = "fit a click model on a session log and write judgments (TREC qrels, JSON Lines)"
EXAMPLES = """\
  evald judge sessions.jsonl --model pbm --qrels judged.qrels --jsonl judged.jsonl
  evald judge sessions.jsonl --model dbn --holdout 0.2          # perplexity on held-out lists
  evald score --run run.txt --qrels judged.qrels --mean         # score with the judgments
"""
EXIT_AT_ONCE = True

#: grade thresholds by model: a relevance at or above the i-th threshold is grade i + 1
THRESHOLDS = {"coec": (0.5, 1.0, 2.0), "default": (0.25, 0.5, 0.75)}
KEYS = {"query": ("query", "qid"), "served": ("served", "items"), "clicked": ("clicked", "clicks")}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="session log (JSON Lines); '-': stdin")
    parser.add_argument(
        "--model",
        choices=("pbm", "dbn", "cascade", "coec"),
        default="pbm",
        help="the click model (default pbm)",
    )
    parser.add_argument("--depth", type=int, default=10, help="ranks read (default 10)")
    parser.add_argument(
        "--max-pairs", type=int, default=1_000_000, help="pairs kept (default 1,000,000)"
    )
    parser.add_argument("--qrels", metavar="OUT", help="write TREC qrels here")
    parser.add_argument("--jsonl", metavar="OUT", help="write JSON Lines judgments here")
    parser.add_argument(
        "--thresholds",
        metavar="LIST",
        help="relevance thresholds of grades 1, 2, ... (default 0.25,0.5,0.75; COEC 0.5,1,2)",
    )
    parser.add_argument(
        "--min-impressions",
        type=int,
        default=1,
        metavar="N",
        help="judge only pairs shown at least N times (default 1)",
    )
    parser.add_argument(
        "--holdout",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="fit on the first lines, report perplexity on the last SHARE of them (default 0)",
    )


class BadLine(ValueError):
    """A session line that cannot be read (its reason)."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when it repeats a key (the input rule of every command)."""
    key = repeated_key(pairs)
    if key is not None:
        raise BadLine(f"duplicate key {json.dumps(key)}")
    return dict(pairs)


def _unicode(text: str) -> bool:
    """False for a string holding a lone surrogate (an unpaired \\ud800-\\udfff escape):
    not Unicode text, so it could not be written to the judgment files."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_line(text: str) -> tuple[str, list[str], set[str]]:
    """(query, served, clicked) of one line; BadLine naming what is wrong."""
    try:
        doc = json.loads(text, object_pairs_hook=_object)
    except BadLine:  # a repeated key (``_object``)
        raise
    except ValueError as exc:  # JSONDecodeError, and an integer past Python's 4,300 digits
        raise BadLine(f"not JSON: {exc}") from None
    except RecursionError:
        raise BadLine("not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadLine("expected a JSON object")
    key: dict[str, str] = {}  # field -> the name the line spells it with
    for field, names in KEYS.items():
        spelt = next((n for n in names if n in doc), None)
        if spelt is None:
            raise BadLine(f'missing "{names[0]}" (or "{names[1]}")')
        key[field] = spelt
    query, served, clicked = (doc[key[f]] for f in ("query", "served", "clicked"))
    if isinstance(query, bool) or not isinstance(query, str | int):
        raise BadLine(f'"{key["query"]}" must be a string or an integer')
    for field, ids in (("served", served), ("clicked", clicked)):
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise BadLine(f'"{key[field]}" must be an array of strings')
    # a blank id names nothing, and would leave a qrels line a column short (input_rule.blank)
    if isinstance(query, str) and blank(query):
        raise BadLine(f'"{key["query"]}": {EMPTY_ID}')
    if any_blank(served):
        pos = next(i for i, item in enumerate(served) if blank(item))
        raise BadLine(f'"{key["served"]}"[{pos}]: {EMPTY_ID}')
    if not all(map(_unicode, [str(query), *served])):
        raise BadLine("a lone surrogate in an id: not Unicode text")
    if len(set(served)) != len(served):
        raise BadLine(f'an id appears twice in "{key["served"]}"')
    missing = set(clicked) - set(served)
    if missing:
        raise BadLine(f'clicked id {sorted(missing)[0]!r} is not in "{key["served"]}"')
    return str(query), served, set(clicked)


def lines(
    stream: IO[bytes], name: str, errors: list[str]
) -> Iterator[tuple[str, list[str], set[str]]]:
    for number, raw in enumerate(stream, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.append(f"{name}:{number}: not valid UTF-8 (byte {exc.start})")
            continue
        text = text.removeprefix(BOM_TEXT).strip()
        if not text:
            continue
        try:
            yield read_line(text)
        except BadLine as exc:
            errors.append(f"{name}:{number}: {exc}")


def thresholds_of(args: argparse.Namespace) -> tuple[float, ...]:
    if args.thresholds is None:
        return THRESHOLDS.get(args.model, THRESHOLDS["default"])
    try:
        values = tuple(float(v) for v in args.thresholds.split(","))
    except ValueError:
        raise ValueError(f"--thresholds: not a list of numbers: {args.thresholds!r}") from None
    if not all(map(math.isfinite, values)):  # NaN would grade every pair 0, silently
        raise ValueError(f"--thresholds: not finite numbers: {args.thresholds!r}")
    if list(values) != sorted(set(values)):
        raise ValueError("--thresholds: must be increasing")
    return values


def run(args: argparse.Namespace) -> int:
    """Entry point of ``evald judge``."""
    from evald.clicks.judgments import judge
    from evald.output_files import clash

    errors: list[str] = []
    try:
        thresholds = thresholds_of(args)
        if not 0 <= args.holdout < 1:
            raise ValueError("--holdout: must be in [0, 1)")
        problem = clash({"--qrels": args.qrels, "--jsonl": args.jsonl}, [args.file])
        if problem is not None:
            raise ValueError(problem)
        name = "<stdin>" if args.file == "-" else args.file
        with contextlib.ExitStack() as stack:
            stream = (
                sys.stdin.buffer if args.file == "-" else stack.enter_context(open(args.file, "rb"))
            )
            if gzipped(stream):  # not UTF-8
                raise ValueError(f"{name} is gzip-compressed: judge reads plain text (zcat it)")
            summary = judge(lines(stream, name, errors), args, thresholds)
    except (ValueError, OSError) as exc:
        for error in errors:  # the lines read so far: why none was left to fit, say
            print(error, file=sys.stderr)
        print(f"evald judge: {exc}", file=sys.stderr)
        return 2
    for error in errors:
        print(error, file=sys.stderr)
    print(json.dumps(summary, ensure_ascii=False, indent=2))
    if errors:
        print(f"evald judge: {len(errors)} line(s) rejected", file=sys.stderr)
        return 1
    return 0
