"""Drawing a :class:`~evald.top.model.View` as plain text that fits a given width (80 by default).

Pure: the same view and width give the same text, so a golden-screen test pins the layout.
One row per measure, one column per display group (e.g. arm) with ``mean±half-width`` of the
95% interval, then treatment − control in the window when both arms exist, marked ``*`` when it
is outside its own interval (descriptive); groups that do not fit the width continue in a second
table below. Below the tables, a line per group of the window's zero-feedback values (when
evald exports them), then the comparison since its start: the always-valid band per
comparison segment and measure, marked ▲/▼ when it excludes 0 (the verdict), then a legend that
says which mark is which. A line wider than the width (verdicts, legends, health) wraps between
its items, then between words, in terminal columns; only a word wider than the width is cut.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from evald.durations import format_duration, readable
from evald.interleaving.report import NO_BAND
from evald.terminal import columns, fitted, ljust, longest, rjust, shown, wrapped
from evald.top import interleaving, zerofeedback
from evald.top.model import Comparison, Estimate, Verdict, View

__all__ = ["ascii_only", "notes", "render"]

_MEASURE_W = 12
_CELL_W = 16
_DELTA_W = 19
_SEP = " · "


def _clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%H:%M:%S")


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _per_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}/s" if value < 10 else f"{value:,.0f}/s"


def _estimate(est: Estimate | None) -> str:
    if est is None or math.isnan(est.mean):
        return "-"
    if math.isnan(est.half):
        return f"{est.mean:.3f}"
    return f"{est.mean:.3f}±{est.half:.3f}"


def _comparison(cmp: Comparison | None) -> str:
    """The window's difference; ``*`` (descriptive) when outside its own 95% interval."""
    if cmp is None:
        return "-"
    if not math.isfinite(cmp.bound):
        return f"{cmp.delta:+.3f}"
    return f"{cmp.delta:+.3f}±{cmp.bound:.3f}{' *' if cmp.outside else '  '}"


_MARKS = {"up": " ▲", "down": " ▼", "": ""}


def _verdict(v: Verdict) -> str:
    """``nDCG@10 -0.012±0.004 ▼``: the band since the start, marked when it excludes 0."""
    if not math.isfinite(v.lower):
        return f"{v.measure} {v.difference:+.3f}, {NO_BAND}"
    half = (v.upper - v.lower) / 2
    return f"{v.measure} {v.difference:+.3f}±{half:.3f}{_MARKS[v.mark]}"


def _verdicts(view: View, width: int, plain: Callable[[str], str]) -> tuple[list[str], list[str]]:
    """The comparison since the start, one wrapped line per (comparison, segment), and apart
    the legend of both marks; ``plain`` spells them for the terminal before they are wrapped
    (in ASCII, ``±`` takes two columns)."""
    legend = _wrap(
        [plain("*: the window's difference is outside its own 95% interval (descriptive)")], width
    )
    if not view.verdicts:
        return [], ([] if view.comparison is None else legend)
    lines = []
    for name, segment in dict.fromkeys((v.comparison, v.segment) for v in view.verdicts):
        group = [v for v in view.verdicts if (v.comparison, v.segment) == (name, segment)]
        level = ""
        # a band not yet defined (too few lists) is list level for that reason, not users
        defined = [v for v in group if not math.isnan(v.lower)]
        if defined and all(v.clustered is False for v in defined):
            level = " (list-level variance: no user ids)"
        head = plain(f"since start, {name} {segment}{level}:")
        lines += _headed(head, [plain(_verdict(v)) for v in group], width)
    verdict = plain("▲▼: the always-valid band since the start excludes 0 (a verdict)")
    return lines, [*_wrap([verdict], width), *legend]


def _preference(p: interleaving.Preference, width: int, plain: Callable[[str], str]) -> list[str]:
    """One interleaving line, or, too long, its segment and then the pair's verdict indented,
    as the verdicts since the start wrap (spelt by ``plain`` first, as they are)."""
    head, items = interleaving.parts(p)
    return _headed(plain(head), [plain(item) for item in items], width)


def _headed(head: str, items: Sequence[str], width: int) -> list[str]:
    """``head`` and ``items`` wrapped (:func:`_wrap`) on its line when the first item fits
    beside it, else ``head`` alone (itself wrapped by words) and the items indented below: a
    line too long breaks after its segment rather than losing what it says."""
    if columns(f"{head} {items[0]}") <= width:
        return _wrap([f"{head} {items[0]}", *items[1:]], width)
    return [*_wrap([head], width), *_wrap(["  " + items[0], *items[1:]], width)]


