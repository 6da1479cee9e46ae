"""The click model's counters (IPS and debiased sums) across partition moves and restarts, at
the engine: two engines stand for two instances of ``evald run``, scraped after every poll.

Each instance's counters must never go down, and summed over the instances their increase
between two scrapes must be what an uninterrupted engine fed the same records scored in
between: the lists a partition's earlier owner (or life) scored are not counted again by the
next one (docs/metrics-reference.md, "Click model")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families as parse_text
from test_stream_restore import Tagged, consumed, feed, make, tagged

from evald.engine import Engine
from evald.exposition import Encoder, build_registry
from evald.histograms import Committed

COUNTERS = (
    "evald_click_ips_clicks_total",
    "evald_click_ips_expected_total",
    "evald_click_ips_ranks_total",
    "evald_click_measure_sum",
    "evald_click_measure_count",
    "evald_click_measure_sum_squares_total",
)
BATCH = 300  # records per poll, a scrape after each (as test_stream_restore feeds them)

Sample = tuple[str, frozenset[tuple[str, str]]]


def scrape(engine: Engine) -> dict[Sample, float]:
    """The click counters of a scrape of ``engine``, by name and labels."""
    registry, _ = build_registry(engine, ready=lambda: True, process=False)
    body, _ = Encoder().encode(registry, None)
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in parse_text(body.decode())
        for sample in family.samples
        if sample.name in COUNTERS
    }


def chunks(records: Tagged) -> list[Tagged]:
    return [records[i : i + BATCH] for i in range(0, len(records), BATCH)]


def partitions() -> tuple[list[Tagged], list[Tagged]]:
    """Two partitions' polls; their request ids apart (an engine joins by request id)."""
    renamed = [(k, o, r.replace(b'"request_id": "r', b'"request_id": "s')) for k, o, r in tagged(5)]
    return chunks(tagged(4)), chunks(renamed)


def move(source: Engine, target: Engine, p: int, records: Tagged, fed: int) -> None:
    """Partition p, fed ``records[:fed]`` by ``source``, committed and revoked there, then
    restored by ``target`` from that commit, which is fed again what the commit left pending
    (``Engine.state``'s committed offsets, as a restore's replay)."""
    state = source.state(p, consumed(records[:fed]))
    source.drop_partition(p)
    target.resume(p, state, consumed(records[:fed]))
    feed(target, [r for r in records[:fed] if r[1] >= state.committed[r[0]]], partition=p)


def check(
    steps: int,
    poll: Callable[[int], list[Engine]],
    reference: Callable[[int], Engine],
) -> int:
    """Run ``steps`` polls: ``poll(i)`` feeds the instances their share of poll i and names
    them (an engine that is new since the last scrape is a new life, whose counters start
    at 0); ``reference(i)`` feeds the uninterrupted engine poll i. Checks every instance's
    counters never go down and the sum of their increases is the reference's, each poll.
    Returns how many series moved."""
    previous: dict[int, dict[Sample, float]] = {}
    before: dict[Sample, float] = {}
    moved = set()
    for i in range(steps):
        instances = poll(i)
        now_ref = scrape(reference(i))
        total: dict[Sample, float] = {}
        seen = {}
        for engine in instances:
            now = scrape(engine)
            last = previous.get(id(engine), {})
            for key, value in last.items():  # a counter never goes down, nor vanishes
                assert now.get(key, -1.0) >= value, (i, key, value, now.get(key))
            for key, value in now.items():
                total[key] = total.get(key, 0.0) + value - last.get(key, 0.0)
            seen[id(engine)] = now
        previous = seen
        want = {key: value - before.get(key, 0.0) for key, value in now_ref.items()}
        assert {k: v for k, v in total.items() if v} == {k: v for k, v in want.items() if v}, i
        moved.update(key for key, value in want.items() if value)
        before = now_ref
    return len(moved)


def test_a_partition_moved_to_another_instance_is_counted_once() -> None:
    """Instance A owns partitions 0 and 1, B none; mid-stream partition 1 moves from A to B
    (A commits and drops it, B restores it from the commit): A keeps what it scored of
    partition 1, B counts from the restore on, and the two sum to the uninterrupted engine's
    counters at every scrape, the move's included."""
    zero, one = partitions()
    records_one = [r for chunk in one for r in chunk]
    a, _ = make()
    b, _ = make()
    uninterrupted, _ = make()
    at = len(one) * 2 // 3  # a third of the scored lists after it

    def poll(i: int) -> list[Engine]:
        if i == at:
            move(a, b, 1, records_one, sum(map(len, one[:at])))
        feed(a, zero[i])
        feed(b if i >= at else a, one[i], partition=1)
        return [a, b]

    def reference(i: int) -> Engine:
        feed(uninterrupted, zero[i])
        feed(uninterrupted, one[i], partition=1)
        return uninterrupted

    assert check(len(one), poll, reference) == len(scrape(uninterrupted)) > 0
    ips = "evald_click_ips_ranks_total"
    split = [sum(v for (n, _), v in scrape(e).items() if n == ips) for e in (a, b)]
    assert all(split), split  # both scored some of partition 1


