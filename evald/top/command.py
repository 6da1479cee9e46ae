"""`evald top [URL]`: watch a running `evald run` or `evald demo` from its ``/metrics``.

It needs nothing but the metrics endpoint, so it works against a daemon in a container or on
another host as well as against the demo. Rates (events/s, scored/s) are counter differences
between two scrapes; intervals come from the exported window sums (see evald.top.model).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

from evald.terminal import can_encode, encodable, fitted, rows, shown
from evald.top.client import (
    PASSWORD_ENV,
    Client,
    Refused,
    Unreachable,
    add_arguments,
    from_args,
    wants_tls,
)

if TYPE_CHECKING:
    from evald.top.model import Scrape, View

SUMMARY = "live terminal view of a running evald (daemon or demo), read from its /metrics"

EXAMPLES = """\
  evald top                                   # the evald on http://127.0.0.1:9464
  evald top 127.0.0.1:9464 --window 1h        # the last complete hour instead of 5 minutes
  evald top http://evald:9464 --group-by arm,model
  evald top --once > snapshot.txt             # one snapshot (two scrapes --interval apart)
  evald top --queries --measures nDCG@10      # the treatment's queries that fell most
  evald top evald:9464 --user prometheus --ca-file ca.crt  # TLS + basic auth (prompts)
