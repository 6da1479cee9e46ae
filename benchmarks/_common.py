"""Shared helpers for the benchmark modules: arguments, timing, RSS, reporting, data, a broker.

Every benchmark prints each figure next to a baseline measured in the same run, so the ratios
stay meaningful on whatever machine runs them. Data is generated deterministically from a seed,
outside every timed region.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

#: Segment label values used by the generated traffic (3 keys, the engine's default label keys).
MODELS = ("m1", "m2")
ARMS = ("control", "treatment")
SURFACES = ("search", "home", "pdp")
ACTIONS = ("click", "add_to_cart", "purchase")
ACTION_P = (0.75, 0.17, 0.08)


# ---------------------------------------------------------------------------------------------
# arguments and availability


def parse_args(
    description: str,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """Common flags: --quick (small sizes, for `make bench` smoke runs) and --seed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a fast run")
    parser.add_argument("--seed", type=int, default=20261121, help="data generator seed")
    if extra is not None:
        extra(parser)
    return parser.parse_args(argv)


class NotAvailable(Exception):
    """A component this benchmark measures does not exist (yet): report it, never fake it."""


def require(module: str, *names: str) -> object:
    """Import `module` and check it has `names`, or raise NotAvailable saying what is missing."""
    try:
        mod = __import__(module, fromlist=["_"])
    except Exception as exc:  # ImportError, or a half-landed module failing at import time
        raise NotAvailable(f"{module} cannot be imported ({type(exc).__name__}: {exc})") from exc
    missing = [n for n in names if not hasattr(mod, n)]
    if missing:
        raise NotAvailable(f"{module} has no {', '.join(missing)}")
    return mod


def run_main(title: str, body: Callable[[], None]) -> int:
    """Print the header, run `body`; a NotAvailable becomes a clear 'not available' line, exit 0."""
    header(title)
    try:
        body()
    except NotAvailable as exc:
        print(f"  NOT AVAILABLE: {exc}", flush=True)
        print("  (no figure reported: the component under test is missing)", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# reporting


def header(title: str) -> None:
    """Title plus the machine facts a reader needs to compare runs."""
    print(f"{title}", flush=True)
    print(
        f"  machine: {os.cpu_count()} cpu(s), {platform.machine()},"
        f" Python {platform.python_version()}, numpy {np.__version__}",
        flush=True,
    )


def line(label: str, value: str) -> None:
    """One aligned report line."""
    print(f"  {label:<52} {value}", flush=True)


def fmt_rate(per_s: float) -> str:
    """Events per second with a thousands separator."""
    return f"{per_s:,.0f}/s"


def fmt_s(seconds: float) -> str:
    """Seconds with a unit that keeps 3 significant digits readable."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def verdict(ok: bool) -> str:
    """'met' / 'MISSED' for a target line."""
    return "met" if ok else "MISSED"


def target(label: str, value: str, ok: bool, goal: str) -> None:
    """A target line: the figure, the goal and whether it is met."""
    line(label, f"{value}   (target {goal}: {verdict(ok)})")


# ---------------------------------------------------------------------------------------------
# timing and memory


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Smallest wall time of `repeat` calls: the least disturbed run on a shared machine."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm (pages -> bytes)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE_SIZE


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank, so p99 of 100 samples is a real sample."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(np.ceil(q / 100 * len(ordered))) - 1))
    return ordered[k]


# ---------------------------------------------------------------------------------------------
# deterministic traffic


@dataclass(frozen=True)
class Traffic:
    """Generated JSONL lines in arrival (= event-time) order, with their kinds."""

    lines: list[bytes]
    kinds: list[str]  # "impression" / "feedback", parallel to lines
    times: list[int]  # event time (epoch ms), parallel to lines
    impressions: int
    feedback: int
    first_ts: int
    last_ts: int

    @property
    def events(self) -> int:
        return len(self.lines)

    @property
    def nbytes(self) -> int:
        return sum(len(x) for x in self.lines)


def impression_line(
    request_id: str, ts: int, items: Sequence[str], labels: dict[str, str]
) -> bytes:
    """One impression event as compact JSON bytes."""
    return json.dumps(
        {"request_id": request_id, "ts": ts, "items": list(items), "labels": labels},
        separators=(",", ":"),
    ).encode()


def feedback_line(request_id: str, ts: int, item: str, action: str) -> bytes:
    """One feedback event as compact JSON bytes."""
    return json.dumps(
        {"request_id": request_id, "ts": ts, "item": item, "action": action},
        separators=(",", ":"),
    ).encode()


def generate_traffic(
    impressions: int,
    *,
    seed: int,
    items_per_list: int = 20,
    feedback_per_impression: float = 1.5,
    gap_ms: int = 10,
    mean_delay_ms: int = 60_000,
    max_delay_ms: int = 25 * 60_000,
    catalogue: int = 200_000,
    start_ms: int = 1_763_683_200_000,
    segments: Sequence[tuple[str, str, str]] | None = None,
) -> Traffic:
    """Impressions of `items_per_list` items plus round(n * feedback_per_impression) feedback.

    Feedback picks its impression uniformly (so ~22% of lists get none and are abandoned), its rank
    with a 1/rank position bias, its delay from an exponential clipped below the default 30m window,
    and everything is sorted by event time: the stream is in order, as the engine's fast path sees
    it in production. Same seed, same bytes.
    """
    rng = np.random.default_rng(seed)
    n = impressions
    ts = start_ms + np.arange(n, dtype=np.int64) * gap_ms
    item_ids = rng.integers(0, catalogue, size=(n, items_per_list))
    segs = list(segments or [(m, a, s) for m in MODELS for a in ARMS for s in SURFACES])
    seg_idx = rng.integers(0, len(segs), size=n)
    n_fb = round(n * feedback_per_impression)
    fb_imp = rng.integers(0, n, size=n_fb)
    bias = 1.0 / np.arange(1, items_per_list + 1)
    fb_rank = rng.choice(items_per_list, size=n_fb, p=bias / bias.sum())
    fb_delay = np.minimum(rng.exponential(mean_delay_ms, size=n_fb).astype(np.int64), max_delay_ms)
    fb_ts = ts[fb_imp] + 1 + fb_delay
    fb_action = rng.choice(len(ACTIONS), size=n_fb, p=ACTION_P)

    label_dicts = [{"model": m, "arm": a, "surface": s} for (m, a, s) in segs]
    imp_lines = [
        impression_line(
            f"r{i:09d}", int(ts[i]), [f"i{x}" for x in item_ids[i]], label_dicts[seg_idx[i]]
        )
        for i in range(n)
    ]
    fb_lines = [
        feedback_line(
            f"r{fb_imp[j]:09d}",
            int(fb_ts[j]),
            f"i{item_ids[fb_imp[j], fb_rank[j]]}",
            ACTIONS[fb_action[j]],
        )
        for j in range(n_fb)
    ]
    # Arrival order = event-time order; an impression precedes feedback with the same ts.
    all_ts = np.concatenate([ts, fb_ts])
    kind_key = np.concatenate([np.zeros(n, dtype=np.int8), np.ones(n_fb, dtype=np.int8)])
    order = np.lexsort((kind_key, all_ts))
    both = imp_lines + fb_lines
    lines = [both[k] for k in order]
    kinds = ["impression" if k < n else "feedback" for k in order]
    times = all_ts[order].tolist()
    return Traffic(lines, kinds, times, n, n_fb, int(all_ts.min()), int(all_ts.max()))


# ---------------------------------------------------------------------------------------------
# network, HTTP, subprocesses


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float) -> None:
    """Block until 127.0.0.1:port accepts connections, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET `url`; returns (status, body) also for 4xx/5xx answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def parse_samples(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {'name{labels}': value}; cheap, for polling loops."""
    out: dict[str, float] = {}
    for row in text.splitlines():
        if not row or row[0] == "#":
            continue
        key, _, value = row.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[key] = float(value)
    return out


def sum_samples(samples: dict[str, float], name: str, *must_contain: str) -> float:
    """Sum of every sample of metric `name` whose label text contains all of `must_contain`."""
    total = 0.0
    for key, value in samples.items():
        base = key.split("{", 1)[0]
        if base == name and all(m in key for m in must_contain):
            total += value
    return total


REPO = Path(__file__).resolve().parents[1]


def evald_at(ref: str, directory: Path) -> str:
    """``evald/`` of git commit ``ref`` unpacked under ``directory``: put the returned path
    first on a child's PYTHONPATH (and run it there) to measure that version as a baseline."""
    import io
    import tarfile

    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "evald"],
        cwd=REPO, check=True, capture_output=True, timeout=120,
    ).stdout  # fmt: skip
    target = directory / f"evald-{ref}"
    target.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return str(target)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Terminate a child we started; kill it if it does not exit in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


