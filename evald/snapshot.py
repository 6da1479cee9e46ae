"""Named numpy arrays + JSON metadata <-> compressed bytes, exactly.

The window aggregates a restart needs are float sums: a restored run must equal an
uninterrupted one digit for digit, so values travel as their raw little-endian bytes (never
as decimal text). Layout (version 1)::

    b"EVSN" | version (1 byte) | zlib( header length (4 bytes, little-endian)
                                      | header JSON {"meta", "arrays": [{name, dtype, shape}]}
                                      | each array's bytes, in header order )

Pure functions; who writes the bytes where (and in how many records) is the caller's business.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["VERSION", "decode", "encode"]

MAGIC = b"EVSN"
VERSION = 1
#: zlib level 1: on the aggregates' float64 sums it is about 4x faster than level 6 for 12%
#: more bytes (4.5 MB -> 2.0 vs 1.8 MB, 90 vs 400 ms); a commit that snapshots waits for it.
#: Any level decodes the same way, so snapshots written at another level stay readable.
COMPRESS_LEVEL = 1
_DTYPES = {"<f8", "<i8"}  # what the aggregates hold; anything else is refused, not guessed


def encode(
    meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], level: int = COMPRESS_LEVEL
) -> bytes:
    """``meta`` (JSON-able) and ``arrays`` (float64 / int64, any shape) as one byte string;
    ``level`` 0 stores the body uncompressed (for a caller that compresses it otherwise)."""
    specs = []
    blobs = []
    for name, array in arrays.items():
        data = np.ascontiguousarray(array)
        dtype = data.dtype.newbyteorder("<").str
        if dtype not in _DTYPES:
            raise ValueError(f"array {name!r}: dtype {data.dtype} is not float64 or int64")
        specs.append({"name": name, "dtype": dtype, "shape": list(data.shape)})
        blobs.append(data.astype(dtype, copy=False).tobytes())
    header = json.dumps({"meta": dict(meta), "arrays": specs}, separators=(",", ":")).encode()
    body = b"".join([struct.pack("<I", len(header)), header, *blobs])
    return MAGIC + bytes([VERSION]) + zlib.compress(body, level)


def decode(raw: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Parse :func:`encode` output; raises ValueError on anything else (truncated, corrupt,
    another version)."""
    if raw[:4] != MAGIC or len(raw) < 5:
        raise ValueError("not a snapshot (bad magic)")
    if raw[4] != VERSION:
        raise ValueError(f"unsupported snapshot version {raw[4]}")
    try:
        body = zlib.decompress(raw[5:])
        (size,) = struct.unpack_from("<I", body)
        header = json.loads(body[4 : 4 + size])
        meta = header["meta"]
        position = 4 + size
        arrays: dict[str, np.ndarray] = {}
        for spec in header["arrays"]:
            dtype = np.dtype(spec["dtype"])
            if spec["dtype"] not in _DTYPES:
                raise ValueError(f"unsupported dtype {spec['dtype']!r}")
            shape = tuple(int(n) for n in spec["shape"])
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if position + nbytes > len(body):
                raise ValueError(f"array {spec['name']!r} is truncated")
            array = np.frombuffer(body, dtype, int(np.prod(shape, dtype=np.int64)), position)
            arrays[str(spec["name"])] = array.reshape(shape).astype(dtype.newbyteorder("="))
            position += nbytes
        if position != len(body):
            raise ValueError("trailing bytes after the last array")
    except (zlib.error, struct.error, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed snapshot: {exc!r}") from None
    if not isinstance(meta, dict):
        raise ValueError("malformed snapshot: meta is not an object")
    return meta, arrays
