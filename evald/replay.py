"""`evald replay`: run the streaming engine over JSON Lines event files, deterministically.

Files are read in the order given (``-`` or none = stdin), plain or gzip-compressed, export
wrappers (``_bulk`` action lines, search hits) taken off (``evald.files``); every record is fed
to one Engine (partition 0, kind from the export's index when the mapping lists it, else
inferred per record), ``tick()`` runs every ``--tick-every`` records and everything pending is
finalized at the end. ``--sort`` feeds the records of all files in event-time order instead,
in bounded memory. The engine's clock never moves (the idle fallback is a live-only concern),
so the same input always gives the same output files; only the plausibility bound on event
times reads the wall clock (an event may lead it by at most ``max_event_lead``).

Lines are read with a bounded reader: a line longer than ``limits.max_event_bytes`` is never
held whole; it is rejected ``too_large`` with its first ``max_event_bytes`` kept.

Exit status: 0 done (rejected lines are counted, reported and kept, not fatal unless
``--strict``), 1 with ``--strict`` when some lines were rejected, 2 usage error (bad option or
configuration value, unreadable file).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from evald.clicks import replay_option as clicks_option
from evald.durations import format_duration
from evald.files.lines import InputError
from evald.files.lines import bounded_lines as _bounded_lines
from evald.input_rule import GZIP_MAGIC
from evald.interleaving.report import NO_BAND

if TYPE_CHECKING:
    from evald.config import EngineConfig
    from evald.engine import Engine, Result
    from evald.files.feed import SortOptions
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
  evald replay ubi_export.ndjson.gz --mapping ubi --sort     an OpenSearch _bulk export, any order

impression: {"request_id": "r1", "ts": "2024-05-01T12:00:00Z", "items": ["a", "b"],
             "labels": {"model": "v2", "arm": "treatment"}}
feedback:   {"request_id": "r1", "ts": 1714564800000, "item": "b", "action": "click"}
results line: {"request_id", "ts" (RFC 3339 UTC, ms), "labels", "measures": {name: value}}
              + "cluster" (16 hex digits) when the impression had a user_id
              + "query" (normalised) when it had a query

comparing arms (A/B): add a `statistics` block at the top level of the --config file
(docs/semantics.md §7, docs/statistics.md); the arms are the values of a segment label:

  label_keys: [model, arm, surface]
  windows: [5m, 1h]
  statistics:
    window: 1h                 # the window folded: one of `windows`
    alpha: 0.05                # family-wise false-alarm rate of the bands
    comparisons:
      - name: ab
        label: arm             # impressions carry labels {"arm": "control" | "treatment"}
        control: control
        treatments: [treatment]
        start: 2026-01-01      # declared before looking
        arm_scoped_labels: [model]    # labels each arm fixes (its ranker), summed away
        min_effect: {nDCG@10: 0.01}   # alert when treatment is this much worse

  evald replay events.jsonl --config ab.yaml            the verdicts, and when each fired
  evald replay events.jsonl --config ab.yaml --looks looks.jsonl   every look, one per line
Impressions with a "user_id" make the variances clustered by user ("variance: user"); without
one every list is its own cluster ("variance: request", the list-level sequence).
"""

