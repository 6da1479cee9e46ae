"""Test-only fault injection at the steps of the commit cycle and of a restore.

``TESTING_EVALD_CRASH_AT=<step>`` makes the process SIGKILL itself the first time it reaches
that step: ``results_sent``, ``offsets_sent``, ``committed`` (steps of a commit, in a
transaction holding results; see transaction.py), ``revoking`` (a revocation commit, once
results were committed) or ``restore`` (restoring a partition); with ``input.repartition``,
``repartition_sent``, ``repartition_offsets_sent`` and ``repartition_committed`` (steps 4, 5
and 6 of the repartition cycle, in a transaction holding copies; see repartition.py). Not an
``EVALD_*`` name: those are all settings.
"""

from __future__ import annotations

import logging
import os

__all__ = ["CRASH_ENV", "crash_point"]

log = logging.getLogger("evald.daemon")

CRASH_ENV = "TESTING_EVALD_CRASH_AT"


def crash_point(step: str, armed: bool = True) -> None:
    """SIGKILL this process when ``armed`` and ``TESTING_EVALD_CRASH_AT`` names ``step``."""
    if armed and os.environ.get(CRASH_ENV) == step:
        log.warning("%s=%s: killing this process", CRASH_ENV, step)
        os.kill(os.getpid(), 9)