"""

DEFAULT_URL = "127.0.0.1:9464"

_HIDE_CURSOR, _SHOW_CURSOR, _HOME_CLEAR = "\x1b[?25l", "\x1b[?25h", "\x1b[H\x1b[J"


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    # at most an hour: the view sleeps it between scrapes, and 1e308 is an OverflowError there
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be 0.1 to 3600 seconds, got {text!r}")
    return value


def _labels(text: str) -> list[str]:
    labels = [part.strip() for part in text.split(",") if part.strip()]
    if not labels:
        raise argparse.ArgumentTypeError("name at least one label, e.g. 'arm' or 'arm,model'")
    return labels


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url",
        nargs="?",
        default=DEFAULT_URL,
        metavar="URL",
        help="the evald to watch: HOST:PORT (http, or https with --ca-file/--cert-file) or "
        "http(s)://HOST:PORT[/metrics] (default: %(default)s)",
    )
    parser.add_argument(
        "--interval",
        type=_interval,
        default=2.0,
        metavar="SECONDS",
        help="seconds between scrapes; rates are measured over it (default: %(default)s)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one snapshot without cursor control and exit (scrapes twice for rates)",
    )
    parser.add_argument(
        "--window",
        default="5m",
        metavar="WIDTH",
        help="which exported event-time window to show, e.g. 5m or 1h (default: %(default)s)",
    )
    parser.add_argument(
        "--group-by",
        type=_labels,
        default=["arm"],
        metavar="LABELS",
        help="segment labels a column stands for, comma-separated; sums merge over the "
        "others (default: arm)",
    )
    parser.add_argument(
        "--arms",
        type=_labels,
        default=["control", "treatment"],
        metavar="CONTROL,TREATMENT",
        help="the two groups compared, control first (default: control,treatment)",
    )
    parser.add_argument(
        "--measures",
        type=_labels,
        metavar="NAMES",
        help="measures to show, comma-separated (default: every exported measure)",
    )
    parser.add_argument(
        "--queries",
        action="store_true",
        help="the worst queries instead: the treatment arm's (the second of --arms, by the "
        "first --group-by label) queries that fell most against the window before, for the "
        "first of --measures, from the evald's /queries (docs/drilldown.md)",
    )
    add_arguments(parser)


def metrics_url(text: str, *, tls: bool = False) -> str:
    """``HOST:PORT``, ``http(s)://HOST:PORT`` or a full ``.../metrics`` URL -> the metrics URL;
    without a scheme it is https when ``tls`` (a CA or client certificate was given)."""
    url = text.strip()
    if "://" not in url:
        url = ("https://" if tls else "http://") + url
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {text!r}")
    scheme, rest = url.split("://", 1)
    host, _, path = rest.partition("/")
    if not host:
        raise ValueError(f"no host in {text!r}")
    if "@" in host:  # not echoed: the part before the @ may be a password
        raise ValueError(
            "a URL with credentials is refused (a password on the command line shows in ps and "
            f"the shell's history): pass --user NAME, the password in ${PASSWORD_ENV} or typed "
            "at the prompt"
        )
    from urllib.parse import urlsplit

    try:  # a port past 65535 or not a number, a bracket left open: no retry reaches it
        port = urlsplit(url).port
    except ValueError as exc:
        raise ValueError(f"bad address in {text!r}: {exc}") from None
    if port == 0:
        raise ValueError(f"bad address in {text!r}: port 0 is no server's")
    if not path:
        path = "metrics"
    return f"{scheme}://{host}/{path}"


class Scraper:
    """Fetches and parses ``/metrics``; the clock and the client are injectable for tests."""

    def __init__(
        self,
        url: str,
        *,
        client: Client | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.client = client if client is not None else Client()
        self.clock = clock

    def scrape(self) -> Scrape:
        """One scrape; raises ``OSError`` (unreachable, HTTP error; :class:`Refused` when no
        retry helps) or ``ValueError`` (not an exposition) with a message fit for the screen."""
        from evald.top.model import parse

        body = self.client.get(self.url, "text/plain").decode("utf-8", "replace")
        try:
            return parse(body, self.clock())
        except ValueError as exc:
            raise ValueError(f"{self.url} did not answer with Prometheus metrics ({exc})") from None


def _source(url: str) -> str:
    return url.split("://", 1)[1].removesuffix("/metrics")


def run(args: argparse.Namespace) -> int:
    import signal

    from evald.durations import DurationError, format_duration, parse_duration

    warnings: list[str] = []

    def warn(text: str) -> None:
        """On stderr at once (before a password prompt), and kept for the live view's frames,
        whose first redraw wipes the line."""
        print(f"evald top: {text}", file=sys.stderr)
        warnings.append(text)

    try:
        url = metrics_url(args.url, tls=wants_tls(args))
        window = format_duration(parse_duration(args.window))
        if window == "0ms":  # no exported window is empty: the view would wait for nothing
            raise DurationError(f"--window: must be longer than 0, got {args.window!r}")
        client = from_args(args, url, warn=warn, timeout=min(5.0, max(1.0, args.interval)))
    except (ValueError, DurationError) as exc:
        print(f"evald top: {exc}", file=sys.stderr)
        return 2
    if len(args.arms) != 2:
        print("evald top: --arms takes two names, control first", file=sys.stderr)
        return 2
    if args.queries:
        from evald.top.queries import queries_url, watch

        measure = args.measures[0] if args.measures else None
        page = queries_url(
            url, window=window, label=args.group_by[0], arm=args.arms[1], measure=measure
        )
        tty = sys.stdout.isatty()
        return watch(
            page,
            measure,
            sys.stdout,
            once=args.once,
            interval=args.interval,
            tty=tty,
            client=client,
            warnings=warnings,
        )
    scraper = Scraper(url, client=client)
    top = Top(
        scraper,
        window=window,
        group_by=args.group_by,
        measures=args.measures,
        arms=(args.arms[0], args.arms[1]),
        stream=sys.stdout,
        warnings=warnings,
    )
    if args.once:
        return top.once(args.interval)

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    return top.live(args.interval, tty=sys.stdout.isatty())


class Top:
    """The scrape-render loop. ``sleep`` is injectable so tests do not wait. ``warnings``, printed
    on stderr before the view started, end every frame redrawn on a terminal."""

    def __init__(
        self,
        scraper: Scraper,
        *,
        window: str,
        group_by: list[str],
        measures: list[str] | None,
        stream: TextIO,
        arms: tuple[str, str] = ("control", "treatment"),
        sleep: Callable[[float], None] = time.sleep,
        width: Callable[[], int] = lambda: shutil.get_terminal_size((80, 24)).columns,
        height: Callable[[], int] = lambda: shutil.get_terminal_size((80, 24)).lines,
        warnings: Sequence[str] = (),
    ) -> None:
        self.scraper = scraper
        self.window = window
        self.group_by = group_by
        self.measures = measures
        self.arms = arms
        self.stream = stream
        self.sleep = sleep
        self.width = width
        self.height = height
        self.unicode = can_encode(stream, "±·▲▼−…")
        self.warnings = tuple(warnings)
        self._prev: Scrape | None = None

    def view(self, scrape: Scrape) -> View:
        from evald.top.model import build_view

        view = build_view(
            _source(self.scraper.url),
            scrape,
            self._prev,
            window=self.window,
            group_by=self.group_by,
            measures=self.measures,
            arms=self.arms,
        )
        self._prev = scrape
        return view

    def frame(self, *, fit: bool = True) -> str:
        """Scrape once and render, to the terminal's size when ``fit`` (its width always), and
        then the warnings; an unreachable evald becomes a one-line frame (:class:`Refused` is
        raised: no retry helps)."""
        from evald.top.render import ascii_only, notes, render

        width, height, footer = max(1, self.width()), None, list[str]()
        if fit:  # the view's rows, then the warnings in what is left (terminal.rows)
            height, room = rows(self.height(), len(self.warnings))
            footer = notes(fitted(list(self.warnings), room, what="warnings", width=width), width)
        if not self.unicode:
            footer = [ascii_only(line) for line in footer]
        try:
            scrape = self.scraper.scrape()
        except Refused:
            raise
        except (OSError, ValueError) as exc:
            self._prev = None
            return "\n".join([shown(f"evald top: {exc} (retrying)", width), *footer]) + "\n"
        text = render(self.view(scrape), width, unicode=self.unicode, height=height)
        return text + "".join(line + "\n" for line in footer)

    def once(self, interval: float) -> int:
        """Two scrapes ``interval`` apart (for rates), one plain frame; 1 if unreachable."""
        from evald.top.render import render

        try:
            self._prev = self.scraper.scrape()
            self.sleep(interval)
            view = self.view(self.scraper.scrape())
        except (OSError, ValueError) as exc:
            hint = (
                "; is evald running there? `evald run` and `evald demo` print their metrics "
                "URL when they start"
                if isinstance(exc, Unreachable)
                else ""
            )
            print(f"evald top: {exc}{hint}", file=sys.stderr)
            return 1
        self.stream.write(encodable(render(view, 80, unicode=self.unicode), self.stream))
        self.stream.flush()
        return 0

    def live(self, interval: float, *, tty: bool) -> int:
        """Redraw in place on a terminal (frames one after another on a pipe) until Ctrl-C; 1 on
        an answer no retry changes (credentials or certificate refused)."""
        if tty:
            self.stream.write(_HIDE_CURSOR)
        try:
            while True:
                text = self.frame(fit=tty)
                # (on a terminal without the last newline: after the last row it scrolls)
                text = encodable(text, self.stream)
                self.stream.write((_HOME_CLEAR + text.rstrip("\n")) if tty else text + "\n")
                self.stream.flush()
                self.sleep(interval)
        except KeyboardInterrupt:
            return 0
        except Refused as exc:
            message = f"evald top: {exc}"  # printed below the frame, once the cursor is back
        finally:
            if tty:
                self.stream.write("\n" + _SHOW_CURSOR)
                self.stream.flush()
        print(message, file=sys.stderr)
        return 1
