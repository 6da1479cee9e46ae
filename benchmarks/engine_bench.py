"""Engine throughput: JSONL bytes in -> validated, joined, scored, aggregated; one process.

Traffic: one impression of 20 items per 1.5 feedback events, in event-time order (seeded).
Baseline, same process, same bytes: the pydantic models' ``model_validate_json`` on every line,
each with the right model (the kind known in advance, so this is the cheapest possible floor).
evald is measured end to end: ``Engine.feed_batch`` on every 500 lines (a poll batch, as replay
and the daemon do; ``Engine.feed`` per line is shown too), ``tick()`` after each batch, and the
final ``drain()``, with a results callback counting every finalized impression so nothing can be
silently skipped.

Targets (issue 6 §1): rate >= 0.5x the validation-only rate; aim >= 150k events/s on one core.
Then cProfile on a smaller run shows where the time goes.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import _common as c

BATCH = 500  # lines between tick() calls: one poll batch
GAP_MS = 50  # impressions 50 ms apart in event time: ~36k pending in a 30m window


class FixedClock:
    """Wall clock that never moves, so the idle fallback never fires during a timed run."""

    def __init__(self, t: float = 1_763_769_600.0) -> None:  # a day after the data starts:
        # no event is ahead of it by more than max_event_lead
        self.t = t

    def __call__(self) -> float:
        return self.t


def load_engine() -> tuple[Any, Any, Any, Any]:
    """(Engine, EngineConfig, Impression, Feedback) or NotAvailable naming what is missing."""
    engine_mod = c.require("evald.engine", "Engine")
    config_mod = c.require("evald.config", "EngineConfig")
    events_mod = c.require("evald.events", "Impression", "Feedback")
    return (
        engine_mod.Engine,  # type: ignore[attr-defined]
        config_mod.EngineConfig,  # type: ignore[attr-defined]
        events_mod.Impression,  # type: ignore[attr-defined]
        events_mod.Feedback,  # type: ignore[attr-defined]
    )


def validate_only(
    lines: Sequence[bytes], kinds: Sequence[str], imp: Any, fb: Any
) -> Callable[[], None]:
    """The floor: each line through its pydantic model's validate_json, nothing else."""
    validators = {"impression": imp.model_validate_json, "feedback": fb.model_validate_json}
    pairs = [(validators[k], line) for k, line in zip(kinds, lines, strict=True)]

    def run() -> None:
        for validate, line in pairs:
            validate(line)

    return run


def engine_run(
    lines: Sequence[bytes],
    kinds: Sequence[str] | None,
    engine_cls: Any,
    config: Any,
    *,
    batched: bool = False,
) -> Callable[[], tuple[int, Any]]:
    """Feed every line (kind given or inferred), tick per batch, drain; return results + engine.

    ``batched``: one ``Engine.feed_batch`` call per poll batch (what replay and the daemon do);
    otherwise ``Engine.feed`` per line.
    """

    def run() -> tuple[int, Any]:
        results = 0

        def on_result(_: object) -> None:
            nonlocal results
            results += 1

        engine = engine_cls(config, clock=FixedClock(), on_result=on_result)
        feed, tick = engine.feed, engine.tick
        n = len(lines)
        for lo in range(0, n, BATCH):
            hi = min(lo + BATCH, n)
            if batched:
                engine.feed_batch(lines[lo:hi], kinds=None if kinds is None else kinds[lo:hi])
            elif kinds is None:
                for k in range(lo, hi):
                    feed(lines[k])
            else:
                for k in range(lo, hi):
                    feed(lines[k], kind=kinds[k])
            tick()
        engine.drain()
        return results, engine

    return run


def decode_only(lines: Sequence[bytes], engine_cls: Any, config: Any) -> Callable[[], None]:
    """evald's decoder alone over the same batches (events dropped as they come)."""

    def run() -> None:
        decoder = engine_cls(config, clock=FixedClock()).decoder
        rejected: list[Any] = []
        for lo in range(0, len(lines), BATCH):
            for _ in decoder.decode_many(lines[lo : lo + BATCH], None, rejected):
                pass

    return run


def decode_and_join(lines: Sequence[bytes], engine_cls: Any, config: Any) -> Callable[[], None]:
    """feed_batch on every batch and nothing else: no tick, so nothing is scored."""

    def run() -> None:
        engine = engine_cls(config, clock=FixedClock())
        for lo in range(0, len(lines), BATCH):
            engine.feed_batch(lines[lo : lo + BATCH])

    return run


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Best wall time of `repeat` runs, and the last run's return value."""
    best, last = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        last = fn()
        best = min(best, time.perf_counter() - t0)
    return best, last


def group_own_time(stats: pstats.Stats) -> list[tuple[str, float]]:
    """Own (tottime) seconds grouped by evald module / pydantic-core / numpy / json / other."""
    groups: dict[str, float] = {}
    for (filename, _lineno, func), row in stats.stats.items():  # type: ignore[attr-defined]
        tottime = row[2]
        if "/evald/" in filename:
            key = "evald." + filename.split("/evald/", 1)[1].removesuffix(".py").replace("/", ".")
        elif "pydantic_core" in func or "validate_json" in func or "/pydantic/" in filename:
            key = "pydantic / pydantic-core (validation)"
        elif "numpy" in filename or "numpy" in func:
            key = "numpy"
        elif filename == "~":
            key = "builtins: " + func
        else:
            key = "other Python: " + filename.rsplit("/", 1)[-1]
        groups[key] = groups.get(key, 0.0) + tottime
    return sorted(groups.items(), key=lambda kv: -kv[1])


