"""`evald top --queries`: the worst queries of the treatment arm, read from ``GET /queries``.

For one measure, per segment of the arm in the last complete window: the queries whose mean
fell most against the window before, with their lists, means and contribution (traffic share x
change of mean; docs/drilldown.md). The page's JSON is fetched and rendered as plain text;
query texts are already normalised (no control or format character) and are cut to fit.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from evald.terminal import columns, encodable, fitted, ljust, rows, shown
from evald.top.client import Client, Refused

__all__ = ["fetch", "queries_url", "render_queries", "watch"]


def queries_url(metrics_url: str, *, window: str, label: str, arm: str, measure: str | None) -> str:
    """The ``/queries`` URL beside ``metrics_url``, filtered to the arm, window and measure."""
    base = metrics_url.rsplit("/", 1)[0]
    params = {"window": window, label: arm, "k": "20"}
    if measure is not None:
        params["measure"] = measure
    return f"{base}/queries?{urllib.parse.urlencode(params)}"


def fetch(url: str, client: Client | None = None) -> dict[str, Any]:
    """The page's document; OSError with a message fit for the screen (:class:`Refused` when
    no retry helps)."""
    body = (client if client is not None else Client()).get(url, "application/json")
    try:
        return dict(json.loads(body.decode("utf-8")))
    except ValueError:
        raise OSError(f"{url} did not answer with JSON (an evald before /queries?)") from None


def render_queries(
    doc: dict[str, Any], measure: str | None, width: int = 80, height: int | None = None
) -> str:
    """Plain text, ``width`` columns: per segment row, its most fallen queries of ``measure``
    (None: the first measure the page reports). Narrower than the table's 48 columns, its
    lines are cut (``~``) rather than wrapped: a wrapped line scrolls a redrawn frame; what
    the page says is shown as text only (``terminal.shown``: a control character is a ``?``).
    ``height`` (the terminal's rows less the warnings below) bounds it for the same reason:
    the last lines give way, their count said in the last line, the first segment's header
    stays."""
    rows = doc.get("queries") or []
    if not rows:
        return (
            shown("no complete window with queries yet (or drilldown.capacity is 0)", width, "~")
            + "\n"
        )
    q = max(12, width - 46)
    out = []
    for row in rows:
        labels = " ".join(f"{k}={v}" for k, v in row["labels"].items())
        where = f"{row['window']} to {row['end']}  {row['lists']:,} lists"
        if len(labels) + 2 + len(where) <= width:
            out.append(f"{labels}  {where}")
        else:  # the segment on a line of its own: the window and its lists stay whole
            out += [labels, f"  {where}"]  # each cut to the width below
        name = measure if measure is not None else next(iter(row["fallen"]), None)
        if name is None or name not in row["fallen"]:
            out.append("  (no window before to compare with)")
            continue
        # the page lists every query held in both windows; the view is of those that fell
        fallen = [f for f in row["fallen"][name] if f["contribution"] < 0]
        if not fallen:
            out.append(f"  {name}: no query fell against the window before")
            continue
        out.append(
            f"  {name} {ljust('query', q - columns(str(name)) - 1)} {'lists':>7} {'mean':>7} "
            f"{'before':>7} {'contrib':>9}"
        )
        for f in fallen:  # padded in columns: a wide character takes two
            out.append(
                f"  {ljust(shown(f['query'], q, '~'), q)} {f['lists']:>7,} {f['mean']:>7.3f} "
                f"{f['baseline_mean']:>7.3f} {f['contribution']:>+9.4f}"
            )
    if height is not None:
        out = fitted(out, height, "~", width=width)
    return "".join(shown(line, width, "~") + "\n" for line in out)


def watch(
    url: str,
    measure: str | None,
    stream: TextIO,
    *,
    once: bool,
    interval: float,
    tty: bool,
    sleep: Callable[[float], None] = time.sleep,
    client: Client | None = None,
    warnings: Sequence[str] = (),
    width: Callable[[], int] = lambda: shutil.get_terminal_size((80, 24)).columns,
    height: Callable[[], int] = lambda: shutil.get_terminal_size((80, 24)).lines,
) -> int:
    """One frame (``once``: 1 if unreachable; 80 columns, every line) or a redraw every
    ``interval`` until Ctrl-C, to the terminal's width (any: lines are cut) and rows (any number, as
    the metrics view: from ``terminal.MIN_ROWS``, 2, the segment's header and a count of the
    rows cut; on one row that count alone); 1 on an answer no retry changes (credentials or
    certificate refused). ``warnings``, printed on stderr before, end every frame redrawn on
    a terminal (the redraw wipes them), a line each, cut like the rows; on a terminal too
    short for them and two rows of the view, the last give way to a line counting them, which
    keeps a row from 2 rows (``terminal.rows``)."""
    if once:
        try:
            stream.write(encodable(render_queries(fetch(url, client), measure), stream))
        except OSError as exc:
            print(f"evald top: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        while True:
            cols = max(1, width())  # any width: a line is cut (terminal.shown)
            view_rows: int | None = None
            footer: list[str] = []
            if tty:
                view_rows, room = rows(height(), len(warnings))
                footer = [
                    shown(text, cols, "~")
                    for text in fitted(list(warnings), room, "~", "warnings", cols)
                ]
            try:
                text = render_queries(fetch(url, client), measure, cols, view_rows)
            except Refused:
                raise
            except OSError as exc:
                text = shown(f"evald top: {exc} (retrying)", cols, "~") + "\n"
            if tty:  # without the last newline: after the terminal's last row it scrolls
                frame = text + "".join(line + "\n" for line in footer)
                stream.write(encodable("\x1b[H\x1b[J" + frame.rstrip("\n"), stream))
            else:
                stream.write(encodable(text + "\n", stream))
            stream.flush()
            sleep(interval)
    except KeyboardInterrupt:
        return 0
    except Refused as exc:
        message = f"evald top: {exc}"  # printed below the frame
    finally:
        if tty:
            stream.write("\n")
            stream.flush()
    print(message, file=sys.stderr)
    return 1
