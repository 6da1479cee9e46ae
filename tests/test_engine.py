"""Engine-level behaviour: counters, partitions, window rows and the daemon hooks."""

from __future__ import annotations

import json
import statistics
from collections import Counter

import numpy as np
import pytest

from evald.config import load_config
from evald.engine import Engine, Result
from evald.events import format_timestamp

MIN = 60_000
WINDOW = 10 * MIN
LATENESS = MIN


#: these tests use small epoch-ms times and a frozen clock: no event-time plausibility bound
UNBOUNDED_TIMES = {"min_event_time": 0, "max_event_lead": None}
#: for tests that state what closes when against a watermark following every event (the
#: confirmation of event times by blocks has its own tests: tests/join/test_clock.py)
EVERY_EVENT = {"watermark_quorum": 1}


def imp(rid: str, ts: int, items: list[str], **labels: str) -> bytes:
    return json.dumps({"request_id": rid, "ts": ts, "items": items, "labels": labels}).encode()


def fb(rid: str, ts: int, item: str, action: str = "click", **extra: object) -> bytes:
    body = {"request_id": rid, "ts": ts, "item": item, "action": action, **extra}
    return json.dumps(body).encode()


def make(**settings: object) -> tuple[Engine, list[Result]]:
    results: list[Result] = []
    config = load_config(
        {
            **UNBOUNDED_TIMES,
            "window": WINDOW,
            "lateness": LATENESS,
            "measures": "RR,P@2",
            **settings,
        }
    )
    return Engine(config, clock=lambda: 0.0, on_result=results.append), results


def test_counters_by_kind_outcome_and_reason():
    engine, _ = make()
    engine.feed(imp("r", 0, ["a"]))
    engine.feed(imp("r", 0, ["a"]))
    engine.feed(fb("r", 1, "a"))
    engine.feed(b"{oops")
    engine.feed(fb("r", 1, "a", action="wink"))
    ev = engine.stats.events
    assert ev[("impression", "accepted")] == 1 and ev[("impression", "duplicate")] == 1
    assert ev[("feedback", "accepted")] == 1 and ev[("feedback", "rejected")] == 1
    assert ev[("unknown", "rejected")] == 1
    assert engine.stats.rejected["invalid_json"] == 1
    assert engine.stats.rejected["unknown_action"] == 1


def test_result_json_schema():
    engine, results = make()
    engine.feed(imp("r", 1_714_564_800_250, ["a", "b"], arm="t", extra="kept"))
    engine.feed(fb("r", 1_714_564_800_300, "b"))
    engine.drain()
    line = results[0].to_json()
    assert line == {
        "request_id": "r",
        "ts": "2024-05-01T12:00:00.250Z",
        "labels": {"arm": "t", "extra": "kept"},
        "measures": {"RR": 0.5, "P@2": 0.5},
    }
    assert format_timestamp(results[0].ts) == line["ts"]


def test_partitions_have_their_own_watermarks():
    engine, results = make(**EVERY_EVENT)
    engine.feed(imp("a", 0, ["x"]), partition=0)
    engine.feed(imp("b", 0, ["x"]), partition=1)
    engine.feed(imp("c", WINDOW + LATENESS, ["x"]), partition=0)
    engine.tick()
    assert engine.watermarks() == {0: WINDOW, 1: -LATENESS}
    assert [(r.request_id, r.partition) for r in results] == [("a", 0)]
    assert engine.pending() == 2


