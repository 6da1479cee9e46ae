"""Every record-batch codec Kafka uses is readable by a runtime install of evald (and so by the
image, which installs the same wheel): the codec packages are runtime dependencies."""

from __future__ import annotations

import importlib.metadata

import kafka.codec
from packaging.requirements import Requirement


def test_runtime_dependencies_pull_in_every_codec() -> None:
    runtime = [
        Requirement(r) for r in importlib.metadata.requires("evald") or [] if "extra ==" not in r
    ]
    (client,) = [r for r in runtime if r.name == "kafka-python"]
    assert {"lz4", "snappy", "zstd"} <= client.extras


def test_this_install_can_decode_every_codec() -> None:
    assert kafka.codec.has_gzip()
    assert kafka.codec.has_snappy()
    assert kafka.codec.has_lz4()
    assert kafka.codec.has_zstd()
    payload = b"evald " * 100
    for compress, decompress in (
        (kafka.codec.snappy_encode, kafka.codec.snappy_decode),
        (kafka.codec.lz4_encode, kafka.codec.lz4_decode),
        (kafka.codec.zstd_encode, kafka.codec.zstd_decode),
    ):
        assert decompress(compress(payload)) == payload
