"""Command line: `evald <command>`.

Each command lives in its own module exposing ``SUMMARY`` (one line), ``EXAMPLES`` (text shown
under ``--help``), ``configure(parser)`` and ``run(args) -> int``. Building the parser imports
every command module, so each keeps its heavy imports (numpy, kafka, pydantic models) inside
``run``: ``evald --help`` stays fast and one command's dependencies never slow another.

A module may also set ``EXIT_AT_ONCE = True``: run from the command line, the process then ends
as soon as the command returns and its output is flushed, without the interpreter's
finalization (tearing down numpy, pyarrow and every module: 10-20 ms, a tenth of a short
`evald score`). Only for commands that hold nothing to release but memory and closed files.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from evald import __version__

COMMANDS: dict[str, str] = {
    "score": "evald.score.command",
    "replay": "evald.replay",
    "demo": "evald.demo.command",
    "run": "evald.daemon.command",
    "check-config": "evald.daemon.check_config",
    "produce": "evald.daemon.produce",
    "top": "evald.top.command",
    "judge": "evald.clicks.judge",
}


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level(text: str) -> str:
    """``--log-level``/``EVALD_LOG_LEVEL`` in any case (``debug`` = ``DEBUG``); argparse turns
    the ArgumentTypeError into exit 2 naming the option, for the flag and the variable alike."""
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a log level (EVALD_LOG_LEVEL or the flag): use one of "
            + ", ".join(LOG_LEVELS)
        )
    return level


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``only`` (one command: no other module imported)."""
    parser = argparse.ArgumentParser(
        prog="evald",
        description="Watch search and recommendation quality: score ranked lists with "
        "trec_eval-exact measures, offline or live from Kafka.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'evald COMMAND --help' for a command's options and examples.",
    )
    parser.add_argument("--version", action="version", version=f"evald {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(
            name,
            help=module.SUMMARY,
            description=module.SUMMARY,
            epilog="examples:\n" + module.EXAMPLES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.configure(cmd)
        cmd.set_defaults(_run=module.run, _exit_at_once=getattr(module, "EXIT_AT_ONCE", False))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command of ``argv`` (by default the command line's, and then a command with
    ``EXIT_AT_ONCE`` ends the process: see the module docstring)."""
    from_command_line = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    # `evald score ...` builds only score's parser: importing the daemon's modules (pydantic
    # settings, YAML) cost about 0.15 s of start-up for a command that uses none of them
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        status = int(args._run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    if from_command_line and args._exit_at_once:
        exit_at_once(status)
    return status


def exit_at_once(status: int) -> NoReturn:
    """Flush stdout and stderr and end the process with ``status``, skipping finalization.

    A reader gone from stdout (``| head``) keeps the command's status (1 still says lines were
    rejected); any other failure to write is reported and ends it with 1 if it would have ended
    with 0 (finalization would have reported it, with status 120)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    except OSError as exc:
        status = status or 1
        with contextlib.suppress(OSError):
            print(f"evald: error: cannot write to stdout: {exc}", file=sys.stderr)
    try:
        sys.stderr.flush()
    except OSError:
        status = status or 1
    os._exit(status)
