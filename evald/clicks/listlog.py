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

import base64
import json
from collections.abc import Iterator

import numpy as np

from evald.clicks.sessions import Sessions

__all__ = ["Base64Log", "decode", "encode"]


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


class Base64Log:
    """The base64 of a log that only grows (batches appended) between snapshots, encoded
    once per byte: every checkpoint carries the whole log since the last snapshot, and
    encoding it anew at each commit cost as much as the rest of the checkpoint. Base64 of
    the log is the base64 of its first 3k bytes followed by that of the rest, so the text
    equals ``b64encode(b"".join(batches))`` to the last character."""

    def __init__(self) -> None:
        self._of: list[bytes] | None = None  # the batches list encoded (a new one: start over)
        self._used = 0  # how many of its batches
        self._text = ""  # base64 of all their bytes but the last len(bytes) % 3
        self._carry = b""  # those last bytes

    def text(self, batches: list[bytes]) -> str:
        """base64 of ``b"".join(batches)``; ``batches`` is the list last passed with
        batches appended since, or another list (encoded from the start)."""
        if batches is not self._of or self._used > len(batches):
            self._of, self._used, self._text, self._carry = batches, 0, "", b""
        fresh = self._carry + b"".join(batches[self._used :])
        cut = len(fresh) - len(fresh) % 3
        if cut:
            self._text += base64.b64encode(fresh[:cut]).decode()
        self._used, self._carry = len(batches), fresh[cut:]
        return self._text + base64.b64encode(self._carry).decode()
