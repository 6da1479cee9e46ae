"""`evald check-config`: every error at once, "did you mean", durations as written, --connect."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from kafka_harness import Broker, KafkaTools, free_port

from evald.daemon import check_config
from evald.daemon.connect_check import (
    FAIL,
    NOTE,
    OK,
    TopicInfo,
    layout_checks,
    permission_checks,
)
from evald.daemon.settings import SettingsError, load_settings


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    check_config.configure(parser)
    return parser.parse_args(argv)


def test_every_error_is_reported_at_once_with_did_you_mean() -> None:
    flags = {
        "kafka": {"request_timeout_ms": -1},
        "topics": {"feedbak": "fb"},
        "daemon": {"grup_id": "g"},
        "kafkaa": {"x": 1},
        "engine": {"windw": "5m", "lateness": "soon"},
    }
    with pytest.raises(SettingsError) as caught:
        load_settings(environ={}, flags=flags)
    lines = set(str(caught.value).splitlines())
    assert "topics.feedbak: unknown setting (did you mean topics.feedback?)" in lines
    assert "daemon.grup_id: unknown setting (did you mean daemon.group_id?)" in lines
    assert "kafkaa: unknown setting (did you mean kafka?)" in lines
    assert "engine.windw: unknown setting (did you mean engine.window?)" in lines
    assert any(line.startswith("engine.lateness: invalid duration 'soon'") for line in lines)
    assert any(line.startswith("kafka.request_timeout_ms: ") for line in lines)
    assert len(lines) == 6


def test_the_replaced_watermark_jump_points_at_watermark_quorum() -> None:
    """A settings file written for the rule before blocks is refused, naming the new one."""
    expected = (
        r"^engine\.watermark_jump: unknown setting \(did you mean engine\.watermark_quorum\?\)$"
    )
    with pytest.raises(SettingsError, match=expected):
        load_settings(environ={}, flags={"engine": {"watermark_jump": "1h"}})


def test_a_key_like_nothing_known_gets_no_guess() -> None:
    with pytest.raises(SettingsError, match=r"^topics\.zzzzzz: unknown setting$"):
        load_settings(environ={}, flags={"topics": {"zzzzzz": 1}})


def test_durations_print_as_written_and_the_output_loads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--set", "engine.window=30m", "--set", "engine.lateness=90s"]
    argv += ["--set", "engine.windows=[5m, 1h]"]
    assert check_config.run(_parse(argv)) == 0
    printed = capsys.readouterr().out
    engine = yaml.safe_load(printed)["engine"]
    assert (engine["window"], engine["lateness"], engine["windows"]) == (
        "30m",
        "1m30s",
        ["5m", "1h"],
    )
    assert engine["retention"] == "3h" and engine["idle_timeout"].endswith(("s", "m", "h"))
    # what check-config prints is a settings file that means the same thing
    saved = tmp_path / "evald.yaml"
    saved.write_text(printed)
    again = load_settings(file=saved, environ={})
    original = load_settings(environ={}, flags={"engine": {"window": "30m", "lateness": "90s"}})
    assert again.engine_config().window == original.engine_config().window == 1_800_000


def _settings() -> object:
    topics = {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"}
    return load_settings(environ={}, flags={"topics": topics})


def test_layout_checks_name_each_problem() -> None:
    settings = _settings()
    good = {"imp": TopicInfo(6), "fb": TopicInfo(6), "res": TopicInfo(6)}
    checks = {c.subject: c for c in layout_checks(settings, good)}  # type: ignore[arg-type]
    assert checks["co-partitioning"].status == OK
    assert checks["topics.dlq dlq"].status == NOTE  # evald run creates it
    skewed = {"imp": TopicInfo(6), "fb": TopicInfo(4)}
    checks = {c.subject: c for c in layout_checks(settings, skewed)}  # type: ignore[arg-type]
    assert checks["co-partitioning"].status == FAIL
    assert "imp has 6 partitions, fb has 4" in checks["co-partitioning"].detail
    short_output = {"imp": TopicInfo(6), "fb": TopicInfo(6), "res": TopicInfo(3)}
    checks = {c.subject: c for c in layout_checks(settings, short_output)}  # type: ignore[arg-type]
    assert (
        checks["co-partitioning"].status == FAIL and "res has 3" in checks["co-partitioning"].detail
    )
    missing = {"imp": TopicInfo(6), "fb": TopicInfo(None, error="not authorized to describe it")}
    checks = {c.subject: c for c in layout_checks(settings, missing)}  # type: ignore[arg-type]
    assert checks["topics.feedback fb"].status == FAIL
    assert "co-partitioning" not in checks


def test_permission_checks_list_missing_operations() -> None:
    settings = _settings()
    rw = frozenset({"DESCRIBE", "READ", "WRITE"})
    info = {
        "imp": TopicInfo(3, frozenset({"DESCRIBE", "READ"})),
        "fb": TopicInfo(3, frozenset({"DESCRIBE"})),
        "res": TopicInfo(3, rw),
        "dlq": TopicInfo(3, frozenset({"DESCRIBE", "READ"})),
    }
    checks = {c.subject: c for c in permission_checks(settings, info)}  # type: ignore[arg-type]
    assert checks["permissions imp"].status == OK
    assert (
        checks["permissions fb"].status == FAIL and "lacks READ" in checks["permissions fb"].detail
    )
    assert (
        checks["permissions dlq"].status == FAIL
        and "lacks WRITE" in checks["permissions dlq"].detail
    )
    unreported = permission_checks(settings, {"imp": TopicInfo(3)})  # type: ignore[arg-type]
    assert [c.status for c in unreported] == [NOTE]


@pytest.mark.kafka
def test_connect_against_a_real_broker(
    broker: Broker, kafka_tools: KafkaTools, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    imp, fb, res = f"cimp-{unique}", f"cfb-{unique}", f"cres-{unique}"
    kafka_tools.create({imp: 3, fb: 3, res: 2})
    base = ["--bootstrap-servers", broker.bootstrap, "--impressions-topic", imp]
    argv = [*base, "--feedback-topic", fb, "--results-topic", res, "--connect"]
    assert check_config.run(_parse(argv)) == 1
    captured = capsys.readouterr()
    report = [line for line in captured.out.splitlines() if line.startswith("# ")]
    assert report[0] == "# --connect"
    assert report[1].startswith("# ok    brokers: 1 broker(s) answered at ")
    assert f"# ok    topics.impressions {imp}: 3 partitions" in report
    assert any(f"output topic {res} has 2 partitions but the inputs have 3" in r for r in report)
    assert "# note  topics.dlq evald.dlq: does not exist; `evald run` creates it" in report
    assert "1 connection check(s) failed" in captured.err
    yaml.safe_load(captured.out)  # the report is YAML comments: stdout still parses

    fine = f"cok-{unique}"
    kafka_tools.create({fine: 3})
    argv = [*base, "--feedback-topic", fb, "--results-topic", fine, "--connect"]
    assert check_config.run(_parse(argv)) == 0
    assert "# ok    co-partitioning: inputs share 3 partitions" in capsys.readouterr().out

    argv = [*base, "--feedback-topic", f"absent-{unique}", "--connect"]
    assert check_config.run(_parse(argv)) == 1
    assert f"# FAIL  topics.feedback absent-{unique}: does not exist" in capsys.readouterr().out


@pytest.mark.kafka
def test_connect_fails_a_transaction_timeout_the_broker_refuses(
    broker: Broker, kafka_tools: KafkaTools, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`evald run` would exit 2 at its producer's InitProducerId: say so before it is run."""
    imp, fb = f"timp-{unique}", f"tfb-{unique}"
    kafka_tools.create({imp: 1, fb: 1})
    base = ["--bootstrap-servers", broker.bootstrap, "--impressions-topic", imp]
    argv = [*base, "--feedback-topic", fb, "--connect"]
    # the test broker keeps Kafka's default transaction.max.timeout.ms, 900000
    assert check_config.run(_parse([*argv, "--set", "kafka.transaction_timeout_ms=900001"])) == 1
    out = capsys.readouterr().out
    assert "# FAIL  kafka.transaction_timeout_ms: 900001 is above the broker's " in out
    assert "transaction.max.timeout.ms (900000)" in out
    assert check_config.run(_parse(argv)) == 0
    assert "# ok    kafka.transaction_timeout_ms: 60000, within" in capsys.readouterr().out


