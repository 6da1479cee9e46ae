"""`evald score`: per-query measures (JSON Lines) or their means, from JSONL or TREC files.

Exit status: 0 when every line was scored, 1 when some lines were rejected (the rest is still
scored and written), 2 on a usage error (bad measure name, unreadable file, conflicting options).
Numpy and the metric engine are imported inside :func:`run` so ``evald --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Iterator, Sequence
from typing import IO, TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from evald.metrics import Measure
    from evald.score.compare import RunValues
    from evald.score.inputs import Input
    from evald.score.records import Qid

SUMMARY = "score ranked lists offline (JSON Lines or TREC run/qrels) with trec_eval-exact measures"

EXAMPLES = """\
  # (paths from the root of evald's source checkout, where the example data set is)
  # per-query JSON Lines on stdout, the default measures
  evald score evald/data/example.jsonl
  # the mean of each measure (an aligned table on a terminal, JSON otherwise)
  evald score evald/data/example.jsonl --mean
  # chosen measures, from stdin
  cat evald/data/example.jsonl | evald score --measures 'nDCG@10,RR,P(rel=2)@5,RBP(p=0.9)'
  # TREC files, like trec_eval (and with --complete, like trec_eval -c)
  evald score --run evald/data/example.run --qrels evald/data/example.qrels --mean
  # per-query rows to a file and the means to stdout
  mkdir -p out && evald score evald/data/example.jsonl --output out/per_query.jsonl --mean
  # the same example.jsonl, from any directory
  evald score --example --mean
  # trec_eval's measure names and output lines (-q rows, then 'all'); -J and -M as in trec_eval
  evald score --run evald/data/example.run --qrels evald/data/example.qrels -m P.5,map --format trec
  # a run against a baseline (here, each query's top document moved last): paired t-test,
  # randomization test, Holm correction
  mkdir -p out && awk '$4 == 1 { $5 = -100 } 1' evald/data/example.run > out/last.run
  evald score --compare evald/data/example.run out/last.run --qrels evald/data/example.qrels -m map

