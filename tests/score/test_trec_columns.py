"""The columnar TREC reader: whatever it accepts, it reads exactly as the exact reader does."""

from __future__ import annotations

import contextlib
import io
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evald.score import inputs, trec_columns
from evald.score.batching import Lists, concat, lists_from
from evald.score.inputs import TrecInput
from evald.score.records import Rejection
from evald.score.trec_columns import delimiter_of, read_columnar

EXACT_ONLY = 1 << 62  # a columnar_min_bytes no file reaches


def through(run: bytes, qrels: bytes, *, complete: bool, min_bytes: int) -> tuple:
    """What the command gets from TrecInput: the lists, the rejections, the notes."""
    source = TrecInput(
        (io.BytesIO(run), "run"),
        (io.BytesIO(qrels), "qrels"),
        complete=complete,
        columnar_min_bytes=min_bytes,
    )
    chunks = list(source.chunks(7))
    parts = [
        c.lists if c.lists is not None else lists_from(c.qids, c.rankings, c.qrels) for c in chunks
    ]
    rejections: list[Rejection] = [r for c in chunks for r in c.rejections]
    return as_plain(concat(parts) if parts else None), rejections, source.notes()


def as_plain(lists: Lists | None) -> tuple:
    """Lists as comparable values (NaN, the unjudged grade, made comparable)."""
    if lists is None or not len(lists):
        return ()
    return (
        lists.qids,
        lists.lengths.tolist(),
        np.nan_to_num(lists.served, nan=-99.0).tolist(),
        lists.counts.tolist(),
        lists.judgments.tolist(),
    )


def columnar(run: str, qrels: str, *, complete: bool = False) -> tuple | None:
    found = read_columnar(run.encode(), qrels.encode(), complete=complete)
    return None if found is None else as_plain(found.lists)


def exact(run: str, qrels: str, *, complete: bool = False) -> tuple:
    return through(run.encode(), qrels.encode(), complete=complete, min_bytes=EXACT_ONLY)[0]


# --- clean files: always accepted, always the exact reader's lists --------------------------

qids = st.sampled_from(["1", "2", "q3", "10", "Q4"])
docids = st.sampled_from(["a", "b", "c", "B", "d10", "d9", "_", "~x"])
scores = st.sampled_from(["1", "2.5", "2.50", "-0", "0", "0.0", "inf", "-inf", "1e400", "+1", ".5"])
grades = st.sampled_from(["0", "1", "2", "-1", "1.5", "3"])


@st.composite
def clean_files(draw: st.DrawFn) -> tuple[str, str]:
    """A run and qrels as trec_eval's users write them: one delimiter (space or tab) between
    fields, LF or CRLF line ends, blank lines, queries interleaved, ties in score."""
    sep = draw(st.sampled_from([" ", "\t"]))
    end = draw(st.sampled_from(["\n", "\r\n"]))
    run_docs = draw(st.dictionaries(qids, st.dictionaries(docids, scores, min_size=1), min_size=1))
    judged = draw(st.dictionaries(qids, st.dictionaries(docids, grades, min_size=1), min_size=1))
    run_rows = [
        [q, "Q0", d, str(rank), s, "tag"]
        for q, docs in run_docs.items()
        for rank, (d, s) in enumerate(docs.items(), start=1)
    ]
    qrels_rows = [[q, "0", d, g] for q, docs in judged.items() for d, g in docs.items()]
    run_rows = draw(st.permutations(run_rows))
    qrels_rows = draw(st.permutations(qrels_rows))
    blank = draw(st.booleans())
    run = "".join(sep.join(r) + end + (end if blank else "") for r in run_rows)
    qrels = "".join(sep.join(r) + end for r in qrels_rows)
    return run, qrels


@settings(max_examples=150, deadline=None)
@given(files=clean_files(), complete=st.booleans())
def test_clean_files_are_read_by_the_columnar_reader_exactly(
    files: tuple[str, str], complete: bool
) -> None:
    run, qrels = files
    found = columnar(run, qrels, complete=complete)
    assert found is not None
    assert found == exact(run, qrels, complete=complete)


@settings(max_examples=100, deadline=None)
@given(files=clean_files(), complete=st.booleans())
def test_the_input_gives_the_same_lists_and_notes_on_either_reader(
    files: tuple[str, str], complete: bool
) -> None:
    run, qrels = (text.encode() for text in files)
    fast = through(run, qrels, complete=complete, min_bytes=0)
    assert fast == through(run, qrels, complete=complete, min_bytes=EXACT_ONLY)


# --- any lines: the columnar reader declines what it cannot read exactly ---------------------

