"""What the repartition stage needs to know about one record: its request id and where it goes.

Pure functions and a small reader, no Kafka client: Kafka's default partitioner (murmur2 over
the key bytes, so a record evald re-keys lands where any Kafka producer keying by the same
request id would have put it), and the request id read with the configured mapping's pointer
for the record's kind (docs/design.md, "Topics keyed any way"). The internal topics' names:
names.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic_core import from_json

from evald.input_rule import BOM
from evald.mapping import load_spec
from evald.mapping.pointer import MISSING, parse_pointer, resolve

__all__ = [
    "RequestIdReader",
    "Unkeyable",
    "murmur2",
    "partition_for",
]

#: the native schema's request id, in both kinds (docs/semantics.md)
NATIVE_REQUEST_ID = "/request_id"


def murmur2(data: bytes) -> int:
    """MurmurHash2 as Kafka's Java client computes it (``Utils.murmur2``, seed 0x9747b28c),
    as a signed 32-bit integer."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner for a keyed record: ``toPositive(murmur2(key)) % n``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True, slots=True)
class Unkeyable:
    """A record whose request id cannot be read: the reason code (``evald_rejected_total``'s
    vocabulary) and a detail naming the pointer."""

    reason: str
    detail: str


class RequestIdReader:
    """Reads only the request id of a record of a known kind (the topic tells the kind).

    Not a decoder: a record with a readable request id is passed on as it is, and the engine
    behind the internal topics decodes it in full (and rejects it there if anything else is
    wrong). A JSON parse is still needed to find the id; nothing else is validated.
    """

    def __init__(self, mapping: str) -> None:
        """``mapping``: a built-in mapping name or a mapping file (``input.mapping``)."""
        spec = load_spec(mapping)
        self._paths: dict[str, tuple[tuple[str, ...], str] | None] = {}
        if spec is None:
            native = (parse_pointer(NATIVE_REQUEST_ID), NATIVE_REQUEST_ID)
            self._paths = {"impression": native, "feedback": native}
            return
        for kind, section in (("impression", spec.impression), ("feedback", spec.feedback)):
            self._paths[kind] = (
                None if section is None else (parse_pointer(section.request_id), section.request_id)
            )

    def key(self, raw: bytes | None, kind: str) -> bytes | Unkeyable:
        """The request id of ``raw`` (a record of ``kind``) as UTF-8 key bytes."""
        path = self._paths.get(kind)
        if path is None:
            return Unkeyable("unknown_kind", f"the mapping has no {kind} section")
        tokens, text = path
        data = raw or b""
        if data.startswith(BOM):
            data = data[len(BOM) :]
        try:
            document = from_json(data, allow_inf_nan=False)
        except ValueError as exc:
            return Unkeyable("invalid_json", f"not JSON: {exc}")
        if type(document) is not dict:
            return Unkeyable("not_an_object", "a record is a JSON object")
        value = resolve(document, tokens)
        if value is MISSING or value is None:
            return Unkeyable("missing_field", f"{text}: missing")
        if type(value) is not str:
            return Unkeyable("wrong_type", f"{text}: a request id is a string")
        return value.encode("utf-8", "surrogatepass")
