"""`evald replay`: CLI behaviour, output files, and replay == offline scoring of joined qrels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evald.cli import main
from evald.events import format_timestamp
from evald.metrics import Batch, evaluate, parse_measures

MIN = 60_000
#: integer times below 10**11 are offsets from 2024-05-01T00:00:00Z (epoch-ms times that small
#: would be implausible: before min_event_time)
BASE = 1_714_521_600_000


def at(ts: int | str) -> int | str:
    return BASE + ts if isinstance(ts, int) and ts < 10**11 else ts


MEASURES = "nDCG@10,RR,Success@10,RBP(p=0.8),P@5,R@10,AP@10,nDCG"


def imp(rid: str, ts: int | str, items: list[str], **labels: str) -> dict:
    return {"request_id": rid, "ts": at(ts), "items": items, "labels": labels}


def fb(rid: str, ts: int | str, item: str, action: str = "click", **extra: object) -> dict:
    return {"request_id": rid, "ts": at(ts), "item": item, "action": action, **extra}


def write_jsonl(path: Path, rows: list[dict | bytes]) -> Path:
    with path.open("wb") as fh:
        for row in rows:
            fh.write(row if isinstance(row, bytes) else json.dumps(row).encode())
            fh.write(b"\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_outputs_summary_and_rejections(tmp_path, capsys):
    events = write_jsonl(
        tmp_path / "events.jsonl",
        [
            imp("r1", 1_714_564_800_000, ["a", "b", "c"], arm="A"),
            fb("r1", 1_714_564_800_500, "b", "purchase"),
            b"",
            b'{"request_id": "r2", "ts": "not a time", "items": ["a"]}',
            b"not json at all",
            imp("r2", "2024-05-01T12:01:00Z", ["a"], arm="B"),
        ],
    )
    out = tmp_path / "results.jsonl"
    windows = tmp_path / "windows.jsonl"
    rejected = tmp_path / "rejected.jsonl"
    rc = main(
        [
            "replay",
            str(events),
            "--measures",
            "RR,P@2",
            "--results",
            str(out),
            "--windows",
            str(windows),
            "--rejected",
            str(rejected),
        ]
    )
    assert rc == 0
    results = read_jsonl(out)
    assert results == [
        {
            "request_id": "r1",
            "ts": "2024-05-01T12:00:00.000Z",
            "labels": {"arm": "A"},
            "measures": {"RR": 0.5, "P@2": 0.5},
        },
        {
            "request_id": "r2",
            "ts": "2024-05-01T12:01:00.000Z",
            "labels": {"arm": "B"},
            "measures": {"RR": 0.0, "P@2": 0.0},
        },
    ]
    bad = read_jsonl(rejected)
    assert [(b["line"], b["reason"]) for b in bad] == [(4, "bad_timestamp"), (5, "invalid_json")]
    assert bad[1]["raw"] == "not json at all" and bad[0]["file"] == str(events)
    rows = read_jsonl(windows)
    five = {(r["labels"]["arm"], r["measure"]): r for r in rows if r["window"] == "5m"}
    assert five[("A", "RR")]["count"] == 1 and five[("A", "RR")]["mean"] == 0.5
    assert five[("A", "RR")]["ci95_halfwidth"] is None
    assert five[("B", "P@2")]["start_ms"] == 1_714_564_800_000
    assert {r["window"] for r in rows} == {"5m", "1h"}
    text = capsys.readouterr().out
    assert "rejected               2 (invalid_json 1, bad_timestamp 1)" in text
    assert "abandoned" in text


def test_strict_exit_status_and_usage_errors(tmp_path, capsys):
    events = write_jsonl(tmp_path / "e.jsonl", [imp("r", 0, ["a"]), b"{"])
    assert main(["replay", str(events)]) == 0
    assert main(["replay", str(events), "--strict"]) == 1
    assert main(["replay", str(events), "--window", "soon"]) == 2
    assert "window" in capsys.readouterr().err
    assert main(["replay", str(events), "--measures", "nope@3"]) == 2
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    config = tmp_path / "engine.yaml"
    config.write_text("window: 5m\nlabel_keys: [le]\n")
    assert main(["replay", str(events), "--config", str(config)]) == 2
    assert "label_keys" in capsys.readouterr().err
    config.write_text("- not a mapping\n")
    assert main(["replay", str(events), "--config", str(config)]) == 2
    assert f"--config: {config}: the top level must be a mapping" in capsys.readouterr().err


def test_a_missing_file_is_named_with_why_as_evald_score_names_it(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert main(["replay", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"evald replay: cannot read {missing}: No such file or directory\n"
    )


def test_a_mapping_reading_the_kafka_record_timestamp_is_refused(tmp_path, capsys):
    """Lines of a file have no record timestamp: exit 2, saying why, before reading them."""
    events = write_jsonl(tmp_path / "e.jsonl", [imp("r1", 0, ["a"])])
    mapping = tmp_path / "m.yaml"
    mapping.write_text(
        "extends: ubi\nfeedback:\n  time: {source: record, path: null, format: null}\n"
    )
    assert main(["replay", str(events), "--mapping", str(mapping)]) == 2
    err = capsys.readouterr().err
    assert "takes the event time from the Kafka record timestamp" in err
    assert "lines of a file have none" in err


def test_config_file_and_flags(tmp_path):
    events = write_jsonl(
        tmp_path / "e.jsonl",
        [imp("r", 0, ["a", "b"]), fb("r", 6 * MIN, "b")],  # inside 10m, outside 5m
    )
    config = tmp_path / "engine.yaml"
    config.write_text("window: 5m\nmeasures: RR\n")
    out = tmp_path / "r.jsonl"
    main(["replay", str(events), "--config", str(config), "--results", str(out)])
    assert read_jsonl(out)[0]["measures"] == {"RR": 0.0}
    main(["replay", str(events), "--config", str(config), "--window", "10m", "--results", str(out)])
    assert read_jsonl(out)[0]["measures"] == {"RR": 0.5}


def test_several_files_in_order_and_stdin(tmp_path):
    first = write_jsonl(tmp_path / "1.jsonl", [imp("r", 0, ["a", "b"])])
    second = write_jsonl(tmp_path / "2.jsonl", [fb("r", 10, "b")])
    out = tmp_path / "r.jsonl"
    main(["replay", str(first), str(second), "--measures", "RR", "--results", str(out)])
    assert read_jsonl(out)[0]["measures"] == {"RR": 0.5}
    proc = subprocess.run(
        [sys.executable, "-m", "evald", "replay", "-", "--measures", "RR", "--results", "-"],
        input=first.read_bytes() + second.read_bytes(),
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert json.loads(proc.stdout.splitlines()[0])["measures"] == {"RR": 0.5}
    assert b"finalized impressions  1" in proc.stderr


# ---------------------------------------------------------------------------- replay == score

WINDOW = 30 * MIN
LATENESS = 2 * MIN
GRADES = {"click": 1, "add_to_cart": 2, "purchase": 3}


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[dict], dict[str, tuple[list[str], dict[str, float]]]]:
    """Random impressions and feedback (inside and outside the window, unknown items,
    repeats), their arrival order shuffled within the lateness bound; and the joined truth."""
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(1, 40))
    rng = np.random.default_rng(seed)
    events: list[tuple[int, dict]] = []
    truth: dict[str, tuple[list[str], dict[str, float]]] = {}
    for k in range(n):
        ts = int(rng.integers(0, 3 * WINDOW))
        length = int(rng.integers(0, 15))
        items = [f"d{x}" for x in rng.choice(40, size=length, replace=False)]
        rid = f"q{k}"
        events.append((ts, imp(rid, ts, items)))
        qrels: dict[str, float] = {}
        for _ in range(int(rng.integers(0, 6))):
            kind = rng.random()
            lag = int(rng.integers(0, WINDOW + 1))
            if kind < 0.1:
                lag = -int(rng.integers(1, MIN))  # early
            elif kind < 0.2:
                lag = WINDOW + int(rng.integers(1, MIN))  # late
            elif kind < 0.4:
                lag = int(rng.choice([-1, 0, 1, WINDOW - 1, WINDOW, WINDOW + 1]))  # edges
            item = str(rng.choice(items)) if items and rng.random() < 0.9 else "unknown"
            if rng.random() < 0.2:
                grade = float(rng.integers(0, 5))
                event = fb(rid, ts + lag, item, "judgment", grade=grade)
            else:
                action = str(rng.choice(list(GRADES)))
                grade = GRADES[action]
                event = fb(rid, ts + lag, item, action)
            events.append((ts + lag, event))
            if 0 <= lag <= WINDOW and item in items:
                qrels[item] = max(qrels.get(item, 0.0), grade)
        truth[rid] = (items, qrels)
    # arrival = event time + a delay below the lateness: no event is ever behind the watermark
    jitter = rng.choice([0, LATENESS - 1], size=len(events))
    jitter = np.where(rng.random(len(events)) < 0.5, jitter, rng.integers(0, LATENESS, len(events)))
    arrival = [ts + int(j) for (ts, _), j in zip(events, jitter, strict=True)]
    order = sorted(range(len(events)), key=lambda i: (arrival[i], i))
    return [events[i][1] for i in order], truth


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(streams())
def test_replay_equals_offline_scoring_of_the_joined_qrels(tmp_path_factory, stream):
    events, truth = stream
    tmp = tmp_path_factory.mktemp("prop")
    path = write_jsonl(tmp / "events.jsonl", events)
    out = tmp / "results.jsonl"
    rc = main(
        ["replay", str(path), "--measures", MEASURES, "--results", str(out), "--tick-every", "3",
         "--window", "30m"]
    )  # fmt: skip
    assert rc == 0
    got = {r["request_id"]: r["measures"] for r in read_jsonl(out)}
    assert set(got) == set(truth)

    ids = sorted(truth)
    measures = parse_measures(MEASURES)
    rankings = [truth[q][0] for q in ids]
    # every served item is judged in the stream (0 unless feedback says otherwise)
    qrels = [{d: truth[q][1].get(d, 0.0) for d in truth[q][0]} for q in ids]
    scored = evaluate(measures, Batch.from_lists(rankings, qrels))
    for i, q in enumerate(ids):
        for m in measures:
            assert got[q][str(m)] == pytest.approx(float(scored[m][i]), abs=1e-12), (q, str(m))

    # and through `evald score` on the same joined qrels, as a user would
    score_in = write_jsonl(
        tmp / "joined.jsonl",
        [{"qid": q, "ranking": truth[q][0], "qrels": qrels[i]} for i, q in enumerate(ids)],
    )
    score_out = tmp / "scored.jsonl"
    assert main(["score", str(score_in), "--measures", MEASURES, "--output", str(score_out)]) == 0
    for row in read_jsonl(score_out):
        for m in measures:
            assert got[row["qid"]][str(m)] == pytest.approx(row[str(m)], abs=1e-12)


def test_results_ts_is_rfc3339_utc_with_ms(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", [imp("r", 1_700_000_000_123, ["a"])])
    out = tmp_path / "r.jsonl"
    main(["replay", str(path), "--results", str(out)])
    assert read_jsonl(out)[0]["ts"] == format_timestamp(1_700_000_000_123)
    assert read_jsonl(out)[0]["ts"] == "2023-11-14T22:13:20.123Z"


def test_progress_bar_on_request(tmp_path, capsys):
    path = write_jsonl(tmp_path / "e.jsonl", [imp(f"r{k}", k, ["a"]) for k in range(50)])
    assert main(["replay", str(path), "--progress", "always", "--tick-every", "10"]) == 0
    err = capsys.readouterr().err
    assert "100.0%" in err and "50 events" in err
    assert main(["replay", str(path), "--progress", "never"]) == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- hostile input (issue 10)

REPRO = [
    b'{"request_id":"a","ts":"2024-05-01T12:00:00Z","items":["x","y"]}',
    b'{"request_id":"a","ts":"2024-05-01T12:00:05Z","item":"x","action":"click"}',
    b'{"request_id":"p","ts":"9999-12-31T23:59:59Z","items":["x"]}',
    b'{"request_id":"b","ts":"2024-05-01T12:00:10Z","items":["x","y"]}',
    b'{"request_id":"b","ts":"2024-05-01T12:00:15Z","item":"x","action":"click"}',
]


def replay_process(stdin: bytes, *args: str) -> tuple[list[dict], str]:
    """``evald replay - --results -`` as a real process; (results, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "evald", "replay", "-", "--results", "-", *args],
        input=stdin,
        capture_output=True,
        check=True,
    )
    return [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr.decode()


def test_a_year_9999_impression_is_rejected_and_poisons_nothing(tmp_path):
    rejected = tmp_path / "rejected.jsonl"
    results, err = replay_process(b"\n".join(REPRO) + b"\n", "--rejected", str(rejected))
    clean, _ = replay_process(b"\n".join(REPRO[:2] + REPRO[3:]) + b"\n")
    assert results == clean
    assert {r["request_id"]: r["measures"]["RR"] for r in results} == {"a": 1.0, "b": 1.0}
    assert "rejected               1 (implausible_timestamp 1)" in err
    assert "feedback not counted   0" in err
    (line,) = read_jsonl(rejected)
    assert line["line"] == 3 and line["reason"] == "implausible_timestamp"
    assert line["raw"] == REPRO[2].decode() and "9999-12-31T23:59:59" in line["detail"]


def test_one_feedback_hours_ahead_leaves_later_impressions_on_time():
    """Within the lead bound (the file is from 2024), so accepted, but one event: the
    watermark does not move on it, so what follows is neither late nor orphaned."""
    rows = []
    for k in range(60):
        ts = BASE + k * MIN
        rows += [imp(f"r{k}", ts, ["x", "y"]), fb(f"r{k}", ts + 5_000, "y")]
    ghost = fb("ghost", BASE + 30 * MIN + 3 * 3_600_000, "x")
    stream = [json.dumps(row).encode() for row in rows]
    results, err = replay_process(
        b"\n".join([*stream[:60], json.dumps(ghost).encode(), *stream[60:]])
    )
    clean, _ = replay_process(b"\n".join(stream))
    assert results == clean and len(results) == 60
    assert all(r["measures"]["RR"] == 0.5 for r in results)
    assert "arrived after their window closed" in err and ", 0 arrived after" in err
    assert "feedback not counted   1 (orphaned 1)" in err  # the ghost itself


def test_the_input_rule_bom_case_and_duplicate_keys(tmp_path):
    bom = b"\xef\xbb\xbf"
    lines = [
        bom + b'{"request_id":"a","ts":"2024-05-01t12:00:00z","items":["x","y"]}',
        b'{"request_id":"a","ts":"2024-05-01T12:00:05Z","item":"y","action":"click"}',
        b'{"request_id":"d","ts":"2024-05-01T12:00:06Z","items":["x"],"items":["y"]}',
    ]
    rejected = tmp_path / "rejected.jsonl"
    results, _ = replay_process(b"\n".join(lines), "--rejected", str(rejected))
    assert [(r["request_id"], r["ts"], r["measures"]["RR"]) for r in results] == [
        ("a", "2024-05-01T12:00:00.000Z", 0.5)
    ]
    (line,) = read_jsonl(rejected)
    assert (line["line"], line["reason"]) == (3, "duplicate_key")


def test_an_over_long_line_is_rejected_without_being_read_whole(tmp_path):
    limit = 1_000
    config = tmp_path / "engine.yaml"
    config.write_text(f"limits: {{max_event_bytes: {limit}}}\nmeasures: RR\n")
    long_line = (
        b'{"request_id":"big","ts":"2024-05-01T12:00:00Z","items":["' + b"z" * 5_000 + b'"]}'
    )
    rows = [
        REPRO[0],
        long_line,
        b"x" * 999 + b"\r",  # exactly the limit once its CR is stripped: judged by the decoder
        b"y" * (limit + 1),  # one byte over, its newline in the same read
        REPRO[1],
    ]
    rejected = tmp_path / "rejected.jsonl"
    results, err = replay_process(
        b"\n".join(rows) + b"\n" + b"w" * 3 * limit,  # and an over-long last line without a newline
        "--config",
        str(config),
        "--rejected",
        str(rejected),
    )
    assert [(r["request_id"], r["measures"]["RR"]) for r in results] == [("a", 1.0)]
    got = [(r["line"], r["reason"], r["detail"], len(r["raw"])) for r in read_jsonl(rejected)]
    assert got == [
        (2, "too_large", f"{len(long_line)} bytes > limit {limit}", limit),
        (3, "invalid_json", got[1][2], 999),
        (4, "too_large", f"{limit + 1} bytes > limit {limit}", limit + 1),
        (6, "too_large", f"{3 * limit} bytes > limit {limit}", limit),
    ]
    assert "lines read             6 (+0 blank)" in err


@pytest.mark.parametrize("limit", [64, 100, 1_000])
@settings(max_examples=60, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600))
def test_bounded_lines_splits_like_readlines_and_never_returns_more_than_the_limit(limit, data):
    import io

    from evald.replay import bounded_lines

    got = list(bounded_lines(io.BytesIO(data), limit))
    expected = io.BytesIO(data).readlines()
    assert len(got) == len(expected)
    assert sum(consumed for _, consumed, _ in got) == len(data)
    for (line, consumed, length), raw in zip(got, expected, strict=True):
        body = raw.rstrip(b"\r\n")
        assert consumed == len(raw)
        assert length == (
            len(body) if length <= limit else len(raw) - raw.endswith(b"\n") - raw.endswith(b"\r\n")
        )
        assert line == (body if length <= limit else raw[:limit])