tokens = st.sampled_from(
    ["1", "q3", "Q0", "a", "b", "B", "é", "#", "#c", "1.5", "-0", "nan", "NaN", "inf", "1e",
     "x", "0x1", "1_0", "\ufeff1", "-2", "t", "101"]
)  # fmt: skip
separators = st.sampled_from([" ", " ", " ", "\t", "  ", " \t", "\x0b", "\x1f", "\xa0", "\r"])
endings = st.sampled_from(["\n", "\n", "\r\n", " \n", "\r", "\x0c\n", "\u2028\n"])


@st.composite
def any_file(draw: st.DrawFn, fields: int) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        n = draw(st.sampled_from([fields, fields, fields, fields - 1, fields + 1, 0]))
        words = draw(st.lists(tokens, min_size=n, max_size=n))
        text = "".join(w + draw(separators) for w in words[:-1]) + "".join(words[-1:])
        lead = draw(st.sampled_from(["", "", "", " ", "\t"]))
        lines.append(lead + text + draw(endings))
    return "".join(lines)


@settings(max_examples=400, deadline=None)
@given(run=any_file(6), qrels=any_file(4), complete=st.booleans())
def test_any_lines_give_the_exact_readers_lists_rejections_and_notes(
    run: str, qrels: str, complete: bool
) -> None:
    """Comments, BOMs, NaN, bad numbers, wrong field counts, doubled, leading and trailing
    delimiters, Unicode and control whitespace, lone CRs, repeated docids: the columnar reader
    takes a file only when it reads it exactly; the rest goes to the exact reader whole."""
    run_b, qrels_b = run.encode(), qrels.encode()
    fast = through(run_b, qrels_b, complete=complete, min_bytes=0)
    assert fast == through(run_b, qrels_b, complete=complete, min_bytes=EXACT_ONLY)


snippets = st.sampled_from(
    [" ", "\t", "\r", "\n", "\n ", " \n", "\x0b", "\x1c", "\xa0", "\u2003", "\ufeff", "#",
     "nan", "inf", "x", "é", "\x00", "0", "1e308"]
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, files: tuple[str, str]) -> tuple[str, str]:
    """Clean files with one or two snippets put somewhere, a few characters cut out (a field
    emptied: "q Q0  1 1 t"), or a line repeated."""
    texts = list(files)
    for _ in range(draw(st.integers(1, 2))):
        which = draw(st.integers(0, 1))
        text = texts[which]
        at = draw(st.integers(0, len(text)))
        kind = draw(st.integers(0, 5))
        if kind == 0:
            text += draw(st.sampled_from(text.splitlines(keepends=True)))
        elif kind == 1:
            text = text[:at] + text[at + draw(st.integers(1, 4)) :]
        else:
            text = text[:at] + draw(snippets) + text[at:]
        texts[which] = text
    return texts[0], texts[1]


@settings(max_examples=400, deadline=None)
@given(files=clean_files().flatmap(mutated), complete=st.booleans())
def test_one_defect_in_clean_files_is_read_as_the_exact_reader_reads_it(
    files: tuple[str, str], complete: bool
) -> None:
    """A defect in otherwise clean files: accepted only if it changes nothing the exact reader
    sees (a digit more in a score), else declined and read by the exact reader."""
    run, qrels = (text.encode() for text in files)
    fast = through(run, qrels, complete=complete, min_bytes=0)
    assert fast == through(run, qrels, complete=complete, min_bytes=EXACT_ONLY)


# --- single cases -----------------------------------------------------------------------------

QRELS = "q 0 a 1\nq 0 b 2\n"


@pytest.mark.parametrize(
    "run",
    [
        "q Q0 a 1 1 t\nq Q0 a 2 2 t\n",  # a docid twice in one query
        "q Q0 a 1 1 t\n# Q0 b 2 2 t\n",  # a comment line with six fields
        "q Q0 a 1 nan t\n",
        "q Q0 a 1 1 t extra\n",  # trec_eval ignores fields after the tag; this reader cannot
        "q Q0 a 1 1\n",
        "q Q0 a 1 1 t\nq Q0  b 2 t\n",  # five fields, one doubled delimiter: six CSV columns
        " q Q0 a 1 1\n",
        "q Q0 a 1 1 \n",
        "q Q0 a 1 1 t\tx\n",  # space-separated with a tab in it
        "q Q0 a 1 1 t\rq Q0 b 1 1 t\n",  # a lone CR is a line break for CSV, a space for split
        "q Q0 é 1 1 t\n",  # not ASCII: Unicode whitespace is not looked for, so not taken
        "q Q0 a 1 1\x0bt\n",
        "",
    ],
)
def test_declined_run_files(run: str) -> None:
    assert columnar(run, QRELS) is None


