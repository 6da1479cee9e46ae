import pytest

from evald.config import RESERVED_LABELS, ConfigError, EngineConfig, load_config, read_mapping_file
from evald.metrics import DEFAULT_MEASURES

AB = {"name": "ab", "label": "arm", "control": "A", "treatments": ["B"], "start": "2026-01-01"}


def test_a_comparison_reads_its_start_as_a_date_and_its_measures_canonical():
    import datetime

    c = load_config(
        {
            "statistics": {
                "comparisons": [
                    {**AB, "start": datetime.date(2026, 1, 1), "min_effect": {"nDCG@10": 0.01}}
                ]
            }
        }
    )
    (comp,) = c.statistics.comparisons
    assert comp.start == 1_767_225_600_000  # YAML's unquoted date, UTC midnight
    assert comp.min_effect == {"nDCG@10": 0.01}


def test_the_statistics_window_only_matters_with_a_comparison():
    """Settings with other windows and no comparison stay valid (the daemon's tests use 5m)."""
    assert load_config(windows=["5m"]).statistics.comparisons == []


def test_defaults():
    c = EngineConfig()
    assert c.window == 5 * 60_000 and c.lateness == 2 * 60_000
    assert c.label_keys == ["model", "arm", "surface"] and c.label_value_cap == 50
    assert c.limits.max_items == 1000
    assert c.action_grades == {"click": 1.0, "add_to_cart": 2.0, "purchase": 3.0}
    assert ",".join(c.measures) == DEFAULT_MEASURES.replace(" ", "")


def test_durations_and_measures_are_normalised():
    c = load_config({"window": "10m", "lateness": 500, "measures": "nDCG@5, RR"})
    assert c.window == 600_000 and c.lateness == 500
    assert c.measures == ["nDCG@5", "RR"]


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"window": "soon"}, "window"),
        ({"window": 0}, "window"),
        ({"lateness": -1}, "lateness"),
        # YAML's true/false (yes/no, on/off) where a number goes: read as 1 or 0, silently
        ({"batch_size": True}, "batch_size: a number, not true"),
        ({"drilldown": {"capacity": True}}, "drilldown.capacity: a number, not true"),
        ({"zero_feedback": {"depth": False}}, "zero_feedback.depth: a number, not false"),
        # and inside a mapping or a list, and in the event limits (a grade of 1, a 50/50 split)
        ({"limits": {"max_items": True}}, "limits.max_items: a number, not true"),
        ({"action_grades": {"click": True}}, "action_grades: a number, not true or false"),
        ({"histogram_bounds": [True, 2]}, "histogram_bounds: a number, not true or false"),
        ({"bucket": 10**400, "windows": [10**400], "retention": 10**400}, "bucket"),
        ({"idle_timeout": "1" * 5000}, "idle_timeout"),
        ({"measures": "nDCG@ten"}, "measures"),
        ({"label_keys": ["arm", "arm"]}, "label_keys"),
        ({"label_keys": ["bad-name"]}, "label_keys"),
        ({"label_keys": ["__x"]}, "label_keys"),
        ({"action_grades": {"like": float("nan")}}, "action_grades"),
        ({"action_grades": {"like": 1e308}}, "action_grades"),
        ({"action_grades": {"judgment": 1}}, "action_grades"),
        ({"limits": {"max_items": 0}}, "limits.max_items"),
        ({"max_pending": 0}, "max_pending"),
        ({"windows": ["90s"]}, "windows"),
        ({"retention": "1m"}, "retention"),
        ({"histogram_bounds": [0.5, 0.1]}, "histogram_bounds"),
        ({"typo": 1}, "typo"),
        ({"statistics": {"alpha": 1.5}}, "statistics.alpha"),
        # 10**400 and 10**8 replicates ended `evald replay` with a traceback; an infinite
        # tuning_n, cusum_k or cusum_h was taken without a word
        ({"limits": {"max_items": 10**400}}, "limits.max_items"),
        ({"limits": {"max_labels": 10**400}}, "limits.max_labels"),
        ({"limits": {"max_string_length": 10**400}}, "limits.max_string_length"),
        ({"limits": {"max_event_bytes": 10**400}}, "limits.max_event_bytes"),
        ({"statistics": {"bootstrap_replicates": 10**8}}, "statistics.bootstrap_replicates"),
        ({"statistics": {"tuning_n": float("inf")}}, "statistics.tuning_n"),
        ({"statistics": {"cusum_k": float("inf")}}, "statistics.cusum_k"),
        ({"statistics": {"cusum_h": float("inf")}}, "statistics.cusum_h"),
        ({"interleaving": {"tuning_n": float("inf")}}, "interleaving.tuning_n"),
        ({"statistics": {"window": "10m", "comparisons": [AB]}}, "statistics.window"),
        ({"statistics": {"comparisons": [{**AB, "label": "color"}]}}, "statistics.comparisons.0"),
        ({"statistics": {"comparisons": [{**AB, "treatments": []}]}}, "statistics.comparisons.0"),
        (
            {"statistics": {"comparisons": [{**AB, "min_effect": {"nDCG@ten": 0.1}}]}},
            "statistics.comparisons.0.min_effect",
        ),
        (
            {"statistics": {"comparisons": [{**AB, "min_effect": {"RR": -1}}]}},
            "statistics.comparisons.0",
        ),
        ({"statistics": {"comparisons": [{**AB, "split": {"A": 1}}]}}, "statistics.comparisons.0"),
        (  # shares of 1e-600 and of a total past the largest float: 0, whose log warned
            {"statistics": {"comparisons": [{**AB, "split": {"A": 1e-300, "B": 1e300}}]}},
            "statistics.comparisons.0",
        ),
        (
            {"statistics": {"comparisons": [{**AB, "split": {"A": 1e308, "B": 1e308}}]}},
            "statistics.comparisons.0",
        ),
        (  # a subnormal share: its prior's log-gamma was infinite, the guard silently off
            {"statistics": {"comparisons": [{**AB, "split": {"A": 1e-311, "B": 1}}]}},
            "statistics.comparisons.0",
        ),
        ({"statistics": {"comparisons": [AB, AB]}}, "statistics"),
        (  # yes/yes was a 50/50 split
            {"statistics": {"comparisons": [{**AB, "split": {"A": True, "B": True}}]}},
            "statistics.comparisons.0.split: a number, not true or false",
        ),
        # arms no segment can ever hold: each was taken, the comparison waiting forever
        (
            {"label_value_cap": 1, "statistics": {"window": "5m", "comparisons": [AB]}},
            "statistics.comparisons.0: 2 arms, but label_value_cap",
        ),
        (
            {"max_segments": 1, "statistics": {"window": "5m", "comparisons": [AB]}},
            "statistics.comparisons.0: 2 arms",
        ),
        (
            {
                "limits": {"max_string_length": 2},
                "drilldown": {"max_query_length": 2},
                "statistics": {"window": "5m", "comparisons": [{**AB, "control": "ctl"}]},
            },
            "statistics.comparisons.0: arm 'ctl' is longer than limits.max_string_length",
        ),
        (
            {"statistics": {"window": "5m", "comparisons": [{**AB, "treatments": ["__other__"]}]}},
            "statistics.comparisons.0: arm '__other__'",
        ),
        (
            {"statistics": {"window": "5m", "comparisons": [{**AB, "treatments": [""]}]}},
            "statistics.comparisons.0: arm ''",
        ),
        (
            {"statistics": {"window": "5m", "comparisons": [{**AB, "arm_scoped_labels": ["arm"]}]}},
            "statistics.comparisons.0.arm_scoped_labels",
        ),
    ],
)
def test_errors_name_the_field(settings, field):
    with pytest.raises(ConfigError) as err:
        load_config(settings)
    assert str(err.value).startswith(field), str(err.value)