def test_window_rows_match_an_independent_computation():
    engine, results = make(bucket="1m", windows=["5m", "1h"], **EVERY_EVENT)
    rng = np.random.default_rng(1)
    max_ts = 0
    for k in range(400):
        ts = k * 15_000  # 100 minutes
        arm = "A" if k % 3 else "B"
        engine.feed(imp(f"r{k}", ts, ["a", "b", "c"], arm=arm))
        max_ts = ts
        if rng.random() < 0.7:
            engine.feed(fb(f"r{k}", ts + 10, str(rng.choice(["a", "b", "c"]))))
            max_ts = ts + 10
        engine.tick()
    complete = engine.complete_before()
    assert complete == max_ts - LATENESS - WINDOW + 1
    rows = engine.window_rows()
    assert {r.window for r in rows} == {"5m", "1h"}
    for row in rows:
        assert row.end_ms <= complete and row.end_ms % (5 * MIN) == 0
        vals = [
            r.measures[row.measure]
            for r in results
            if row.start_ms <= r.ts < row.end_ms and r.labels["arm"] == row.labels["arm"]
        ]
        assert row.count == len(vals)
        assert row.sum == pytest.approx(sum(vals))
        assert row.sum_squares == pytest.approx(sum(v * v for v in vals))
        assert row.mean == pytest.approx(statistics.fmean(vals))
        half = 1.959963984540054 * statistics.stdev(vals) / len(vals) ** 0.5
        assert row.ci95_halfwidth == pytest.approx(half)
        assert row.labels == {"model": "__none__", "arm": row.labels["arm"], "surface": "__none__"}
    five = {r.end_ms for r in rows if r.window == "5m"}
    assert five == {complete // (5 * MIN) * (5 * MIN)}


def test_histograms_count_every_finalized_impression():
    engine, results = make(histogram_bounds=[0.0, 0.5, 1.0])
    for k in range(20):
        engine.feed(imp(f"r{k}", k, ["a", "b"], arm="A"))
        if k % 2:
            engine.feed(fb(f"r{k}", k + 1, "a" if k % 4 == 1 else "b"))
    engine.drain()
    agg = engine.aggregates
    seg = engine.segments.segment_of({"arm": "A"})
    m = agg.measures.index("RR")
    rr = [r.measures["RR"] for r in results]
    assert agg.hist_count[seg, m] == 20
    assert agg.hist_sum[seg, m] == pytest.approx(sum(rr))
    # buckets: <=0, (0, 0.5], (0.5, 1], +Inf
    assert agg.hist_counts[seg, m].tolist() == [
        sum(v <= 0 for v in rr),
        sum(0 < v <= 0.5 for v in rr),
        sum(0.5 < v <= 1 for v in rr),
        0,
    ]
    assert agg.abandoned[seg] == 10


def test_cardinality_is_capped_under_100k_distinct_label_values():
    engine, results = make(label_value_cap=50, window="1m", lateness=0)
    for k in range(100_000):
        engine.feed(imp(f"r{k}", k, ["a"], model=f"m{k}", arm=f"a{k % 70}"))
        if k % 5_000 == 0:
            engine.tick()
    engine.drain()
    assert len(results) == 100_000
    segments = engine.segments.segments
    for key_index in range(3):
        assert len({seg[key_index] for seg in segments}) <= 51
    assert len(segments) <= 51 * 51
    assert engine.segments.value_counts()[:2] == [50, 50]
    assert any(seg[0] == "__other__" for seg in segments)
    # the raw labels are still on every result
    assert results[-1].labels == {"model": "m99999", "arm": "a39"}


# ------------------------------------------------------------------------ daemon hooks


def test_low_offsets_track_pending_impressions_merged_and_held_feedback():
    engine, _ = make(**EVERY_EVENT)
    assert engine.low_offsets(0) == {"impression": None, "feedback": None}
    engine.feed(imp("a", 0, ["x"]), kind="impression", offset=10)
    engine.feed(imp("b", 1, ["x"]), kind="impression", offset=11)
    engine.feed(fb("b", 2, "x"), kind="feedback", offset=5)
    engine.feed(fb("later", 3, "x"), kind="feedback", offset=6)  # held
    assert engine.low_offsets(0) == {"impression": 10, "feedback": 5}
    engine.feed(imp("c", WINDOW + LATENESS + 1, ["x"]), kind="impression", offset=12)
    engine.tick()  # a and b closed and emitted; the held feedback is still waiting
    assert engine.low_offsets(0) == {"impression": 12, "feedback": 6}
    engine.drain()
    assert engine.low_offsets(0) == {"impression": None, "feedback": None}
    assert engine.checkpoint(0) == WINDOW + 1
    assert engine.checkpoint(7) is None


def _stream(seed: int, n: int = 400) -> list[tuple[str, int, bytes]]:
    """(kind, per-kind offset, raw) in arrival order for two co-partitioned topics."""
    rng = np.random.default_rng(seed)
    events: list[tuple[int, str, bytes]] = []
    for k in range(n):
        ts = k * 20_000
        items = [f"i{x}" for x in rng.choice(30, size=4, replace=False)]
        events.append((ts, "impression", imp(f"r{k}", ts, items, arm=f"{k % 2}")))
        for _ in range(int(rng.integers(0, 4))):
            lag = int(rng.integers(-MIN, WINDOW + MIN))
            events.append((ts + lag, "feedback", fb(f"r{k}", ts + lag, str(rng.choice(items)))))
    events.sort(key=lambda e: e[0] + int(rng.integers(0, LATENESS)))
    offsets = {"impression": 0, "feedback": 0}
    out = []
    for _, kind, raw in events:
        out.append((kind, offsets[kind], raw))
        offsets[kind] += 1
    return out


@pytest.mark.parametrize("crash_at", [1, 150, 433, 700])
def test_restore_after_a_crash_emits_every_impression_exactly_once(crash_at):
    stream = _stream(5)
    reference, ref_results = make()
    for kind, off, raw in stream:
        reference.feed(raw, kind=kind, offset=off)
        reference.tick()
    reference.drain()
    want = {r.request_id: r.measures for r in ref_results}

    # first life: commit (results emitted so far + low offsets + watermark) at crash_at
    first, first_results = make()
    consumed = {"impression": 0, "feedback": 0}
    for kind, off, raw in stream[:crash_at]:
        first.feed(raw, kind=kind, offset=off)
        first.tick()
        consumed[kind] = off + 1
    committed = list(first_results)
    low = first.low_offsets(0)
    watermark = first.checkpoint(0)
    # ... events after the commit are lost with the crash (their results were never committed)

    second, second_results = make()
    second.restore(0, watermark, consumed)
    start = {k: consumed[k] if low[k] is None else low[k] for k in consumed}
    for kind, off, raw in stream:
        if off >= start[kind]:
            second.feed(raw, kind=kind, offset=off)
            second.tick()
    second.drain()
    got = [r.request_id for r in committed + second_results]
    assert len(got) == len(set(got)), "an impression was emitted twice"
    assert {r.request_id: r.measures for r in committed + second_results} == want


def test_restore_counts_only_events_not_seen_before():
    engine, _ = make()
    engine.restore(0, 15 * MIN, {"impression": 2, "feedback": 1})
    engine.feed(imp("old", 0, ["a"]), kind="impression", offset=0)  # done before: skipped
    engine.feed(imp("open", 15 * MIN, ["a"]), kind="impression", offset=1)  # rebuilt silently
    engine.feed(fb("gone", 1, "a"), kind="feedback", offset=0)  # no impression: silent
    engine.feed(b"junk", kind="feedback", offset=0)  # rejected before: not counted again
    assert sum(engine.stats.events.values()) == 0
    assert engine.pending() == 1 and engine.watermarks() == {0: 15 * MIN}
    engine.feed(imp("new", 15 * MIN, ["a"]), kind="impression", offset=2)
    engine.feed(b"junk", kind="feedback", offset=1)
    assert engine.stats.events[("impression", "accepted")] == 1
    assert engine.stats.rejected["invalid_json"] == 1


def test_a_record_a_restore_re_feeds_is_not_handed_back_for_a_second_dead_letter():
    """It was refused, and dead-lettered, before the checkpoint: neither ``feed`` nor
    ``feed_batch`` hands it back again; the first refused record past the replay is."""
    engine, _ = make()
    engine.restore(0, 15 * MIN, {"impression": 2, "feedback": 0})
    assert engine.feed(b"junk", kind="impression", offset=0) is None
    got = engine.feed_batch([b"junk", b"junk"], kinds="impression", offsets=[1, 2])
    assert [position for position, _ in got] == [1]
    assert engine.stats.rejected["invalid_json"] == 1


def test_re_fed_feedback_on_an_unserved_item_counts_when_its_rebuilt_impression_closes():
    """The impression was still open at the checkpoint, so its feedback was never graded: the
    click on an item it did not serve is counted once, by the life that closes it."""
    first, _ = make(**EVERY_EVENT)
    first.feed(imp("r", 0, ["a"]), kind="impression", offset=0)
    first.feed(fb("r", 10, "ghost"), kind="feedback", offset=0)
    first.tick()
    assert first.stats.unattributed["unknown_item"] == 0 and first.pending() == 1
    second, results = make(**EVERY_EVENT)
    consumed = {"impression": 1, "feedback": 1}
    second.restore(0, first.checkpoint(0), consumed, first.event_times(0))
    second.feed(imp("r", 0, ["a"]), kind="impression", offset=0)
    second.feed(fb("r", 10, "ghost"), kind="feedback", offset=0)
    second.feed(imp("later", WINDOW + LATENESS, ["a"]), kind="impression", offset=1)
    second.tick()
    assert [r.request_id for r in results] == ["r"]
    assert second.stats.unattributed["unknown_item"] == 1


def test_drop_partition_forgets_state_and_window_sums_but_not_histograms():
    engine, _ = make()
    engine.feed(imp("a", 0, ["x"], arm="A"), partition=0)
    engine.feed(imp("b", 0, ["x"], arm="A"), partition=1)
    engine.feed(imp("c", 0, ["x"], arm="A"), partition=1)
    engine.drain()
    seg = engine.segments.segment_of({"arm": "A"})
    assert engine.aggregates.hist_count[seg].max() == 3
    engine.drop_partition(1)
    assert engine.aggregates.partitions() == [0]
    assert engine.aggregates.hist_count[seg].max() == 3
    rows = engine.window_rows()
    assert {r.count for r in rows} == {1}
    assert 1 not in engine.watermarks()


def test_absorb_result_feeds_window_sums_only():
    engine, results = make()
    engine.feed(imp("a", 0, ["x"], arm="A"))
    engine.feed(fb("a", 1, "x"))
    engine.drain()
    line = json.loads(json.dumps(results[0].to_json()))
    other, _ = make()
    assert other.absorb_result(line, 4)
    assert other.absorb_result({**line, "request_id": "b", "measures": {"RR": 0.25, "P@2": 0.5}}, 4)
    for bad in (
        {},
        {**line, "ts": "yesterday"},
        {**line, "measures": {"RR": "x"}},
        {**line, "labels": [1]},
    ):
        assert not other.absorb_result(bad, 4)
    assert other.aggregates.hist_count.sum() == 0
    other.drain()
    rows = {(r.window, r.measure): r for r in other.window_rows()}
    assert rows[("5m", "RR")].count == 2
    assert rows[("5m", "RR")].sum == pytest.approx(1.25)
    assert other.aggregates.partitions() == [4]


def test_absorb_results_in_one_call_equal_one_at_a_time():
    """What a restore absorbs in one call (a partition's result ranges) gives the window sums
    of absorbing each result alone, to the digit; the clustered interval's replicate sums to
    the last digits (one matrix product per run instead of one per result)."""
    from evald import snapshot as codec

    rng = np.random.default_rng(7)
    docs: list[object] = []
    for k in range(300):
        doc = {
            "request_id": f"r{k}",
            "ts": int(k * 7_000 + rng.integers(0, 5_000)),
            "labels": {"arm": "AB"[k % 2], "model": "m"},
            "measures": {"RR": float(rng.random()), "P@2": float(rng.random())},
        }
        if k % 3 == 0:
            doc["cluster"] = f"{k + 1:016x}"
        docs.append(doc)
    docs[17:17] = [{"ts": "never"}, None, [1, 2]]  # not results: left out
    alone, _ = make()
    taken = sum(alone.absorb_result(doc, 2) for doc in docs)  # type: ignore[arg-type]
    together, _ = make()
    assert together.absorb_results(docs, 2) == taken == 300
    meta_a, arrays_a = codec.decode(alone.snapshot(2))
    meta_b, arrays_b = codec.decode(together.snapshot(2))
    assert meta_a == meta_b
    for name in ("windows.buckets", "windows.values", "boot.buckets"):
        assert np.array_equal(arrays_a[name], arrays_b[name]), name
    np.testing.assert_allclose(arrays_b["boot.values"], arrays_a["boot.values"], rtol=1e-12)
    assert together.absorb_results([], 2) == 0


def test_on_result_gets_every_result_in_finalization_order():
    engine, results = make(**EVERY_EVENT)
    for k in range(5):
        engine.feed(imp(f"r{k}", k * MIN, ["x"]), partition=k % 2)
    engine.feed(imp("z", 30 * MIN, ["x"]), partition=0)
    engine.feed(imp("z", 30 * MIN, ["x"]), partition=1)
    engine.tick()
    # partition 0 first (r0, r2, r4 in deadline order), then partition 1
    assert [r.request_id for r in results] == ["r0", "r2", "r4", "r1", "r3"]


class _TabDecoder:
    """Another input format through the decoder seam: ``rid<TAB>ts<TAB>item[,item]`` lines are
    impressions, ``rid<TAB>ts<TAB>item<TAB>action`` lines feedback (via the native decoder)."""

    def __init__(self, engine_config: object) -> None:
        from evald.decode import Decoder

        self.native = Decoder(engine_config.limits, engine_config.action_grades)  # type: ignore[attr-defined]
        self.action_grades = self.native.action_grades

    def _to_json(self, raw: bytes) -> bytes:
        parts = raw.decode().split("\t")
        if len(parts) == 3:
            return imp(parts[0], int(parts[1]), parts[2].split(","))
        return fb(parts[0], int(parts[1]), parts[2], parts[3])

    def decode(self, raw, kind=None, reference=None, record_time=None):
        return self.native.decode(self._to_json(raw), kind, reference)

    def decode_many(self, raws, kinds, rejections, references=None, record_times=None, skips=None):
        converted = [self._to_json(raw) for raw in raws]
        return self.native.decode_many(converted, kinds, rejections, references)


def test_another_input_format_is_another_decoder_not_an_engine_edit():
    """The seam: an engine handed a decoder reads that format, by record and by batch."""
    config = load_config({**UNBOUNDED_TIMES, "window": WINDOW, "measures": "RR"})
    results: list[Result] = []
    engine = Engine(
        config, clock=lambda: 0.0, on_result=results.append, decoder=_TabDecoder(config)
    )
    engine.feed(b"r1\t0\ta,b")
    engine.feed(b"r1\t5\tb\tclick")
    engine.feed_batch([b"r2\t1\tx,y,z", b"r2\t6\tz\tclick"])
    engine.drain()
    assert {r.request_id: r.measures["RR"] for r in results} == {"r1": 0.5, "r2": 1 / 3}


def _two_lives(crash_at: int, *, max_pending: int, carry_evicted: bool) -> list[Result]:
    """Results committed by a first life cut at ``crash_at`` plus those of a restored second
    life; ``carry_evicted`` passes the cap's evictions through the checkpoint."""
    stream = _stream(5)
    first, first_results = make(max_pending=max_pending)
    consumed = {"impression": 0, "feedback": 0}
    for kind, off, raw in stream[:crash_at]:
        first.feed(raw, kind=kind, offset=off)
        first.tick()
        consumed[kind] = off + 1
    committed = list(first_results)
    low = first.low_offsets(0)
    start = {k: consumed[k] if low[k] is None else low[k] for k in consumed}
    evicted = first.evicted(0, start["impression"]) if carry_evicted else []
    second, second_results = make(max_pending=max_pending)
    second.restore(0, first.checkpoint(0), consumed, first.event_times(0), evicted)
    for kind, off, raw in stream:
        if off >= start[kind]:
            second.feed(raw, kind=kind, offset=off)
            second.tick()
    second.drain()
    return committed + second_results


#: crash points where an impression the cap closed lies inside the replay (found by a scan)
EVICTED_IN_REPLAY = [242, 279, 427, 538, 834, 945]


@pytest.mark.parametrize("crash_at", [150, 433, *EVICTED_IN_REPLAY])
def test_impressions_evicted_by_the_cap_are_emitted_once_across_a_restore(crash_at):
    both = _two_lives(crash_at, max_pending=4, carry_evicted=True)
    got = [r.request_id for r in both]
    assert len(got) == len(set(got)), "an impression was emitted twice"
    assert {r.reason for r in both} >= {"cap"}  # the cap did evict
    assert len(got) == sum(1 for kind, _, _ in _stream(5) if kind == "impression")


def test_without_the_evicted_offsets_a_restore_emits_evicted_impressions_again():
    """Negative control: what the checkpoint's evicted offsets prevent."""
    for crash_at in EVICTED_IN_REPLAY:
        both = _two_lives(crash_at, max_pending=4, carry_evicted=False)
        got = [r.request_id for r in both]
        assert len(got) > len(set(got)), crash_at


def test_evicted_offsets_below_the_replay_start_are_forgotten():
    engine, _ = make(max_pending=1)
    for k in range(4):
        engine.feed(imp(f"r{k}", k * MIN, ["a"]), kind="impression", offset=k)
    engine.tick()
    assert engine.evicted(0, 0) == [0, 1, 2]
    assert engine.evicted(0, 2) == [2]
    assert engine.evicted(0, 0) == [2]  # forgotten for good
    assert engine.evicted(0, None) == [] and engine.evicted(9, 0) == []


# ------------------------------------------------------------------------ two lives, one outcome


def _lives(
    events: list[tuple[str, int, bytes]], cut: int, *, carry_held: bool = True, **settings: object
) -> tuple[list[Result], dict[str, int], list[Result], dict[str, int]]:
    """One uninterrupted engine over ``events`` (kind, offset, raw), and a first life stopped
    right after a checkpoint at ``cut`` plus a second life restored from it, re-fed from the
    checkpoint's committed offsets: (results, counters) of both, the lives' summed.
    ``carry_held`` passes the feedback held at the checkpoint through it."""
    reference, want = make(**settings)
    for kind, off, raw in events:
        reference.feed(raw, kind=kind, offset=off)
        reference.tick()
    reference.drain()
    first, got = make(**settings)
    consumed = {"impression": 0, "feedback": 0}
    for kind, off, raw in events[:cut]:
        first.feed(raw, kind=kind, offset=off)
        first.tick()
        consumed[kind] = off + 1
    low = first.low_offsets(0)
    start = {k: consumed[k] if low[k] is None else low[k] for k in consumed}
    second, _ = make(**settings)
    second.on_result = got.append
    second.restore(
        0,
        first.checkpoint(0),
        consumed,
        first.event_times(0),
        first.evicted(0, start["impression"]),
        held_feedback=first.held_feedback(0, start["feedback"]) if carry_held else (),
    )
    for kind, off, raw in events:
        if off >= start[kind]:
            second.feed(raw, kind=kind, offset=off)
            second.tick()
    second.drain()
    summed = Counter(first.stats.counted()) + Counter(second.stats.counted())
    return want, reference.stats.counted(), got, dict(summed)


@pytest.mark.parametrize("max_pending", [1_000_000, 2])
def test_a_repeated_impression_refused_before_a_restore_is_refused_by_its_replay(max_pending):
    """``r`` is accepted, its repeat (later in time) refused while ``r`` is pending; ``r``
    closes and is emitted while ``hold``, at a lower offset, keeps the replay's start below
    the repeat. The replay skips ``r`` as emitted: the repeat then found no pending ``r`` and
    was rebuilt and emitted, a second result for ``r``. It must be refused again, as the
    first life refused it (with the cap full, by the cap's check for a pending one)."""
    events = [
        ("impression", 0, imp("hold", 5 * MIN, ["a"])),
        ("impression", 1, imp("r", 0, ["a"])),
        ("impression", 2, imp("r", 3 * MIN, ["a", "b"])),  # refused: r is pending
        ("feedback", 0, fb("r", 4 * MIN, "b")),
        ("impression", 3, imp("x", 11 * MIN + 1, ["a"])),  # closes r, not hold
        ("impression", 4, imp("end", 40 * MIN, ["a"])),
    ]
    want, want_counts, got, got_counts = _lives(events, 5, max_pending=max_pending, **EVERY_EVENT)
    assert [r.request_id for r in got].count("r") == 1
    assert sorted(r.request_id for r in got) == sorted(r.request_id for r in want)
    assert {r.request_id: r.measures for r in got} == {r.request_id: r.measures for r in want}
    assert got_counts == want_counts
    assert want_counts["events/impression/duplicate"] == 1


def test_feedback_held_at_a_checkpoint_counts_its_outcome_once_across_a_restore():
    """Feedback held at the checkpoint (its impression not seen yet) is re-fed by the restore:
    its outcome (orphaned when none comes, early when one comes after it) is still to be
    counted, as an uninterrupted engine counts it. Re-fed feedback that had been attached to
    an impression emitted before the checkpoint is held too, but its outcome was decided: it
    expires without a count."""
    events = [
        ("impression", 0, imp("hold", 5 * MIN, ["a"])),
        ("feedback", 0, fb("nobody", 4 * MIN, "a")),  # held, never claimed: orphaned
        ("feedback", 1, fb("soon", 4 * MIN, "a")),  # held, claimed after the restart: early
        ("impression", 1, imp("r", 0, ["a"])),
        ("feedback", 2, fb("r", MIN, "a")),  # attached to r, emitted before the checkpoint
        ("impression", 2, imp("x", 11 * MIN + 1, ["a"])),  # closes r
        ("impression", 3, imp("soon", 6 * MIN, ["a"])),
        ("impression", 4, imp("end", 40 * MIN, ["a"])),
    ]
    want, want_counts, got, got_counts = _lives(events, 6, **EVERY_EVENT)
    assert want_counts["unattributed/orphaned"] == 1 and want_counts["unattributed/early"] == 1
    assert got_counts == want_counts
    assert {r.request_id: r.measures for r in got} == {r.request_id: r.measures for r in want}
    assert len(got) == len(want)


@pytest.mark.parametrize("cut", [5, 6])
def test_a_replay_forgets_the_feedback_it_re_held_for_an_impression_emitted_before(cut):
    """``f`` was attached to ``r``, emitted before the checkpoint; the replay, re-feeding
    ``f`` with ``r`` skipped as emitted, holds it again, a copy whose outcome was decided. The
    uninterrupted engine holds no ``f``, so a second delivery of ``f`` is accepted (held, then
    orphaned), not counted as a duplicate of that copy: delivered after the restart (cut 5),
    once the replay is fed and the copy gone; delivered before it (cut 6), held and undecided
    at the checkpoint, re-fed after the copy and held again as it was (seen in the
    rolling-restart chaos test as one ``orphaned`` short in the last checkpoints)."""
    events = [
        ("impression", 0, imp("hold", 5 * MIN, ["a"])),  # pending at the checkpoint
        ("feedback", 0, fb("soon", 4 * MIN, "a")),  # held: the feedback replay starts here
        ("impression", 1, imp("r", 0, ["a"])),
        ("feedback", 1, fb("r", 9 * MIN, "a", event_id="e1")),  # attached to r
        ("impression", 2, imp("x", 11 * MIN + 1, ["a"])),  # closes r: emitted
        ("feedback", 2, fb("r", 9 * MIN, "a", event_id="e1")),  # delivered again
        ("impression", 3, imp("soon", 6 * MIN, ["a"])),
        ("impression", 4, imp("end", 40 * MIN, ["a"])),
    ]
    want, want_counts, got, got_counts = _lives(events, cut, **EVERY_EVENT)
    assert "events/feedback/duplicate" not in want_counts
    assert want_counts["unattributed/orphaned"] == 1
    assert got_counts == want_counts
    assert sorted((r.request_id, r.measures) for r in got) == sorted(
        (r.request_id, r.measures) for r in want
    )


#: crash points of _stream(5) where feedback held at the checkpoint is found early by its
#: impression after the restart (a scan of every third point found them; with the held
#: offsets no point's counters differ from the uninterrupted engine's)
HELD_AT_CHECKPOINT = [223, 593]


@pytest.mark.parametrize("crash_at", [150, 433, *HELD_AT_CHECKPOINT])
def test_counters_across_a_restore_equal_an_uninterrupted_engine_s(crash_at):
    want, want_counts, got, got_counts = _lives(_stream(5), crash_at)
    assert got_counts == want_counts
    assert sorted(r.request_id for r in got) == sorted(r.request_id for r in want)


def test_without_the_held_offsets_a_restore_undercounts_feedback_held_at_the_checkpoint():
    """Negative control: what the checkpoint's held feedback offsets prevent."""
    for crash_at in HELD_AT_CHECKPOINT:
        _, want_counts, _, got_counts = _lives(_stream(5), crash_at, carry_held=False)
        assert got_counts["unattributed/early"] < want_counts["unattributed/early"], crash_at


@pytest.mark.parametrize("cut", [60, 300, 700])
def test_a_snapshot_plus_later_results_equals_an_uninterrupted_run_exactly(cut):
    """The window sums restored from a snapshot and the results after it are bit-identical
    to the uninterrupted engine's (float sums compared with ==, not approx)."""
    stream = _stream(11)
    reference, ref_results = make()
    snap, emitted_before = b"", 0
    for position, (kind, off, raw) in enumerate(stream):
        reference.feed(raw, kind=kind, offset=off)
        reference.tick()
        if position == cut:
            snap, emitted_before = reference.snapshot(0), len(ref_results)
    reference.drain()
    restored, _ = make()
    restored.absorb_result({"ts": format_timestamp(0), "labels": {}, "measures": {}}, 0)
    restored.load_snapshot(0, snap)  # replaces whatever the partition held
    for result in ref_results[emitted_before:]:
        assert restored.absorb_result(json.loads(json.dumps(result.to_json())), 0)
    restored.drain()
    want = reference.window_rows(last_only=False)
    got = restored.window_rows(last_only=False)
    assert want and [r.to_json() for r in got] == [r.to_json() for r in want]


def _user_stream(seed: int, users: int = 30, lists: int = 12) -> list[tuple[str, int, bytes]]:
    """(kind, per-kind offset, raw) for ``users`` users with ``lists`` lists each inside one
    hour; a user's lists share its click rate, so they are correlated (what clustering is for).
    Every fourth list has no user id: it is its own cluster."""
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.0, 1.0, size=users)
    events: list[tuple[int, str, dict[str, object]]] = []
    for k in range(users * lists):
        user = k % users
        ts = k * 5_000  # 360 lists over 30 minutes
        body: dict[str, object] = {"request_id": f"r{k}", "ts": ts, "items": ["a", "b", "c"]}
        if k % 4:
            body["user_id"] = f"user-{user}"
        events.append((ts, "impression", body))
        if rng.random() < rates[user]:
            click = {"request_id": f"r{k}", "ts": ts + 1_000, "item": "a", "action": "click"}
            events.append((ts + 1_000, "feedback", click))
    events.sort(key=lambda e: e[0])
    offsets = {"impression": 0, "feedback": 0}
    out = []
    for _, kind, body in events:
        out.append((kind, offsets[kind], json.dumps(body).encode()))
        offsets[kind] += 1
    return out