TICK_EVERY = 4096
#: the records ``--sort`` holds in memory before it writes a sorted run to disk
SORT_MEMORY = "256M"
#: the share of records behind the watermark past which replay suggests ``--sort``
OUT_OF_ORDER_SHARE = 0.01


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the options; engine defaults live in EngineConfig (docs/semantics.md).

    Long because: a flat list of option declarations.
    """
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="JSON Lines event files, plain or gzip-compressed, also OpenSearch/Elasticsearch "
        "_bulk files and search-hit dumps as they are; read one after the other (see --sort); "
        "'-' or none: stdin",
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
    parser.add_argument(
        "--sort",
        action="store_true",
        help="read every file first and feed the records in event-time order (equal times in "
        "input order), for exports and files out of order; memory stays within --sort-memory, "
        "the rest goes to temporary files",
    )
    parser.add_argument(
        "--sort-memory",
        metavar="SIZE",
        default=SORT_MEMORY,
        help=f"records --sort holds in memory before it spills to disk (default {SORT_MEMORY}; "
        "K, M, G: binary units)",
    )
    parser.add_argument(
        "--sort-dir",
        metavar="DIR",
        help="where --sort writes its temporary files (default: the system's temporary directory)",
    )
    parser.add_argument("--results", metavar="OUT", help="one JSON line per finalized impression")
    parser.add_argument(
        "--windows", metavar="OUT", help="one JSON line per (window, segment, measure)"
    )
    parser.add_argument("--rejected", metavar="OUT", help="rejected lines with their reasons")
    parser.add_argument(
        "--looks",
        metavar="OUT",
        help="one JSON line per comparison, treatment, segment and measure at every window "
        "folded (the statistics config block): the replay of each look",
    )
    parser.add_argument(
        "--queries",
        metavar="OUT",
        help="one JSON line per window still in retention and segment: its top queries and, "
        "per measure, the queries that fell most against the window before (docs/drilldown.md;"
        " needs drilldown.capacity above 0, as by default)",
    )
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
    clicks_option.add_options(parser)


class UsageError(Exception):
    """Bad option, configuration value or unreadable input: exit status 2."""


def build_config(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from ``--config`` plus the flags; errors name the field."""
    from evald.config import ConfigError, load_config
    from evald.exposition.budget import check_series_budget

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
        config = load_config(data)
        check_series_budget(config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return config


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


#: re-exported: the bounded line reader lives with the other file readers
bounded_lines = _bounded_lines


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
    sort: SortOptions | None = None,
) -> dict[str, int]:
    """Feed every record of ``paths`` to ``engine`` (in order, or with ``sort`` in event-time
    order), then drain; returns counts (``evald.files.feed``).

    Records are fed ``tick_every`` at a time (``Engine.feed_batch``), then scored. Event times
    may lead ``wall_clock`` (read once per batch) by at most the configured lead.
    """
    from evald.files.feed import feed

    if results is not None:
        write_result = results.write
        also = engine.on_result  # e.g. the per-segment summary's accumulator

        def on_result(result: Result) -> None:
            write_result(result_line(result) + "\n")
            if also is not None:
                also(result)

        engine.on_result = on_result
    update = None if progress is None else progress.update
    counts = feed(
        engine,
        paths,
        rejected=rejected,
        tick_every=tick_every,
        progress=update,
        wall_clock=wall_clock,
        sort=sort,
    )
    if progress is not None:
        progress.update(counts["bytes"], counts["lines"], force=True)
    return counts


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
    if counts.get("actions"):
        bodies = counts.get("bodies", 0)
        rows.insert(
            1,
            f"export lines           {counts['actions']:,} _bulk action lines"
            + (f", {bodies:,} update bodies" if bodies else "")
            + " (not records)",
        )
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
        "behind_watermark": counts.get("behind", 0),
        "means": {name: est.to_json() for name, est in moments.overall().items()},
        "segments": [row.to_json() for row in moments.rows()],
    }
    if engine.statistics is not None:
        doc["comparisons"] = comparison_records(engine)
    if engine.interleaving.seen:
        doc["interleaving"] = engine.interleaving.records()
    if engine.zero_feedback.enabled:
        from evald.zerofeedback.windows import grouped

        doc["zero_feedback"] = grouped(engine.zero_feedback_rows())
    from evald.drilldown.outputs import document

    doc.update(document(engine, doc.get("comparisons"), final=True))  # type: ignore[arg-type]
    return json.dumps(doc, ensure_ascii=False, indent=2)


def watch_looks(engine: Engine, out: IO[str] | None) -> None:
    """``--looks``: every window a comparison folds writes its records as they are then (the
    summary's ``comparisons`` records at that look), one JSON line each."""
    if out is None:
        return
    live = engine.statistics
    assert live is not None, "_check_flags refuses --looks without a comparison"
    from evald.statistics.live import summary as comparison_summary

    alpha = live.settings.alpha

    def write(view: Any) -> None:
        for record in comparison_summary(view, alpha):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")

    live.on_look = write


def comparison_records(engine: Engine) -> list[dict[str, object]]:
    """One record per (comparison, treatment, comparison segment, measure), in that order."""
    from evald.statistics.live import summary as comparison_summary

    live = engine.statistics
    if live is None:
        return []
    alpha = live.settings.alpha
    return [rec for view in live.views() for rec in comparison_summary(view, alpha)]


def comparisons(engine: Engine) -> list[str]:
    """The text summary's comparison lines: per treatment, comparison segment and measure the
    band since the start, the minimum-effect verdict, the CUSUMs and the sample-ratio guard,
    then when each signal first fired (in event time, with its values at that look)."""
    records = comparison_records(engine)
    if not records:
        return []
    settings = engine.config.statistics
    rows = [
        f"comparisons (always-valid {1 - settings.alpha:.0%} confidence sequence on treatment − "
        f"control, family-wise; CUSUM threshold h {settings.cusum_h:g}):"
    ]
    for r in records:
        rows += _comparison_lines(r)
    return rows


#: why a look has no band: below min_n lists an arm, lists worth too few users, or SE² 0
#: (docs/statistics.md §3)


def _why_list(r: dict[str, Any]) -> str:
    """Why a comparison's variance is the list-level one: an arm with too few lists is not
    lists without user ids (a segment holding one arm only has users and no band)."""
    if min(r["n_treatment"], r["n_control"]) < 2:
        return "too few lists in an arm"
    return "no user ids" if r["lists_with_user"] == 0 else "no replicate sums"