def test_events_of_the_last_day_there_is_replay_with_their_windows_past_it(tmp_path, capsys):
    """Events at 9999-12-31T23:59 (in range, with no bound on how far ahead they are): their
    5-minute window ends in year 10000; the queries report, the windows and the comparison's
    looks name it rather than crash."""
    from evald.events import MAX_TS_MS

    last = MAX_TS_MS - 30_000
    rows: list[dict | bytes] = []
    for i in range(40):
        arm = ("control", "treatment")[i % 2]
        rows.append({**imp(f"r{i}", last + i, ["a", "b"], arm=arm), "query": "q"})
        rows.append(fb(f"r{i}", last + i + 1, "b"))
    events = write_jsonl(tmp_path / "events.jsonl", rows)
    comparison = {"name": "ab", "label": "arm", "control": "control",
                  "treatments": ["treatment"], "start": 0}  # fmt: skip
    config = {"max_event_lead": None, "windows": ["5m"], "label_keys": ["arm"],
              "statistics": {"window": "5m", "bootstrap_replicates": 0, "min_n": 2,
                             "comparisons": [comparison]}}  # fmt: skip
    (tmp_path / "c.json").write_text(json.dumps(config))
    outputs = [f"--{name}={tmp_path / name}.jsonl" for name in ("queries", "windows", "looks")]
    config_file = f"--config={tmp_path / 'c.json'}"
    argv = ["replay", str(events), config_file, "--format=json", "--progress=never", *outputs]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary
    ends = {row["end"] for row in read_jsonl(tmp_path / "queries.jsonl")}
    assert ends == {"10000-01-01T00:00:00.000Z"}
    # the comparison records carry the end as an int too: a five-digit year does not parse
    records = summary["comparisons"]
    assert records and all(format_timestamp(r["end_ms"]) == r["end"] for r in records)


