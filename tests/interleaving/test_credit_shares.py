"""Credit shares: their records, when they are final, their checkpoint round trip, the fold
that waits for every partition, and that the statistics topic still reads the comparisons'
records of every release (the credit records are a kind of their own beside them)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evald.daemon.main.comparisons import decode_statistics
from evald.interleaving.fold import Settings
from evald.interleaving.live import LiveCredit
from evald.interleaving.shares import CreditFrozen, CreditShare, CreditShares, decode_credit
from evald.interleaving.sums import PairSums
from evald.statistics.shares import Frozen, PartitionShares, Share

WIDTH = 600_000  # the interleaving window
WINDOW = 60_000  # the attribution window
T0 = 1_700_000_400_000 // WIDTH * WIDTH


def observe(shares: CreditShares, p: int, ts: list[int], surface: str = "web") -> None:
    """One A-vs-B outcome per ts: A wins, B wins and ties in turn, A leading every other."""
    n = len(ts)
    weights = None
    if shares.replicates:
        weights = np.random.default_rng(n).integers(0, 4, (n, shares.replicates), dtype=np.uint8)
    shares.observe(
        p,
        [t // WIDTH * WIDTH for t in ts],
        [((surface,), "A", "B")] * n,
        [i % 2 == 0 for i in range(n)],
        [(1, -1, 0)[i % 3] for i in range(n)],
        [True] * n,
        [i % 4 != 0 for i in range(n)],
        weights,
    )


@pytest.mark.parametrize("replicates", [0, 5])
def test_records_round_trip_exactly(replicates: int) -> None:
    shares = CreditShares(WIDTH, WINDOW, replicates)
    observe(shares, 3, [T0 + i * 1000 for i in range(50)])
    frozen = shares.freeze(3, None, final=True)
    assert frozen is not None and len(frozen.shares) == 1
    (share,) = frozen.shares
    assert share.key == f"credit.{T0}.3.0".encode()
    back = decode_statistics(share.encode())
    assert isinstance(back, CreditShare)
    assert (back.start, back.width, back.partition, back.chunk) == (T0, WIDTH, 3, 0)
    assert back.cells == share.cells  # PairSums compare every count and replicate sum
    ((cell, sums),) = back.cells
    assert cell == (("web",), "A", "B") and (sums.wins_a, sums.wins_b, sums.ties) == (17, 17, 16)
    assert frozen.key == b"credit_final.3"
    assert decode_statistics(frozen.encode_mark()) == CreditFrozen(3, frozen.final_until)


def test_a_share_is_final_when_its_partition_passes_the_window_end_by_the_attribution_window():
    shares = CreditShares(WIDTH, WINDOW, 0)
    observe(shares, 0, [T0 + 5, T0 + WIDTH + 5])
    assert not shares.due(0, None)
    end = T0 + WIDTH
    frozen = shares.freeze(0, end + WINDOW - 2)
    assert frozen is not None and frozen.final_until == end - WIDTH and not frozen.shares
    assert shares.freeze(0, end + WINDOW - 2) is None  # the mark did not move
    assert shares.due(0, end + WINDOW - 1)
    frozen = shares.freeze(0, end + WINDOW - 1)
    assert frozen is not None and frozen.final_until == end
    assert [s.start for s in frozen.shares] == [T0]
    observe(shares, 0, [T0 + 7])  # a window handed out is not reopened
    assert [s.start for s in shares.freeze(0, None, final=True).shares] == [T0 + WIDTH]  # type: ignore[union-attr]


def test_a_share_of_many_cells_is_cut_into_records_that_add_up(monkeypatch) -> None:
    # 16 numbers a cell (6 counts, 2 x 5 replicate sums): 2 cells a record
    monkeypatch.setattr("evald.interleaving.shares.NUMBERS_PER_RECORD", 32)
    shares = CreditShares(WIDTH, WINDOW, 5)
    for i in range(5):
        observe(shares, 1, [T0 + j for j in range(10 + i)], surface=f"s{i}")
    frozen = shares.freeze(1, None, final=True)
    assert frozen is not None
    assert [s.chunk for s in frozen.shares] == [0, 1, 2]
    assert [len(s.cells) for s in frozen.shares] == [2, 2, 1]
    cells = dict(c for s in frozen.shares for c in decode_statistics(s.encode()).cells)  # type: ignore[union-attr]
    assert sorted(c[0][0] for c in cells) == [f"s{i}" for i in range(5)]
    assert [cells[((f"s{i}",), "A", "B")].lists for i in range(5)] == [10, 11, 12, 13, 14]


def test_the_open_shares_round_trip_through_a_checkpoint() -> None:
    """What a restore loads freezes to the very shares the uninterrupted partition hands out."""
    kept, restored = CreditShares(WIDTH, WINDOW, 5), CreditShares(WIDTH, WINDOW, 5)
    for shares in (kept, restored):
        observe(shares, 0, [T0 + i for i in range(30)])
        shares.freeze(0, T0 + WINDOW)  # a mark before the first window's end
    doc = json.loads(json.dumps(restored.state(0)))
    restored = CreditShares(WIDTH, WINDOW, 5)
    restored.load(0, doc, watermark=T0)
    for shares in (kept, restored):
        observe(shares, 0, [T0 + 40 + i for i in range(20)] + [T0 + WIDTH + 1])
    a, b = kept.freeze(0, None, final=True), restored.freeze(0, None, final=True)
    assert a is not None and b is not None and a == b
    assert a.shares[0].cells[0][1].lists == 50


def test_a_checkpoint_without_credit_counts_the_windows_final_at_its_watermark_as_done() -> None:
    """A checkpoint of the release before (no ``interleaving`` key) or of another window width:
    the windows final at its watermark are not published again, the open ones start empty."""
    for doc in (None, {"v": 1, "width": 2 * WIDTH, "replicates": 0, "final": None, "open": []}):
        shares = CreditShares(WIDTH, WINDOW, 0)
        shares.load(0, doc, watermark=T0 + WIDTH + WINDOW - 1)
        assert not shares.due(0, T0 + WIDTH + WINDOW - 1)
        observe(shares, 0, [T0 + 5, T0 + WIDTH + 5])
        frozen = shares.freeze(0, None, final=True)
        assert frozen is not None and [s.start for s in frozen.shares] == [T0 + WIDTH]


def test_a_comparison_checkpoint_with_the_credit_beside_it_loads_as_before() -> None:
    """The checkpoint's ``statistics`` holds the comparisons' state and, under
    ``interleaving``, the credit's: the comparisons' loader reads its part as before."""
    from evald.segments import SegmentIndex

    segments = SegmentIndex(["arm"], 100, 100)
    comparisons = PartitionShares(3_600_000, WINDOW, 1, segments)
    seg = segments.segment_of({"arm": "A"})
    comparisons.observe(0, np.asarray([seg]), np.asarray([T0]), np.ones((1, 1)), ["window"])
    credit = CreditShares(WIDTH, WINDOW, 0)
    observe(credit, 0, [T0])
    doc = json.loads(json.dumps({**comparisons.state(0), "interleaving": credit.state(0)}))
    again = PartitionShares(3_600_000, WINDOW, 1, segments)
    again.load(0, doc, watermark=None)
    assert again.state(0) == comparisons.state(0)
    other = CreditShares(WIDTH, WINDOW, 0)
    other.load(0, doc["interleaving"], watermark=None)
    assert other.state(0) == credit.state(0)


#: a comparison share and mark exactly as the releases before wrote them (versions 1 and 2)
V1_SHARE = (
    b'{"v":1,"kind":"share","start":1767225600000,"width":3600000,"partition":0,"chunk":0,'
    b'"segments":[[[["arm","A"]],[[40.0,20.0,12.0]]]]}'
)
V2_SHARE = (
    b'{"v":2,"kind":"share","start":1767225600000,"width":3600000,"partition":1,'
    b'"segments":[[[["arm","B"]],[[4.0,2.0,1.5,3.0,1.0,2.0,2.0,3.0]]]]}'
)
V1_MARK = b'{"v":1,"kind":"final","partition":0,"final":1767229200000}'


def test_the_statistics_topic_still_reads_the_comparisons_records_of_every_release() -> None:
    share = decode_statistics(V1_SHARE)
    assert isinstance(share, Share) and share.segments[0][1].tolist() == [[40.0, 20.0, 12.0]]
    share = decode_statistics(V2_SHARE)
    assert isinstance(share, Share) and share.segments[0][1].shape == (1, 8)
    assert share.chunk == 0  # the field came later: absent reads as 0
    assert decode_statistics(V1_MARK) == Frozen(0, 1767229200000)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b'{"v":1,"kind":"credit","start":0,"width":1,"partition":0}',
        b'{"v":1,"kind":"credit","start":0,"width":1,"partition":0,"cells":[[["web"],"A","B",[1,2],null,null]]}',
        b'{"v":1,"kind":"credit","start":0,"width":1,"partition":0,"cells":[[["web"],"A","B",[1,1,1,0,0,0],[1.0],null]]}',
        b'{"v":9,"kind":"credit_final","partition":0,"final":5}',
        b'{"v":1,"kind":"credit_final","final":5}',
    ],
)
def test_malformed_credit_records_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_statistics(raw)


def test_decode_credit_refuses_other_kinds() -> None:
    with pytest.raises(ValueError, match="not a credit record"):
        decode_credit({"v": 1, "kind": "share"})


def test_the_fold_waits_for_every_partition_and_counts_each_share_once() -> None:
    settings = Settings(min_n=2)
    live = LiveCredit(settings, WIDTH, 0)
    parts = [CreditShares(WIDTH, WINDOW, 0) for _ in range(2)]
    for p, shares in enumerate(parts):
        observe(shares, p, [T0 + i for i in range(10)] + [T0 + WIDTH + 1])
    first = parts[0].freeze(0, T0 + WIDTH + WINDOW - 1)
    assert first is not None
    live.add(first)
    assert live.unmarked([0, 1]) == [1]
    assert live.fold([0, 1]) == 0 and not live.records(["surface"])  # partition 1 has no mark
    second = parts[1].freeze(1, None, final=True)
    assert second is not None
    live.add(second)
    live.add(second.shares[0])  # a copy: ignored
    assert live.ignored == 1
    assert live.fold([0, 1]) == 1  # the first window only: partition 0's mark stops there
    (record,) = live.records(["surface"])
    assert record["lists"] == 20 and record["looks"] == 1
    assert live.state.pairs[(("web",), "A", "B")].total == PairSums(20, 10, 8, 6, 6, 14)
    rest = parts[0].freeze(0, None, final=True)
    assert rest is not None
    live.add(rest)
    live.add(first.shares[0])  # a share of a window folded already: ignored
    assert live.ignored == 2
    assert live.fold([0, 1]) == 1
    (record,) = live.records(["surface"])
    assert record["lists"] == 22 and record["looks"] == 2


def test_shares_of_another_width_or_number_of_replicates_are_ignored_not_folded() -> None:
    """Written before a settings change: their sums do not add up with the new ones (folding
    them would raise in the statistics reader at every poll)."""
    live = LiveCredit(Settings(min_n=2), WIDTH, 5)
    for p, (width, replicates) in enumerate(((WIDTH, 3), (2 * WIDTH, 5), (WIDTH, 5))):
        shares = CreditShares(width, WINDOW, replicates)
        observe(shares, p, [T0 + i for i in range(10)])
        frozen = shares.freeze(p, None, final=True)
        assert frozen is not None
        live.add(frozen)
    assert live.ignored == 2
    assert live.fold([0, 1, 2]) == 1  # partition 2's share alone
    (record,) = live.records(["surface"])
    assert record["lists"] == 10


def test_windows_starting_before_the_tests_start_are_not_folded() -> None:
    """``interleaving.start``: the test started over after its shares were lost."""
    shares = CreditShares(WIDTH, WINDOW, 0)
    observe(shares, 0, [T0 + i for i in range(10)] + [T0 + WIDTH + i for i in range(4)])
    frozen = shares.freeze(0, None, final=True)
    assert frozen is not None
    for start, lists in ((0, 14), (T0 + 1, 4), (T0 + WIDTH, 4), (T0 + WIDTH + 1, 0)):
        live = LiveCredit(Settings(min_n=2, start=start), WIDTH, 0)
        live.add(frozen)
        assert live.fold([0]) == (lists > 0) + (lists == 14)
        assert sum(r["lists"] for r in live.records(["surface"])) == lists


def test_a_share_of_cells_with_long_names_is_cut_by_their_bytes_too(monkeypatch) -> None:
    """Cells of ``[["s0"],"A","B"]`` (16 bytes of names) under a 40-byte budget: 2 a record,
    however few numbers they hold (the statistics topic's records stay under its limit)."""
    monkeypatch.setattr("evald.statistics.shares.LABEL_BYTES_PER_RECORD", 40, raising=False)
    shares = CreditShares(WIDTH, WINDOW, 0)
    for i in range(5):
        observe(shares, 1, [T0 + j for j in range(3)], surface=f"s{i}")
    frozen = shares.freeze(1, None, final=True)
    assert frozen is not None
    assert [len(s.cells) for s in frozen.shares] == [2, 2, 1]
    assert [s.chunk for s in frozen.shares] == [0, 1, 2]