DECLINED_QRELS = ["q 0 a 1\nq 0 a 2\n", "q 0 a inf\n", "q 0 a nan\n", "q 0 a 1 x\n", "q 0 a\n",
                  "q 0 a 101\n", "q 0 a 1e308\n", "q 0 a -inf\n"]  # fmt: skip


@pytest.mark.parametrize("qrels", DECLINED_QRELS)
def test_declined_qrels_files(qrels: str) -> None:
    assert columnar("q Q0 a 1 1 t\n", qrels) is None


def test_ties_are_broken_by_docid_descending_bytewise() -> None:
    run = "q Q0 a 1 5 t\nq Q0 B 2 5 t\nq Q0 c 3 5 t\nq Q0 b 4 -0 t\nq Q0 d 5 0 t\n"
    qrels = "q 0 a 1\nq 0 B 2\nq 0 c 3\nq 0 b 4\nq 0 d 5\n"
    found = columnar(run, qrels)
    assert found is not None
    assert found[2] == [3.0, 1.0, 2.0, 5.0, 4.0]  # c a B at 5, then d b at 0 (-0 ties with 0)
    assert found == exact(run, qrels)


def test_tab_separated_crlf_files_with_blank_lines_are_accepted() -> None:
    run = "q\tQ0\ta\t1\t2\tt\r\n\r\nq\tQ0\tb\t2\t1\tt\r\n"
    assert columnar(run, "q\t0\tb\t1\r\n") == (["q"], [2], [-99.0, 1.0], [1], [1.0])


def test_join_order_and_notes_match_the_exact_reader() -> None:
    """Run queries in first-appearance order, unjudged ones skipped; qrels-only ones after them
    with --complete; negative grades are unjudged but their query is judged."""
    run = "r Q0 a 1 1 t\nq Q0 a 1 1 t\nu Q0 a 1 1 t\nr Q0 b 2 2 t\nn Q0 a 1 1 t\n"
    qrels = "z 0 a 1\nq 0 a 2\nr 0 b 1\nn 0 a -1\ny 0 c 1\n"
    for complete in (False, True):
        fast = through(run.encode(), qrels.encode(), complete=complete, min_bytes=0)
        assert fast == through(
            run.encode(), qrels.encode(), complete=complete, min_bytes=EXACT_ONLY
        )
    found = columnar(run, qrels, complete=True)
    assert found is not None and found[0] == ["r", "q", "n", "z", "y"]


def test_files_of_many_csv_blocks_are_read_exactly() -> None:
    """Arrow reads a file in blocks of 1 MiB, each its own chunk: qids and docids must get one
    code each across chunks, and queries their first-appearance order, with lines of a query
    spread over blocks, shuffled, tied in score, unjudged or judged negative."""
    rng = random.Random(5)
    tag = "a-run-tag-long-enough-to-fill-blocks"
    lines = [
        f"q{q} Q0 doc{d} 0 {rng.choice(['1', '2.5', '-0', '0', '3', '0.25'])} {tag}\n"
        for q in range(150)
        for d in rng.sample(range(5000), 400)
    ]
    rng.shuffle(lines)
    run = "".join(lines)
    qrels = "".join(
        f"q{q} 0 doc{d} {rng.choice([-1, 0, 1, 2])}\n"
        for q in range(10, 130)
        for d in rng.sample(range(5000), 60)
    )
    assert len(run) > 3 << 20  # at least three blocks
    for complete in (False, True):
        found = columnar(run, qrels, complete=complete)
        assert found is not None
        assert found == exact(run, qrels, complete=complete)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.integers(0, 63), max_size=40),
    per_key=st.sampled_from([0, 1, 64]),
    most=st.sampled_from([0, 1 << 20]),
)
def test_a_repeated_key_is_found_by_the_table_and_by_the_sort(
    keys: list[int], per_key: int, most: int
) -> None:
    """Small files take the table of seen keys; 0 bytes a key, or 0 in all, forces the sort
    big ones take."""
    with (
        mock.patch.object(trec_columns, "SEEN_TABLE_BYTES_PER_KEY", per_key),
        mock.patch.object(trec_columns, "SEEN_TABLE_MAX_BYTES", most),
    ):
        found = trec_columns._repeats(np.array(keys, dtype=np.int64), 64)
    assert found == (len(set(keys)) != len(keys))


def test_delimiter_is_a_tab_only_when_the_first_lines_hold_one() -> None:
    assert delimiter_of(b"q Q0 a 1 1 t\n") == b" "
    assert delimiter_of(b"q\tQ0\ta\t1\t1\tt\n") == b"\t"
    assert delimiter_of(b"q\tQ0 a\t1\t1\tt\n") is None
    assert delimiter_of(b"q Q0 a 1 1 t\r\n") == b" "
    assert delimiter_of(b"q Q0 a 1 1 t\r") is None