def _comparison_lines(r: dict[str, Any]) -> list[str]:
    segment = " ".join(f"{k}={v}" for k, v in r["segment"].items())
    low, high = r["lower"], r["upper"]
    band = NO_BAND if low is None else f"[{low:+.6f}, {high:+.6f}]"
    if r["intersection_empty"]:
        band += " (the running intersection is empty: the difference changed)"
    elif r["intersection_lower"] is not None:
        band += f", running intersection [{r['intersection_lower']:+.6f}, "
        band += f"{r['intersection_upper']:+.6f}]"
    verdict = ""
    if r["min_effect"] is not None:
        verdict = f"; {'BELOW' if r['below_min_effect'] else 'not below'} −{r['min_effect']}"
    variance = "clustered by user" if r["variance"] == "user" else f"list level ({_why_list(r)})"
    first = r["first"]
    baseline = r["cusum_vs_baseline"]
    lines = [
        f"  {r['comparison']} {r['treatment']} vs {r['control']} {segment} {r['measure']}: "
        f"Δ {_signed(r['difference'])} {band}{verdict}, p {r['p_value']:.3g}, "
        f"n {r['n_treatment']:,}/{r['n_control']:,}, variance {variance}; "
        f"SRM p {r['srm_p_value']:.3g}",
        "    band first excluded 0: " + _band_look(first["excluded"]),
        f"    CUSUM vs control {r['cusum_vs_control']:.2f}: "
        + _cusum_look(first["cusum_vs_control"]),
    ]
    if r["min_effect"] is not None:
        lines.insert(2, f"    band first below −{r['min_effect']}: " + _band_look(first["below"]))
    for arm, statistic in baseline.items():
        now = "-" if statistic is None else f"{statistic:.2f}"
        lines.append(
            f"    CUSUM vs baseline, {arm} {now}: " + _cusum_look(first["cusum_vs_baseline"][arm])
        )
    return lines


def _window(look: dict[str, Any]) -> str:
    return f"window {look['window']} (to {look['end']})"


def _band_look(look: dict[str, Any] | None) -> str:
    if look is None:
        return "never"
    return (
        f"{_window(look)}: Δ {_signed(look['difference'])} "
        f"[{look['lower']:+.6f}, {look['upper']:+.6f}], p {look['p_value']:.3g}, "
        f"n {look['n_treatment']:,}/{look['n_control']:,}"
    )


def _cusum_look(look: dict[str, Any] | None) -> str:
    if look is None:
        return "never crossed"
    return f"crossed at {_window(look)} at {look['statistic']:.2f}"


def _signed(value: object) -> str:
    return "n/a" if value is None else f"{value:+.6f}"


def _sort_options(args: argparse.Namespace) -> SortOptions | None:
    """``--sort`` and its memory and directory, checked (UsageError naming the option)."""
    from evald.files.feed import SortOptions
    from evald.files.sort import parse_size

    try:
        budget = parse_size(args.sort_memory)
    except ValueError as exc:
        raise UsageError(f"--sort-memory: {exc}") from None
    if args.sort_dir is not None and not os.path.isdir(args.sort_dir):
        raise UsageError(f"--sort-dir: {args.sort_dir} is not a directory")
    return SortOptions(budget, args.sort_dir) if args.sort else None


