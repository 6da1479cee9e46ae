"""Transactional ids: one per (group, instance, stage), never shared by two deployments."""

from __future__ import annotations

import itertools

from evald.daemon.names import transactional_id
from evald.daemon.settings import load_settings


def test_a_separator_inside_a_part_does_not_make_two_groups_share_an_id() -> None:
    """Group ``g-a`` with instance ``b`` and group ``g`` with instance ``a-b`` fenced each
    other when the parts were joined by ``-``."""
    assert transactional_id("g-a", "b") != transactional_id("g", "a-b")
    assert transactional_id("g/a", "b") != transactional_id("g", "a/b")
    assert transactional_id("g%2Fa", "b") != transactional_id("g/a", "b")


def test_no_instance_takes_another_instances_repartition_id() -> None:
    """Instance ``a``'s repartition stage and instances named after it (``a-repartition``,
    ``a/repartition``) have ids of their own, so no instance id needs to be refused."""
    stage = transactional_id("g", "a", repartition=True)
    for name in ("a-repartition", "a/repartition", "a%2Frepartition", "a"):
        assert transactional_id("g", name) != stage
    settings = load_settings(
        environ={"EVALD_DAEMON__GROUP_ID": "g", "EVALD_DAEMON__INSTANCE_ID": "a-repartition"},
        validate_engine=False,
    )
    assert settings.daemon.transactional_id() != stage


def test_distinct_parts_give_distinct_ids() -> None:
    """Over parts built from the separator, the escape and the stage name, every (group,
    instance, stage) has an id of its own."""
    pieces = ["", "a", "-", "/", "%", "%2F", "%25", "repartition"]
    parts = {"".join(p) for p in itertools.product(pieces, repeat=2)} - {""}
    seen: dict[str, tuple[str, str, bool]] = {}
    for group, instance, stage in itertools.product(sorted(parts), sorted(parts), (False, True)):
        tid = transactional_id(group, instance, repartition=stage)
        assert seen.setdefault(tid, (group, instance, stage)) == (group, instance, stage), tid


def test_ids_are_stable() -> None:
    """Golden values: a change of scheme changes every deployment's ids (docs/daemon.md,
    "Transactional ids" says what an operator sees then), so it must be deliberate."""
    assert transactional_id("evald-prod", "evald-0") == "evald/evald-prod/evald-0"
    assert (
        transactional_id("evald-prod", "evald-0", repartition=True)
        == "evald/evald-prod/evald-0/repartition"
    )
    assert transactional_id("a/b%", "c") == "evald/a%2Fb%25/c"
    settings = load_settings(
        environ={"EVALD_DAEMON__GROUP_ID": "g-a", "EVALD_DAEMON__INSTANCE_ID": "b"},
        validate_engine=False,
    )
    assert settings.daemon.transactional_id() == "evald/g-a/b"
    assert settings.daemon.transactional_id(repartition=True) == "evald/g-a/b/repartition"


def test_every_topic_and_member_name_is_derived_from_strings_as_before() -> None:
    """The names the settings and the stages use come from names.py, spelled as they always
    were (a renamed topic would strand the checkpoints and shares already written)."""
    from evald.daemon.main.comparisons import statistics_topic as of_settings
    from evald.daemon.names import (
        checkpoint_topic,
        internal_topic,
        repartition_group,
        repartition_member,
        statistics_topic,
    )

    assert checkpoint_topic("evald.results", None) == "evald.results.checkpoints"
    assert checkpoint_topic("evald.results", "cp") == "cp"
    assert statistics_topic("cp") == "cp.statistics"
    assert repartition_group("g") == "g.repartition"
    assert repartition_member("evald-0") == "evald-0-repartition"
    assert internal_topic("g", "t") == "g.t.evald-repartition"
    settings = load_settings(environ={"EVALD_TOPICS__RESULTS": "res"}, validate_engine=False)
    assert settings.topics.checkpoint_topic == "res.checkpoints"
    assert of_settings(settings.topics) == "res.checkpoints.statistics"
