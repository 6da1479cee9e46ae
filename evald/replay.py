"""`evald replay`: run the streaming engine over JSON Lines event files, deterministically.

Files are read in the order given (``-`` or none = stdin), every line is fed to one Engine
(partition 0, kind inferred per line), ``tick()`` runs every ``--tick-every`` lines and
everything pending is finalized at the end. The engine's clock never moves (the idle fallback
is a live-only concern), so the same input always gives the same output files; only the
plausibility bound on event times reads the wall clock (an event may lead it by at most
``max_event_lead``).

Lines are read with a bounded reader: a line longer than ``limits.max_event_bytes`` is never
held whole; it is rejected ``too_large`` with its first ``max_event_bytes`` kept.

Exit status: 0 done (rejected lines are counted, reported and kept, not fatal unless
``--strict``), 1 with ``--strict`` when some lines were rejected, 2 usage error (bad option or
configuration value, unreadable file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evald.config import EngineConfig
    from evald.decode import Rejection
    from evald.engine import Engine, Result
    from evald.moments import Interval, SegmentMoments

SUMMARY = "replay JSON Lines impression/feedback events through the streaming engine"

EXAMPLES = """\
  evald replay events.jsonl                                  summary of counts
  evald replay day1.jsonl day2.jsonl --results results.jsonl --windows windows.jsonl
  cat events.jsonl | evald replay - --window 10m --lateness 30s --measures 'nDCG@10,RR'
  evald replay events.jsonl --rejected rejected.jsonl --strict   exit 1 if a line is rejected
  evald replay events.jsonl --config engine.yaml             every engine knob from a file
  evald replay ubi.jsonl --mapping ubi                       OpenSearch UBI queries and events
  evald replay sample.jsonl --mapping mine.yaml --rejected -  check a mapping on a sample

impression: {"request_id": "r1", "ts": "2024-05-01T12:00:00Z", "items": ["a", "b"],
             "labels": {"model": "v2", "arm": "treatment"}}
feedback:   {"request_id": "r1", "ts": 1714564800000, "item": "b", "action": "click"}
results line: {"request_id", "ts" (RFC 3339 UTC, ms), "labels", "measures": {name: value}}
              + "cluster" (16 hex digits) when the impression had a user_id
"""

TICK_EVERY = 4096


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the options; engine defaults live in EngineConfig (docs/semantics.md)."""
    parser.add_argument(
        "files", nargs="*", metavar="FILE", help="JSON Lines event files; '-' or none: stdin"
    )
    parser.add_argument("--window", metavar="DUR", help="attribution window (default 5m)")
    parser.add_argument("--lateness", metavar="DUR", help="allowed lateness (default 2m)")
    parser.add_argument(
        "-m", "--measures", metavar="LIST", help="comma-separated measures (default set: see docs)"
    )
    parser.add_argument(
        "--label-keys",
        metavar="KEYS",
        help="comma-separated segment label keys (model,arm,surface)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or JSON mapping of EngineConfig fields; the flags above override it",
    )
    parser.add_argument(
        "--mapping",
        metavar="NAME|FILE",
        default="evald",
        help="how records are read: evald (native, default), ubi (OpenSearch User Behavior "
        "Insights), or a YAML/JSON mapping file (docs/mapping.md)",
    )
    parser.add_argument("--results", metavar="OUT", help="one JSON line per finalized impression")
    parser.add_argument(
        "--windows", metavar="OUT", help="one JSON line per (window, segment, measure)"
    )
    parser.add_argument("--rejected", metavar="OUT", help="rejected lines with their reasons")
    parser.add_argument(
        "--tick-every",
        type=int,
        default=TICK_EVERY,
        metavar="N",
        help=f"score what the watermark closed every N lines (default {TICK_EVERY})",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when any line was rejected")
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="the summary: text for people, or one JSON object for scripts (default: text)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar on stderr (auto: when stderr is a terminal)",
    )


class UsageError(Exception):
    """Bad option, configuration value or unreadable input: exit status 2."""


