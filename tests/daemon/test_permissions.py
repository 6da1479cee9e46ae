"""What evald needs on each Kafka resource and what it says when one is denied (permissions.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)

from evald.daemon.permissions import (
    denied_topics,
    explain_denial,
    principal,
    topic_needs,
    unauthorized,
)
from evald.daemon.settings import Settings, load_settings

TOPICS = {"impressions": "imp", "feedback": "fb", "results": "res", "dlq": "dlq"}
COMPARISONS = [{"name": "ab", "label": "arm", "control": "c", "treatments": ["t"], "start": 0}]
GRANT = "kafka-acls.sh --bootstrap-server k1:9092 --add --allow-principal 'User:ANONYMOUS'"


def settings(**flags: Any) -> Settings:
    kafka = {"bootstrap_servers": ["k1:9092", "k2:9092"], **flags.pop("kafka", {})}
    base = {"topics": TOPICS, "kafka": kafka, "daemon": {"group_id": "g", "instance_id": "i-0"}}
    return load_settings(environ={}, flags={**base, **flags})


def test_every_topic_of_the_main_stage_with_its_operations() -> None:
    needs = {need.topic: need.operations for need in topic_needs(settings())}
    assert needs == {
        "imp": ("DESCRIBE", "READ"),
        "fb": ("DESCRIBE", "READ"),
        "res": ("DESCRIBE", "READ", "WRITE"),
        "res.checkpoints": ("DESCRIBE", "READ", "WRITE"),
        "dlq": ("DESCRIBE", "WRITE"),
    }
    with_comparisons = settings(engine={"statistics": {"comparisons": COMPARISONS}})
    topics = [need.topic for need in topic_needs(with_comparisons)]
    assert topics[-1] == "res.checkpoints.statistics"
    # interleaving teams alone: the daemon writes and folds the credit shares there too
    with_teams = settings(engine={"interleaving": {"teams": ["A", "B"]}})
    last = topic_needs(with_teams)[-1]
    assert (last.setting, last.topic) == ("interleaving.teams", "res.checkpoints.statistics")
    assert last.operations == ("DESCRIBE", "READ", "WRITE")


def test_the_principal_as_the_broker_sees_it() -> None:
    assert principal(settings()) == "User:ANONYMOUS"
    sasl = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "evald-prod",
        "sasl_password": "x",
    }
    assert principal(settings(kafka=sasl)) == "User:evald-prod"
    ssl = {"security_protocol": "SSL", "ssl_certfile": "/etc/evald/cert.pem"}
    assert "client certificate" in principal(settings(kafka=ssl))


def test_missing_operations_are_named_with_the_line_that_grants_them() -> None:
    said = unauthorized(
        settings(),
        {
            "imp": frozenset({"DESCRIBE", "READ", "WRITE"}),
            "fb": frozenset(),  # the broker refused to describe it
            "res": frozenset({"DESCRIBE", "READ"}),
            "dlq": None,  # not reported: nothing is known to be missing
        },
    )
    assert len(said) == 2
    fb, res = said
    assert "denies evald's principal (User:ANONYMOUS) Describe and Read on topic fb" in fb
    assert f"{GRANT} --operation Describe --operation Read --topic fb;" in fb
    assert "Write on topic res (topics.results: evald writes the results" in res
    assert f"grant it: {GRANT} --operation Write --topic res;" in res
    assert "a DENY ACL overrides any grant" in res


def test_a_denied_request_names_what_the_broker_reports_missing() -> None:
    error = TopicAuthorizationFailedError({"res"})
    assert denied_topics(error) == {"res"}
    # what the broker reports now: only Write is missing
    exact = explain_denial(settings(), error, {"res": frozenset({"DESCRIBE", "READ"})})
    assert exact.startswith("TopicAuthorizationFailedError: the broker denies")
    assert "Write on topic res" in exact and "Read" not in exact.split("topic res")[0]
    # nothing reported (the broker could not be asked): every operation evald needs there
    assert "Describe, Read and Write on topic res" in explain_denial(settings(), error)
    # kafka-python's metadata log names topics in its message only
    assert denied_topics(TopicAuthorizationFailedError("Topic 'fb' is not authorized")) == {"fb"}


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (GroupAuthorizationFailedError(), "Read on its consumer group g (daemon.group_id)"),
        (GroupAuthorizationFailedError(), f"{GRANT} --operation Read --group g"),
        (
            TransactionalIdAuthorizationFailedError(),
            "Write on its transactional id evald/g/i-0; grant Write and Describe",
        ),
        (
            TransactionalIdAuthorizationFailedError(),
            "--transactional-id 'evald/g/' --resource-pattern-type prefixed",
        ),
        (ClusterAuthorizationFailedError(), "Describe and Write on the dead-letter topic"),
        (TopicAuthorizationFailedError({"unknown"}), "Read on both input topics"),
    ],
)
def test_group_transactional_id_and_other_denials(error: Any, said: str) -> None:
    assert said in explain_denial(settings(), error)