def _hour_rr(engine: Engine) -> object:
    (row,) = [
        r
        for r in engine.window_rows(last_only=False)
        if r.window == "1h" and r.start_ms == 0 and r.measure == "RR"
    ]
    return row


def _direct_halfwidths(stream: list[tuple[str, int, bytes]], results: list[Result]):
    """(user-clustered, per-request) bootstrap half-widths of RR computed from the results."""
    from evald.statistics.bootstrap import BootstrapState, list_cluster

    users = {}
    for kind, _, raw in stream:
        body = json.loads(raw)
        if kind == "impression":
            users[body["request_id"]] = body.get("user_id")
    rr = [r.measures["RR"] for r in results]
    by_user = [list_cluster(users[r.request_id], r.request_id) for r in results]
    by_request = [list_cluster(None, r.request_id) for r in results]
    return (
        BootstrapState.of(by_user, rr).interval().half_width,
        BootstrapState.of(by_request, rr).interval().half_width,
    )


def test_the_clustered_interval_clusters_the_lists_of_one_user():
    """Issue 14: the join carries the impression's user id to the clustered interval."""
    stream = _user_stream(3)
    engine, results = make(windows=["1h"])
    for kind, off, raw in stream:
        engine.feed(raw, kind=kind, offset=off)
    engine.drain()
    assert len(results) == 360
    by_user, by_request = _direct_halfwidths(stream, results)
    assert by_user > 1.2 * by_request  # correlated lists: whole users resampled, wider
    got = _hour_rr(engine).ci95_clustered_halfwidth
    assert got == pytest.approx(by_user, rel=1e-9)