def build_config(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from ``--config`` plus the flags; errors name the field."""
    from evald.config import ConfigError, load_config

    data: dict[str, Any] = {}
    if args.config:
        data = _read_config_file(args.config)
    if args.window is not None:
        data["window"] = args.window
    if args.lateness is not None:
        data["lateness"] = args.lateness
    if args.measures is not None:
        data["measures"] = args.measures
    if args.label_keys is not None:
        data["label_keys"] = [k.strip() for k in args.label_keys.split(",") if k.strip()]
    try:
        return load_config(data)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _read_config_file(path: str) -> dict[str, Any]:
    from evald.config import ConfigError, read_mapping_file

    try:
        return read_mapping_file(path)
    except ConfigError as exc:
        raise UsageError(f"--config: {exc}") from None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def result_line(result: Result) -> str:
    """The ``--results`` JSON line (non-finite measure values become null)."""
    body = result.to_json()
    measures = body["measures"]
    if not all(math.isfinite(v) for v in measures.values()):
        body["measures"] = {k: _finite(v) for k, v in measures.items()}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


class Progress:
    """A one-line progress bar on stderr, redrawn at most 5 times a second."""

    def __init__(self, total_bytes: int | None, enabled: bool) -> None:
        self.total = total_bytes
        self.enabled = enabled
        self._last = 0.0

    def update(self, done_bytes: int, events: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.2:
            return
        self._last = now
        if self.total:
            share = min(1.0, done_bytes / self.total)
            bar = "#" * int(share * 30)
            text = f"\r[{bar:<30}] {share:6.1%}  {events:,} events"
        else:
            text = f"\r{events:,} events, {done_bytes / 1e6:.1f} MB"
        sys.stderr.write(text)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


#: bytes read at a time while skipping the rest of an over-long line
SKIP_CHUNK = 1 << 16


def bounded_lines(stream: IO[bytes], limit: int) -> Iterator[tuple[bytes, int, int]]:
    """(line without its newline, bytes consumed, line length) per line of ``stream``.

    A line longer than ``limit`` bytes comes back cut to its first ``limit`` bytes, with its
    full length: memory stays within ``limit`` plus one read buffer whatever the input.
    """
    cap = limit + 2  # room for the body and a CRLF
    readline = stream.readline
    while True:
        raw = readline(cap)
        if not raw:
            return
        consumed = len(raw)
        if len(raw) == cap and not raw.endswith(b"\n"):  # over-long: skip to its end
            head = raw[:limit]
            tail = b""
            while True:
                more = readline(SKIP_CHUNK)
                if not more:
                    break
                consumed += len(more)
                tail = (tail + more)[-2:]
                if more.endswith(b"\n"):
                    break
            ending = 2 if tail.endswith(b"\r\n") else 1 if tail.endswith(b"\n") else 0
            yield head, consumed, consumed - ending
            continue
        line = raw.rstrip(b"\r\n")
        yield line, consumed, len(line)


def _lines(paths: list[str], limit: int) -> Iterator[tuple[str, int, bytes, int, int]]:
    """(source name, line number, raw line without its newline (at most ``limit`` bytes),
    bytes consumed, full line length) per line."""
    for path in paths or ["-"]:
        if path == "-":
            name, stream = "<stdin>", sys.stdin.buffer
            ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext(stream)
        else:
            name = path
            try:
                ctx = open(path, "rb")  # noqa: SIM115 (closed by the with below)
            except OSError as exc:
                raise UsageError(f"cannot read {path}: {exc.strerror}") from None
        with ctx as fh:
            for number, (line, size, length) in enumerate(bounded_lines(fh, limit), start=1):
                if length <= limit and not line.strip():
                    line = b""
                yield name, number, line, size, length


def _open_out(path: str | None, stack: contextlib.ExitStack) -> IO[str] | None:
    if path is None:
        return None
    if path == "-":
        return sys.stdout
    try:
        return stack.enter_context(open(path, "w", encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def replay(
    engine: Engine,
    paths: list[str],
    *,
    results: IO[str] | None = None,
    rejected: IO[str] | None = None,
    tick_every: int = TICK_EVERY,
    progress: Progress | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> dict[str, int]:
    """Feed every line of ``paths`` (in order) to ``engine``, then drain; returns counts.

    Lines are fed ``tick_every`` at a time (``Engine.feed_batch``), then scored. Event times
    may lead ``wall_clock`` (read once per batch) by at most the configured lead.
    """
    from evald.decode import Rejection

    if results is not None:
        write_result = results.write
        also = engine.on_result  # e.g. the per-segment summary's accumulator

        def on_result(result: Result) -> None:
            write_result(result_line(result) + "\n")
            if also is not None:
                also(result)

        engine.on_result = on_result
    feed_batch, tick = engine.feed_batch, engine.tick
    lines = blank = 0
    done_bytes = 0
    where: list[tuple[str, int]] = []  # (file, line) of each record in the batch
    raws: list[bytes] = []

    def write_rejected(name: str, number: int, rejection: Rejection) -> None:
        if rejected is not None:
            line = {"file": name, "line": number, **rejection.to_json()}
            rejected.write(json.dumps(line, ensure_ascii=False) + "\n")

    def feed() -> None:
        if raws:
            now = [int(wall_clock() * 1000)] * len(raws)
            for position, got in feed_batch(raws, timestamps=now):
                write_rejected(*where[position], got)
        where.clear()
        raws.clear()

    limit = engine.config.limits.max_event_bytes
    for name, number, raw, size, length in _lines(paths, limit):
        done_bytes += size
        if not raw:
            blank += 1
            continue
        lines += 1
        if length > limit:  # cut by the reader: rejected here, in input order
            feed()
            rejection = Rejection("too_large", f"{length} bytes > limit {limit}", raw)
            engine.reject(rejection)
            write_rejected(name, number, rejection)
            continue
        raws.append(raw)
        where.append((name, number))
        if lines % tick_every == 0:
            feed()
            tick()
            if progress is not None:
                progress.update(done_bytes, lines)
    feed()
    tick()
    engine.drain()
    if progress is not None:
        progress.update(done_bytes, lines, force=True)
    return {"lines": lines, "blank": blank}


def summary(engine: Engine, counts: dict[str, int]) -> list[str]:
    """Human-readable summary lines of what happened to every event."""
    stats = engine.stats
    ev = stats.events
    rows = [
        f"lines read             {counts['lines']:,} (+{counts['blank']:,} blank)",
        f"impressions            {ev[('impression', 'accepted')]:,} accepted, "
        f"{ev[('impression', 'duplicate')]:,} duplicate, "
        f"{stats.finalized['late']:,} arrived after their window closed",
        f"feedback               {ev[('feedback', 'accepted')]:,} accepted, "
        f"{ev[('feedback', 'duplicate')]:,} duplicate",
        f"rejected               {sum(stats.rejected.values()):,}" + _breakdown(stats.rejected),
        f"finalized impressions  {sum(stats.finalized.values()):,}"
        + _breakdown(stats.finalized)
        + f", {stats.abandoned:,} abandoned (no positive feedback)",
        f"feedback not counted   {sum(stats.unattributed.values()):,}"
        + _breakdown(stats.unattributed),
    ]
    if stats.skipped:
        rows.append(
            f"feedback skipped       {sum(stats.skipped.values()):,}"
            + _breakdown(stats.skipped)
            + " (actions the mapping does not grade)"
        )
    return rows


def _breakdown(counts: dict[str, int]) -> str:
    parts = [f"{k} {v:,}" for k, v in counts.items() if v]
    return f" ({', '.join(parts)})" if parts else ""


def _interval(est: Interval) -> str:
    half = "" if math.isnan(est.half) else f" ± {est.half:.6f}"
    return f"{est.mean:.6f}{half}"


def means(moments: SegmentMoments) -> list[str]:
    """Overall mean and 95% interval per measure over every finalized impression, then the
    same per segment (all segment label keys)."""
    rows = [
        f"  {name:<20} {_interval(est)}  (n={est.n:,})" for name, est in moments.overall().items()
    ]
    segments = moments.rows()
    if segments:
        rows.append("per segment (mean ± 95% interval):")
    for seg in segments:
        labels = " ".join(f"{key}={value}" for key, value in seg.labels.items())
        rows.append(f"  {labels}  (n={seg.n:,})")
        rows += [f"    {name:<18} {_interval(est)}" for name, est in seg.measures.items()]
    return rows


def summary_json(engine: Engine, counts: dict[str, int], moments: SegmentMoments) -> str:
    """The ``--format json`` summary: counts, overall and per-segment intervals."""
    stats = engine.stats
    doc = {
        "lines": counts["lines"],
        "blank": counts["blank"],
        "events": {f"{kind}.{outcome}": n for (kind, outcome), n in stats.events.items()},
        "rejected": {k: v for k, v in stats.rejected.items() if v},
        "finalized": dict(stats.finalized),
        "abandoned": stats.abandoned,
        "unattributed": dict(stats.unattributed),
        "skipped": dict(stats.skipped),
        "means": {name: est.to_json() for name, est in moments.overall().items()},
        "segments": [row.to_json() for row in moments.rows()],
    }
    if engine.statistics is not None:
        doc["comparisons"] = comparison_records(engine)
    return json.dumps(doc, ensure_ascii=False, indent=2)


def comparison_records(engine: Engine) -> list[dict[str, object]]:
    """One record per (comparison, treatment, comparison segment, measure), in that order."""
    from evald.statistics.live import summary as comparison_summary

    live = engine.statistics
    if live is None:
        return []
    alpha = live.settings.alpha
    return [rec for view in live.views() for rec in comparison_summary(view, alpha)]


def comparisons(engine: Engine) -> list[str]:
    """The text summary's comparison lines: the sequence's bounds, the minimum-effect verdict,
    the CUSUM and the sample-ratio guard per treatment, comparison segment and measure."""
    records = comparison_records(engine)
    if not records:
        return []
    rows = [
        f"comparisons (always-valid {1 - engine.config.statistics.alpha:.0%} confidence "
        "sequence on treatment − control, family-wise):"
    ]
    for r in records:
        segment = " ".join(f"{k}={v}" for k, v in r["segment"].items())  # type: ignore[attr-defined]
        low, high = r["lower"], r["upper"]
        band = "n too small" if low is None else f"[{low:+.6f}, {high:+.6f}]"
        if r["intersection_empty"]:
            band += " (the running intersection is empty: the difference changed)"
        elif r["intersection_lower"] is not None:
            low, high = r["intersection_lower"], r["intersection_upper"]
            band += f", running intersection [{low:+.6f}, {high:+.6f}]"
        verdict = ""
        if r["min_effect"] is not None:
            worse = "BELOW" if r["below_min_effect"] else "not below"
            verdict = f"; {worse} −{r['min_effect']}"
        alarm = r["cusum_alarm_window"]
        rows.append(
            f"  {r['comparison']} {r['treatment']} vs {r['control']} {segment} {r['measure']}: "
            f"Δ {_signed(r['difference'])} {band}{verdict}, p {r['p_value']:.3g}, "
            f"n {r['n_treatment']:,}/{r['n_control']:,}; CUSUM {r['cusum_vs_control']:.2f}"
            + ("" if alarm is None else f" (alarm at window {alarm})")
            + f"; SRM p {r['srm_p_value']:.3g}"
        )
    return rows


def _signed(value: object) -> str:
    return "n/a" if value is None else f"{value:+.6f}"


def run(args: argparse.Namespace) -> int:
    """Entry point of ``evald replay``."""
    try:
        config = build_config(args)
        if args.tick_every < 1:
            raise UsageError("--tick-every must be >= 1")
        from evald.engine import Engine
        from evald.mapping import MappingError, decoder_for
        from evald.moments import SegmentMoments

        try:
            decoder = decoder_for(args.mapping, config)
        except MappingError as exc:
            raise UsageError(f"--mapping: {exc}") from None
        if decoder is not None and decoder.reads_record_time:
            raise UsageError(
                f"--mapping: {args.mapping} takes the event time from the Kafka record timestamp"
                " (time: {source: record}); lines of a file have none: use a mapping that reads"
                " the time from a field of the record"
            )
        engine = Engine(config, clock=lambda: 0.0, decoder=decoder, global_statistics=True)
        moments = SegmentMoments(engine.measure_names, engine.aggregates.segments)
        engine.on_result = moments.add
        paths = list(args.files)
        for path in paths:
            if path != "-" and not os.access(path, os.R_OK):
                raise UsageError(f"cannot read {path}")
        sizes = [os.path.getsize(p) for p in paths if p != "-" and os.path.isfile(p)]
        total = sum(sizes) if paths and len(sizes) == len(paths) else None
        show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
        progress = Progress(total, show)
        with contextlib.ExitStack() as stack:
            results = _open_out(args.results, stack)
            rejected = _open_out(args.rejected, stack)
            windows = _open_out(args.windows, stack)
            counts = replay(
                engine,
                paths,
                results=results,
                rejected=rejected,
                tick_every=args.tick_every,
                progress=progress,
            )
            progress.close()
            if windows is not None:
                for row in engine.window_rows(last_only=False):
                    windows.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
    except UsageError as exc:
        print(f"evald replay: {exc}", file=sys.stderr)
        return 2
    out = sys.stderr if "-" in (args.results, args.windows, args.rejected) else sys.stdout
    if args.format == "json":
        print(summary_json(engine, counts, moments), file=out)
    else:
        text = [
            *summary(engine, counts),
            "means (± 95% interval):",
            *means(moments),
            *comparisons(engine),
        ]
        print("\n".join(text), file=out)
    rejected_n = sum(engine.stats.rejected.values())
    return 1 if args.strict and rejected_n else 0
