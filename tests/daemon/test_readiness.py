"""/readyz explains a transient wait by the error being retried, not a generic state."""

from __future__ import annotations

import threading
import time

from kafka_harness import free_port

from evald.daemon.main.runner import Daemon
from evald.daemon.settings import load_settings
from evald.engine import Engine


def test_readyz_names_the_error_being_retried() -> None:
    settings = load_settings(
        environ={},
        flags={
            # nothing listens there: every session fails to connect
            "kafka": {"bootstrap_servers": f"127.0.0.1:{free_port()}", "request_timeout_ms": 1000},
            "topics": {"impressions": "i", "feedback": "f", "results": "r", "dlq": "d"},
            "daemon": {
                "group_id": "g",
                "instance_id": "a",
                "metrics_address": "127.0.0.1:0",
                "retry_backoff_initial_ms": 100,
                "retry_backoff_max_ms": 200,
            },
        },
    )
    config = settings.engine_config()
    daemon = Daemon(settings, lambda on_result: Engine(config, on_result=on_result))
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(daemon.run()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not daemon.ready()[1].startswith("retrying after"):
            assert time.monotonic() < deadline, daemon.ready()
            time.sleep(0.1)
        ready, reason = daemon.ready()
        assert not ready
        assert "Error" in reason  # the exception's name, e.g. KafkaConnectionError
    finally:
        daemon.stop()
        thread.join(timeout=60)
    assert status == [0]