def test_reading_does_not_import_pandas() -> None:
    """pyarrow's numpy conversions import pandas when it is installed (0.3 s of start-up):
    columns cross over through their buffers instead."""
    code = (
        "import sys\n"
        "from evald.score.trec_columns import read_columnar\n"
        "found = read_columnar(b'q Q0 a 1 1 t\\nq Q0 b 2 2 t\\n', b'q 0 a 1\\n', complete=True)\n"
        "assert found is not None and found.lists.qids == ['q']\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_reading_does_not_import_pyarrow_compute() -> None:
    """Its import builds a wrapper per Arrow function (0.03-0.04 s of CPU); the reader calls
    the compiled functions directly. Comments, repeats and the join all run here."""
    code = (
        "import sys\n"
        "from evald.score.trec_columns import read_columnar\n"
        "run = b'q Q0 a 1 1 t\\nq Q0 b 2 2 t\\nr Q0 a 1 1 t\\n'\n"
        "found = read_columnar(run, b'q 0 a 1\\nz 0 b 1\\n', complete=True)\n"
        "assert found is not None and found.lists.qids == ['q', 'z']\n"
        "assert read_columnar(b'# Q0 a 1 1 t\\n', b'q 0 a 1\\n', complete=True) is None\n"
        "assert read_columnar(b'q Q0 a 1 1 t\\n', b'q 0 a 1\\nq 0 a 2\\n', complete=True) is None\n"
        "print('pyarrow.compute' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@contextlib.contextmanager
def columnar_reader() -> Iterator[None]:
    """Every TREC input tried with the columnar reader; checks it took them all."""
    read = trec_columns.read_columnar
    taken: list[bool] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        found = read(*args, **kwargs)
        taken.append(found is not None)
        return found

    with (
        mock.patch.object(inputs, "COLUMNAR_MIN_BYTES", 0),
        mock.patch.object(trec_columns, "read_columnar", spy),
    ):
        yield
    assert taken and all(taken)


@pytest.mark.parametrize(
    "options",
    [
        ["-m", "map,P.5,ndcg_cut.10,recip_rank,num_ret", "--format", "trec"],
        ["-m", "map,P.5", "--format", "trec", "--mean", "--complete", "-J", "-M", "3"],
        ["-m", "nDCG@3,RR,AP", "--output", "-"],
    ],
)
def test_the_command_prints_the_same_bytes_on_either_reader(
    evald_main: Callable[..., Any], tmp_path: Path, options: list[str]
) -> None:
    """Rows, means, --complete, -J and -M, end to end: the same stdout and stderr."""
    rng = random.Random(7)
    run = tmp_path / "run"
    qrels = tmp_path / "qrels"
    run.write_text(
        "".join(
            f"q{q} Q0 d{d} 0 {rng.choice(['1', '2.5', '-0', '0', '7e-1'])} t\n"
            for q in range(30)
            for d in rng.sample(range(60), rng.randint(1, 25))
        )
    )
    qrels.write_text(
        "".join(
            f"q{q} 0 d{d} {rng.choice([-1, 0, 1, 2])}\n"
            for q in range(5, 40)
            for d in rng.sample(range(60), rng.randint(1, 12))
        )
    )
    argv = ["score", "--run", str(run), "--qrels", str(qrels), *options]
    exact = evald_main(*argv)
    with columnar_reader():
        fast = evald_main(*argv)
    assert (fast.status, fast.out, fast.err) == (exact.status, exact.out, exact.err)
    assert exact.out and "no qrels and were skipped" in exact.err


def test_compare_pairs_the_same_values_on_either_reader(
    evald_main: Callable[..., Any], tmp_path: Path
) -> None:
    rng = random.Random(3)
    runs = []
    for name in ("base", "new"):
        path = tmp_path / name
        path.write_text(
            "".join(
                f"q{q} Q0 d{d} 0 {rng.random():.3f} {name}\n"
                for q in range(20)
                for d in rng.sample(range(40), 15)
            )
        )
        runs.append(str(path))
    qrels = tmp_path / "qrels"
    qrels.write_text("".join(f"q{q} 0 d{d} 1\n" for q in range(20) for d in range(0, 40, 3)))
    argv = ["score", "--compare", *runs, "--qrels", str(qrels), "-m", "AP,RR", "--format", "json"]
    exact = evald_main(*argv)
    with columnar_reader():
        fast = evald_main(*argv)
    assert (fast.status, fast.out) == (exact.status, exact.out) and exact.status == 0
