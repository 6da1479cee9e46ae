"""The demo's terminal view: quality of the last complete window per segment, treatment −
control in a column of its own (as in ``evald top``), the comparison since the start, and join
health.

Everything here is a pure function of the engine's plain state (``Aggregates`` window sums,
``Stats`` counters) except :class:`LiveView`, which only decides *when* and *how* to write:
a redrawn ANSI table on a terminal, one summary line per segment every few seconds otherwise
(logs and pipes stay readable).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TextIO

import numpy as np

from evald.aggregate import Aggregates
from evald.durations import readable
from evald.interleaving.report import NO_BAND, NONE_NOW, NONE_YET, band_favours
from evald.statistics.live import ComparisonView
from evald.stats import Stats, mean_ci95
from evald.terminal import can_encode

#: the measures the demo shows, in order, by their canonical names (the column titles, the
#: ``measure`` label in /metrics and the keys in results files). The first drives the trend.
SHOWN: tuple[str, ...] = ("nDCG@10", "RR", "Success@10", "RBP(p=0.8)")

#: the table and every line around it fit a terminal this wide
WIDTH = 80

UP, DOWN, FLAT = "up", "down", "flat"

_ARROWS = {UP: ("↑", "^"), DOWN: ("↓", "v"), FLAT: ("→", "="), "": (" ", " ")}
_GREEN, _RED, _DIM, _BOLD, _RESET = "\x1b[32m", "\x1b[31m", "\x1b[2m", "\x1b[1m", "\x1b[0m"
_HOME_CLEAR = "\x1b[H\x1b[J"


@dataclass(frozen=True)
class Estimate:
    """Mean of one measure over a window, with its 95% CI half-width (NaN if unknown)."""

    mean: float
    half: float


@dataclass(frozen=True)
class SegmentSummary:
    """One row of the view: a segment's last complete window against the one before."""

    name: str
    count: int  # impressions in the current window
    total: int  # impressions finalized since start
    current: dict[str, Estimate]
    previous: dict[str, Estimate]
    trend: str  # UP / DOWN / FLAT, or "" when there is no previous window to compare to


@dataclass(frozen=True)
class Versus:
    """One treatment arm against control in the current window: per measure the difference of
    the means and its 95% bound (independent arms: the half-widths add in quadrature)."""

    treatment: str
    control: str
    difference: dict[str, Estimate]

    @property
    def title(self) -> str:
        return f"{self.treatment}−{self.control}"


def versus_control(
    arms: Sequence[SegmentSummary], control: str, treatments: Sequence[str]
) -> list[Versus]:
    """Each configured treatment against ``control`` from per-arm rows (``summarize`` grouped
    by the arm label alone, so surfaces and models merge exactly); one entry per treatment
    even before any window, so the view's column is there from the first frame."""
    by_name = {row.name: row.current for row in arms}
    base = by_name.get(control, {})
    out = []
    for treatment in treatments:
        current = by_name.get(treatment, {})
        difference = {
            name: Estimate(est.mean - base[name].mean, math.hypot(est.half, base[name].half))
            for name, est in current.items()
            if name in base
        }
        out.append(Versus(treatment, control, difference))
    return out


@dataclass(frozen=True)
class Health:
    """Join health in the units a person watching wants."""

    events_per_s: float
    accepted: int
    pending: int
    rejected: int
    late: int
    orphaned: int
    duplicates: int
    unknown_items: int
    abandoned: int
    finalized: int
    watermark_lag_s: float | None  # newest event time seen minus the watermark


@dataclass(frozen=True)
class Snapshot:
    """Everything one frame shows."""

    event_time_ms: int
    window: tuple[int, int] | None  # [start, end) of the current window
    segments: list[SegmentSummary]
    health: Health
    notes: list[str] = field(default_factory=list)
    #: the comparison since the start, below the table (:func:`comparison_lines`)
    comparison: list[str] = field(default_factory=list)
    #: the table's treatment − control column(s), in every frame (:func:`versus_control`)
    versus: list[Versus] = field(default_factory=list)


