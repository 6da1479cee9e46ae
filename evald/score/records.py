"""The two things an input reader produces: a query ready to score, or a rejected line."""

from __future__ import annotations

from dataclasses import dataclass

Qid = str | int
"""JSONL accepts string or integer qids and echoes them unchanged; TREC qids are strings."""


@dataclass(frozen=True, slots=True)
class Query:
    """One ranked list with its judgments: ``ranking`` is the served order, rank 1 first."""

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
