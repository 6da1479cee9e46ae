"""The input-mapping path against the native one (issue 13: mapping <= 1.5x native, CPU time).

The engine benchmark's traffic (one impression of 20 items per 1.5 feedback events, seeded) is
fed three ways, end to end (``Engine.feed_batch`` per 500 lines, kind inferred as in replay,
``tick`` per batch, ``drain``): the native schema; the same events as OpenSearch UBI records read
by ``--mapping ubi`` (nested fields, RFC 3339 times, kind told by ``action_name``); and as a custom
nested schema (docs/mapping.md: items as objects, labels from two places, epoch-second times
with milliseconds as the fraction, kind told by a ``type`` field). The decoders alone are timed
too (``decode_many`` per batch, events dropped).

Every round runs every case once, in turn (native, ubi, nested, ...), so load drifting on a
shared machine hits all alike; each run is timed in CPU seconds of this process. Printed: the
median and spread (min..max) per case and the ratio of medians against native, with the load
average before and after. ``--profile`` adds cProfile of the mapping decoders alone.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import _common as c
from benchmarks.engine_bench import BATCH, GAP_MS, FixedClock, engine_run, load_engine
from evald.events import format_timestamp

#: the custom schema of docs/mapping.md with the engine traffic's labels (model, arm, surface)
NESTED_MAPPING: dict[str, Any] = {
    "kind": {"field": "/type", "impression": "serve", "feedback": "act"},
    "impression": {
        "request_id": "/ctx/request",
        "time": {"path": "/at", "format": "epoch_s"},
        "items": {"path": "/results", "id": "/doc/id"},
        "labels": [{"path": "/experiment"}, {"path": "/ctx/model", "name": "model"}],
    },
    "feedback": {
        "request_id": "/ctx/request",
        "time": {"path": "/at", "format": "epoch_s"},
        "item": "/doc/id",
        "action": "/event",
        "actions": {"click": 1, "add_to_cart": 2, "purchase": 3},
    },
}

#: the traffic sizes: --quick, and the default (noise at the quick size is several percent)
QUICK_IMPRESSIONS, IMPRESSIONS = 20_000, 60_000


def ubi_lines(lines: Sequence[bytes]) -> list[bytes]:
    """The same traffic as OpenSearch UBI query and event records (docs/mapping.md), for the
    ``--mapping ubi`` path: nested fields, RFC 3339 times, the kind told by ``action_name``."""
    out = []
    for line in lines:
        event = json.loads(line)
        when = format_timestamp(event["ts"])
        if "items" in event:
            record: dict[str, Any] = {
                "query_id": event["request_id"],
                "timestamp": when,
                "query_response_hit_ids": event["items"],
                "query_attributes": event.get("labels", {}),
            }
        else:
            attributes: dict[str, Any] = {"object": {"object_id": event["item"]}}
            if "position" in event:
                attributes["position"] = {"ordinal": event["position"]}
            record = {
                "action_name": event["action"],
                "query_id": event["request_id"],
                "timestamp": when,
                "event_attributes": attributes,
            }
        out.append(json.dumps(record, separators=(",", ":")).encode())
    return out


def nested_lines(lines: Sequence[bytes]) -> list[bytes]:
    """The same traffic in :data:`NESTED_MAPPING`'s schema."""
    out = []
    for line in lines:
        event = json.loads(line)
        at = event["ts"] / 1000  # epoch seconds, milliseconds as the fraction
        if "items" in event:
            labels = dict(event.get("labels", {}))
            model = labels.pop("model")
            record: dict[str, Any] = {
                "type": "serve",
                "at": at,
                "ctx": {"request": event["request_id"], "model": model},
                "results": [{"doc": {"id": item}} for item in event["items"]],
                "experiment": labels,
            }
        else:
            record = {
                "type": "act",
                "at": at,
                "ctx": {"request": event["request_id"]},
                "doc": {"id": event["item"]},
                "event": event["action"],
            }
        out.append(json.dumps(record, separators=(",", ":")).encode())
    return out


def mapping_decoders(config: Any) -> dict[str, Callable[[], Any]]:
    """A fresh decoder per call, by mapping name: ``ubi`` and ``nested``."""
    from evald.mapping import MappingDecoder, MappingSpec, decoder_for

    spec = MappingSpec.model_validate(NESTED_MAPPING)
    return {
        "ubi": lambda: decoder_for("ubi", config),
        "nested": lambda: MappingDecoder(
            spec, config.limits, min_ts=config.min_event_time, max_lead=config.max_event_lead
        ),
    }


def with_decoder(engine_cls: Any, make: Callable[[], Any]) -> Callable[..., Any]:
    """``engine_cls`` taking a fresh decoder from ``make`` on each construction."""

    def build(*args: Any, **kwargs: Any) -> Any:
        return engine_cls(*args, decoder=make(), **kwargs)

    return build


def decode_run(lines: Sequence[bytes], make: Callable[[], Any]) -> Callable[[], tuple[int, None]]:
    """The decoder alone: ``decode_many`` per batch, kind inferred; (events decoded, None)."""

    def run() -> tuple[int, None]:
        decoder = make()
        rejected: list[Any] = []
        decoded = 0
        for lo in range(0, len(lines), BATCH):
            for _ in decoder.decode_many(lines[lo : lo + BATCH], None, rejected):
                decoded += 1
        return decoded, None

    return run


