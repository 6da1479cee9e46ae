"""The label pairs of the attribution against the rule of docs/drilldown.md ("Label keys that
are not segment keys") written out plainly: per list, its keys that are not segment keys nor
``query``, in code-point order, the first ``max_keys``; each pair one string that splits back
to its key and value whatever they hold."""

from __future__ import annotations

import numpy as np
import pytest

from evald.drilldown.labels import LabelPairs, pair, split

KEYS = ["arm", "query", "device", "b", "a:1", "10:x", "é", "e\u0301", "", "Z", "session", "ü"]


def plain(labels: list[dict[str, str]], segment: set[str], max_keys: int) -> list[tuple]:
    out = []
    for i, one in enumerate(labels):
        taken = sorted(k for k in one if k not in segment and k != "query")[:max_keys]
        out += [(i, k, one[k]) for k in taken]
    return out


def batch(rng: np.random.Generator, n: int, same: bool) -> list[dict[str, str]]:
    def one() -> dict[str, str]:
        keys = rng.choice(KEYS, size=int(rng.integers(0, len(KEYS))), replace=False).tolist()
        return {k: f"{rng.integers(0, 9)}:{rng.choice(['', '7', 'a:b', 'x' * 5])}" for k in keys}

    if same:
        shape = one()
        return [{k: f"{v}{i}" for k, v in shape.items()} for i in range(n)]
    return [one() for _ in range(n)]


@pytest.mark.parametrize("max_keys", [0, 1, 3, 64])
def test_the_pairs_equal_the_plain_rule_in_both_paths_and_through_the_cache(max_keys: int) -> None:
    rng = np.random.default_rng(max_keys)
    pairs = LabelPairs(["arm", "surface"], max_keys)
    pairs.CACHE = 8  # emptied often: a key set seen again is taken again alike
    for _ in range(300):
        labels = batch(rng, int(rng.integers(1, 12)), same=rng.random() < 0.5)
        rows, items = pairs.expand(labels)
        got = [(r, *split(item)) for r, item in zip(rows.tolist(), items, strict=True)]
        assert got == plain(labels, {"arm", "surface"}, max_keys)
        assert [pairs.pairs(one) for one in labels] == [
            [pair(k, v) for _, k, v in plain([one], {"arm", "surface"}, max_keys)] for one in labels
        ]


def test_a_pair_splits_back_whatever_the_key_holds() -> None:
    for key in KEYS:
        for value in ["", "1", ":", "10:x", "é"]:
            assert split(pair(key, value)) == (key, value)
    assert pair("a", "1:b") != pair("a1", ":b")  # the key's length tells them apart


def test_the_oracle_catches_keys_taken_in_another_order() -> None:
    """Negative control: the rule with the keys in insertion order differs on these batches."""
    rng = np.random.default_rng(1)
    labels = batch(rng, 50, same=False)
    unsorted = [
        (i, k, one[k])
        for i, one in enumerate(labels)
        for k in [k for k in one if k not in {"arm", "surface", "query"}][:3]
    ]
    assert unsorted != plain(labels, {"arm", "surface"}, 3)