# ---------------------------------------------------------------------------------------------
# Apache Kafka (deploy.local_kafka), the broker the daemon's tests use


@contextlib.contextmanager
def broker(timeout: float = 300.0) -> Iterator[str]:
    """Start a single-node Apache Kafka on free loopback ports with its data in a temporary
    directory, yield 'host:port', stop it by PID and delete the data.

    The JVM's start (about 10 s) is outside every figure: each benchmark starts its clocks
    after this yields.
    """
    from deploy.local_kafka import LocalKafka, LocalKafkaError

    data = tempfile.mkdtemp(prefix="evald-bench-kafka-")
    kafka = LocalKafka(Path(data), heap="1g")
    try:
        try:
            kafka.start(timeout=timeout)
        except LocalKafkaError as exc:
            raise NotAvailable(f"Apache Kafka cannot start: {exc}") from exc
        yield kafka.bootstrap
    finally:
        kafka.stop()
        shutil.rmtree(data, ignore_errors=True)


def python_cmd(*args: str) -> list[str]:
    """Command line running this interpreter (the project's .venv) with `args`."""
    return [sys.executable, *args]


def create_topics(bootstrap: str, names: Sequence[str], partitions: int) -> None:
    """Create topics with `partitions` partitions each (inputs must be co-partitioned)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="evald-bench-admin")
    try:
        admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in names]
        )
    finally:
        admin.close()


def produce(bootstrap: str, records: Sequence[tuple[str, bytes, bytes]]) -> float:
    """Send (topic, key, value) records, keyed so the default partitioner co-partitions by key.

    Returns the seconds it took (flush included); not part of any benchmark figure.
    """
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id="evald-bench-producer",
        linger_ms=20,
        batch_size=512 * 1024,
        acks=1,
        max_request_size=8 * 1024 * 1024,
    )
    t0 = time.perf_counter()
    try:
        for topic, key, value in records:
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=600)
    finally:
        producer.close(timeout=30)
    return time.perf_counter() - t0


def request_key(raw: bytes) -> bytes:
    """The request_id of a generated event line, as the Kafka key (producers key by it)."""
    start = raw.index(b'"request_id":"') + len(b'"request_id":"')
    return raw[start : raw.index(b'"', start)]
