"""ListMemory scores a batch at once exactly as the list-by-list definition would: every value
and the checkpointed state bit for bit, after every batch, on random streams made to hit the
edges (maps far over capacity within a batch, empty lists, lists without a query or an arm,
an item twice in a list, few queries and items so pairs repeat, references out of retention),
and through ``state``/``load`` mid-stream."""

from __future__ import annotations

import base64
import math
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest

from evald.zerofeedback import lru
from evald.zerofeedback.memory import ListMemory, Scored, pair_key
from evald.zerofeedback.rbo import rbo_ext

DEPTH = 6


class PlainMemory:
    """The definition (docs/drilldown.md), one list at a time with two OrderedDicts."""

    def __init__(self, p: float, retention: int, judged_capacity: int, ref_capacity: int) -> None:
        self.p, self.retention = p, retention
        self.judged_capacity, self.ref_capacity = judged_capacity, ref_capacity
        self.judged: OrderedDict[int, int] = OrderedDict()
        self.refs: OrderedDict[int, tuple[int, tuple[int, ...]]] = OrderedDict()

    def score_one(self, query: int | None, arm: str | None, t: int, length: int,
                  keys: list[int], judged: list[bool]) -> list[float]:  # fmt: skip
        out = [float(length == 0), math.nan, math.nan]
        if query is None or (length and not keys):
            return out
        pairs = [pair_key(query, k) for k in keys]
        if pairs:
            seen = [self.judged.get(pair, -(1 << 63)) for pair in pairs]
            out[1] = sum(s < t - self.retention for s in seen) / len(pairs)
        for pair, hit in zip(pairs, judged, strict=False):
            if hit:
                self.judged.pop(pair, None)
                self.judged[pair] = t
                if len(self.judged) > self.judged_capacity:
                    self.judged.popitem(last=False)
        if arm == "control":
            self.refs.pop(query, None)
            self.refs[query] = (t, tuple(keys))
            if len(self.refs) > self.ref_capacity:
                self.refs.popitem(last=False)
        elif arm is not None:
            ref = self.refs.get(query)
            if ref is not None and ref[0] >= t - self.retention:
                out[2] = rbo_ext(keys, list(ref[1]), self.p)
        return out

    def state_rows(self) -> tuple[list[tuple[int, int]], list[list[int]]]:
        judged = [(k - (1 << 64) if k >= 1 << 63 else k, t) for k, t in self.judged.items()]
        width = 3 + max((len(keys) for _, keys in self.refs.values()), default=0)
        refs = [
            [q, t, len(keys), *keys] + [0] * (width - 3 - len(keys))
            for q, (t, keys) in self.refs.items()
        ]
        return judged, refs


def state_rows(doc: dict[str, Any]) -> tuple[list[tuple[int, int]], list[list[int]]]:
    import base64

    def rows(text: str, width: int) -> np.ndarray:
        return np.frombuffer(base64.b64decode(text), "<i8").reshape(-1, width)

    judged = [tuple(r) for r in rows(doc["judged"], 2).tolist()]
    return judged, rows(doc["references"], doc["width"]).tolist()  # type: ignore[return-value]


def random_batch(rng: np.random.Generator, n: int, t0: int, queries: int, items: int) -> Scored:
    keys = np.zeros((n, DEPTH), np.int64)
    counts = rng.integers(0, DEPTH + 1, n)
    lengths = np.where(rng.random(n) < 0.1, 0, np.maximum(counts, rng.integers(0, 9, n)))
    counts = np.where(lengths == 0, 0, counts)
    counts[rng.random(n) < 0.05] = 0  # items served, none keyed
    for i, c in enumerate(counts.tolist()):
        keys[i, :c] = rng.integers(-3, items, c) * 7919  # repeats within a list, negatives
    qs = rng.integers(0, queries, n).tolist()
    return Scored(
        queries=["" if q == 0 else f"q{q}" for q in qs],
        arms=[[None, "control", "treatment", "other"][a] for a in rng.integers(0, 4, n).tolist()],
        ts=np.sort(t0 + rng.integers(0, 5_000, n)),
        lengths=lengths,
        keys=keys,
        key_lengths=counts,
        judged=(rng.random((n, DEPTH)) < rng.choice([0.0, 0.4]))
        & (np.arange(DEPTH) < counts[:, None]),
    )