def _plain(path: str) -> bool:
    """A readable file that is not gzip-compressed (its size is the progress bar's total)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(2) != GZIP_MAGIC
    except OSError:
        return False


def out_of_order(engine: Engine, counts: dict[str, int], *, sorted_first: bool) -> list[str]:
    """A note when more than ``OUT_OF_ORDER_SHARE`` of the records came behind the watermark
    (later than the lateness allows): replayed as they are, their lists and feedback were
    closed or orphaned early; ``--sort`` orders them first."""
    behind = counts.get("behind", 0)
    records = counts.get("lines", 0) - counts.get("actions", 0) - counts.get("bodies", 0)
    if sorted_first or not records or behind <= OUT_OF_ORDER_SHARE * records:
        return []
    lateness = format_duration(engine.config.lateness)
    return [
        f"note: {behind:,} of {records:,} records ({behind / records:.1%}) came more than the "
        f"lateness ({lateness}) behind newer ones: the input is not in event-time order; "
        "`evald replay --sort` orders it first"
    ]


def _engine(mapping: str, config: EngineConfig) -> Engine:
    """The replay's engine with the decoder of ``mapping`` (UsageError when it cannot read
    files); its clock never moves."""
    from evald.engine import Engine
    from evald.mapping import MappingError, decoder_for

    try:
        decoder = decoder_for(mapping, config)
    except MappingError as exc:
        raise UsageError(f"--mapping: {exc}") from None
    if decoder is not None and decoder.reads_record_time:
        raise UsageError(
            f"--mapping: {mapping} takes the event time from the Kafka record timestamp"
            " (time: {source: record}); lines of a file have none: use a mapping that reads"
            " the time from a field of the record"
        )
    return Engine(config, clock=lambda: 0.0, decoder=decoder, global_statistics=True)


def _check_flags(args: argparse.Namespace, config: EngineConfig) -> None:
    """Flags out of range, or needing a feature the settings turn off (UsageError naming the
    flag), before any output file is opened."""
    if args.tick_every < 1:
        raise UsageError("--tick-every must be >= 1")
    if args.queries is not None and config.drilldown.capacity == 0:
        raise UsageError(
            "--queries: the drill-down is off (drilldown.capacity: 0 in --config), so "
            "there are no query summaries to write: set a capacity above 0 or drop --queries"
        )
    if args.looks is not None and not config.statistics.comparisons:
        raise UsageError(
            "--looks: no comparison is configured (a statistics block with comparisons in "
            "--config; see evald replay --help)"
        )
    _check_outputs(args)


def _check_outputs(args: argparse.Namespace) -> None:
    """An output that is an input, or another output: refused (UsageError naming the flags)."""
    from evald.output_files import clash

    flags = ("results", "windows", "rejected", "looks", "queries")
    # --mapping is a file only when one is there (else a name: evald, ubi)
    settings = (path for path in (args.config, args.mapping) if path and os.path.isfile(path))
    inputs = [*args.files, *settings]
    problem = clash({f"--{flag}": getattr(args, flag) for flag in flags}, inputs)
    if problem is not None:
        raise UsageError(problem)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``evald replay``."""
    try:
        config = build_config(args)
        _check_flags(args, config)
        from evald.moments import SegmentMoments

        engine = _engine(args.mapping, config)
        moments = SegmentMoments(engine.measure_names, engine.aggregates.segments)
        engine.on_result = moments.add
        try:
            click_settings = clicks_option.settings_of(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        collector = None
        if click_settings is not None:
            collector = clicks_option.attach(engine, config.label_keys, click_settings.depth)
        paths = list(args.files)
        for path in paths:
            if path != "-" and not os.access(path, os.R_OK):
                code = errno.EACCES if os.path.exists(path) else errno.ENOENT
                raise UsageError(f"cannot read {path}: {os.strerror(code)}")
        sort = _sort_options(args)
        sizes = [os.path.getsize(p) for p in paths if p != "-" and _plain(p)]
        total = sum(sizes) if paths and len(sizes) == len(paths) else None
        show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
        progress = Progress(total, show)
        with contextlib.ExitStack() as stack:
            results = _open_out(args.results, stack)
            rejected = _open_out(args.rejected, stack)
            windows = _open_out(args.windows, stack)
            queries = _open_out(args.queries, stack)
            watch_looks(engine, _open_out(args.looks, stack))
            counts = replay(
                engine,
                paths,
                results=results,
                rejected=rejected,
                tick_every=args.tick_every,
                progress=progress,
                sort=sort,
            )
            progress.close()
            if windows is not None:
                for row in engine.window_rows(last_only=False):
                    windows.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
            if queries is not None:
                from evald.drilldown.outputs import every_window

                for doc in every_window(engine):
                    queries.write(json.dumps(doc, ensure_ascii=False) + "\n")
    except (UsageError, InputError) as exc:
        print(f"evald replay: {exc}", file=sys.stderr)
        return 2
    counts["behind"] = engine.behind_watermark()
    click = None
    if click_settings is not None and collector is not None:
        click = clicks_option.result(click_settings, collector, engine.measure_names)
    print_summary(args, engine, counts, moments, click)
    rejected_n = sum(engine.stats.rejected.values())
    return 1 if args.strict and rejected_n else 0


def print_summary(
    args: argparse.Namespace,
    engine: Engine,
    counts: dict[str, int],
    moments: SegmentMoments,
    click: dict[str, Any] | None = None,
) -> None:
    """The summary (``--format``), on stderr when an output file is stdout (``-``);
    ``click``: the ``--click-model`` object (evald/clicks/report.py)."""
    outputs = (args.results, args.windows, args.rejected, args.looks, args.queries)
    out = sys.stderr if "-" in outputs else sys.stdout
    if args.format == "json":
        doc = summary_json(engine, counts, moments)
        if click is not None:
            doc = json.dumps(
                {**json.loads(doc), "click_model": click}, ensure_ascii=False, indent=2
            )
        print(doc, file=out)
        return
    text = [
        *summary(engine, counts),
        "means (± 95% interval):",
        *means(moments),
        *comparisons(engine),
        *engine.interleaving.lines(),
        *out_of_order(engine, counts, sorted_first=args.sort),
    ]
    if click is not None:
        from evald.clicks.report import text as click_text

        text += click_text(click)
    print("\n".join(text), file=out)
