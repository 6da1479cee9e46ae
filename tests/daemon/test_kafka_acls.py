"""`evald run` as a real process against a broker that checks ACLs (the session's ``acl_broker``):
whatever the broker denies, evald exits 2 with the resource, the operation and the
`kafka-acls.sh` line that grants it, is never ready meanwhile, and does not flood its log.

Every client here is ``User:ANONYMOUS`` (plaintext). The broker allows everything on a resource
no ACL names, so each test names only its own topics, group or transactional ids: "allow all,
deny X" on a topic is what an operator's grant that forgot X amounts to.
"""

from __future__ import annotations

import time

import pytest
from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import Instance, names, run_argv, run_to_exit

from evald.daemon.names import transactional_id

pytestmark = pytest.mark.kafka

ANONYMOUS = "User:ANONYMOUS"


def set_acls(bootstrap: str, resource: tuple[str, str], deny: tuple[str, ...]) -> None:
    """Allow everything on ``resource`` (type, name; a ``prefix*`` name is a prefixed pattern)
    except the ``deny`` operations."""
    from kafka import KafkaAdminClient
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourceType,
    )

    kind, name = resource
    pattern_type = ACLResourcePatternType.LITERAL
    if name.endswith("*"):
        name, pattern_type = name[:-1], ACLResourcePatternType.PREFIXED
    pattern = ResourcePattern(ResourceType[kind], name, pattern_type)
    wanted = [(ACLOperation.ALL, ACLPermissionType.ALLOW)]
    wanted += [(ACLOperation[op], ACLPermissionType.DENY) for op in deny]
    acls = [ACL(ANONYMOUS, "*", op, permission, pattern) for op, permission in wanted]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        created = admin.create_acls(acls)
    finally:
        admin.close()
    assert not created["failed"], created


def loud_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]


@pytest.mark.parametrize(
    ("kind", "deny", "said"),
    [
        ("results", ("ALL",), "Describe, Read and Write on topic"),
        ("results", ("WRITE",), "Write on topic"),
        ("feedback", ("DESCRIBE", "READ"), "Describe and Read on topic"),
        ("feedback", ("READ",), "Read on topic"),
    ],
    ids=[
        "results-no-access",
        "results-no-write",
        "feedback-no-describe-no-read",
        "feedback-no-read",
    ],
)
def test_a_topic_evald_may_not_use_is_refused_at_start_with_the_grant(
    kind: str, deny: tuple[str, ...], said: str, acl_broker: Broker, unique: str
) -> None:
    """Before: no access to the results topic left evald ready with no result and hundreds of
    ERROR lines; with Write denied it retried forever; a feedback topic it may not describe
    was reported as missing. (The results topic does not exist yet: evald creates it.)"""
    topics = names(unique)
    KafkaTools(acl_broker.bootstrap).create({topics["impressions"]: 1, topics["feedback"]: 1})
    set_acls(acl_broker.bootstrap, ("TOPIC", topics[kind]), deny)
    proc = run_to_exit(run_argv(acl_broker.bootstrap, unique, "127.0.0.1:0"))
    assert proc.returncode == 2, proc.stderr
    text = proc.stderr
    assert f"the broker denies evald's principal ({ANONYMOUS}) {said} {topics[kind]}" in text
    grant = (
        f"kafka-acls.sh --bootstrap-server {acl_broker.bootstrap} --add --allow-principal "
        f"'{ANONYMOUS}' --operation "
    )
    assert grant in text and f"--topic {topics[kind]};" in text
    assert "does not exist" not in text
    assert "evald.daemon: ready " not in text  # never ready ("ready 0.8s after start")
    assert len(loud_lines(text)) <= 3, text


def test_write_denied_while_running_exits_2_at_the_next_send(
    acl_broker: Broker, unique: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Before: /readyz turned 503 and the session was retried forever ("Cannot perform send
    because at least one previous transactional or idempotent request has failed")."""
    tools = KafkaTools(acl_broker.bootstrap)
    topics = names(unique)
    tools.create({topics["impressions"]: 1, topics["feedback"]: 1})
    tools.produce_sim(topics["impressions"], topics["feedback"], events=600, seed=31)
    inst = Instance(acl_broker.bootstrap, unique, "a", tmp_path_factory.mktemp("acl-write"))
    try:
        wait_until(lambda: inst.lag_zero(1), 90, "the daemon to catch up")
        set_acls(acl_broker.bootstrap, ("TOPIC", topics["results"]), ("WRITE",))
        denied_at = time.monotonic()
        before = len(inst.log_path.read_text(errors="replace"))
        tools.produce_sim(
            topics["impressions"], topics["feedback"], events=1500, seed=31, skip=1500
        )
        wait_until(lambda: inst.proc.poll() is not None, 60, "evald to exit")
        took = time.monotonic() - denied_at
    finally:
        inst.close()
    assert inst.proc.returncode == 2
    text = inst.log_path.read_text(errors="replace")[before:]
    assert f"denies evald's principal ({ANONYMOUS}) Write on topic {topics['results']}" in text
    assert f"--operation Write --topic {topics['results']};" in text
    assert "Traceback" not in text
    assert len(loud_lines(text)) <= 10, text
    print(f"Write denied on the results topic while running: exit 2 after {took:.1f}s")


def test_a_transactional_id_denied_exits_2_with_the_prefixed_grant(
    acl_broker: Broker, unique: str
) -> None:
    """An operator who forgot the transactional-id grant (every id of the group denied)."""
    topics = names(unique)
    KafkaTools(acl_broker.bootstrap).create({topics["impressions"]: 1, topics["feedback"]: 1})
    prefix = transactional_id(f"g-{unique}", "")  # every id of the group: evald/g-…/
    set_acls(acl_broker.bootstrap, ("TRANSACTIONAL_ID", f"{prefix}*"), ("WRITE",))
    proc = run_to_exit(run_argv(acl_broker.bootstrap, unique, "127.0.0.1:0"))
    assert proc.returncode == 2, proc.stderr
    text = proc.stderr
    assert "TransactionalIdAuthorizationFailedError" in text
    assert f"Write on its transactional id {prefix}" in text
    assert f"--transactional-id '{prefix}' --resource-pattern-type prefixed" in text
