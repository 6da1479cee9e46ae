"""What input readers produce: a query ready to score or a rejected line, and chunks of both.

:class:`Chunk` is here rather than beside the JSONL chunk reader so that TREC input, which
yields chunks too, does not import that reader (and msgspec) at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from evald.score.batching import Lists

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


@dataclass(slots=True)
class Chunk:
    """The queries of a run of input lines, as columns in input order, and its rejections."""

    qids: list[Qid] = field(default_factory=list)
    rankings: list[list[str]] = field(default_factory=list)
    qrels: list[dict[str, float]] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    fallbacks: int = 0  # lines of the chunk read by the per-line reader
    #: more queries, already looked up into numbers (the columnar TREC reader), after the above
    lists: Lists | None = None

    def __len__(self) -> int:
        return len(self.qids) + (len(self.lists) if self.lists is not None else 0)

    def add(self, item: Query | Rejection) -> None:
        """Append one query, or one rejection, read line by line."""
        if isinstance(item, Rejection):
            self.rejections.append(item)
        else:
            self.qids.append(item.qid)
            self.rankings.append(item.ranking)
            self.qrels.append(item.qrels)

    def queries(self) -> list[Query]:
        """The queries as :class:`Query` tuples (for tests and callers that want rows)."""
        return list(map(Query, self.qids, self.rankings, self.qrels))