def interleaving_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """Per interleaved segment and pair of teams (``interleaving.report.record``'s records): the
    preference since the start with its always-valid band, ▲ when team_a won, ▼ when team_b
    won (the test's verdict, kept from the look that decided: the band may hold 0 again after
    the rankers change) and the verdict in words: who won and when, or ``no difference shown
    yet``; below a verdict the band no longer shows, ``no difference shown now`` while it holds
    0 again, ``reversed since`` and the team it now favours once it excludes 0 for the other."""
    lines: list[str] = []
    for pair in sorted({(r["team_a"], r["team_b"]) for r in records}):
        lines.append(f"interleaving: {pair[0]} vs {pair[1]}, preference since the start:")
        for r in records:
            if (r["team_a"], r["team_b"]) != pair:
                continue
            where = " ".join(v for k, v in r["segment"].items() if k not in ("arm", "model"))
            band = NO_BAND if r["lower"] is None else f"[{r['lower']:+.3f}, {r['upper']:+.3f}]"
            winner = r["winner"]
            band += "" if winner is None else " ▲" if winner == pair[0] else " ▼"
            # decided_at: RFC 3339 UTC, its time of day as the view's other times
            said = NONE_YET if winner is None else f"{winner} won at {r['decided_at'][11:19]}"
            pref = r["preference"]
            value = "n/a" if pref is None else f"{pref:+.4f}"
            lines.append(f"  {where or 'all':<6} {value} {band}  {said} ({r['compared']:,} lists)")
            if winner is None:
                continue
            # what the band shows now beside the kept verdict, unless it agrees: a line of its
            # own, the verdict's line has no room left
            now = band_favours(pair[0], pair[1], r["lower"], r["upper"])
            if now is None:
                lines.append(f"  {where or 'all':<6} {NONE_NOW}: the band holds 0 again")
            elif now != winner:
                lines.append(f"  {where or 'all':<6} reversed since: the band now favours {now}")
    return lines


def comparison_lines(
    views: Sequence[ComparisonView], regress_at_ms: int | None, measure: str = SHOWN[0]
) -> list[str]:
    """Per comparison segment: the difference since the start with its always-valid band (▲/▼
    once it excludes 0: the verdict marks of the screen), the CUSUM against control and, once
    the bands of the looks no longer overlap (an empty running intersection: the difference
    changed), ``bands disjoint``; then when a drop was first detected and how long after the
    change (event time)."""
    lines: list[str] = []
    for view in views:
        state = view.state
        rows = sorted((key, seq) for key, seq in state.sequences.items() if key[2] == measure)
        if not rows:
            continue
        lines.append(f"{measure}: treatment − control since the start (always-valid band):")
        for key, seq in rows:
            treatment, rest, _ = key
            bound = state.bounds[key]
            where = " ".join(v for _, v in rest) or "all"
            band = NO_BAND if math.isnan(bound.low) else f"[{bound.low:+.3f}, {bound.high:+.3f}]"
            band += " ▲" if bound.low > 0 else " ▼" if bound.high < 0 else "  "
            cusum = state.vs_control[key].statistic
            # the running intersection of the bands is empty: the difference changed
            changed = "  bands disjoint" if seq.empty else ""
            lines.append(
                f"  {treatment} {where:<6} {bound.difference:+.4f} {band}  CUSUM {cusum:5.1f}"
                + changed
            )
        found = sorted(view.detected.items(), key=lambda item: item[1].end_ms)
        for (key, signal), detection in found:
            if key[2] != measure or signal not in ("cusum", "below"):
                continue
            end = detection.end_ms
            what = "the CUSUM" if signal == "cusum" else "the band"
            where = " ".join(v for _, v in key[1]) or "all"
            after = ""
            if regress_at_ms is not None:
                delay = end - regress_at_ms
                after = (
                    f", {readable(delay / 1000)} after the change"
                    if delay >= 0
                    else " (before the change: a false alarm)"
                )
            lines.append(f"  drop detected {where} by {what}: window to {hms(end)}{after}")
    return lines


