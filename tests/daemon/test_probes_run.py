"""/healthz and /readyz of a real `evald run` on Apache Kafka keep answering while 50 clients
send a wrong password and 50 scrapers hammer /metrics with the right one (issue 22, item 10).

With bcrypt checks on the two threads that also answered the probes, 50 wrong-password clients
made /healthz take 4.6-7.3 s, past the shipped liveness timeout. tests/test_http_probes.py holds
the server's slow work still in-process; this runs the whole process with a bcrypt hash of cost
13 (each check a few tenths of a second of a core or more) and asks only that each probe is
answered, with its status, within a generous bound: no assertion on latency (``python -m
benchmarks probes`` measures it). Before the probes had a thread of their own (commit b3178d4)
every wrong password was checked again on those two threads, and the probes waited behind up to
50 checks: this test failed there with probes left unanswered for 10 s.
"""

from __future__ import annotations

import base64
import http.client
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import bcrypt
import yaml
from child_processes import die_with_parent
from kafka_harness import Broker, KafkaTools, free_port, wait_until
from kafka_instances import names, run_argv

#: a probe not answered within this is a failure (a kubelet gives up after 3 s)
PROBE_S = 10.0
#: a client's bound: its first answer waits for a bcrypt check, one at a time
CLIENT_S = 30.0
USER, PASSWORD = "prometheus", "right"
WRONG_CLIENTS, SCRAPERS, PROBE_ROUNDS = 50, 50, 20


def request(
    port: int, path: str, password: str | None = None, timeout: float = PROBE_S
) -> tuple[int, str | None]:
    """One GET on a fresh connection: the status and the Retry-After header (if any)."""
    headers = {"Connection": "close"}
    if password is not None:
        token = base64.b64encode(f"{USER}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("Retry-After")
    finally:
        conn.close()


class Clients:
    """Threads that GET /metrics over and over until stopped, counting the answers (status,
    Retry-After) per kind and the requests that got none."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: dict[str, Counter[tuple[int, str | None]]] = {}
        self.failures: list[str] = []
        self.waiting = 0  # threads not answered yet
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, kind: str, passwords: list[str]) -> None:
        """One thread per password in ``passwords``."""
        self.answers[kind] = Counter()
        for password in passwords:
            thread = threading.Thread(target=self._loop, args=(kind, password), daemon=True)
            self._threads.append(thread)
            with self._lock:
                self.waiting += 1
            thread.start()

    def _loop(self, kind: str, password: str) -> None:
        first = True
        while not self._stop.is_set():
            try:
                answer = request(self.port, "/metrics", password, CLIENT_S)
            except OSError as exc:  # a timeout included
                with self._lock:
                    self.failures.append(f"{kind}: {type(exc).__name__}: {exc}")
                continue
            with self._lock:
                self.answers[kind][answer] += 1
                self.waiting -= first
            first = False

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(CLIENT_S + 5)
        assert not any(t.is_alive() for t in self._threads), "a client never returned"


def probe_while(port: int, loaded: Clients) -> list[tuple[str, int | str]]:
    """/healthz and /readyz, in turns, at least PROBE_ROUNDS times and until every client has
    been answered (so the probes overlap the bcrypt checks and the answers from memory); stops
    at the first probe not answered 200."""
    probes: list[tuple[str, int | str]] = []
    deadline = time.monotonic() + 2 * CLIENT_S
    while len(probes) < 2 * PROBE_ROUNDS or (loaded.waiting and time.monotonic() < deadline):
        for path in ("/healthz", "/readyz"):
            try:
                probes.append((path, request(port, path)[0]))
            except OSError as exc:
                probes.append((path, f"no answer: {type(exc).__name__}: {exc}"))
        if any(status != 200 for _, status in probes):
            break  # one probe left waiting is enough to fail
        time.sleep(0.2)
    return probes


def test_evald_run_answers_probes_while_passwords_are_wrong_and_scrapers_hammer(
    broker: Broker, kafka_tools: KafkaTools, unique: str, tmp_path: Path
) -> None:
    topics = names(unique)
    kafka_tools.create({topics["impressions"]: 2, topics["feedback"]: 2})
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=13)).decode()
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {USER: hashed}}))
    port = free_port()
    argv = [*run_argv(broker.bootstrap, unique, f"127.0.0.1:{port}"), "--web-config-file", str(web)]
    with (tmp_path / "run.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
    clients = Clients(port)
    try:

        def ready() -> bool:
            try:
                return request(port, "/readyz")[0] == 200
            except OSError:
                return False

        wait_until(ready, 90, "evald run to be ready")
        clients.start("wrong", ["wrong"] * WRONG_CLIENTS)
        clients.start("scraper", [PASSWORD] * SCRAPERS)
        probes = probe_while(port, clients)
        clients.stop()
        log_tail = (tmp_path / "run.log").read_text(errors="replace")[-3000:]
        assert set(probes) == {("/healthz", 200), ("/readyz", 200)}, (probes, log_tail)
        assert clients.failures == [], clients.failures[:5]
        assert clients.waiting == 0
        # every client was answered, each per the documented rules (docs/security.md): a wrong
        # password 401, a scraper its page or, while its credentials wait for a check past the
        # backlog, 503 with Retry-After
        wrong, scraped = clients.answers["wrong"], clients.answers["scraper"]
        assert set(wrong) == {(401, None)}, wrong
        assert set(scraped) <= {(200, None), (503, "1")}, scraped
        assert scraped[(200, None)] >= SCRAPERS, scraped
    finally:
        clients.stop()
        proc.terminate()
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