@pytest.mark.parametrize("crash_at", [40, 200, 400])
def test_a_restore_keeps_the_user_id_of_the_impressions_it_re_feeds(crash_at):
    """Pending impressions are rebuilt from their records on a restore, user id included: the
    clustered interval after a crash (snapshot at the commit, re-feed from the low offsets)
    equals the direct user-clustered bootstrap of every result."""
    stream = _user_stream(8)
    first, first_results = make(windows=["1h"])
    consumed = {"impression": 0, "feedback": 0}
    for kind, off, raw in stream[:crash_at]:
        first.feed(raw, kind=kind, offset=off)
        first.tick()
        consumed[kind] = off + 1
    low, watermark = first.low_offsets(0), first.checkpoint(0)
    times, evicted = first.event_times(0), first.evicted(0, low["impression"])
    snap, committed = first.snapshot(0), list(first_results)
    assert first.pending() > 0  # the restore has pending impressions to rebuild

    second, second_results = make(windows=["1h"])
    second.load_snapshot(0, snap)
    second.restore(0, watermark, consumed, times, evicted)
    start = {k: consumed[k] if low[k] is None else low[k] for k in consumed}
    for kind, off, raw in stream:
        if off >= start[kind]:
            second.feed(raw, kind=kind, offset=off)
            second.tick()
    second.drain()
    results = committed + second_results
    assert sorted(r.request_id for r in results) == sorted(f"r{k}" for k in range(360))
    by_user, _ = _direct_halfwidths(stream, results)
    assert _hour_rr(second).ci95_clustered_halfwidth == pytest.approx(by_user, rel=1e-9)