def _shorten(lines: list[str], over: int, width: int) -> list[str]:
    """``lines`` less ``over`` of them, the last ones, said in one line of their own."""
    if over <= 0 or not lines:
        return lines
    keep = max(0, len(lines) - over - 1)
    hidden = len(lines) - keep
    note = longest(
        [
            f"… {hidden} lines of verdicts: a taller terminal or `evald top --once` shows them",
            f"… {hidden} lines of verdicts",
            f"… {hidden} more",
            f"…{hidden}",
        ],
        width,
    )
    return [*lines[:keep], note]


def _wrap(items: Sequence[str], width: int, indent: str = "  ") -> list[str]:
    """Join ``items`` with `` · `` into lines no wider than ``width`` terminal columns (a wide
    character takes two): an item that does not fit beside the ones before starts a line of
    its own, indented; one wider than a line by itself is broken between its words
    (``terminal.wrapped``), where it was cut and lost its end. Only a word wider than a line
    is cut (``terminal.shown``)."""
    lines: list[str] = []
    line = ""
    for item in items:
        candidate = item if not line else line + _SEP + item
        if columns(candidate) > width:
            if line:
                lines.append(line)
                candidate = indent + item
            *full, candidate = wrapped(candidate, width, indent + "  ")
            lines += full
        line = candidate
    if line:
        lines.append(line)
    return [shown(text, width) for text in lines]


def _header(view: View, width: int) -> list[str]:
    state = {None: "", True: "ready", False: "NOT READY"}[view.ready]
    title = [f"evald top · {view.source}", *([state] if state else []), f"{_clock(view.at)} UTC"]
    if view.window_end is None:
        return [
            *_wrap(title, width),
            *(text for line in _waiting(view) for text in _wrap([line], width)),
        ]
    start = view.window_end - _window_seconds(view.window)
    where = (
        f"{view.window} window {_clock(start)}-{_clock(view.window_end)} UTC (event time)"
        " · mean±95% interval"
    )
    return [*_wrap(title, width), *_wrap([where], width)]


def _waiting(view: View) -> list[str]:
    """Why no window is shown yet, and when the first one will be: it is complete when the
    watermark passes its end plus the attribution window (every impression in it scored);
    and, when other windows are complete, that a window not among the evald's never is."""
    lines = _first_window(view)
    if view.progress.complete:
        have = ", ".join(view.progress.complete)
        lines.append(f"complete: {have} (a window not in engine.windows never is)")
    return lines


def _first_window(view: View) -> list[str]:
    head = f"no complete {view.window} window yet"
    p = view.progress
    if p.watermark is None:
        return [f"{head}: no event read yet"]
    if p.attribution_s is None or p.oldest_open is None:
        return [f"{head} (windows close in event time)"]
    width = _window_seconds(view.window)
    end = p.oldest_open // width * width + width
    due = end + p.attribution_s
    now = f"watermark now {_clock(p.watermark)}"
    if p.watermark_pace is not None:
        left = max(0.0, due - p.watermark)
        if p.watermark_pace > 0:
            now += f", about {readable(left / p.watermark_pace)} away at its pace"
        elif left > 0:
            now += ", standing still: no newer events"
    return [
        f"{head}: the first ends {_clock(end)} UTC (event time) and is",
        f"complete at watermark {_clock(due)} (its end + the "
        f"{format_duration(round(p.attribution_s * 1000))} attribution window);",
        now,
    ]


def _window_seconds(window: str) -> float:
    from evald.durations import parse_duration

    return parse_duration(window) / 1000