def test_replicates_past_a_share_records_numbers_are_refused_naming_the_largest_allowed():
    """One segment's row of a comparison share (M x (4 + 2B) numbers) and one credit cell
    (6 + 2B) are never cut across records: 10,000 replicates of 5 measures made a share record
    of 1.17 MB, which a statistics topic at Kafka's default refused in every session."""
    measures = ["nDCG@10", "RR", "P@10", "R@10", "AP@10"]
    comparing = {"comparisons": [AB], "window": "5m"}
    with pytest.raises(ConfigError) as err:
        load_config(measures=measures, statistics={**comparing, "bootstrap_replicates": 10_000})
    assert str(err.value).startswith("statistics.bootstrap_replicates: 10000 replicates")
    assert "at most 1198 with 5 measures" in str(err.value)
    load_config(measures=measures, statistics={**comparing, "bootstrap_replicates": 1198})
    with pytest.raises(ConfigError, match="at most 1198"):
        load_config(measures=measures, statistics={**comparing, "bootstrap_replicates": 1199})
    # without comparisons no share is written; with interleaving teams a credit cell is
    load_config(measures=measures, statistics={"bootstrap_replicates": 10_000})
    teams = {"teams": ["a", "b"]}
    with pytest.raises(ConfigError) as err:
        load_config(interleaving=teams, statistics={"bootstrap_replicates": 6000})
    assert str(err.value).startswith("statistics.bootstrap_replicates: 6000 replicates")
    assert "at most 5997" in str(err.value)
    load_config(interleaving=teams, statistics={"bootstrap_replicates": 5997})


@pytest.mark.parametrize("key", sorted(RESERVED_LABELS))
def test_reserved_label_keys_refused(key):
    with pytest.raises(ConfigError, match="reserved"):
        load_config(label_keys=[key])


def test_extra_actions_configurable():
    c = load_config(action_grades={"click": 1, "like": 0.5})
    assert c.action_grades == {"click": 1.0, "like": 0.5}


@pytest.mark.parametrize(
    ("text", "reason"),
    [(None, "No such file"), ("window: [5m", "not valid YAML"), ("- 5m\n", "must be a mapping")],
)
def test_settings_file_errors_name_the_file(tmp_path, text, reason):
    path = tmp_path / "engine.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=reason) as info:
        read_mapping_file(path)
    assert str(info.value).startswith(f"{path}: ")


