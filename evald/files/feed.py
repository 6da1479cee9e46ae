"""`evald replay`'s input side: the records of its files fed to the engine, in batches.

Files are read line by line within the size limit (``lines``), export wrappers taken off
(``exports``), and with ``--sort`` the records ordered by event time in bounded memory
(``sort``); a record's kind comes from the index an export named when the mapping lists it
(``indices``), else the decoder tells it. Rejections keep their file and line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from evald.decode import Rejection
from evald.engine import Engine
from evald.files.exports import Line, Record, Unwrapped, unwrap
from evald.files.lines import read_lines
from evald.files.sort import sorted_by_time


class Batches:
    """Records fed to the engine ``tick_every`` at a time, with their kinds (from the index an
    export named, when the mapping knows it) and where they came from (for ``--rejected``)."""

    def __init__(
        self,
        engine: Engine,
        rejected: IO[str] | None,
        tick_every: int,
        wall_clock: Callable[[], float],
    ) -> None:
        self.engine, self.rejected, self.tick_every = engine, rejected, tick_every
        self.wall_clock = wall_clock
        self.indices: dict[str, str] = dict(getattr(engine.decoder, "indices", None) or {})
        self.raws: list[bytes] = []
        self.kinds: list[str | None] = []
        self.where: list[tuple[str, int]] = []
        self.fed = 0

    def write_rejected(self, name: str, number: int, rejection: Rejection) -> None:
        if self.rejected is not None:
            line = {"file": name, "line": number, **rejection.to_json()}
            self.rejected.write(json.dumps(line, ensure_ascii=False) + "\n")

    def refuse(self, name: str, number: int, rejection: Rejection) -> None:
        """A record refused before decoding, in input order."""
        self.flush()
        self.engine.reject(rejection)
        self.write_rejected(name, number, rejection)

    def add(self, record: Record) -> bool:
        """Queue ``record``; True when a batch was fed and scored."""
        kind = None
        if record.index is not None and self.indices:
            kind = self.indices.get(record.index)
            if kind is None:
                known = ", ".join(sorted(self.indices))
                detail = f"index {record.index!r} is not one the mapping reads ({known})"
                self.refuse(
                    record.name, record.number, Rejection("unknown_kind", detail, record.raw)
                )
                return False
        self.raws.append(record.raw)
        self.kinds.append(kind)
        self.where.append((record.name, record.number))
        self.fed += 1
        if self.fed % self.tick_every:
            return False
        self.flush()
        self.engine.tick()
        return True

    def flush(self) -> None:
        raws = self.raws
        if raws:
            now = [int(self.wall_clock() * 1000)] * len(raws)
            kinds = self.kinds if any(k is not None for k in self.kinds) else None
            for position, got in self.engine.feed_batch(raws, kinds=kinds, timestamps=now):
                self.write_rejected(*self.where[position], got)
        self.raws, self.kinds, self.where = [], [], []


@dataclass
class SortOptions:
    """``--sort``: order the records by event time first, holding at most ``budget`` bytes of
    them in memory (the rest in run files under ``directory``; None: the system's)."""

    budget: int
    directory: str | None = None


def records_of(
    lines: Iterator[tuple[str, int, bytes, int, int]],
    batches: Batches,
    counts: dict[str, int],
    skipped: Unwrapped,
    limit: int,
    progress: Callable[[int, int], None] | None,
) -> Iterator[Record]:
    """The records of ``lines``: blank lines counted, over-long ones refused in input order,
    export wrappers taken off (``evald.files.exports``)."""

    def read() -> Iterator[Line]:
        for name, number, raw, size, length in lines:
            counts["bytes"] += size
            if not raw:
                counts["blank"] += 1
                continue
            counts["lines"] += 1
            if progress is not None and counts["lines"] % 4096 == 0:
                progress(counts["bytes"], counts["lines"])
            yield Line(name, number, raw, size, length)

    for item in unwrap(read(), skipped, limit):
        if isinstance(item, Record):
            yield item
        elif item.length > limit:  # cut by the reader: refused here
            detail = f"{item.length} bytes > limit {limit}"
            batches.refuse(item.name, item.number, Rejection("too_large", detail, item.raw))


def feed(
    engine: Engine,
    paths: list[str],
    *,
    rejected: IO[str] | None,
    tick_every: int,
    progress: Callable[[int, int], None] | None,
    wall_clock: Callable[[], float],
    sort: SortOptions | None,
) -> dict[str, int]:
    """Every record of ``paths`` fed to ``engine`` (with ``sort``: in event-time order), then
    a drain. Returns the counts: ``lines`` (not blank), ``blank``, ``bytes`` (read,
    decompressed), ``actions`` (export action lines) and ``bodies`` (update bodies skipped)."""
    limit = engine.config.limits.max_event_bytes
    counts = {"lines": 0, "blank": 0, "bytes": 0}
    skipped = Unwrapped()
    batches = Batches(engine, rejected, tick_every, wall_clock)
    records = records_of(read_lines(paths, limit), batches, counts, skipped, limit, progress)
    if sort is not None:
        decode = engine.decoder.decode
        indices = batches.indices

        def time_of(record: Record) -> int | None:
            kind = None if record.index is None else indices.get(record.index)
            return getattr(decode(record.raw, kind), "ts", None)

        records = sorted_by_time(records, time_of, budget=sort.budget, directory=sort.directory)
    for record in records:
        if batches.add(record) and progress is not None:
            progress(counts["bytes"], counts["lines"])
    batches.flush()
    engine.tick()
    engine.drain()
    counts["actions"], counts["bodies"] = skipped.actions, skipped.bodies
    return counts
