"""Test-only fault injection at the steps of the commit cycle and of a restore.

``TESTING_EVALD_CRASH_AT=<step>`` makes the process SIGKILL itself the first time it reaches
that step: ``results_sent``, ``offsets_sent``, ``commit_in_flight``, ``committed`` (steps of a
commit, in a transaction holding results; see transaction.py), ``statistics_sent`` and
``statistics_committed`` (before and after the commit of a transaction holding comparison
shares), ``revoking`` (a revocation
commit, once results were committed), ``restore`` (restoring partitions: the group's offsets
fetched, nothing read yet) or ``restore_rebuilt`` (the engine rebuilt from the checkpoints,
snapshots and committed results, the inputs not yet sought nor anything replayed); with
``input.repartition``, ``repartition_sent``, ``repartition_offsets_sent`` and
``repartition_committed`` (steps 4, 5 and 6 of the repartition cycle, in a transaction holding
copies; see repartition.py). Not an ``EVALD_*`` name: those are all settings.

``commit_in_flight`` is the one step with no line of evald's own: ``commit_transaction()`` only
enqueues the EndTxn request, and kafka-python's sender thread sends it and reads the answer. So
that crash point arms :func:`kill_when_the_commit_is_answered` instead of killing at once.

``replay_committed`` is reached after a commit that wrote the checkpoint of a partition whose
restore is still replaying (some of the replay not fed yet). ``<step>:term`` sends SIGTERM
instead of SIGKILL, once: the clean stop (shutdown commit, leave the group) from that point.
``<step>:fault`` raises a connection error there instead, once: what a broker lost at that
point makes of the session (it ends and the process starts a new one, with a new engine, while
its statistics topic reader, counters and HTTP server live on).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

__all__ = ["CRASH_ENV", "crash_point"]

log = logging.getLogger("evald.daemon")

CRASH_ENV = "TESTING_EVALD_CRASH_AT"


def crash_point(step: str, armed: bool = True) -> None:
    """SIGKILL this process when ``armed`` and ``TESTING_EVALD_CRASH_AT`` names ``step``;
    SIGTERM it (once) when that is ``<step>:term``; raise a connection error (once) when that
    is ``<step>:fault``."""
    if not armed:
        return
    wanted = os.environ.get(CRASH_ENV)
    if wanted == step == "commit_in_flight":
        kill_when_the_commit_is_answered()
    elif wanted == step:
        log.warning("%s=%s: killing this process", CRASH_ENV, step)
        os.kill(os.getpid(), 9)
    elif wanted == f"{step}:term":
        global _terminated
        if not _terminated:
            _terminated = True
            log.warning("%s=%s: stopping this process (SIGTERM)", CRASH_ENV, wanted)
            os.kill(os.getpid(), signal.SIGTERM)
    elif wanted == f"{step}:fault":
        global _faulted
        if not _faulted:
            _faulted = True
            from kafka.errors import KafkaConnectionError

            log.warning("%s=%s: failing this session (connection error)", CRASH_ENV, wanted)
            raise KafkaConnectionError(f"{CRASH_ENV}={wanted}")


_armed = False
_terminated = False
_faulted = False


def kill_when_the_commit_is_answered() -> None:
    """SIGKILL this process when the coordinator's answer to EndTxn(commit) arrives, before
    kafka-python handles it (so before ``commit_transaction()`` returns).

    Why there and not a timer: ``commit_transaction()`` only enqueues the EndTxn request; the
    producer's sender thread writes it and later reads the answer. A timer fired a few ms after
    the call lands before the request left or after the answer was handled, depending on the
    load of the machine. The answer's arrival is a fixed point: the request has left and the
    coordinator has decided (the commit is prepared, its markers are being written), while evald
    cannot know whether its transaction committed. Dying before the request reaches the broker
    is the ``offsets_sent`` step. The kill comes from the sender thread; the patch is for this
    process only and is never undone, as the process does not outlive it.
    """
    global _armed
    if _armed:
        return
    _armed = True
    from kafka.producer.transaction_manager import EndTxnHandler

    handle = EndTxnHandler.handle_response

    def die_on_the_commit_answer(handler: Any, response: Any) -> None:
        if handler.request.committed:
            log.warning("EndTxn(commit) answered: killing this process before it learns so")
            os.kill(os.getpid(), signal.SIGKILL)
        handle(handler, response)

    EndTxnHandler.handle_response = die_on_the_commit_answer