def test_a_result_carries_its_user_s_cluster_key_only_with_a_user_id():
    """The result document's ``"cluster"`` is the user's key as 16 hex digits (what
    ``absorb_result`` reads back); a list without a user id has no such field."""
    from evald.statistics.bootstrap import user_cluster

    engine, results = make()
    engine.feed(b'{"request_id": "u", "ts": 0, "items": ["a"], "user_id": "alice"}')
    engine.feed(imp("n", 0, ["a"]))
    engine.drain()
    docs = {r.request_id: r.to_json() for r in results}
    assert docs["u"]["cluster"] == f"{user_cluster('alice'):016x}"
    assert len(docs["u"]["cluster"]) == 16
    assert "cluster" not in docs["n"]
    off, off_results = make(statistics={"bootstrap_replicates": 0})
    off.feed(b'{"request_id": "u", "ts": 0, "items": ["a"], "user_id": "alice"}')
    off.drain()
    assert "cluster" not in off_results[0].to_json()  # no clustered interval: no key kept


def test_absorb_result_refuses_a_malformed_cluster():
    engine, results = make()
    engine.feed(b'{"request_id": "u", "ts": 0, "items": ["a"], "user_id": "alice"}')
    engine.drain()
    line = json.loads(json.dumps(results[0].to_json()))
    other, _ = make()
    for bad in ("", "0" * 16, "+" + "1" * 15, "1_" + "1" * 14, "A" * 16, "1" * 17, 12, None):
        doc = {**line, "cluster": bad}
        if bad is None:
            doc["cluster"] = None  # null: as absent (own cluster), accepted
            assert other.absorb_result(doc, 0)
        else:
            assert not other.absorb_result(doc, 0), bad
    assert other.absorb_result(line, 0)