def profile(lines: Sequence[bytes], engine_cls: Any, config: Any) -> None:
    """cProfile one end-to-end run (feed_batch, kind inferred); print top functions by own
    and cumulative time."""
    run = engine_run(lines, None, engine_cls, config, batched=True)
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    stats = pstats.Stats(prof)
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    print(f"  -- profile of {len(lines):,} events (cProfile; total own time {total:.2f} s)")
    print("  own time by component:")
    for key, secs in group_own_time(stats)[:12]:
        print(f"    {100 * secs / total:5.1f}%  {secs:7.3f} s  {key}")
    for order, count in (("tottime", 15), ("cumulative", 15)):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(order).print_stats(count)
        text = buf.getvalue()
        body = text[text.index("ncalls") :] if "ncalls" in text else text
        print(f"  top {count} by {order}:")
        for row in body.rstrip().splitlines():
            print("    " + row)
    sys.stdout.flush()


def body(argv: Sequence[str] | None) -> None:
    args = c.parse_args(__doc__ or "", argv)
    n_imp = 20_000 if args.quick else 200_000
    repeat = 2 if args.quick else 3
    engine_cls, config_cls, imp, fb = load_engine()
    # the window these figures were first measured with (the default until it became 5m)
    config = config_cls(window="30m")
    t0 = time.perf_counter()
    traffic = c.generate_traffic(n_imp, seed=args.seed, gap_ms=GAP_MS)
    c.line(
        "traffic",
        f"{traffic.impressions:,} impressions x 20 items + {traffic.feedback:,} feedback"
        f" = {traffic.events:,} events, {traffic.nbytes / 1e6:.0f} MB",
    )
    c.line("  generated in (not timed)", c.fmt_s(time.perf_counter() - t0))
    c.line("engine config", f"defaults; tick() every {BATCH} lines; drain at the end")

    base_s, _ = timed(validate_only(traffic.lines, traffic.kinds, imp, fb), repeat)
    base_rate = traffic.events / base_s
    c.line(
        "baseline: pydantic validate_json per line", f"{c.fmt_s(base_s)}  {c.fmt_rate(base_rate)}"
    )

    per_event_s, _ = timed(engine_run(traffic.lines, None, engine_cls, config), repeat)
    c.line(
        "evald: feed per line (kind inferred) + tick + drain",
        f"{c.fmt_s(per_event_s)}  {c.fmt_rate(traffic.events / per_event_s)}",
    )
    inferred_s, (results, engine) = timed(
        engine_run(traffic.lines, None, engine_cls, config, batched=True), repeat
    )
    rate = traffic.events / inferred_s
    c.line(
        f"evald: feed_batch per {BATCH} lines (kind inferred: replay)",
        f"{c.fmt_s(inferred_s)}  {c.fmt_rate(rate)}",
    )
    known_s, _ = timed(
        engine_run(traffic.lines, traffic.kinds, engine_cls, config, batched=True), repeat
    )
    known_rate = traffic.events / known_s
    c.line(
        f"evald: feed_batch per {BATCH} lines (kind given: Kafka)",
        f"{c.fmt_s(known_s)}  {c.fmt_rate(known_rate)}",
    )
    c.line(
        "check: impressions finalized (results callback)", f"{results:,} of {traffic.impressions:,}"
    )
    stats = getattr(engine, "stats", None)
    if stats is not None:
        accepted = {k: v for (k, o), v in getattr(stats, "events", {}).items() if o == "accepted"}
        c.line(
            "check: accepted events by kind", ", ".join(f"{k} {v:,}" for k, v in accepted.items())
        )
        c.line("check: unattributed feedback", repr(getattr(stats, "unattributed", "?")))
    if results != traffic.impressions:
        c.line("WARNING", "not every impression was finalized: figures below are suspect")

    c.target(
        "evald rate / validation-only rate",
        f"{rate / base_rate:.2f}x",
        rate >= 0.5 * base_rate,
        ">= 0.5x",
    )
    c.target(
        "evald absolute rate, one core", c.fmt_rate(rate), rate >= 150_000, ">= 150,000/s (aim)"
    )

    # the input-mapping path (docs/mapping.md): the same events as UBI records and as a custom
    # nested schema, against the native path, interleaved rounds in CPU time (mapping_bench)
    from benchmarks.mapping_bench import compare_paths

    compare_paths(traffic, engine_cls, config, rounds=2 * repeat + 1, expected=results)

    # where the time goes, by phase and without a profiler: each phase is timed cumulatively
    # (decode; decode + join; everything) and the differences are the phases' own costs
    dec_s, _ = timed(decode_only(traffic.lines, engine_cls, config), repeat)
    join_s, _ = timed(decode_and_join(traffic.lines, engine_cls, config), repeat)
    per = 1e6 / traffic.events
    c.line("-- phases (feed_batch, kind inferred), us per event", "")
    c.line("  pydantic validation (the floor)", f"{base_s * per:.2f} us")
    c.line("  evald decode (limits, kind sniff, reasons)", f"{dec_s * per:.2f} us")
    c.line("  + join (hash ids, table, slots, queue)", f"{(join_s - dec_s) * per:.2f} us")
    c.line("  + score, aggregate, results (tick, drain)", f"{(inferred_s - join_s) * per:.2f} us")
    c.line(
        "  budget above decode for 0.5x",
        f"{(2 * base_s - dec_s) * per:.2f} us (spent: {(inferred_s - dec_s) * per:.2f} us)",
    )

    prof_lines = traffic.lines[: min(len(traffic.lines), 50_000)]
    profile(prof_lines, engine_cls, config)


def main(argv: Sequence[str] | None = None) -> int:
    return c.run_main("Engine throughput: decode -> join -> score -> aggregate", lambda: body(argv))


if __name__ == "__main__":
    sys.exit(main())