def _tables(view: View, width: int, plain: Callable[[str], str]) -> list[str]:
    """The measure tables; ``plain`` spells each cell for the terminal before it is cut and
    padded, both in terminal columns: a wide character in a label value takes two, and
    padded by characters the columns after it stood out of line."""
    if not view.groups:
        return ["(no scored impression in the window yet)"]
    compare = view.comparison is not None
    control, treatment = view.arms
    delta_title = plain(f"{treatment}−{control}")
    delta_w = min(max(_DELTA_W, columns(delta_title) + 2), 32)
    room = width - _MEASURE_W - (delta_w if compare else 0)
    per_table = max(1, room // _CELL_W)
    lines: list[str] = []
    for start in range(0, len(view.groups), per_table):
        chunk = view.groups[start : start + per_table]
        with_delta = compare and start == 0
        head = ljust("measure", _MEASURE_W) + "".join(
            rjust(shown(plain(g.name), _CELL_W - 1), _CELL_W) for g in chunk
        )
        counts = ljust("n", _MEASURE_W) + "".join(rjust(f"{g.n:,}", _CELL_W) for g in chunk)
        if with_delta:
            head += rjust(shown(delta_title, delta_w - 2), delta_w)
        if lines:
            lines.append("")
        lines += [head, counts]
        for measure in view.measures:
            row = ljust(shown(plain(measure), _MEASURE_W - 1), _MEASURE_W) + "".join(
                rjust(plain(_estimate(g.estimates.get(measure))), _CELL_W) for g in chunk
            )
            if with_delta and view.comparison is not None:
                row += rjust(plain(_comparison(view.comparison.get(measure))), delta_w)
            lines.append(row.rstrip())
    if view.exported:
        missing = ", ".join(m for m in view.measures if m not in view.exported)
        lines.append(
            f"not in the {view.window} window: {missing}; it has {', '.join(view.exported)}"
        )
    return [shown(line, width) for line in lines]


def _health(view: View, width: int) -> list[str]:
    flow = [
        f"events {_per_s(view.events_per_s)} (rejected {_per_s(view.rejected_per_s)})",
        f"scored {_per_s(view.scored_per_s)}",
    ]
    if view.results_per_s is not None:
        flow.append(f"results {_per_s(view.results_per_s)}")
    state = [
        f"pending {_count(view.pending_impressions)} impressions,"
        f" {_count(view.pending_feedback)} feedback",
    ]
    if view.watermark_delay_s is None:
        state.append("watermark -")
    elif view.watermark_delay_s >= 0:
        state.append(f"watermark delay {readable(view.watermark_delay_s)}")
    else:  # event time ahead of the wall clock (the demo runs it faster)
        state.append(f"watermark {readable(-view.watermark_delay_s)} ahead of wall time")
    if view.consumer_lag is not None:
        state.append(f"consumer lag {_count(view.consumer_lag)}")
    rejects = [f"{reason} {value:,.0f}" for reason, value in view.rejects] or ["none"]
    unattributed = [f"{reason} {value:,.0f}" for reason, value in view.unattributed] or ["none"]
    return [
        *_wrap(flow, width),
        *_wrap(state, width),
        *_wrap(["rejects since start: " + rejects[0], *rejects[1:]], width),
        *_wrap(["unattributed feedback: " + unattributed[0], *unattributed[1:]], width),
    ]


def render(view: View, width: int = 80, *, unicode: bool = True, height: int | None = None) -> str:
    """The whole frame, every line at most ``width`` characters, ending in a newline.

    ``unicode=False`` spells ``±``, ``·``, arrows and ellipses in ASCII, for a terminal or pipe
    that cannot encode them. Data (label values) is shown as text only: a control character
    (an escape sequence in an event's label) is a ``?``, and each line is cut at the width
    in terminal columns (a wide character takes two). ``height`` (a terminal's rows) bounds
    the frame: a taller one scrolls its header away on every redraw. The verdicts since the
    start give way first (the window's table and the health lines say what is happening now),
    then the last lines, each cut said in a line of its own.
    """
    # in ASCII, a label value's own letters are a "?" before the cells are padded (one
    # column, where a wide letter took two)
    plain = (lambda text: text) if unicode else (lambda text: _ascii(ascii_only(text)))
    head = [*_header(view, width), ""]
    tables = _tables(view, width, plain)
    verdict_lines, legends = _verdicts(view, width, plain)
    verdict_lines += [text for p in view.preferences for text in _preference(p, width, plain)]
    # the window's zero-feedback lines first: when the frame is too tall, they give way after
    # the verdicts since the start and before the health lines
    zero = [
        text for z in view.zero_feedback for text in _wrap(zerofeedback.line(z).split(_SEP), width)
    ]
    verdict_lines = [*zero, *verdict_lines]
    tail = ["", *_health(view, width)]
    if height is not None:
        rows = len(head) + len(tables) + len(verdict_lines) + len(legends) + len(tail)
        verdict_lines = _shorten(verdict_lines, rows - height, width)
    marks = [plain(line) for line in [*verdict_lines, *legends]]
    lines = [*head, *tables, *marks, *tail]
    if height is not None:
        lines = fitted(lines, height, width=width)
    if unicode:
        lines = [shown(line, width) for line in lines]
    else:  # what ascii_only does not spell (a label value's own letters) as "?"
        lines = [_ascii(shown(ascii_only(line), width, "~")) for line in lines]
    return "\n".join(lines) + "\n"


def _ascii(text: str) -> str:
    return text.encode("ascii", "replace").decode("ascii")


def notes(texts: Sequence[str], width: int) -> list[str]:
    """The warnings printed before a live view started, a line each, cut at ``width`` like
    the rows: the view's first redraw wipes the screen they were on, and a password going
    over plain http:// stays true for as long as the view runs (stderr has them whole)."""
    return [shown(text, width) for text in texts]


def ascii_only(text: str) -> str:
    """``text`` with the view's non-ASCII symbols spelt in ASCII."""
    for fancy, plain in (("·", "|"), ("±", "+-"), ("▲", "^"), ("▼", "v"), ("−", "-"), ("…", "~")):
        text = text.replace(fancy, plain)
    return text