@pytest.mark.parametrize("cut", [250, 300, 380])
def test_a_restore_with_results_after_the_snapshot_keeps_the_users_clusters(cut):
    """Issue 14: a kill -9 after the snapshot at ``cut`` re-adds the results written since
    then from the results topic (``absorb_result`` of their JSON), then rebuilds the pending
    impressions by re-feeding from the low offsets. With user ids the window rows (the
    bootstrap sums behind the clustered half-width included) equal the uninterrupted run's
    exactly: each read-back result keeps its user's cluster."""
    stream = _user_stream(13)
    reference, _ = make(windows=["1h"])
    for kind, off, raw in stream:
        reference.feed(raw, kind=kind, offset=off)
        reference.tick()
    reference.drain()

    first, first_results = make(windows=["1h"])
    consumed = {"impression": 0, "feedback": 0}
    snap, emitted_before = b"", 0
    crash_at = cut + 120
    assert crash_at < len(stream)
    for position, (kind, off, raw) in enumerate(stream[:crash_at]):
        first.feed(raw, kind=kind, offset=off)
        first.tick()
        consumed[kind] = off + 1
        if position == cut:
            snap, emitted_before = first.snapshot(0), len(first_results)
    low, watermark = first.low_offsets(0), first.checkpoint(0)
    times, evicted = first.event_times(0), first.evicted(0, low["impression"])
    after_snapshot = first_results[emitted_before:]
    users = {json.loads(raw)["request_id"] for _, _, raw in stream if b"user_id" in raw}
    assert any(r.request_id in users for r in after_snapshot) and first.pending() > 0

    second, _ = make(windows=["1h"])
    second.load_snapshot(0, snap)
    for result in after_snapshot:  # what the results topic holds after the snapshot
        assert second.absorb_result(json.loads(json.dumps(result.to_json())), 0)
    second.restore(0, watermark, consumed, times, evicted)
    start = {k: consumed[k] if low[k] is None else low[k] for k in consumed}
    for kind, off, raw in stream:
        if off >= start[kind]:
            second.feed(raw, kind=kind, offset=off)
            second.tick()
    second.drain()
    want = [r.to_json() for r in reference.window_rows(last_only=False)]
    assert want and [r.to_json() for r in second.window_rows(last_only=False)] == want
    assert _hour_rr(second).ci95_clustered_halfwidth == _hour_rr(reference).ci95_clustered_halfwidth