def test_an_output_that_is_an_input_or_another_output_is_refused_before_anything_is_written(
    tmp_path, capsys
):
    # `--results events.jsonl` emptied the input before reading it: nothing replayed, exit 0
    events = tmp_path / "events.jsonl"
    line = '{"request_id": "r1", "ts": 1714564800000, "items": ["a"]}\n'
    events.write_text(line)
    link = tmp_path / "link.jsonl"
    link.symlink_to(events)
    for argv in (
        ["--results", str(events)],
        ["--rejected", str(link)],
        ["--windows", str(tmp_path / "out.jsonl"), "--queries", str(tmp_path / "out.jsonl")],
    ):
        assert main(["replay", str(events), *argv]) == 2, argv
        assert "evald replay: --" in capsys.readouterr().err
    assert events.read_text() == line
    assert not (tmp_path / "out.jsonl").exists()
    assert main(["replay", str(events), "--results", "-", "--windows", "-"]) == 0
    # the settings a replay reads are inputs too: --config c.json --results c.json emptied it
    config = tmp_path / "c.json"
    config.write_text('{"windows": ["5m"]}')
    mapping = tmp_path / "m.yaml"
    mapping.write_text("name: m\n")
    for argv in (["--config", str(config), "--results", str(config)],
                 ["--mapping", str(mapping), "--rejected", str(mapping)]):  # fmt: skip
        assert main(["replay", str(events), *argv]) == 2, argv
        assert "is also an input" in capsys.readouterr().err
    assert config.read_text() == '{"windows": ["5m"]}' and mapping.read_text() == "name: m\n"