@pytest.mark.parametrize(
    ("seed", "judged_capacity", "ref_capacity", "batch", "queries", "items", "at_once"),
    [
        (1, 4096, 512, 200, 300, 50, lru._AT_ONCE),  # the defaults: nothing evicted for a while
        (2, 40, 8, 150, 60, 20, lru._AT_ONCE),  # evictions in every batch
        (3, 1, 1, 80, 10, 5, lru._AT_ONCE),  # a map of one: every new key evicts
        (3, 1, 1, 80, 10, 5, 0),  # the same through the exact loop
        (4, 7, 3, 400, 2000, 2000, lru._AT_ONCE),  # a batch writing far more than fits
        (5, 300, 20, 1, 30, 10, lru._AT_ONCE),  # batches of one list
    ],
)
def test_equals_the_list_by_list_definition(
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    judged_capacity: int,
    ref_capacity: int,
    batch: int,
    queries: int,
    items: int,
    at_once: int,
) -> None:
    monkeypatch.setattr(lru, "_AT_ONCE", at_once)
    rng = np.random.default_rng(seed)
    kwargs = {"p": 0.9, "arm_label": "arm", "reference": "control", "retention": 20_000}
    memory = ListMemory(**kwargs, judged_capacity=judged_capacity, reference_capacity=ref_capacity)
    plain = PlainMemory(0.9, 20_000, judged_capacity, ref_capacity)
    from evald.join.item_keys import item_key

    t = 0
    for b in range(24 if batch > 1 else 120):
        lists = random_batch(rng, int(rng.integers(0, batch + 1)), t, queries, items)
        t += 3_000
        got = memory.score(lists)
        want = [
            plain.score_one(
                item_key(q) if q else None, arm, ts, length, keys[:c], judged[:c]
            )
            for q, arm, ts, length, keys, c, judged in zip(
                lists.queries, lists.arms, lists.ts.tolist(), lists.lengths.tolist(),
                lists.keys.tolist(), lists.key_lengths.tolist(), lists.judged.tolist(),
                strict=True,
            )
        ]  # fmt: skip
        assert got.tobytes() == np.asarray(want, float).reshape(-1, 3).tobytes(), b
        assert state_rows(memory.state()) == plain.state_rows(), b
        if b % 7 == 3:  # a restart: the next batches score alike
            restored = ListMemory(
                **kwargs, judged_capacity=judged_capacity, reference_capacity=ref_capacity
            )
            restored.load(memory.state())
            memory = restored


def plain_batch(
    old: list[int], capacity: int, writes: list[int], reads: list[int], read_at: list[int]
) -> tuple[list[int], list[int]]:
    """lru.batch's answer by an OrderedDict of key -> position, write by write."""
    held = OrderedDict((k, p) for p, k in enumerate(old))
    capacity = max(capacity, len(old))
    src, done = [], 0
    for key, at in zip(reads, read_at, strict=True):
        for w in range(done, at):
            held.pop(writes[w], None)
            held[writes[w]] = len(old) + w
            if len(held) > capacity:
                held.popitem(last=False)
        done = max(done, at)
        src.append(held.get(key, -1))
    for w in range(done, len(writes)):
        held.pop(writes[w], None)
        held[writes[w]] = len(old) + w
        if len(held) > capacity:
            held.popitem(last=False)
    return src, list(held.values())


@pytest.mark.parametrize("at_once", [lru._AT_ONCE, 0])  # 0: the exact loop for every batch
def test_lru_batch_equals_writing_one_by_one(monkeypatch: pytest.MonkeyPatch, at_once: int) -> None:
    monkeypatch.setattr(lru, "_AT_ONCE", at_once)
    rng = np.random.default_rng(11)
    for _ in range(150):
        capacity = int(rng.integers(1, 30))
        universe = int(rng.integers(1, 60))
        old = rng.permutation(universe)[: int(rng.integers(0, capacity + 5))]  # may be over
        writes = rng.integers(0, universe, int(rng.integers(0, 80)))
        read_at = np.sort(rng.integers(0, len(writes) + 1, int(rng.integers(0, 80))))
        reads = rng.integers(0, universe, len(read_at))
        args = [a.astype(np.uint64) for a in (old, writes, reads)]
        src, held, order = lru.batch(
            args[0], np.argsort(args[0]), capacity, args[1], args[2], read_at
        )
        assert order.tolist() == np.argsort(np.concatenate(args[:2])[held]).tolist()
        want = plain_batch(*(a.tolist() for a in (old, np.int64(capacity), writes, reads, read_at)))
        assert (src.tolist(), held.tolist()) == want


def test_a_checkpoint_of_a_greater_depth_scores_against_its_longer_references() -> None:
    """``zero_feedback.depth`` lowered across a restart: the references kept at the former
    depth stay whole (an unequal-length RBO), where the former code failed to broadcast."""
    kwargs = {"p": 0.9, "arm_label": "arm", "reference": "control", "retention": 10**9}
    caps = {"judged_capacity": 8, "reference_capacity": 4}

    def one(depth: int, arm: str) -> Scored:
        keys = np.arange(1, depth + 1, dtype=np.int64)[None, :]
        lengths = np.array([depth])
        return Scored(["q"], [arm], np.array([1000]), lengths, keys, lengths, keys == 2)

    before = ListMemory(**kwargs, **caps)
    before.score(one(8, "control"))
    after = ListMemory(**kwargs, **caps)
    after.load(before.state())
    got = after.score(one(6, "treatment"))
    assert got[0, 2] == rbo_ext([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8], 0.9)
    assert state_rows(after.state()) == state_rows(before.state())