def test_a_mapping_s_user_id_reaches_the_clustered_interval():
    """UBI query records name their user in ``client_id``: the same clustering as native."""
    from evald.events import parse_timestamp
    from evald.mapping import decoder_for

    config = load_config(
        {**UNBOUNDED_TIMES, "window": WINDOW, "lateness": LATENESS, "measures": "RR"}
    )
    results: list[Result] = []
    engine = Engine(
        config, clock=lambda: 0.0, on_result=results.append, decoder=decoder_for("ubi", config)
    )
    native = _user_stream(5)
    for kind, _, raw in native:  # the same traffic, as UBI records
        body = json.loads(raw)
        when = format_timestamp(body["ts"])
        if kind == "impression":
            ubi = {"query_id": body["request_id"], "timestamp": when}
            ubi["query_response_hit_ids"] = body["items"]
            if "user_id" in body:
                ubi["client_id"] = body["user_id"]
        else:
            ubi = {"query_id": body["request_id"], "timestamp": when, "action_name": "click"}
            ubi["event_attributes"] = {"object": {"object_id": body["item"]}}
        assert parse_timestamp(when) == body["ts"]
        engine.feed(json.dumps(ubi).encode())
    engine.drain()
    assert len(results) == 360
    by_user, by_request = _direct_halfwidths(native, results)
    assert by_user != pytest.approx(by_request, rel=0.05)
    assert _hour_rr(engine).ci95_clustered_halfwidth == pytest.approx(by_user, rel=1e-9)