def test_connect_to_nothing_fails_within_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--bootstrap-servers", f"127.0.0.1:{free_port()}", "--connect"]
    assert check_config.run(_parse([*argv, "--connect-timeout", "1"])) == 1
    out = capsys.readouterr().out
    assert "# FAIL  brokers: none answered at 127.0.0.1:" in out and "within 1s" in out


def test_layout_checks_with_repartitioning_accept_inputs_of_any_partition_counts() -> None:
    settings = load_settings(
        environ={},
        flags={
            "topics": {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"},
            "input": {"repartition": True},
        },
    )
    skewed = {"imp": TopicInfo(6), "fb": TopicInfo(4), "res": TopicInfo(6)}
    checks = {c.subject: c for c in layout_checks(settings, skewed)}
    assert "co-partitioning" not in checks
    assert (
        checks["repartitioning"].status == OK
        and "into 6 partitions" in checks["repartitioning"].detail
    )
    internal = ("evald.imp.evald-repartition", "evald.fb.evald-repartition")
    assert checks[f"input.repartition {internal[0]}"].status == NOTE  # evald creates it
    wrong = {**skewed, internal[0]: TopicInfo(6), internal[1]: TopicInfo(4)}
    checks = {c.subject: c for c in layout_checks(settings, wrong)}
    assert checks["repartitioning"].status == FAIL
    assert f"{internal[1]} has 4" in checks["repartitioning"].detail
    short = {**skewed, "res": TopicInfo(3)}
    checks = {c.subject: c for c in layout_checks(settings, short)}
    assert (
        checks["repartitioning"].status == FAIL and "res has 3" in checks["repartitioning"].detail
    )


def test_the_repartitioning_example_of_docs_mapping_is_what_check_config_reports(
    tmp_path: Path,
) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "mapping.md").read_text()
    section = text[text.index("## Topics") :]
    start = section.index("# evald.yaml")
    config = section[start : section.index("```", start)]
    (tmp_path / "evald.yaml").write_text(config)
    settings = load_settings(file=tmp_path / "evald.yaml", environ={})
    info = {"ubi_queries": TopicInfo(6), "ubi_events": TopicInfo(12)}
    lines = {f"# {check.line()}" for check in layout_checks(settings, info)}
    shown = [line.strip() for line in section.splitlines() if line.startswith("    # ")]
    assert len(shown) == 5
    for line in shown:
        assert line in lines


