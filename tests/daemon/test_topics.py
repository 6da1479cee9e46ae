"""TopicGuard against a stand-in admin client: what it refuses at start and while running (the
Kafka tests run the same through `evald run`: test_kafka_topic_faults.py, test_kafka_acls.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from settable_clock import SettableClock

from evald.daemon.fatal import Fatal
from evald.daemon.settings import Settings, load_settings
from evald.daemon.topics import TOPIC_CHECK_INTERVAL_S, TopicGuard, ensure_statistics_topic

ALL = frozenset({"DESCRIBE", "READ", "WRITE", "CREATE", "DELETE", "ALTER"})
DENIED = "denied"  # the broker refuses to describe the topic (TOPIC_AUTHORIZATION_FAILED)


class Admin:
    """Topics by name: (topic id, partitions, authorized operations or DENIED)."""

    def __init__(self, topics: dict[str, tuple[str, int, Any]]) -> None:
        self.topics = dict(topics)
        #: what a created topic is authorized for (the principal's ACLs on its name)
        self.created_ops: frozenset[str] = ALL
        self.created: list[str] = []

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        out = []
        for name in names:
            if name not in self.topics:
                out.append({"name": name, "error_code": 3, "partitions": []})
                continue
            topic_id, partitions, ops = self.topics[name]
            if ops == DENIED:
                out.append({"name": name, "error_code": 29, "partitions": []})
                continue
            out.append(
                {
                    "name": name,
                    "error_code": 0,
                    "topic_id": topic_id,
                    "partitions": [{}] * partitions,
                    "authorized_operations": sorted(ops),
                }
            )
        return out

    def create_topics(self, new: list[Any]) -> None:
        for topic in new:
            self.topics[topic.name] = (f"id-{topic.name}", topic.num_partitions, self.created_ops)
            self.created.append(topic.name)

    def wait_for_topics(self, names: list[str], timeout_ms: int) -> None:
        pass

    def describe_configs(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


def settings() -> Settings:
    topics = {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"}
    return load_settings(environ={}, flags={"topics": topics, "daemon": {"group_id": "g"}})


def inputs(ops: Any = ALL) -> dict[str, tuple[str, int, Any]]:
    return {"imp": ("id-imp", 3, ops), "fb": ("id-fb", 3, ops)}


def test_a_topic_it_may_not_describe_is_not_called_missing() -> None:
    admin = Admin({**inputs(), "fb": ("id-fb", 3, DENIED)})
    with pytest.raises(Fatal, match="refusing to start: the broker denies") as info:
        TopicGuard(settings(), SettableClock()).start(admin)
    assert "Describe and Read on topic fb (topics.feedback" in str(info.value)
    assert "does not exist" not in str(info.value) and not admin.created


def test_an_output_it_creates_but_may_not_write_is_refused_before_it_is_used() -> None:
    admin = Admin(inputs())
    admin.created_ops = frozenset({"DESCRIBE", "READ", "CREATE"})
    with pytest.raises(Fatal, match="Write on topic res ") as info:
        TopicGuard(settings(), SettableClock()).start(admin)
    assert admin.created == ["res", "res.checkpoints", "dlq"]
    assert "Write on topic res.checkpoints" in str(info.value)


def test_outputs_deleted_or_recreated_while_running_stop_it() -> None:
    clock = SettableClock()
    admin = Admin(inputs())
    guard = TopicGuard(settings(), clock)
    guard.start(admin)
    assert guard.topic_ids() == {"imp": "id-imp", "fb": "id-fb", "res": "id-res"}
    del admin.topics["res"]
    guard.recheck(admin, clock())  # checked at start: not due yet
    clock.now += TOPIC_CHECK_INTERVAL_S
    with pytest.raises(Fatal, match="stopping: output topic res was deleted while evald ran"):
        guard.recheck(admin, clock())
    # a commit waiting in a rebalance callback (another thread) never uses the admin client
    clock.now += TOPIC_CHECK_INTERVAL_S
    raised: list[BaseException] = []

    def elsewhere() -> None:
        try:
            guard.recheck(admin, clock(), 0.0)
        except BaseException as exc:
            raised.append(exc)

    other = threading.Thread(target=elsewhere)
    other.start()
    other.join()
    assert raised == []
    # the next session in this process: the results topic is not created again
    with pytest.raises(Fatal, match="refusing to start: output topic res was deleted"):
        guard.start(admin)
    admin.topics["res"] = ("id-new", 3, ALL)  # recreated by someone
    with pytest.raises(Fatal, match=r"res was deleted and recreated \(topic id id-res -> id-new"):
        guard.start(admin)


def test_a_checkpoint_against_another_results_topic_is_refused_at_restore() -> None:
    guard = TopicGuard(settings(), SettableClock())
    guard.start(Admin({**inputs(), "res": ("id-new", 3, ALL)}))
    guard.check_checkpoint({"imp": "id-imp", "res": "id-new"}, 0)
    guard.check_checkpoint({"imp": "id-imp"}, 0)  # written before results ids were kept
    with pytest.raises(Fatal, match="results topic res was deleted and recreated since the"):
        guard.check_checkpoint({"imp": "id-imp", "res": "id-old"}, 2)


def test_a_permission_lost_while_running_stops_it() -> None:
    clock = SettableClock()
    admin = Admin(inputs())
    guard = TopicGuard(settings(), clock)
    guard.start(admin)
    admin.topics["imp"] = ("id-imp", 3, frozenset({"DESCRIBE"}))
    clock.now += TOPIC_CHECK_INTERVAL_S
    with pytest.raises(Fatal, match=r"stopping: the broker denies .* Read on topic imp"):
        guard.recheck(admin, clock())


def test_a_dead_letter_topic_deleted_while_running_ends_the_session_to_create_it_again() -> None:
    """evald never reads the DLQ back: a new session creates it again (daemon.md)."""
    from kafka.errors import KafkaError

    clock = SettableClock()
    admin = Admin(inputs())
    guard = TopicGuard(settings(), clock)
    guard.start(admin)
    del admin.topics["dlq"]
    clock.now += TOPIC_CHECK_INTERVAL_S
    with pytest.raises(KafkaError, match="dead-letter topic dlq was deleted; recreating it"):
        guard.recheck(admin, clock())
    admin.created.clear()
    guard.start(admin)  # the next session
    assert admin.created == ["dlq"]


def test_a_topic_the_broker_cannot_describe_yet_is_not_taken_for_deleted() -> None:
    """Only UNKNOWN_TOPIC_OR_PARTITION means missing; another topic error (a topic being
    created answers LEADER_NOT_AVAILABLE) skips the check instead of stopping evald."""
    from kafka.errors import KafkaError

    clock = SettableClock()
    admin = Admin(inputs())
    guard = TopicGuard(settings(), clock)
    guard.start(admin)
    described = admin.describe_topics
    admin.describe_topics = lambda names: [  # type: ignore[method-assign]
        {**d, "error_code": 5} if d["name"] == "res" else d for d in described(names)
    ]
    clock.now += TOPIC_CHECK_INTERVAL_S
    guard.recheck(admin, clock())  # skipped (logged at debug), not a Fatal
    with pytest.raises(KafkaError, match="describing topic res: error code 5"):
        guard.start(admin)  # a session start retries later


def test_the_statistics_topic_is_created_with_kafkas_default_limit_whatever_the_brokers() -> None:
    """A share record is about 250 KiB: a broker whose message.max.bytes is smaller would give
    the created topic a limit that refuses it in every session."""
    created: list[Any] = []

    class StatisticsAdmin:
        def list_topics(self) -> list[str]:
            return []

        def create_topics(self, new: list[Any]) -> None:
            created.extend(new)

    ensure_statistics_topic(StatisticsAdmin(), "stats", 600_000)  # type: ignore[arg-type]
    (topic,) = created
    assert topic.topic_configs == {"cleanup.policy": "compact", "max.message.bytes": "1048588"}
    # settings whose labels make a record larger than Kafka's default get a topic that takes it
    ensure_statistics_topic(StatisticsAdmin(), "big", 2_000_000)  # type: ignore[arg-type]
    assert created[1].topic_configs["max.message.bytes"] == "2000000"


class LimitedAdmin(Admin):
    """Topics with a ``max.message.bytes`` each (Kafka's default where not given), the
    statistics topic existing and compacted."""

    def __init__(self, topics: dict[str, tuple[str, int, Any]], limits: dict[str, int]) -> None:
        super().__init__(topics)
        self.limits = limits

    def list_topics(self) -> list[str]:
        return list(self.topics)

    def describe_configs(self, resources: list[Any], **kwargs: Any) -> dict[str, Any]:
        name = resources[0].name
        configs = {"cleanup.policy": {"value": "compact"}}
        if name in self.limits:
            configs["max.message.bytes"] = {"value": str(self.limits[name])}
        return {"topic": {name: configs}}


def test_the_producers_batches_stay_under_the_statistics_topics_limit() -> None:
    """The commit transaction writes the shares with the results: a statistics topic accepting
    less than the 512 KiB batch refused the batch of several shares, in every session."""
    from evald.daemon.record_limits import statistics_bytes

    limit = statistics_bytes(settings().engine_config()) + 10_000
    admin = LimitedAdmin({**inputs(), "stats": ("id-stats", 1, ALL)}, {"stats": limit})
    limits = TopicGuard(settings(), SettableClock(), "stats").start(admin)
    assert limits.statistics == limit
    assert limits.batch_bytes(512 * 1024) < limit


def test_a_statistics_topic_below_a_full_share_record_exits_2_at_start() -> None:
    """A share of CELLS_PER_RECORD sums is cut no further: the broker would refuse its
    transaction in every session."""
    from evald.daemon.record_limits import statistics_bytes

    need = statistics_bytes(settings().engine_config())

    admin = LimitedAdmin({**inputs(), "stats": ("id-stats", 1, ALL)}, {"stats": need - 1})
    with pytest.raises(Fatal) as raised:
        TopicGuard(settings(), SettableClock(), "stats").start(admin)
    assert raised.value.status == 2
    assert f"statistics topic stats accepts records of at most {need - 1}" in str(raised.value)
    assert f"max.message.bytes={need}" in str(raised.value)


def test_a_statistics_topic_at_a_records_numbers_alone_exits_2_at_start() -> None:
    """308,340 bytes (a record's numbers, its labels left out) was the need: a topic there
    started, then refused a share record holding labels in every session."""
    from evald.daemon.record_limits import statistics_bytes

    comparison = {"name": "ab", "label": "arm", "control": "c", "treatments": ["t"], "start": 0}
    flags = {
        "topics": {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"},
        "daemon": {"group_id": "g"},
        "engine": {"statistics": {"comparisons": [comparison]}},
    }
    comparing = load_settings(environ={}, flags=flags)
    admin = LimitedAdmin({**inputs(), "stats": ("id-stats", 1, ALL)}, {"stats": 308_340})
    with pytest.raises(Fatal) as raised:
        TopicGuard(comparing, SettableClock(), "stats").start(admin)
    need = statistics_bytes(comparing.engine_config())
    assert raised.value.status == 2 and f"max.message.bytes={need}" in str(raised.value)