def test_a_restarted_instance_counts_from_its_restore() -> None:
    """Instances A (partition 0) and B (partition 1); mid-stream B restarts: a new engine
    restores partition 1 from B's last commit. Its counters start at 0 (not at the history
    its checkpoint carries), and A, B and B's next life sum to the uninterrupted engine's
    counters at every scrape."""
    zero, one = partitions()
    records_one = [r for chunk in one for r in chunk]
    a, _ = make()
    lives = [make()[0]]
    uninterrupted, _ = make()
    at = len(one) * 2 // 3  # a third of the scored lists after it

    def poll(i: int) -> list[Engine]:
        if i == at:
            lives.append(make()[0])
            move(lives[-2], lives[-1], 1, records_one, sum(map(len, one[:at])))
            assert not any(scrape(lives[-1]).values())  # nothing scored in this life yet
        feed(a, zero[i])
        feed(lives[-1], one[i], partition=1)
        return [a, lives[-1]]

    def reference(i: int) -> Engine:
        feed(uninterrupted, zero[i])
        feed(uninterrupted, one[i], partition=1)
        return uninterrupted

    assert check(len(one), poll, reference) == len(scrape(uninterrupted)) > 0


def test_evald_run_shows_the_counters_its_commits_held_over_its_engines() -> None:
    """``evald run`` (``Engine.export_committed``, a fresh engine after each broker outage):
    the counters move only at commits, what an engine scored after its last commit is never
    shown (the next engine scores it again), and a new engine adds to what the process
    committed before: the counters never go down within the process and end at the
    uninterrupted engine's."""
    zero, one = partitions()
    flat = {0: [r for chunk in zero for r in chunk], 1: [r for chunk in one for r in chunk]}
    process = Committed()
    uninterrupted, _ = make()
    for i in range(len(one)):
        feed(uninterrupted, zero[i])
        feed(uninterrupted, one[i], partition=1)
    want = scrape(uninterrupted)

    def new_engine() -> Engine:
        engine = make()[0]
        process.session_started()
        engine.export_committed(process)
        return engine

    def commit(engine: Engine) -> None:
        assert engine.clicks is not None
        process.commit(engine.scored(), engine.stats, [], engine.clicks.scored())

    first = new_engine()
    at = len(one) * 2 // 3
    fed = at * BATCH
    for i in range(at):
        feed(first, zero[i])
        feed(first, one[i], partition=1)
    states = {p: first.state(p, consumed(flat[p][:fed])) for p in flat}
    commit(first)
    held = scrape(first)
    assert any(held.values())
    feed(first, zero[at])  # scored, never committed: the engine is given up
    feed(first, one[at], partition=1)
    assert first.clicks is not None and process.clicks is not None
    assert first.clicks.scored().ips != process.clicks.ips
    assert scrape(first) == held
    second = new_engine()
    assert scrape(second) == held  # the process's counters, not the new engine's
    for p, state in states.items():
        second.resume(p, state, consumed(flat[p][:fed]))
        feed(second, [r for r in flat[p][:fed] if r[1] >= state.committed[r[0]]], partition=p)
    for i in range(at, len(one)):
        feed(second, zero[i])
        feed(second, one[i], partition=1)
        commit(second)
        now = scrape(second)
        assert all(now.get(key, -1.0) >= value for key, value in held.items()), i
        held = now
    assert held == want


def test_a_restored_partition_shows_every_segment_of_its_history() -> None:
    """An arm served only in the first fifth of a partition's stream, a restore at two thirds:
    the new owner shows that arm's counters (at 0) from its restore on, as it does the other
    arm's, though no list of the arm is in the checkpoint's log since its last snapshot. The
    checkpoint's sums carry the segments (docs/click-models.md, "What the counters count");
    the same checkpoint without them loses the arm (the control)."""
    records = tagged(4)
    early = len(records) // 5
    records = [
        (k, o, r.replace(b'"arm": "a1"', b'"arm": "early"') if i < early else r)
        for i, (k, o, r) in enumerate(records)
    ]
    fed = len(records) * 2 // 3
    source, _ = make()
    feed(source, records[:fed])
    state = source.state(0, consumed(records[:fed]))
    want = {sample for sample in scrape(source) if ("arm", "early") in sample[1]}
    assert want

    def restored(strip: bool) -> dict[Sample, float]:
        assert state.click_model is not None
        kept = ("snapshot", "log")
        clicks = {k: v for k, v in state.click_model.items() if not strip or k in kept}
        engine = make()[0]
        engine.resume(0, replace(state, click_model=clicks), consumed(records[:fed]))
        feed(engine, [r for r in records[:fed] if r[1] >= state.committed[r[0]]])
        return scrape(engine)

    shown = restored(strip=False)
    assert want <= set(shown) and not any(shown[sample] for sample in want)
    assert not want & set(restored(strip=True))  # the control: no sums, no arm