def test_a_result_carries_its_normalised_query_only_when_it_has_one():
    """Issue 27: the impression's query, normalised (evald/query.py), is the result's
    ``"query"``; a list without a query (or one the rule empties) has no such field, and the
    results topic's encoder writes the same document."""
    from evald.daemon.main.results import ResultEncoder

    engine, results = make()
    engine.feed(b'{"request_id": "q", "ts": 0, "items": ["a"], "query": "  Red\\tSHOES\\u200b "}')
    engine.feed(b'{"request_id": "e", "ts": 0, "items": ["a"], "query": " \\u0000 "}')
    engine.feed(imp("n", 0, ["a"]))
    engine.drain()
    docs = {r.request_id: r.to_json() for r in results}
    assert docs["q"]["query"] == "red shoes"
    assert "query" not in docs["e"] and "query" not in docs["n"]
    encoder = ResultEncoder()
    for result in results:
        assert json.loads(encoder.encode(result)[1]) == json.loads(json.dumps(result.to_json()))


def test_absorb_result_adds_a_result_s_query_to_the_summaries_and_the_same_window_sums():
    engine, results = make()
    engine.feed(b'{"request_id": "q", "ts": 0, "items": ["a"], "query": "lamp"}')
    engine.feed(fb("q", 1, "a"))
    engine.drain()
    doc = json.loads(json.dumps(results[0].to_json()))
    assert doc["query"] == "lamp"
    with_query, _ = make()
    without, _ = make()
    assert with_query.absorb_result(doc, 0)
    assert without.absorb_result({k: v for k, v in doc.items() if k != "query"}, 0)
    with_query.drain(), without.drain()
    rows = [r.to_json() for r in without.window_rows(last_only=False)]
    assert rows and [r.to_json() for r in with_query.window_rows(last_only=False)] == rows
    summaries = with_query.aggregates.queries
    assert summaries is not None and summaries.windows()
    assert [
        e.query for s in summaries.merged(*summaries.windows()[0]).values() for e in s.entries()
    ] == ["lamp"]
    assert not without.aggregates.queries.windows()  # type: ignore[union-attr]
    assert not with_query.absorb_result({**doc, "query": 5}, 0)  # not a result evald wrote


def test_a_grade_above_100_is_bad_grade_and_grades_of_100_score_finite_without_a_warning():
    """A grade of 1e308 made DCG's sums overflow (a numpy warning per batch, nDCG NaN, the
    window sums infinite): it is rejected as ``bad_grade``. A list of 1,000 items all graded
    100, the most there is, scores finite numbers in every measure that sums gains, with
    2^100 - 1 gains too, and its window exports finite sums."""
    import math
    import warnings

    from prometheus_client.parser import text_string_to_metric_families

    from evald.exposition import Encoder, build_registry

    measures = "nDCG@10,DCG,DCG(dcg='exp-log2'),nDCG(dcg='exp-log2'),CG,ERR@10,KendallTau"
    engine, results = make(measures=measures, windows=[WINDOW], bucket=WINDOW)
    items = [f"d{i}" for i in range(1000)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.feed(imp("r", 0, items, arm="t"))
        engine.feed(fb("r", 1, "d0", grade=1e308))
        for i, item in enumerate(items):
            engine.feed(fb("r", 1, item, grade=100.0 if i % 2 else 50.0))
        engine.feed(imp("later", 3 * WINDOW, ["x"]))
        engine.drain()
        registry, _ = build_registry(engine, ready=lambda: True, process=False)
        body, _ = Encoder().encode(registry, None)
    assert engine.stats.rejected["bad_grade"] == 1
    values = results[0].measures
    assert all(math.isfinite(v) for v in values.values()), values
    assert 0 < values["nDCG@10"] <= 1 and 0 < values["nDCG(dcg='exp-log2')"] <= 1
    samples = [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]
    assert samples and all(math.isfinite(s.value) for s in samples)