STATISTICS = {
    "comparisons": [
        {"name": "ab", "label": "arm", "control": "control", "treatments": ["t"], "start": 0}
    ]
}


def _statistics_lines(info: dict[str, TopicInfo]) -> dict[str, object]:
    settings = load_settings(
        environ={},
        flags={
            "topics": {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"},
            "engine": {"statistics": STATISTICS},
        },
    )
    inputs = {"imp": TopicInfo(6), "fb": TopicInfo(6)}
    checks = layout_checks(settings, {**inputs, **info})
    return {c.subject: c for c in checks if c.subject.startswith("statistics.comparisons")}


def test_the_statistics_topic_is_checked_only_with_comparisons() -> None:
    subject = "statistics.comparisons res.checkpoints.statistics"
    assert not any("statistics" in c.subject for c in layout_checks(_settings(), {}))
    missing = _statistics_lines({})[subject]
    assert missing.status == NOTE  # type: ignore[attr-defined]
    assert "creates it (1 partition, compacted)" in missing.detail  # type: ignore[attr-defined]

    def status(partitions: int, configs: dict[str, str] | None) -> tuple[str, str]:
        topic = TopicInfo(partitions, configs=configs)
        check = _statistics_lines({"res.checkpoints.statistics": topic})[subject]
        return check.status, check.detail  # type: ignore[attr-defined]

    assert status(1, {"cleanup.policy": "compact"}) == (OK, "1 partition, compacted")
    assert status(1, {"cleanup.policy": "compact,delete", "retention.ms": "-1"})[0] == OK
    deleted, detail = status(1, {"cleanup.policy": "delete", "retention.ms": "604800000"})
    assert deleted == FAIL and "cleanup.policy=delete (retention.ms=604800000)" in detail
    assert "--add-config cleanup.policy=compact" in detail
    both, detail = status(1, {"cleanup.policy": "compact,delete", "retention.ms": "86400000"})
    assert both == FAIL and "(retention.ms=86400000)" in detail
    assert status(3, {"cleanup.policy": "compact"})[0] == NOTE  # only partition 0 is used
    assert status(1, None)[0] == NOTE  # the broker did not say


@pytest.mark.kafka
def test_connect_reports_the_statistics_topics_config(
    broker: Broker, kafka_tools: KafkaTools, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A statistics topic created without compaction fails the check; a compacted one passes,
    on a real broker's answer to DescribeConfigs."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    imp, fb = f"simp-{unique}", f"sfb-{unique}"
    kafka_tools.create({imp: 2, fb: 2})
    argv = ["--bootstrap-servers", broker.bootstrap, "--impressions-topic", imp]
    argv += ["--feedback-topic", fb, "--set", f"engine.statistics={json.dumps(STATISTICS)}"]
    for name, configs, want in (
        (
            f"sdel-{unique}",
            {},
            "# FAIL  statistics.comparisons sdel-{u}.checkpoints.statistics: "
            "cleanup.policy=delete (retention.ms=",
        ),
        (
            f"scmp-{unique}",
            {"cleanup.policy": "compact"},
            "# ok    statistics.comparisons scmp-{u}.checkpoints.statistics: "
            "1 partition, compacted",
        ),
    ):
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            topic = NewTopic(f"{name}.checkpoints.statistics", 1, 1, topic_configs=configs)
            admin.create_topics([topic])
        finally:
            admin.close()
        checked = [*argv, "--results-topic", name, "--connect"]
        code = check_config.run(_parse(checked))
        out = capsys.readouterr().out
        assert want.format(u=unique) in out, out
        assert code == (1 if configs == {} else 0)
    absent = [*argv, "--results-topic", f"snew-{unique}", "--connect"]
    assert check_config.run(_parse(absent)) == 0
    out = capsys.readouterr().out
    assert (
        f"# note  statistics.comparisons snew-{unique}.checkpoints.statistics: does not exist; "
        "`evald run` creates it (1 partition, compacted)" in out
    )


def test_nested_and_optional_durations_and_instants_print_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not only the engine's own fields: the statistics, interleaving and click-model blocks,
    the optional max_event_lead and the instants read as what a person writes in the file."""
    comparison = {"name": "ab", "label": "arm", "control": "c", "treatments": ["t"]}
    argv = ["--set", "engine.statistics.window=1h", "--set", "engine.max_event_lead=90m"]
    argv += [
        "--set",
        f"engine.statistics.comparisons=[{json.dumps({**comparison, 'start': '2026-01-01'})}]",
    ]
    assert check_config.run(_parse(argv)) == 0
    printed = capsys.readouterr().out
    engine = yaml.safe_load(printed)["engine"]
    assert engine["max_event_lead"] == "1h30m"
    assert engine["min_event_time"] == "2000-01-01T00:00:00.000Z"
    assert engine["statistics"]["window"] == engine["interleaving"]["window"] == "1h"
    assert engine["statistics"]["comparisons"][0]["start"] == "2026-01-01T00:00:00.000Z"
    assert engine["interleaving"]["start"] == "1970-01-01T00:00:00.000Z"
    assert engine["click_model"]["half_life"] == "1d"
    saved = tmp_path / "evald.yaml"
    saved.write_text(printed)
    flags = {"engine": {"statistics": {"window": "1h"}, "max_event_lead": "90m"}}
    flags["engine"]["statistics"]["comparisons"] = [{**comparison, "start": "2026-01-01"}]
    want = load_settings(environ={}, flags=flags).engine_config()
    assert load_settings(file=saved, environ={}).engine_config() == want


def test_a_max_event_lead_of_null_stays_null(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_config.run(_parse(["--set", "engine.max_event_lead=null"])) == 0
    assert yaml.safe_load(capsys.readouterr().out)["engine"]["max_event_lead"] is None


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf", "1e308", "3601"])
def test_a_connect_timeout_out_of_range_is_a_usage_error(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(["--connect", "--connect-timeout", seconds])
    assert exc.value.code == 2
    assert "argument --connect-timeout: must be > 0 and <= 3600 seconds" in capsys.readouterr().err


def test_replicates_a_share_record_cannot_hold_exit_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """10,000 replicates of 5 measures: one segment's share record of 1.17 MB, refused by a
    statistics topic at Kafka's default in every session; now refused here (and by `evald run`
    and `evald replay --config`, which validate the same engine settings)."""
    comparison = {"name": "ab", "label": "arm", "control": "c", "treatments": ["t"], "start": 0}
    engine = {
        "measures": ["nDCG@10", "RR", "P@10", "R@10", "AP@10"],
        "windows": ["5m", "1h"],
        "statistics": {"bootstrap_replicates": 10_000, "comparisons": [comparison]},
    }
    (tmp_path / "evald.yaml").write_text(yaml.safe_dump({"engine": engine}))
    assert check_config.run(_parse(["--config", str(tmp_path / "evald.yaml")])) == 2
    err = capsys.readouterr().err
    assert "engine.statistics.bootstrap_replicates: 10000 replicates" in err
    assert "at most 1198 with 5 measures" in err
