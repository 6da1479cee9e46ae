"""Rebalance handling: what a revoked, lost or assigned partition means for the session.

The callbacks run on kafka-python's I/O thread while the loop thread is blocked inside
``poll()`` or ``close()``, which it calls without the daemon's engine lock; they take it (once:
a revocation commit lets go of it while it waits on the broker), record what happened and, on
revocation, commit through the producer (which has its own I/O thread). Restoring an assigned
partition happens later, on the loop thread (``Daemon.process``: ``Inputs.to_restore``).
"""

from __future__ import annotations

import logging

from kafka import TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener

from evald.daemon.crash import crash_point
from evald.daemon.health import Health
from evald.daemon.main.engine_lock import EngineLock
from evald.daemon.main.inputs import Inputs
from evald.daemon.main.transaction import Transaction
from evald.daemon.stats import DaemonStats
from evald.engine import Engine

__all__ = ["Rebalance"]

log = logging.getLogger("evald.daemon")


class Rebalance(ConsumerRebalanceListener):
    """The rebalance listener of one session."""

    def __init__(
        self,
        lock: EngineLock,
        inputs: Inputs,
        transaction: Transaction,
        engine: Engine,
        health: Health,
        stats: DaemonStats,
    ) -> None:
        self._lock = lock
        self._inputs = inputs
        self._transaction = transaction
        self._engine = engine
        self._health = health
        self._stats = stats

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.revoke({tp.partition for tp in revoked}, lost=False)

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.assign({tp.partition for tp in assigned})

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.revoke({tp.partition for tp in lost}, lost=True)

    def revoke(self, partitions: set[int], *, lost: bool) -> None:
        """Commit what is finalized (unless lost), then forget the revoked partitions."""
        with self._lock:
            self._revoke(partitions, lost=lost)

    def _revoke(self, partitions: set[int], *, lost: bool) -> None:
        transaction = self._transaction
        if transaction.abandoned:
            lost = True  # the session failed: its in-memory state is not trusted any more
        if not lost:
            crash_point("revoking", self._stats.results_produced > 0)
            try:
                transaction.commit()
            except Exception:
                log.exception("commit on revocation failed; aborting")
                lost = True
        if lost and transaction.open:
            if not transaction.abandoned:  # taken over while our transaction was open: a zombie
                with self._stats.lock:
                    self._stats.fenced_revocations += 1
            # what the aborted transaction held for partitions we keep is gone too
            transaction.abort(poisoned=True)
        for p in self._inputs.revoke(partitions):
            self._engine.drop_partition(p)
            transaction.forget(p)
        log.info("partitions %s %s", sorted(partitions), "lost" if lost else "revoked")

    def assign(self, partitions: set[int]) -> None:
        """Take on ``partitions``: restored by the next poll cycle."""
        with self._lock:
            self._health.joined_group()
            self._inputs.assign(partitions)
            log.info("partitions %s assigned", sorted(partitions))