def cases(traffic: c.Traffic, engine_cls: Any, config: Any, *, decoders: bool) -> dict[str, Any]:
    """Case name -> (events fed, run); a run returns (results or events decoded, anything)."""
    makers = mapping_decoders(config)
    inputs = {"ubi": ubi_lines(traffic.lines), "nested": nested_lines(traffic.lines)}
    out: dict[str, Any] = {
        "native": engine_run(traffic.lines, None, engine_cls, config, batched=True),
    }
    for name in ("ubi", "nested"):
        mapped = with_decoder(engine_cls, makers[name])
        out[f"--mapping {name}"] = engine_run(inputs[name], None, mapped, config, batched=True)
    if decoders:
        native_decoder = lambda: engine_cls(config, clock=FixedClock()).decoder  # noqa: E731
        out["decoder alone: native"] = decode_run(traffic.lines, native_decoder)
        for name in ("ubi", "nested"):
            out[f"decoder alone: {name}"] = decode_run(inputs[name], makers[name])
    return out


def interleaved(runs: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """CPU seconds of each run per round, the runs taking turns within every round; raises
    when a case's output count changes between rounds or an engine case loses results."""
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    counts: dict[str, int] = {}
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = time.process_time()
            count, _ = run()
            cpu[name].append(time.process_time() - t0)
            if counts.setdefault(name, count) != count:
                raise SystemExit(f"{name}: {count} outputs, {counts[name]} in an earlier round")
    engine_counts = {counts[name] for name in runs if not name.startswith("decoder")}
    if len(engine_counts) != 1:
        raise SystemExit(f"the paths finalized different numbers of impressions: {counts}")
    return cpu


def spread(values: Sequence[float], events: int) -> str:
    """Median CPU and its spread, also per event."""
    median = statistics.median(values)
    lo, hi = min(values), max(values)
    per = 1e6 / events
    return (
        f"median {c.fmt_s(median)} ({median * per:.2f} µs/event), "
        f"spread {lo * per:.2f}..{hi * per:.2f} µs/event"
    )


def report(cpu: dict[str, list[float]], events: int, limit: float = 1.5) -> dict[str, float]:
    """Print each case and the ratio of medians against its native counterpart; returns the
    engine-path ratios by mapping name."""
    ratios: dict[str, float] = {}
    for name, values in cpu.items():
        c.line(name, spread(values, events))
    native = statistics.median(cpu["native"])
    for name in ("ubi", "nested"):
        ratio = statistics.median(cpu[f"--mapping {name}"]) / native
        ratios[name] = ratio
        worst = max(cpu[f"--mapping {name}"]) / min(cpu["native"])
        c.target(
            f"--mapping {name} / native (medians; worst pair)",
            f"{ratio:.2f}x ({worst:.2f}x)",
            ratio <= limit,
            f"<= {limit}x",
        )
    if "decoder alone: native" in cpu:
        alone = statistics.median(cpu["decoder alone: native"])
        for name in ("ubi", "nested"):
            ratio = statistics.median(cpu[f"decoder alone: {name}"]) / alone
            c.line(f"decoder alone: {name} / native (medians)", f"{ratio:.2f}x")
    return ratios


def compare_paths(
    traffic: c.Traffic, engine_cls: Any, config: Any, *, rounds: int, expected: int
) -> dict[str, float]:
    """The engine benchmark's mapping lines: the engine paths only, interleaved ``rounds``
    times; ``expected``: the impressions the native run finalized (each path must match)."""
    runs = cases(traffic, engine_cls, config, decoders=False)
    cpu = interleaved(runs, rounds)
    results, _ = runs["native"]()
    if results != expected:
        raise SystemExit(f"the native path finalized {results:,}, not {expected:,}")
    c.line(f"mapping vs native: {rounds} interleaved rounds, CPU", f"load average {load()}")
    return report(cpu, traffic.events)


def profile(lines: Sequence[bytes], make: Callable[[], Any], title: str) -> None:
    """cProfile the decoder alone over ``lines``; the top functions by own time."""
    run = decode_run(lines, make)
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(12)
    text = buf.getvalue()
    print(f"  -- profile: {title} decoder alone, {len(lines):,} records (cProfile)")
    for row in text[text.index("ncalls") :].rstrip().splitlines():
        print("    " + row)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def body(argv: Sequence[str] | None) -> None:
    def extra(parser: Any) -> None:
        parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
        parser.add_argument("--impressions", type=int, help="traffic size (impressions)")
        parser.add_argument("--profile", action="store_true", help="cProfile the decoders")

    args = c.parse_args(__doc__ or "", argv, extra)
    impressions = args.impressions or (QUICK_IMPRESSIONS if args.quick else IMPRESSIONS)
    rounds = max(1, 3 if args.quick and args.rounds == 5 else args.rounds)
    engine_cls, config_cls, _imp, _fb = load_engine()
    config = config_cls()
    traffic = c.generate_traffic(impressions, seed=args.seed, gap_ms=GAP_MS)
    c.line(
        "traffic",
        f"{traffic.impressions:,} impressions x 20 items + {traffic.feedback:,} feedback"
        f" = {traffic.events:,} events; {rounds} interleaved rounds, CPU time",
    )
    runs = cases(traffic, engine_cls, config, decoders=True)
    c.line("load average before", load())
    cpu = interleaved(runs, rounds)
    c.line("load average after", load())
    report(cpu, traffic.events)
    if args.profile:
        makers = mapping_decoders(config)
        sample = traffic.lines[:50_000]
        profile(ubi_lines(sample), makers["ubi"], "--mapping ubi")
        profile(nested_lines(sample), makers["nested"], "--mapping nested")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    return c.run_main("Input mappings against the native path", lambda: body(argv))


if __name__ == "__main__":
    sys.exit(main())
