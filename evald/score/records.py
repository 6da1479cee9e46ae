"""The two things an input reader produces: a query ready to score, or a rejected line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

Qid = str | int
"""JSONL accepts string or integer qids and echoes them unchanged; TREC qids are strings."""


class Query(NamedTuple):
    """One ranked list with its judgments: ``ranking`` is the served order, rank 1 first.

    A named tuple rather than a frozen dataclass: one is built per input line, and a tuple is
    several times cheaper to construct.
    """

    qid: Qid
    ranking: list[str]
    qrels: dict[str, float]


@dataclass(frozen=True, slots=True)
class Rejection:
    """An input line that was not scored, with where it came from and why."""

    source: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason}"