def test_a_checkpoint_over_the_capacity_keeps_its_newest_entries() -> None:
    """The capacities lowered across a restart: the loaded maps hold at most the new
    capacities (the entries written most recently), as the docs promise, and score so."""
    kwargs = {"p": 0.9, "arm_label": "arm", "reference": "control", "retention": 10**9}

    def one(query: str, item: int, t: int) -> Scored:
        keys = np.array([[item]], np.int64)
        lengths = np.array([1])
        return Scored([query], ["control"], np.array([t]), lengths, keys, lengths, keys > 0)

    before = ListMemory(**kwargs, judged_capacity=8, reference_capacity=8)
    for t, (query, item) in enumerate([("a", 1), ("b", 2), ("c", 3)]):
        before.score(one(query, item, t))
    assert before.sizes() == (3, 3)
    after = ListMemory(**kwargs, judged_capacity=2, reference_capacity=2)
    after.load(before.state())
    assert after.sizes() == (2, 2)
    judged, refs = state_rows(after.state())
    assert (judged, refs) == tuple(rows[1:] for rows in state_rows(before.state()))
    # the oldest pair is gone: never judged; a newer one still is; a rewrite does not shrink it
    after.score(one("c", 3, 10))
    assert after.score(one("a", 1, 11))[0, 1] == 1.0
    assert after.sizes() == (2, 2)
    assert after.score(one("a", 1, 12))[0, 1] == 0.0


@pytest.mark.parametrize("width", [0, 1, 2, "x", None])
def test_a_malformed_state_is_a_value_error(width: object) -> None:
    """Every malformed state a ValueError (the restore refuses it, exit 2), never another
    error every retry would meet again: a width below the three leading columns was an
    IndexError."""
    memory = ListMemory(**ARM, p=0.9, retention=10**9, judged_capacity=8, reference_capacity=4)
    references = base64.b64encode(np.arange(4, dtype="<i8").tobytes()).decode()
    with pytest.raises(ValueError, match="zero_feedback state is malformed"):
        memory.load({"judged": "", "references": references, "width": width})


ARM = {"arm_label": "arm", "reference": "control"}


def two_lists() -> ListMemory:
    """A memory holding one judged pair and one reference list (of arm=control)."""
    memory = ListMemory(**ARM, p=0.9, retention=10**9, judged_capacity=8, reference_capacity=4)
    keys = np.array([[1, 2, 3]], np.int64)
    lengths = np.array([3])
    memory.score(Scored(["q"], ["control"], np.array([1000]), lengths, keys, lengths, keys == 2))
    assert memory.sizes() == (1, 1)
    return memory


def treatment_rbo(memory: ListMemory, arm: str = "treatment") -> float:
    keys = np.array([[1, 2, 4]], np.int64)
    lengths = np.array([3])
    lists = Scored(["q"], [arm], np.array([2000]), lengths, keys, lengths, keys < 0)
    return float(memory.score(lists)[0, 2])


@pytest.mark.parametrize(
    "arm",
    [
        {"reference": "treatment"},
        {"arm_label": "variant"},
        {"arm_label": "variant", "reference": "x"},
    ],
)
def test_references_of_another_arm_are_dropped_on_load_and_the_judged_pairs_kept(
    arm: dict[str, str],
) -> None:
    """``arm_label`` or ``reference`` changed across a restart: the old arm's lists would be
    compared with their own lists (an RBO the new settings never give)."""
    after = ListMemory(
        **{**ARM, **arm}, p=0.9, retention=10**9, judged_capacity=8, reference_capacity=4
    )
    assert after.load(two_lists().state()) == ("arm", "control")
    assert after.sizes() == (1, 0)
    other = "control" if after.reference != "control" else "treatment"
    assert math.isnan(treatment_rbo(after, other))  # no reference to compare it with yet
    assert after.state()["reference"] == after.reference
    assert after.state()["arm_label"] == after.arm_label


def test_references_of_the_same_arm_and_of_a_state_naming_none_are_kept() -> None:
    """A state written before it named its arm is read as before: of the settings' arm."""
    state = two_lists().state()
    older = {k: v for k, v in state.items() if k not in ARM}
    for doc in (state, older):
        after = ListMemory(**ARM, p=0.9, retention=10**9, judged_capacity=8, reference_capacity=4)
        assert after.load(doc) is None
        assert after.sizes() == (1, 1)
        assert treatment_rbo(after) == rbo_ext([1, 2, 4], [1, 2, 3], 0.9)


@pytest.mark.parametrize("field", ["arm_label", "reference"])
def test_an_arm_not_a_string_is_a_value_error(field: str) -> None:
    doc = {**two_lists().state(), field: 3}
    memory = ListMemory(**ARM, p=0.9, retention=10**9, judged_capacity=8, reference_capacity=4)
    with pytest.raises(ValueError, match="zero_feedback state is malformed"):
        memory.load(doc)
