"""Records of any number of files in event-time order, in bounded memory (``evald replay --sort``).

An external merge sort: records are read in input order and keyed by their event time (read
by the decoder; a record without a readable time keys before every other, it is rejected or
skipped whatever its place); once the records held pass ``budget`` bytes they are sorted and
written to a run file in a temporary directory; the runs are merged (at most ``FAN_IN`` files
open at once, merged in passes beyond that) and the records come out ordered by (time, input
order): stable for equal times. What is held is one buffer of records, then one record per
open run and the reader buffers: memory is bounded by ``budget`` whatever the input's size.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO

from evald.files.exports import Record

#: the memory a held record costs besides its bytes (its object, its (time, order) tuple and
#: their ints, the list slot, the sort's scratch), measured with tracemalloc on CPython 3.11:
#: 277 bytes held, 281 at the peak of sorting 100,000 of them
OVERHEAD = 300
#: run files merged at once
FAN_IN = 64
#: bytes of each run file's read buffer while merging
READ_BUFFER = 1 << 16

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes of ``512M``, ``2G``, ``65536`` (K, M, G binary; a trailing B or iB allowed);
    ValueError saying what is wrong."""
    body = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = body[-1:] if body[-1:] in _UNITS else ""
    number = body[: len(body) - len(unit)]
    if not number.isdigit() or int(number) * _UNITS[unit] < 1 << 20:
        raise ValueError(f"{text!r} is not a size of at least 1M (like 256M or 2G)")
    return int(number) * _UNITS[unit]


_HEAD = struct.Struct("<qqiqqiI")  # key, seq, name id, line number, length, index id, size
Keyed = tuple[int, int, Record]


class _Names:
    """Source names and index names of the records, as small ids in the run files."""

    def __init__(self) -> None:
        self.ids: dict[str | None, int] = {None: -1}
        self.names: list[str] = []

    def id_of(self, name: str | None) -> int:
        found = self.ids.get(name)
        if found is None:
            assert name is not None
            found = self.ids[name] = len(self.names)
            self.names.append(name)
        return found

    def name_of(self, ident: int) -> str | None:
        return None if ident < 0 else self.names[ident]


def _write_run(keyed: list[Keyed], directory: str, names: _Names) -> str:
    keyed.sort()  # by (time, input order): unique, so records are never compared
    handle, path = tempfile.mkstemp(prefix="evald-sort-", suffix=".run", dir=directory)
    with os.fdopen(handle, "wb", buffering=1 << 20) as out:
        for key, seq, record in keyed:
            _put(out, key, seq, record, names)
    return path


def _put(out: IO[bytes], key: int, seq: int, record: Record, names: _Names) -> None:
    head = _HEAD.pack(
        key,
        seq,
        names.id_of(record.name),
        record.number,
        record.length,
        names.id_of(record.index),
        len(record.raw),
    )
    out.write(head)
    out.write(record.raw)


def _read_run(path: str, names: _Names) -> Iterator[Keyed]:
    size = _HEAD.size
    with open(path, "rb", buffering=READ_BUFFER) as run:
        while True:
            head = run.read(size)
            if not head:
                return
            key, seq, name, number, length, index, raw_size = _HEAD.unpack(head)
            raw = run.read(raw_size)
            record = Record(names.name_of(name) or "", number, raw, length, names.name_of(index))
            yield key, seq, record


def _merged(paths: list[str], names: _Names) -> Iterator[Keyed]:
    """The runs merged by (time, input order), unique: records are never compared."""
    return heapq.merge(*(_read_run(path, names) for path in paths))


def sorted_by_time(
    records: Iterable[Record],
    time_of: Callable[[Record], int | None],
    *,
    budget: int,
    directory: str | None = None,
) -> Iterator[Record]:
    """``records`` ordered by ``time_of`` (None: before every time), equal times in input
    order, holding at most about ``budget`` bytes of records; run files go to ``directory``
    (None: the system's temporary directory) and are removed when the iteration ends."""
    with tempfile.TemporaryDirectory(prefix="evald-sort-", dir=directory) as workdir:
        names = _Names()
        runs: list[str] = []
        held: list[Keyed] = []
        size = 0
        for seq, record in enumerate(records):
            key = time_of(record)
            held.append((-1 if key is None else key, seq, record))
            size += len(record.raw) + OVERHEAD
            if size >= budget:
                runs.append(_write_run(held, workdir, names))
                held, size = [], 0
        if not runs:
            held.sort()
            for _, _, record in held:
                yield record
            return
        if held:
            runs.append(_write_run(held, workdir, names))
            held = []
        while len(runs) > FAN_IN:  # merge in passes: at most FAN_IN files open at once
            group, runs = runs[:FAN_IN], runs[FAN_IN:]
            handle, path = tempfile.mkstemp(prefix="evald-sort-", suffix=".run", dir=workdir)
            with os.fdopen(handle, "wb", buffering=1 << 20) as out:
                for key, seq, record in _merged(group, names):
                    _put(out, key, seq, record, names)
            for done in group:
                with contextlib.suppress(OSError):
                    os.remove(done)
            runs.append(path)
        for _, _, record in _merged(runs, names):
            yield record