def attribution_lines(records: Sequence[dict[str, Any]], measure: str = SHOWN[0]) -> list[str]:
    """Per flagged drop of ``measure`` (``GET /queries``' attribution records, against the
    control or the arm's own baseline): what carries it, best first, with its share of the
    drop; ``no slice explains it`` when the attribution names nothing (an even drop). Read
    from the engine's drill-down, not from the simulator."""
    lines: list[str] = []
    for record in records:
        if record["measure"] != measure:
            continue
        where = " ".join(str(v) for v in record["segment"].values()) or "all"
        named = [
            f"{e['value']!r} {e['explanatory_power']:.0%}"
            if e["dimension"] == "query"
            else f"{e['dimension']}={e['value']} {e['explanatory_power']:.0%}"
            for e in record["explanations"][:4]
        ]
        carried = ", ".join(named) if named else "no slice explains it"
        # a treatment's drop can be flagged against the control and against its own baseline:
        # two records, each explained over its own windows
        against = "vs its baseline" if record.get("against") == "baseline" else "vs control"
        lines.append(f"  {record['treatment']} {where} ({against}) drop carried by: {carried}")
    if lines:
        lines.insert(0, f"{measure} drop attribution (queries or labels, share of the drop):")
    return [_fit(line) for line in lines]


def trend(current: Estimate | None, previous: Estimate | None) -> str:
    """UP/DOWN when the change exceeds the combined 95% half-widths, FLAT otherwise.

    A change inside the noise is FLAT, so the arrow only moves for a real shift such as the
    injected regression.
    """
    if current is None or previous is None or math.isnan(current.mean + previous.mean):
        return ""
    bound = math.hypot(_finite(current.half), _finite(previous.half))
    delta = current.mean - previous.mean
    if delta > bound:
        return UP
    if delta < -bound:
        return DOWN
    return FLAT


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def group_sums(
    aggregates: Aggregates, sums: np.ndarray, group_by: Sequence[str]
) -> dict[str, np.ndarray]:
    """Merge per-segment (segments, measures, k) sums into display groups by label values.

    Sums merge by addition, so grouping over, say, every surface is exact.
    """
    groups: dict[str, np.ndarray] = {}
    for seg_id in range(min(len(aggregates.segments), sums.shape[0])):
        labels = aggregates.segments.labels_of(seg_id)
        name = " · ".join(labels.get(key, "__none__") for key in group_by)
        if name in groups:
            groups[name] = groups[name] + sums[seg_id]
        else:
            groups[name] = sums[seg_id].copy()
    return groups


