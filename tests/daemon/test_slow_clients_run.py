"""Slow clients against `evald run` on Apache Kafka: while ~20k half-sent requests are open,
/metrics, /healthz and /readyz answer, the process holds them without a thread each, and the
consumer keeps consuming and stays in its group (the old server starved the Kafka client's I/O
thread, a heartbeat risk)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path

from child_processes import die_with_parent
from kafka_harness import ENGINE, Broker, KafkaTools, free_port, wait_until
from kafka_instances import names, run_argv
from kafka_oracle import results_by_id
from slow_clients import get, open_slow, proc_status, raise_own_fd_limit

from evald.http import Limits


def test_evald_run_answers_and_keeps_consuming_under_many_slow_connections(
    broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    port = free_port()
    with (tmp_path / "run.log").open("wb") as log:
        argv = run_argv(broker.bootstrap, unique, f"127.0.0.1:{port}")
        for key, value in ENGINE.items():  # a one-minute window: results within seconds
            argv += ["--set", f"engine.{key}={json.dumps(value)}"]
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
    try:

        def answers(path: str) -> bool:
            with contextlib.suppress(OSError):
                return get(port, path)[0] == 200
            return False

        wait_until(lambda: answers("/readyz"), 90, "evald run to be ready")
        count = min(20_000, raise_own_fd_limit() - 200)
        socks = open_slow(port, count)
        try:
            # records produced while the slow clients hold their connections are scored
            kafka_tools.produce_sim(
                topics["impressions"], topics["feedback"], events=3000, seed=5, clean=True
            )
            wait_until(
                lambda: len(results_by_id(kafka_tools, topics["results"])) > 0,
                120,
                "results while the slow clients are connected",
            )
            for path in ("/metrics", "/healthz", "/readyz"):
                status, body = get(port, path)
                assert status == 200, (path, body[:200])
            threads, files = proc_status(proc.pid)
            # the daemon's own threads (loop, Kafka clients, endpoint): not one per connection
            assert threads < 48, threads
            assert files <= Limits().max_connections + 128, files
            # one assignment of partitions (an empty one may come first, before the topics'
            # metadata) and no revocation: the group session outlived the flood
            log_text = (tmp_path / "run.log").read_text()
            given = re.findall(r"partitions \[\d[^\]]*\] assigned", log_text)
            assert len(given) == 1, log_text[-3000:]
            taken = re.findall(r"partitions \[\d[^\]]*\] (?:revoked|lost)", log_text)
            assert not taken, log_text[-3000:]
        finally:
            for sock in socks:
                sock.close()
        assert get(port, "/readyz")[0] == 200
    finally:
        proc.terminate()
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
