import struct
import zlib

import numpy as np
import pytest

from evald import snapshot


def test_round_trip_is_exact_for_every_float():
    rng = np.random.default_rng(1)
    floats = rng.random((3, 4, 5)) / 7
    special = np.asarray([0.1 + 0.2, -0.0, 5e-324, 1.7976931348623157e308, np.inf, np.nan])
    ints = rng.integers(-(2**62), 2**62, size=9)
    meta, arrays = snapshot.decode(
        snapshot.encode({"k": [1, "a"]}, {"f": floats, "s": special, "i": ints})
    )
    assert meta == {"k": [1, "a"]}
    assert list(arrays) == ["f", "s", "i"]
    for name, want in (("f", floats), ("s", special), ("i", ints)):
        assert arrays[name].dtype == want.dtype and arrays[name].shape == want.shape
        assert arrays[name].tobytes() == want.tobytes()  # bit for bit, NaN and -0.0 included


def test_empty_arrays_and_big_endian_input():
    big = np.arange(4, dtype=">f8")
    _, arrays = snapshot.decode(snapshot.encode({}, {"e": np.zeros((0, 3)), "b": big}))
    assert arrays["e"].shape == (0, 3)
    assert arrays["b"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_zeros_compress():
    raw = snapshot.encode({}, {"z": np.zeros((100, 50, 6))})
    assert len(raw) < 100 * 50 * 6 * 8 / 50


def test_other_dtypes_are_refused():
    with pytest.raises(ValueError, match="float64 or int64"):
        snapshot.encode({}, {"x": np.zeros(3, dtype=np.float32)})


def _body(header: bytes, payload: bytes = b"") -> bytes:
    return b"EVSN\x01" + zlib.compress(struct.pack("<I", len(header)) + header + payload)


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"", "bad magic"),
        (b"JSON{}", "bad magic"),
        (b"EVSN\x02" + zlib.compress(b"x"), "version 2"),
        (b"EVSN\x01not zlib", "malformed"),
        (_body(b'{"meta":{},"arrays":[{"name":"a","dtype":"<f8","shape":[2]}]}', b"x"), "trunc"),
        (_body(b'{"meta":{},"arrays":[]}', b"extra"), "trailing"),
        (_body(b'{"meta":[],"arrays":[]}'), "meta is not"),
        (_body(b'{"meta":{},"arrays":[{"name":"a","dtype":"|O","shape":[1]}]}'), "dtype"),
        (_body(b"{"), "malformed"),
    ],
)
def test_anything_else_is_a_value_error(raw, message):
    with pytest.raises(ValueError, match=message):
        snapshot.decode(raw)


def test_compressed_at_the_fastest_level_and_any_level_decodes():
    # a commit that snapshots waits for the compression (docs/performance.md, Kafka section):
    # level 1, whose zlib header says "fastest"; a snapshot written at another level (level 6
    # before) decodes the same
    values = np.arange(1000, dtype=np.float64) / 3
    raw = snapshot.encode({"k": 1}, {"v": values})
    assert raw[5:7] == b"\x78\x01"
    body = zlib.decompress(raw[5:])
    older = raw[:5] + zlib.compress(body, 6)
    assert older != raw
    meta, arrays = snapshot.decode(older)
    assert meta == {"k": 1} and arrays["v"].tobytes() == values.tobytes()