def last_windows(
    complete_before_ms: int | None, width_ms: int
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The last complete window ending at or before ``complete_before_ms``, and the one before.

    Windows are aligned to multiples of ``width_ms`` since the epoch, as the exposition's.
    """
    if complete_before_ms is None:
        return None
    end = complete_before_ms // width_ms * width_ms
    return (end - width_ms, end), (end - 2 * width_ms, end - width_ms)


def summarize(
    aggregates: Aggregates,
    current: tuple[int, int] | None,
    previous: tuple[int, int] | None,
    *,
    group_by: Sequence[str] = ("arm", "model"),
    shown: Sequence[str] = SHOWN,
) -> list[SegmentSummary]:
    """Rows comparing event-time range ``current`` with ``previous``, per display group.

    Segments are grouped by the ``group_by`` labels (sums merge exactly); groups with no
    scored impression at all are left out. The trend compares the first ``shown`` measure.
    """
    index = {name: i for i, name in enumerate(aggregates.measures)}
    wanted = [name for name in shown if name in index]
    cur_sums = _range_sums(aggregates, current, group_by)
    prev_sums = _range_sums(aggregates, previous, group_by)
    n_seg = len(aggregates.segments)
    totals = group_sums(aggregates, aggregates.hist_count[:n_seg, :, None], group_by)

    rows: list[SegmentSummary] = []
    for name in sorted(set(totals) | set(cur_sums)):
        total = int(totals[name][:, 0].max()) if name in totals else 0
        count = int(cur_sums[name][:, 0].max()) if name in cur_sums else 0
        if total == 0 and count == 0:
            continue
        cur = _estimates(cur_sums.get(name), wanted, index)
        prev = _estimates(prev_sums.get(name), wanted, index)
        first = wanted[0] if wanted else None
        arrow = trend(cur.get(first), prev.get(first)) if first else ""
        rows.append(SegmentSummary(name, count, total, cur, prev, arrow))
    return rows


def _range_sums(
    aggregates: Aggregates, span: tuple[int, int] | None, group_by: Sequence[str]
) -> dict[str, np.ndarray]:
    if span is None:
        return {}
    return group_sums(aggregates, aggregates.window_sums(*span), group_by)


def _estimates(
    sums: np.ndarray | None, wanted: Sequence[str], index: Mapping[str, int]
) -> dict[str, Estimate]:
    if sums is None:
        return {}
    out: dict[str, Estimate] = {}
    for name in wanted:
        count, total, squares = sums[index[name]].tolist()
        if count > 0:
            out[name] = Estimate(*mean_ci95(count, total, squares))
    return out


def health(
    stats: Stats,
    *,
    pending: int,
    newest_ms: int | None,
    watermark_ms: int | None,
    events_per_s: float,
) -> Health:
    """Fold the engine's counters into the health line."""
    accepted = sum(n for (_, outcome), n in stats.events.items() if outcome == "accepted")
    # every duplicate, impression or feedback, once: a duplicate feedback is also counted as
    # unattributed (reason duplicate), which must not be added again
    duplicates = sum(n for (_, outcome), n in stats.events.items() if outcome == "duplicate")
    lag = None
    if newest_ms is not None and watermark_ms is not None:
        lag = max(0.0, (newest_ms - watermark_ms) / 1000.0)
    return Health(
        events_per_s=events_per_s,
        accepted=accepted,
        pending=pending,
        rejected=sum(stats.rejected.values()),
        late=stats.unattributed.get("late", 0),
        orphaned=stats.unattributed.get("orphaned", 0),
        duplicates=duplicates,
        unknown_items=stats.unattributed.get("unknown_item", 0),
        abandoned=stats.abandoned,
        finalized=sum(stats.finalized.values()),
        watermark_lag_s=lag,
    )


# ------------------------------------------------------------------------------ rendering


def hms(ms: int) -> str:
    """Event time of day, UTC (``HH:MM:SS``): enough to follow windows closing."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%H:%M:%S")


def _value(estimate: Estimate | None) -> str:
    if estimate is None or math.isnan(estimate.mean):
        return "-"
    if math.isnan(estimate.half):
        return f"{estimate.mean:.3f}"
    return f"{estimate.mean:.3f}±{estimate.half:.3f}"


def arrow(direction: str, *, unicode: bool = True) -> str:
    fancy, plain = _ARROWS.get(direction, _ARROWS[""])
    return fancy if unicode else plain


def health_items(h: Health) -> list[str]:
    """The health figures as short items, joined with `` · `` and wrapped by the renderers."""
    lag = "-" if h.watermark_lag_s is None else readable(h.watermark_lag_s)
    return [
        f"{h.events_per_s:,.0f} events/s",
        f"pending {h.pending:,}",
        f"scored {h.finalized:,} (abandoned {h.abandoned:,})",
        f"rejected {h.rejected:,}",
        f"late {h.late:,}",
        f"orphaned {h.orphaned:,}",
        f"duplicates {h.duplicates:,}",
        f"unknown item {h.unknown_items:,}",
        f"watermark lag {lag}",
    ]


def health_line(h: Health) -> str:
    return " · ".join(health_items(h))


def _fit(text: str, width: int = WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def wrap(items: Sequence[str], width: int = WIDTH) -> list[str]:
    """``items`` joined with `` · `` into lines of at most ``width`` (an item is never split)."""
    lines: list[str] = []
    line = ""
    for item in items:
        joined = f"{line} · {item}" if line else item
        if line and len(joined) > width:
            lines.append(line)
            line = "  " + item
        else:
            line = joined
    if line:
        lines.append(line)
    return [_fit(text, width) for text in lines]


_VALUE = 13  # "0.700±0.020 ↓": a mean, its half-width and the trend mark
_GAP = 2
_COUNTS = "impressions"  # the row of impressions per segment in the window


def _difference(estimate: Estimate | None) -> str:
    """``-0.300±0.028 *``: the window's difference, marked ``*`` when outside its own 95%
    interval — descriptive: the verdicts (▲▼) are the band since the start's."""
    if estimate is None or math.isnan(estimate.mean):
        return "-"
    text = _value(estimate)
    if not math.isnan(estimate.half) and abs(estimate.mean) > estimate.half:
        text += " *"
    return text


def render_table(
    snap: Snapshot,
    *,
    shown: Sequence[str] = SHOWN,
    color: bool = True,
    unicode: bool = True,
) -> str:
    """The full-screen frame (no cursor movement; :class:`LiveView` adds that), at most
    :data:`WIDTH` columns: a row per measure, a column per segment with its mean±95%
    half-width in the current window (the first measure marked with its trend), then a
    treatment − control column per treatment arm; impressions per segment below; then the
    comparison since the start and the health figures, wrapped."""

    def paint(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    lines: list[str] = []
    if snap.window is None:
        where = "waiting for the first complete window"
    else:
        start, end = snap.window
        where = f"window {hms(start)}-{hms(end)}"
    title = f"evald demo · event time {hms(snap.event_time_ms)} · {where}"
    lines.append(paint(_fit(title), _BOLD))
    label_w = max(len(_COUNTS), *(len(name) for name in shown)) + 1
    versus_w = max([_VALUE + 1, *(len(v.title) for v in snap.versus)]) + _GAP
    room = WIDTH - label_w - versus_w * len(snap.versus)
    longest = max([_VALUE, *(len(s.name) for s in snap.segments)]) + _GAP
    cell = max(_VALUE + _GAP, min(longest, room // max(1, len(snap.segments))))
    header = f"{'measure':<{label_w}}"
    header += "".join(f"{_fit(s.name, cell - _GAP):>{cell}}" for s in snap.segments)
    header += "".join(f"{v.title:>{versus_w}}" for v in snap.versus)
    lines.append(header)
    for i, name in enumerate(shown):
        row = f"{name:<{label_w}}"
        for seg in snap.segments:
            mark = arrow(seg.trend, unicode=unicode) if i == 0 else " "
            if i == 0 and seg.trend == UP:
                mark = paint(mark, _GREEN)
            elif i == 0 and seg.trend == DOWN:
                mark = paint(mark, _RED)
            text = _value(seg.current.get(name))
            row += " " * (cell - len(text) - 2) + f"{text} {mark}"
        for versus in snap.versus:
            text = _difference(versus.difference.get(name))
            row += " " * (versus_w - len(text) - 1) + text + " "
        lines.append(row.rstrip())
    if snap.segments:
        counts = "".join(f"{s.count:>{cell - 2},}  " for s in snap.segments)
        lines.append((f"{_COUNTS:<{label_w}}" + counts).rstrip())
    if not snap.segments:
        lines.append(paint("(no impression scored yet: windows close in event time)", _DIM))
    elif shown:
        legend = [f"arrow: {shown[0]} against the window before"]
        if snap.versus:
            legend.append("*: the window's difference outside its 95% interval (descriptive)")
        if snap.comparison:
            legend.append(
                f"{'▲▼' if unicode else '^v'}: the always-valid band since the start excludes 0"
                " (a verdict)"
            )
        lines.extend(paint(line, _DIM) for line in wrap(legend))
    lines.extend(_verdict_line(line, paint) for line in snap.comparison)
    lines.append("")
    lines.extend(wrap(health_items(snap.health)))
    lines.extend(_fit(note) for note in snap.notes)
    return "\n".join(lines) + "\n"


def _verdict_line(line: str, paint: Callable[[str, str], str]) -> str:
    """A comparison line, its verdict mark coloured (red ▼, green ▲)."""
    line = _fit(line)
    for mark, code in (("▼", _RED), ("▲", _GREEN)):
        if f"] {mark}" in line:
            head, tail = line.split(f"] {mark}", 1)
            return f"{head}] {paint(mark, code)}{tail}"
    return line


def render_lines(snap: Snapshot, elapsed_s: float, *, shown: Sequence[str] = SHOWN) -> str:
    """The plain form: one line per segment and one health line, each prefixed by the time."""
    stamp = f"[{readable(elapsed_s):>6}]"
    lines: list[str] = []
    window = "-" if snap.window is None else f"{hms(snap.window[0])}-{hms(snap.window[1])}"
    for seg in snap.segments:
        values = " ".join(f"{name}={_value(seg.current.get(name)).split('±')[0]}" for name in shown)
        trend_text = seg.trend or "-"
        lines.append(
            f"{stamp} window={window} segment={seg.name!r} {values} n={seg.count} "
            f"total={seg.total} trend={trend_text}"
        )
    for versus in snap.versus:
        values = " ".join(
            f"{name}={_difference(versus.difference.get(name))}".replace(" ", "") for name in shown
        )
        lines.append(f"{stamp} window={window} {versus.title} {values}")
    lines.extend(f"{stamp} {line.strip()}" for line in snap.comparison)
    lines.append(f"{stamp} {health_line(snap.health)}")
    return "\n".join(lines) + "\n"


class LiveView:
    """Decides when to draw and in which form; the caller supplies snapshots.

    On a terminal (``tty=True``) it redraws the table in place at most every ``interval``
    seconds; otherwise it appends a plain summary every ``plain_interval`` seconds. The clock
    is injected so tests control time.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        tty: bool,
        interval: float = 1.0,
        plain_interval: float = 5.0,
        clock: Callable[[], float],
    ) -> None:
        self.stream = stream
        self.tty = tty
        self.interval = interval if tty else plain_interval
        self._clock = clock
        self._start = clock()
        self._last: float | None = None
        self.unicode = can_encode(stream, "↑↓→±·▲▼−")
        self.frames = 0

    def due(self) -> bool:
        return self._last is None or self._clock() - self._last >= self.interval

    def show(self, snap: Snapshot, *, force: bool = False) -> bool:
        """Draw ``snap`` if a frame is due (or ``force``); returns whether it drew."""
        if not force and not self.due():
            return False
        now = self._clock()
        self._last = now
        if self.tty:
            text = _HOME_CLEAR + render_table(snap, unicode=self.unicode)
        else:
            text = render_lines(snap, now - self._start)
        if not self.unicode:
            text = _ascii(text)
        self.stream.write(text)
        self.stream.flush()
        self.frames += 1
        return True

    def final(self, snap: Snapshot) -> None:
        """The closing summary: always the plain table, no cursor control and no colour."""
        text = render_table(snap, color=False, unicode=self.unicode)
        if not self.unicode:
            text = _ascii(text)
        self.stream.write("\n" + text)
        self.stream.flush()


def _ascii(text: str) -> str:
    return (
        text.replace("·", "|")
        .replace("±", "+-")
        .replace("…", "~")
        .replace("−", "-")
        .replace("▲", "^")
        .replace("▼", "v")
    )