def test_empty_settings_file_is_no_settings(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text("")
    assert read_mapping_file(path) == {}
    path.write_text("window: 5m\n")
    assert read_mapping_file(path) == {"window": "5m"}


def test_event_time_plausibility_and_watermark_quorum_settings():
    config = load_config()
    assert config.min_event_time == 946_684_800_000  # 2000-01-01T00:00:00Z
    assert config.max_event_lead == 3_600_000 and config.watermark_quorum == 32
    for spelling in (
        "2024-05-01",
        "2024-05-01T00:00:00Z",
        "2024-05-01t00:00:00z",
        1_714_521_600_000,
    ):
        assert load_config({"min_event_time": spelling}).min_event_time == 1_714_521_600_000
    assert load_config({"max_event_lead": None}).max_event_lead is None
    assert load_config({"max_event_lead": "3h", "watermark_quorum": 8}).watermark_quorum == 8
    assert load_config({"watermark_quorum": 1}).watermark_quorum == 1
    for settings, field in [
        ({"min_event_time": "soon"}, "min_event_time"),
        ({"min_event_time": -1}, "min_event_time"),
        ({"min_event_time": "2024-05-01T00:00:00"}, "min_event_time"),  # no offset
        ({"max_event_lead": "-1h"}, "max_event_lead"),
        ({"watermark_quorum": 0}, "watermark_quorum"),
        ({"watermark_quorum": 1025}, "watermark_quorum"),  # its block goes into checkpoints
        ({"watermark_quorum": 2.5}, "watermark_quorum"),
        ({"watermark_quorum": None}, "watermark_quorum"),
        ({"watermark_jump": "1h"}, "watermark_jump"),  # replaced by watermark_quorum
    ]:
        with pytest.raises(ConfigError) as info:
            load_config(settings)
        assert str(info.value).startswith(f"{field}:"), info.value


def test_measures_split_at_top_level_commas_only():
    config = load_config(measures="nDCG(gains={1:3,2:9})@10,RR")
    assert len(config.measures) == 2 and config.measures[1] == "RR"
    assert load_config(measures="P@5,P@10").measures == ["P@5", "P@10"]


def test_an_aggregate_only_measure_is_refused_naming_what_to_export():
    with pytest.raises(ConfigError, match=r"GMAP.*geometric mean of AP: export AP"):
        load_config(measures="nDCG@10,GMAP")


COMPARISON = {"name": "ab", "label": "arm", "control": "c", "treatments": ["t"], "start": 0}


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            {"comparisons": [COMPARISON]},
            "comparisons: unknown setting (did you mean statistics.comparisons? it belongs there)",
        ),
        (
            {"statistics": {"comparisons": [{**COMPARISON, "treatment": ["t"]}]}},
            "statistics.comparisons.0.treatment: unknown setting "
            "(did you mean statistics.comparisons.0.treatments?)",
        ),
        (
            {"statistics": {"comparisons": [{**COMPARISON, "alpha": 0.1}]}},
            "statistics.comparisons.0.alpha: unknown setting "
            "(did you mean statistics.alpha? it belongs there)",
        ),
        (
            {"statistics": {"control": "c"}},
            "statistics.control: unknown setting "
            "(did you mean statistics.comparisons[].control? it belongs there)",
        ),
        ({"statistcs": {}}, "statistcs: unknown setting (did you mean statistics?)"),
        ({"colour": 1}, "colour: unknown setting"),
    ],
)
def test_an_unknown_setting_gets_the_nearest_one_or_where_it_belongs(settings, line):
    with pytest.raises(ConfigError) as err:
        load_config(settings)
    assert line in str(err.value).splitlines()


def test_evald_run_settings_given_as_engine_settings_say_so():
    with pytest.raises(ConfigError, match="the contents of an `evald run` settings file's engine"):
        load_config({"engine": {"statistics": {}}})


def test_the_statistics_block_of_the_settings_reference_is_valid():
    """docs/semantics.md §7's example loads as engine settings, every field it lists exists."""
    import re
    from pathlib import Path

    import yaml

    from evald.config import ComparisonConfig, StatisticsConfig

    text = (Path(__file__).resolve().parents[1] / "docs/semantics.md").read_text()
    (block,) = re.findall(r"```yaml\n(label_keys:.*?)```", text, re.DOTALL)
    (comparison,) = load_config(yaml.safe_load(block)).statistics.comparisons
    assert comparison.treatments == ["treatment"] and comparison.arm_scoped_labels == ["model"]
    section = text[text.index("### The `statistics` block") :]
    listed = set(re.findall(r"^\| `(?:comparisons\[\]\.)?(\w+)`", section, re.MULTILINE))
    listed |= {"treatments", "cusum_h", "comparisons"}  # beside control, cusum_k; the list
    fields = set(StatisticsConfig.model_fields) | set(ComparisonConfig.model_fields)
    assert fields == listed
