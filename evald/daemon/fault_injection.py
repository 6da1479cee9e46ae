"""Test-only fault injection that cannot be a plain kill at a line of the runner.

The chaos tests (``TESTING_EVALD_CRASH_AT``, see the runner) kill ``evald run`` at each step
of its commit cycle. One step has no line of evald's own: the moment ``commit_transaction()``
is *in flight*, after the EndTxn request left and before evald learns the outcome.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

log = logging.getLogger(__name__)

_armed = False


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
