"""Fetch the Apache Kafka broker's jars from Maven Central once per machine."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

KAFKA_VERSION = "4.3.1"
POM = Path(__file__).with_name("pom.xml")
CACHE_ENV = "LOCAL_KAFKA_CACHE"
"""Overrides the cache directory (default ``~/.cache/evald``); not EVALD_*, which are settings."""

INSTALL_HINT = (
    "the local Apache Kafka needs Java >= 17 and Maven: on Debian/Ubuntu run "
    "`apt-get install openjdk-17-jdk-headless maven` (`make test` and `make kafka` do it when "
    "run as root)"
)


class LocalKafkaError(RuntimeError):
    """The local broker cannot be fetched, started or reached; the message says what to do."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "evald")


def ensure_libs(root: Path | None = None) -> Path:
    """The directory holding the broker's jars, fetching them first if the cache lacks them.

    A file lock serialises parallel callers (pytest-xdist workers, two `make kafka`), so the
    download happens once; a marker file written last means an interrupted fetch is redone.
    """
    home = (root or cache_root()) / f"kafka-{KAFKA_VERSION}"
    libs, done = home / "libs", home / ".complete"
    if done.exists():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return libs
        mvn = shutil.which("mvn")
        if mvn is None or shutil.which("java") is None:
            raise LocalKafkaError(f"java or mvn not found: {INSTALL_HINT}")
        shutil.rmtree(libs, ignore_errors=True)
        proc = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(POM),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={libs}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0 or not any(libs.glob("kafka_2.13-*.jar")):
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise LocalKafkaError(
                "fetching Apache Kafka from Maven Central failed (is the network or a Maven "
                "mirror reachable?):\n" + "\n".join(tail)
            )
        done.write_text(KAFKA_VERSION + "\n")
    return libs
