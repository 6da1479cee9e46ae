"""Ctrl-C (SIGINT) makes `evald run` leave its consumer group before it exits, so a restart or
the other instances get its partitions at once instead of after the session timeout (docs/
daemon.md, "What a restart waits for"). The negative control: an instance killed with SIGKILL
sends nothing, and the coordinator still lists it as a member right after it died."""

from __future__ import annotations

import signal
from collections.abc import Callable

from kafka_harness import Broker, KafkaTools, wait_until
from kafka_instances import Instance, group_state, names


def test_sigint_leaves_the_group_and_sigkill_does_not(
    broker: Broker,
    kafka_tools: KafkaTools,
    unique: str,
    instances: Callable[..., Instance],
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    group, bootstrap = f"g-{unique}", broker.bootstrap
    for sig, left in ((signal.SIGINT, True), (signal.SIGKILL, False)):
        inst = instances(instance=f"i-{sig.name}")

        def ready(inst: Instance = inst) -> bool:
            return inst.get("/readyz")[0] == 200

        wait_until(ready, 90, "evald run to be ready")
        assert group_state(bootstrap, group) == ("Stable", 1)
        inst.proc.send_signal(sig)
        status = inst.proc.wait(40)
        # asked at once: the harness's session timeout (6 s) has not run out for a member
        # that did not leave
        state, count = group_state(bootstrap, group)
        if left:
            assert status == 0
            assert (state, count) == ("Empty", 0), (state, inst.log_path.read_text()[-2000:])
        else:
            assert status == -signal.SIGKILL
            assert count == 1, state
            # the coordinator drops it when its session times out
            wait_until(lambda: group_state(bootstrap, group)[1] == 0, 60, "the dead one to expire")
