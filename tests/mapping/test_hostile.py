"""The mapping decoder never raises on data: any bytes, any JSON value at any mapped path."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from evald.config import load_config
from evald.decode import Rejection, Skipped
from evald.events import Feedback, Impression
from evald.mapping import decoder_for

CONFIG = load_config({})
UBI = decoder_for("ubi", CONFIG)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ubi_keys = st.sampled_from(
    ["query_id", "timestamp", "query_response_hit_ids", "query_attributes", "client_id",
     "user_id", "user_query", "action_name", "event_attributes"]
)  # fmt: skip


@settings(max_examples=300, derandomize=True)
@given(st.binary(max_size=300), st.sampled_from([None, "impression", "feedback", "other"]))
def test_any_bytes_give_an_event_a_rejection_or_a_skip(raw: bytes, kind: str | None) -> None:
    got = UBI.decode(raw, kind, None)
    assert isinstance(got, (Impression, Feedback, Rejection, Skipped))


@settings(max_examples=500, derandomize=True)
@given(st.dictionaries(ubi_keys, values, max_size=9), st.sampled_from([None, "impression"]))
def test_any_json_at_the_mapped_paths_never_raises(record: dict, kind: str | None) -> None:
    raw = json.dumps(record, allow_nan=True).encode()
    got = UBI.decode(raw, kind, 1_714_564_800_000)
    assert isinstance(got, (Impression, Feedback, Rejection, Skipped))
    if isinstance(got, Rejection):
        assert got.reason and got.detail and got.raw == raw
