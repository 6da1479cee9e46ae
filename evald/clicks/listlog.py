"""The lists a partition's click model observed since its last snapshot, as compact bytes.

A checkpoint carries a partition's model as its last snapshot plus this log (``StreamClicks
.state``): snapshotting the whole model at every commit cost a quarter of the engine's CPU and
about a megabyte per partition per commit on the checkpoint topic, where a scored list logs
in about a hundred bytes. A restore loads the snapshot and observes the logged batches again,
in order and batched as they were, with the segments declared in the order they first came:
the model ends equal to the last bit (observing is a function of its input).

One batch: a 4-byte little-endian length, a JSON header ``{"n": lists, "labels": [segment
label values, in the order the batch declared them]}``, then per list the pair keys (int64,
depth of them), the clicks (bit-packed, rows × depth), the ranks shown (uint16), the index of
its segment in ``labels`` (uint32) and its event time (int64 ms).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from evald.clicks.sessions import Sessions

__all__ = ["decode", "encode"]


def encode(sessions: Sessions, labels: list[tuple[str, ...]], inverse: np.ndarray) -> bytes:
    """One batch: ``sessions`` whose session i is in segment ``labels[inverse[i]]``."""
    n = len(sessions)
    header = json.dumps({"n": n, "labels": labels}, separators=(",", ":")).encode()
    return b"".join(
        (
            len(header).to_bytes(4, "little"),
            header,
            np.ascontiguousarray(sessions.pairs, "<i8").tobytes(),
            np.packbits(sessions.clicks, axis=None).tobytes(),
            sessions.lengths.astype("<u2").tobytes(),
            np.asarray(inverse, "<u4").tobytes(),
            sessions.ts.astype("<i8").tobytes(),
        )
    )


def decode(raw: bytes, depth: int) -> Iterator[tuple[list[tuple[str, ...]], Sessions]]:
    """The batches of a log (concatenated ``encode``), each as (labels, sessions whose
    ``segments`` index ``labels``); ValueError if the bytes are not such a log."""
    at = 0
    while at < len(raw):
        size = int.from_bytes(raw[at : at + 4], "little")
        try:
            header = json.loads(raw[at + 4 : at + 4 + size])
            n, labels = int(header["n"]), [tuple(map(str, x)) for x in header["labels"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"a click-model log batch at byte {at} is unreadable: {exc}") from None
        at += 4 + size
        cells = n * depth
        widths = (8 * cells, (cells + 7) // 8, 2 * n, 4 * n, 8 * n)
        if at + sum(widths) > len(raw):
            raise ValueError(f"a click-model log batch at byte {at} is cut short")
        parts = []
        for width in widths:
            parts.append(raw[at : at + width])
            at += width
        pairs = np.frombuffer(parts[0], "<i8").reshape(n, depth).astype(np.int64)
        clicks = np.unpackbits(np.frombuffer(parts[1], np.uint8), count=cells).astype(bool)
        inverse = np.frombuffer(parts[3], "<u4").astype(np.intp)
        if n and int(inverse.max()) >= len(labels):
            raise ValueError(f"a click-model log batch at byte {at} names an unknown segment")
        yield (
            labels,
            Sessions(
                pairs,
                clicks.reshape(n, depth),
                np.frombuffer(parts[2], "<u2").astype(np.int64),
                inverse,
                np.frombuffer(parts[4], "<i8").astype(np.int64),
                np.ones(n),
            ),
        )