input line: {"qid": "q1", "ranking": ["d3", "d1", "d7"], "qrels": {"d1": 2, "d9": 1}}
exit status: 0 all lines scored, 1 some lines rejected (reported on stderr), 2 usage error
formats and trec_eval conventions: docs/score.md; measure names: docs/metrics.md
"""

#: End the process as soon as scoring is done (evald.cli): its files are closed by then, and
#: the interpreter's finalization took 10-20 ms of each run, a tenth of a short one
EXIT_AT_ONCE = True

DEFAULT_BATCH_SIZE = 10_000
#: Lines read and checked together: enough to run the checks as C-level passes over many lines,
#: few enough that the lines' objects are still in the CPU cache when they are checked and
#: looked up (10 000 at once measured about 2x slower to read than a few hundred).
READ_CHUNK = 256
EXAMPLE = "example.jsonl"


class UsageError(Exception):
    """A problem with the command line or an input file as a whole: exit status 2."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the options (the default measure set is shown without importing numpy).

    Long because: a flat list of argparse declarations, one per option, in --help order.
    """
    parser.add_argument(
        "input",
        nargs="?",
        metavar="FILE",
        help="JSON Lines input, one list per line; '-' or omitted reads stdin",
    )
    parser.add_argument("--run", metavar="FILE", help="TREC run: qid Q0 docid rank score tag")
    parser.add_argument("--qrels", metavar="FILE", help="TREC qrels: qid iter docid grade")
    parser.add_argument(
        "--complete",
        action="store_true",
        help="with --run/--qrels: also score qrels queries missing from the run, as empty "
        "rankings (trec_eval -c); by default they are skipped, as trec_eval does",
    )
    parser.add_argument(
        "--example",
        action="store_true",
        help="score the small example data set bundled with evald",
    )
    parser.add_argument(
        "-m",
        "--measures",
        metavar="LIST",
        help="comma-separated ir_measures-style names "
        "(default: nDCG@10,RR,Success@10,RBP(p=0.8),P@10,R@10,AP@10)",
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="write per-query rows to FILE instead of stdout"
    )
    parser.add_argument(
        "--mean",
        action="store_true",
        help="print the mean of each measure instead of per-query rows (with --output, the rows "
        "still go to FILE)",
    )
    parser.add_argument(
        "--format",
        choices=("auto", "table", "json", "trec"),
        default="auto",
        help="how --mean prints: a table on a terminal and JSON otherwise (auto, the default); "
        "trec: trec_eval's lines, per query (as -q) unless --mean, then the 'all' lines",
    )
    parser.add_argument(
        "--digits",
        type=_digits,
        default=4,
        metavar="N",
        help="decimals in the table and trec formats (default 4, as trec_eval)",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="FILE",
        help="compare runs: each FILE after the first against the first, per measure, with a "
        "paired t-test and a randomization test (TREC runs with --qrels, else JSON Lines)",
    )
    parser.add_argument(
        "--permutations",
        type=_positive_int,
        default=10_000,
        metavar="N",
        help="--compare: sign patterns the randomization test draws (default 10000; every "
        "pattern, an exact test, when 2^queries <= N)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="--compare: seed of the randomization test's draws (default 0)",
    )
    parser.add_argument(
        "--correction",
        choices=("holm", "bonferroni", "none"),
        default="holm",
        help="--compare: multiple-testing correction over the runs compared with the first, "
        "per measure and test (default holm)",
    )
    parser.add_argument(
        "-J",
        "--judged-only",
        action="store_true",
        help="score each list with its unjudged documents removed (trec_eval -J)",
    )
    parser.add_argument(
        "-M",
        "--max-docs",
        type=_positive_int,
        metavar="M",
        help="score only the first M documents of each list (trec_eval -M); with -J, the "
        "cut comes first, as in trec_eval",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive_int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"lists scored per batch (default {DEFAULT_BATCH_SIZE}); it bounds the memory of "
        "JSON Lines input (a TREC run is read whole first, as trec_eval reads it)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be ≥ 1")
    return value


def _digits(text: str) -> int:
    """1 to 30 decimals: a double's 17 significant digits even for a value of 1e-13; far more
    was Python's "Too many decimal digits" traceback, or gigabytes of zeros."""
    value = _positive_int(text)
    if value > 30:
        raise argparse.ArgumentTypeError(f"at most 30 decimals, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Score everything readable; see the module docstring for the exit status."""
    # numpy's OpenBLAS starts a thread per core when imported (about 30 ms of CPU, a fifth of
    # the start-up); nothing here hands BLAS enough work for a second thread to pay off
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from evald.metrics import DEFAULT_MEASURES, MeasureError, parse_measures

    try:
        measures = parse_measures(DEFAULT_MEASURES if args.measures is None else args.measures)
    except MeasureError as exc:
        _error(str(exc))
        return 2
    try:
        _check_sources(args)
        with contextlib.ExitStack() as stack:
            if args.compare is not None:
                return _compare(args, measures, stack)
            return _score(args, measures, stack)
    except UsageError as exc:
        _error(str(exc))
        return 2


def _score(args: argparse.Namespace, measures: list[Measure], stack: contextlib.ExitStack) -> int:
    from evald.score.output import (
        JsonlWriter,
        TrecWriter,
        format_mean_json,
        format_table,
        format_trec_all,
    )
    from evald.score.scoring import BatchScorer, per_query

    source = _input(args, stack)
    rows_out: TextIO | None = None
    if args.output:
        rows_out = _open_write(args.output, stack, [args.input, args.run, args.qrels])
    elif not args.mean:
        rows_out = sys.stdout
    trec = args.format == "trec"
    names = [_name_of(m, trec) for m in per_query(measures)]
    writer: JsonlWriter | TrecWriter | None = None
    if rows_out is not None:
        writer = (
            TrecWriter(rows_out, names, digits=args.digits)
            if trec
            else JsonlWriter(rows_out, names)
        )
    scorer = BatchScorer(measures, writer.write if writer else _discard, batch_size=args.batch_size)
    rejected = 0
    with _cyclic_gc_paused():
        for chunk in source.chunks(READ_CHUNK):
            if chunk.rejections:
                rejected += len(chunk.rejections)
                print(*chunk.rejections, sep="\n", file=sys.stderr)
            scorer.add_chunk(chunk, args.max_docs, args.judged_only)
        scorer.flush()
    if rows_out is not None:
        rows_out.flush()
    notes = source.notes()
    if rejected:
        notes.insert(0, f"{rejected} line(s) rejected; {scorer.scored} queries scored")
    for note in notes:
        print(f"evald score: {note}", file=sys.stderr)
    if trec:
        all_names = [_name_of(m, trec) for m in measures]
        rows = scorer.means(intervals=False)
        sys.stdout.write(format_trec_all(rows, all_names, digits=args.digits))
        sys.stdout.flush()
    elif args.mean:
        table = args.format == "table" or (args.format == "auto" and sys.stdout.isatty())
        rows = scorer.means()
        text = (
            format_table(rows, digits=args.digits)
            if table
            else format_mean_json(rows, scorer.scored)
        )
        sys.stdout.write(text)
        sys.stdout.flush()
    return 1 if rejected else 0


def _name_of(measure: Measure, trec: bool) -> str:
    """The output name: trec_eval's (``P_5``) in the trec format where it has one."""
    if trec:
        from evald.metrics.trec_names import trec_name

        return trec_name(measure) or str(measure)
    return str(measure)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while lines stream through.

    Its passes re-scan the containers still alive. JSONL now keeps only a chunk of lines' objects
    alive (a batch holds numbers), and pausing made no measurable difference on 1M lists; TREC
    input is read whole, and there it saved about 5% (1M run lines). Nothing on this path makes
    reference cycles (refcounting frees every line's objects), so pausing it costs no memory; it
    is restored as it was, even on error.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _discard(qids: Sequence[Qid], columns: Sequence[object]) -> None:
    """The row sink when only the means are wanted."""


def _compare(args: argparse.Namespace, measures: list[Measure], stack: contextlib.ExitStack) -> int:
    """Score every run, pair the queries by qid, and print the comparison table or JSON."""
    from evald.score import compare

    row_measures, names = _compared(args, measures)
    runs = _score_runs(args, row_measures, stack)
    for run_values in runs:
        compare.report_notes(run_values)
    pairing = compare.paired(runs)
    if pairing.unpaired:
        print(
            f"evald score: {pairing.unpaired} queries are not scored in every run and are left "
            f"out of the comparison; {pairing.queries} are compared",
            file=sys.stderr,
        )
    results = compare.compare(
        runs,
        names,
        permutations=args.permutations,
        seed=args.seed,
        correction=args.correction,
        pairing=pairing,
    )
    table = args.format == "table" or (args.format == "auto" and sys.stdout.isatty())
    if table:
        sys.stdout.write(compare.format_table(results, args.correction, digits=args.digits))
    else:
        sys.stdout.write(
            compare.format_json(
                results,
                args.compare[0],
                pairing.queries,
                permutations=args.permutations,
                seed=args.seed,
                correction=args.correction,
            )
        )
    sys.stdout.flush()
    return 1 if any(r.rejected for r in runs) else 0


def _score_runs(
    args: argparse.Namespace, measures: list[Measure], stack: contextlib.ExitStack
) -> list[RunValues]:
    """Each run of ``--compare`` scored by ``measures`` (per-query ones), in order."""
    from evald.score import compare
    from evald.score.inputs import JsonlInput, TrecInput

    runs = []
    for path in args.compare:
        source: Input
        if args.qrels is not None:
            source = TrecInput(
                (_lines(path, stack), path),
                (_lines(args.qrels, stack), args.qrels),
                complete=args.complete,
            )
        else:
            source = JsonlInput(_lines(path, stack), path)
        try:
            runs.append(
                compare.score_run(
                    path,
                    source,
                    measures,
                    batch_size=args.batch_size,
                    max_docs=args.max_docs,
                    judged_only=args.judged_only,
                    report=lambda text: print(text, file=sys.stderr),
                )
            )
        except compare.DuplicateQid as exc:
            raise UsageError(str(exc)) from None
    return runs


def _compared(args: argparse.Namespace, measures: list[Measure]) -> tuple[list[Measure], list[str]]:
    """The measures --compare tests (those with a per-query value), each with the name the
    user gave it: `-m map,ndcg_cut.10` shows map and ndcg_cut.10, not AP and nDCG@10."""
    from evald.metrics import DEFAULT_MEASURES, labelled_measures
    from evald.score.scoring import per_query

    row_measures = per_query(measures)
    if not row_measures:
        raise UsageError("--compare needs a per-query measure (GAUC and GMAP are aggregates)")
    labels = labelled_measures(DEFAULT_MEASURES if args.measures is None else args.measures)
    return row_measures, [labels[m] for m in row_measures]


def _check_sources(args: argparse.Namespace) -> None:
    if args.compare is not None:
        if len(args.compare) < 2:
            raise UsageError("--compare needs at least two runs: the baseline and another")
        if args.run is not None or args.input is not None or args.example:
            raise UsageError("--compare takes its runs as its own arguments (no FILE or --run)")
        if args.output or args.mean or args.format == "trec":
            raise UsageError(
                "--compare prints a table or JSON; --output, --mean and --format trec do not apply"
            )
        if "-" in args.compare or args.qrels == "-":
            raise UsageError("--compare reads files, not stdin")
        if args.complete and args.qrels is None:
            raise UsageError("--complete applies to TREC runs (--compare with --qrels)")
        return
    trec = args.run is not None or args.qrels is not None
    if trec and (args.run is None or args.qrels is None):
        raise UsageError("--run and --qrels go together")
    if sum([trec, args.input is not None, args.example]) > 1:
        raise UsageError("give one input: a JSONL FILE, --run/--qrels, or --example")
    if args.complete and not trec:
        raise UsageError("--complete applies to --run/--qrels input")
    if trec and args.run == "-" and args.qrels == "-":
        raise UsageError("--run and --qrels cannot both read stdin")


def _input(args: argparse.Namespace, stack: contextlib.ExitStack) -> Input:
    """The chosen input; files are opened here so a missing one is a usage error up front."""
    from evald.score.inputs import JsonlInput, TrecInput

    if args.run is not None:
        return TrecInput(
            (_lines(args.run, stack), _name(args.run)),
            (_lines(args.qrels, stack), _name(args.qrels)),
            complete=args.complete,
        )
    if args.example:
        from importlib import resources

        path = resources.files("evald") / "data" / EXAMPLE
        return JsonlInput(stack.enter_context(path.open("rb")), f"<example {EXAMPLE}>")
    source = args.input or "-"
    return JsonlInput(_lines(source, stack), _name(source))


def _name(path: str) -> str:
    return "<stdin>" if path == "-" else path


def _lines(path: str, stack: contextlib.ExitStack) -> IO[bytes]:
    """The file (or stdin for '-') as binary lines; unreadable and gzip-compressed files are
    usage errors (a compressed file was rejected line by line as not UTF-8)."""
    from evald.input_rule import gzipped  # its readers import it too

    try:
        if path == "-":
            stream: IO[bytes] = sys.stdin.buffer
        else:
            stream = stack.enter_context(open(path, "rb"))  # noqa: SIM115 (the stack closes it)
        packed = gzipped(stream)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if packed:
        raise UsageError(
            f"{_name(path)} is gzip-compressed: evald score reads plain text (zcat it first)"
        )
    return stream


def _open_write(path: str, stack: contextlib.ExitStack, inputs: Sequence[str | None]) -> TextIO:
    """Open the rows file, refusing one of the inputs: opening it would truncate it unread."""
    if path == "-":
        return sys.stdout
    for source in inputs:
        if source not in (None, "-") and _same_file(path, source):
            raise UsageError(f"--output {path} is also an input; it would be overwritten")
    try:
        return stack.enter_context(open(path, "w", encoding="utf-8", newline="\n"))
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # the output does not exist yet
        return False


def _error(message: str) -> None:
    print(f"evald score: error: {message}", file=sys.stderr)
