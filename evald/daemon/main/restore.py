"""Reading state back from Kafka when partitions are assigned: their checkpoints, the snapshots
of their window aggregates and the results written after those snapshots.

Every partition assigned by one rebalance is restored in one go: one OffsetFetch for all of
them, one ListOffsets per end, then one concurrent read per kind of record (state_reads.py), so
the cost is a few round trips whatever the partition count (docs/performance.md §11). State
that cannot be used (a checkpoint topic deleted or expired, a record that is not a checkpoint, a
watermark no event could give) is refused with exit 2 and what to do (restore_checks.py); a
read that stops moving is a transient error the session retries.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError

from evald.daemon.crash import crash_point
from evald.daemon.fatal import Fatal
from evald.daemon.kafka_compat import close_quietly, committed_offsets
from evald.daemon.logs import event_time
from evald.daemon.main import restore_checks as checks
from evald.daemon.main.checkpoint import Checkpoint, SnapshotRef
from evald.daemon.main.comparisons import publishes_statistics
from evald.daemon.main.inputs import Inputs, Restored
from evald.daemon.main.merge import KINDS
from evald.daemon.main.snapshots import whole
from evald.daemon.main.state_reads import Progress, RestoreError, Span, read_spans
from evald.daemon.settings import Settings
from evald.daemon.topics import TopicGuard
from evald.engine import Engine

__all__ = ["RESTORE_STALL_S", "Progress", "RestoreError", "Restorer"]

log = logging.getLogger("evald.daemon")

#: a restore read that makes no progress for this long fails (transient); no overall deadline
RESTORE_STALL_S = 60.0
#: results absorbed in one engine call (``Engine.absorb_results``): one call per result cost
#: a millisecond each, and the batch bounds what is held decoded
ABSORB_BATCH = 10_000


class Restorer:
    """Restores the partitions a session is assigned, with that session's clients."""

    def __init__(
        self,
        settings: Settings,
        *,
        consumer: KafkaConsumer,
        reader: KafkaConsumer,
        committed_reader: Callable[[], KafkaConsumer],
        engine: Engine,
        guard: TopicGuard,
        inputs: Inputs,
        clock: Callable[[], float],
        heartbeat: Callable[[], None] = lambda: None,
        verify_topics: Callable[[], None] = lambda: None,
        stall_s: float = RESTORE_STALL_S,
        offset_wait_s: float = RESTORE_STALL_S,
    ) -> None:
        """``committed_reader`` opens a group-less ``read_committed`` consumer (closed after
        use): only a group with no offset at all for a partition whose checkpoint partition
        holds records needs one. ``verify_topics`` (``TopicGuard.verify``) runs before a
        refusal: an input topic recreated under the session is the better explanation."""
        self._topics = settings.topics
        self._where = checks.Where(
            settings.daemon.group_id,
            settings.topics.checkpoint_topic,
            {kind: inputs.tp(kind, 0).topic for kind in KINDS},
        )
        self._consumer, self._reader, self._committed_reader = consumer, reader, committed_reader
        self._engine, self._guard, self._inputs = engine, guard, inputs
        self._clock, self._heartbeat, self._verify_topics = clock, heartbeat, verify_topics
        self._stall_s, self._offset_wait_s = stall_s, offset_wait_s

    def close(self) -> None:
        """The session ended: close the reader."""
        close_quietly(self._reader)

    # -- naming ---------------------------------------------------------------------------

    def _ckpt(self, p: int) -> TopicPartition:
        return TopicPartition(self._topics.checkpoint_topic, p)

    def _results(self, p: int) -> TopicPartition:
        return TopicPartition(self._topics.results, p)

    # -- the protocol ---------------------------------------------------------------------

    def restore(self, ps: Sequence[int]) -> dict[int, Restored]:
        """Resume partitions ``ps`` from their committed checkpoints (or from the start of both
        inputs), all together; returns where each was left, for the inputs and the ledgers.

        1. One OffsetFetch: the group's committed offsets on the checkpoint topic and both
           inputs of every partition, waiting at most ``offset_wait_s`` (crash point
           ``restore``); the topics checked (``verify_topics``: an input topic deleted under
           the session, which is what set off this rebalance, ends evald with that message
           instead of a ListOffsets waiting ``request_timeout_ms`` on it); one ListOffsets per
           end for the log bounds of those partitions.
        2. Per partition, where its checkpoint is: refuse (exit 2) a group with input offsets
           but none on the checkpoint topic (the topic was deleted), a checkpoint below the
           log start (expired), and a group with no offset at all whose checkpoint partition
           holds a committed checkpoint (the group's offsets expired). No offset and no
           committed checkpoint: a fresh start from both inputs' beginning.
        3. Read every checkpoint record at once; refuse one that is not the partition's
           checkpoint, was written against other input topics or holds values that cannot be
           right (restore_checks.check_checkpoint).
        4. Read the records every checkpoint names (its snapshot, its large open comparison
           shares) at once; resume each engine partition from the state its checkpoint holds
           (``Engine.resume``: watermark, event times, evicted impressions, held feedback, open
           comparison shares) with its consumed offsets; refuse (or warn) when the statistics
           topic lost shares a comparison or the interleaving test needs; load each
           snapshot, then read every committed result range at once, absorbed as it arrives
           (crash point ``restore_rebuilt``).
        5. Seek both inputs of every partition to the committed offsets; records up to the
           consumed ones are replayed to rebuild pending joins.
        """
        if not ps:
            return {}
        started = self._clock()
        progress = Progress(self._stall_s, self._clock, self._heartbeat)
        ps = list(ps)
        saved = self._saved(ps)  # 1
        crash_point("restore")
        self._verify_topics()
        starts, ends = self._bounds(ps)
        at = self._refuse(self._locate, ps, saved, starts, ends, progress)  # 2
        found = self._refuse(self._checkpoints, at, starts, ends, progress)  # 3
        read = {p: [1, len(checkpoint.encode())] for p, checkpoint in found.items()}
        absorbed = self._refuse(self._rebuild, found, starts, read, progress)  # 4
        crash_point("restore_rebuilt")
        elapsed = self._clock() - started
        restored = {}
        for p in ps:  # 5
            checkpoint = found.get(p)
            if checkpoint is None:
                start = {k: starts[self._inputs.tp(k, p)] for k in KINDS}
                restored[p] = self._seek(p, start, None)
                log.info("partition %d: no checkpoint, both inputs from their beginning", p)
                continue
            restored[p] = self._seek(p, dict(checkpoint.committed), checkpoint)
            self._log_restored(checkpoint, absorbed.get(p, 0), read[p], elapsed)
            self._note_expired(checkpoint, starts)
        if len(ps) > 1:
            log.info(
                "%d partitions restored in %.2fs (%d records, %d bytes read)",
                len(ps),
                elapsed,
                progress.records,
                progress.bytes,
            )
        return restored

    def _refuse(self, step: Callable[..., Any], *args: Any) -> Any:
        """Run one step; a Refusal ends evald with exit 2 and its message, unless a topic
        changed under the session (then that is what ends it, with its own message)."""
        try:
            return step(*args)
        except checks.Refusal as exc:
            self._verify_topics()
            raise Fatal(2, f"evald run: refusing to restore: {exc}") from None

    # -- step 1: offsets and log bounds ---------------------------------------------------

    def _saved(self, ps: list[int]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets on the checkpoint and input partitions of ``ps``.

        Why bounded: kafka-python retries OffsetFetch without end while the group coordinator
        is away or answers that a transaction still holds offsets of the group
        (``require_stable``: a dead instance's transaction, aborted only at its timeout). The
        restore runs holding the engine, so the loop would hang with it; failing lets the next
        session try again."""
        tps = [self._ckpt(p) for p in ps]
        tps += [self._inputs.tp(kind, p) for p in ps for kind in KINDS]
        timeout_ms = int(self._offset_wait_s * 1000)
        try:
            offsets = committed_offsets(self._consumer, tps, timeout_ms)
        except KafkaTimeoutError as exc:
            raise RestoreError(
                f"the group's committed offsets of {len(tps)} partitions not answered within "
                f"{timeout_ms / 1000:g}s (group coordinator away, or an open transaction of "
                "another instance still holds the group's offsets)"
            ) from exc
        return {tp: offsets[tp].offset if tp in offsets else None for tp in tps}

    def _bounds(self, ps: list[int]) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """Log start of the checkpoint, input and results partitions of ``ps``, log end of the
        checkpoint and input ones (ListOffsets: one request per leader for all)."""
        ckpt = [self._ckpt(p) for p in ps]
        inputs = [self._inputs.tp(kind, p) for p in ps for kind in KINDS]
        results = [self._results(p) for p in ps]
        starts = self._reader.beginning_offsets(ckpt + inputs + results)
        ends = self._reader.end_offsets(ckpt + inputs)
        return dict(starts), dict(ends)

    # -- step 2: where each checkpoint is -------------------------------------------------

    def _locate(
        self,
        ps: list[int],
        saved: Mapping[TopicPartition, int | None],
        starts: Mapping[TopicPartition, int],
        ends: Mapping[TopicPartition, int],
        progress: Progress,
    ) -> dict[int, int]:
        """Partition -> the offset of its committed checkpoint record (fresh ones left out)."""
        at: dict[int, int] = {}
        unsaved = []
        for p in ps:
            inputs = {kind: saved[self._inputs.tp(kind, p)] for kind in KINDS}
            tp = self._ckpt(p)
            offset = checks.checkpoint_offset(p, saved[tp], inputs, starts[tp], self._where)
            if offset is not None:
                at[p] = offset
            elif ends[tp] > starts[tp]:
                unsaved.append(p)
        if unsaved:
            found = self._committed_checkpoints(unsaved, starts, ends, progress)
            for p, offset in sorted(found.items()):
                raise checks.offsets_lost(p, offset, self._where)
        return at

    def _committed_checkpoints(
        self,
        ps: list[int],
        starts: Mapping[TopicPartition, int],
        ends: Mapping[TopicPartition, int],
        progress: Progress,
    ) -> dict[int, int]:
        """Partition -> offset of the first committed checkpoint of it in its checkpoint
        partition, for those of ``ps`` that have one. A fresh group's checkpoint partition can
        hold records of a first transaction that never committed (killed before its commit):
        those are not state, and a read_committed read does not see them."""
        found: dict[int, int] = {}
        by_tp = {self._ckpt(p): p for p in ps}

        def look(tp: TopicPartition, record: Any) -> bool:
            p = by_tp[tp]
            if record.key != str(p).encode():
                return False
            try:
                if Checkpoint.decode(record.value).partition != p:
                    return False
            except ValueError:
                return False
            found[p] = record.offset
            return True

        reader = self._committed_reader()
        try:
            read_spans(reader, {tp: [(starts[tp], ends[tp])] for tp in by_tp}, progress, look)
        finally:
            close_quietly(reader)
        return found

    # -- step 3: the checkpoint records ---------------------------------------------------

    def _checkpoints(
        self,
        at: Mapping[int, int],
        starts: Mapping[TopicPartition, int],
        ends: Mapping[TopicPartition, int],
        progress: Progress,
    ) -> dict[int, Checkpoint]:
        """Read, decode and check the checkpoint record of every partition in ``at``."""
        values: dict[int, bytes | None] = {}
        spans = {self._ckpt(p): [(offset, offset + 1)] for p, offset in at.items()}

        def keep(tp: TopicPartition, record: Any) -> None:
            values[tp.partition] = record.value

        short = read_spans(self._reader, spans, progress, keep)
        found: dict[int, Checkpoint] = {}
        for p, offset in sorted(at.items()):
            where = f"{self._topics.checkpoint_topic}:{p}@{offset}"
            if p not in values:
                raise checks.Refusal(self._missing(p, where, short.get(self._ckpt(p))))
            try:
                checkpoint = Checkpoint.decode(values[p] or b"")
            except ValueError as exc:
                raise checks.Refusal(
                    f"the committed checkpoint of partition {p} at {where} is not a checkpoint "
                    f"({exc}). Find what else writes to that topic, then "
                    f"{checks.ways_out(self._where, p)}"
                ) from None
            self._guard.check_checkpoint(checkpoint.extra.get("topic_ids"), p)
            bounds = checks.Bounds(
                self._latest_ms(),
                int(self._engine.config.min_event_time),
                int(self._engine.config.lateness),
                self._inputs_end(p, checkpoint, ends, progress),
                starts[self._ckpt(p)],
                offset,
            )
            checks.check_checkpoint(p, checkpoint, bounds, self._where)
            found[p] = checkpoint
        return found

    def _missing(self, p: int, where: str, high: int | None) -> str:
        """Why the record at ``where`` was not read: the log ends first, or no record is there."""
        if high is not None:
            return (
                f"the committed checkpoint of partition {p} at {where} is not there: the "
                f"partition ends at offset {high} (the topic was truncated or recreated, or "
                f"the broker lost data); {checks.start_over(self._where)}"
            )
        return (
            f"the group's offset on {self._topics.checkpoint_topic}:{p} points after offset "
            f"{where.rsplit('@', 1)[1]}, which holds no record (a transaction marker): evald "
            "never commits such an offset, so it was reset by hand. "
            f"{checks.ways_out(self._where, p)}"
        )

    def _latest_ms(self) -> int | None:
        """No event time the engine accepts is later than this (restore_checks.Bounds)."""
        lead = self._engine.config.max_event_lead
        if lead is None:
            return None
        return int(self._engine.clock() * 1000) + int(lead) + checks.RECORD_LEAD_MS

    def _inputs_end(
        self,
        p: int,
        checkpoint: Checkpoint,
        ends: Mapping[TopicPartition, int],
        progress: Progress,
    ) -> dict[str, int]:
        """Per kind, the end of p's input partition where the checkpoint says it consumed
        past what ListOffsets answered: confirmed by a fetch (a broker whose ListOffsets lags
        behind its last batch, as tansu's does, must not make a good checkpoint look bad)."""
        beyond = {
            self._inputs.tp(kind, p): checkpoint.consumed[kind]
            for kind in KINDS
            if checkpoint.consumed.get(kind, 0) > ends[self._inputs.tp(kind, p)]
        }
        if not beyond:
            return {}
        spans = {tp: [(offset - 1, offset)] for tp, offset in beyond.items()}
        short = read_spans(self._reader, spans, progress, lambda tp, record: None)
        return {self._inputs.kind(tp.topic): high for tp, high in short.items()}

    # -- step 4: the engine's state -------------------------------------------------------

    def _rebuild(
        self,
        found: Mapping[int, Checkpoint],
        starts: Mapping[TopicPartition, int],
        read: dict[int, list[int]],
        progress: Progress,
    ) -> dict[int, int]:
        """Open shares, snapshots, then the committed results; returns the results absorbed
        per partition."""
        chunks = self._chunks(found, read, progress)
        engine = self._engine
        lost: dict[int, int] = {}
        credit_lost: dict[int, int] = {}
        compares = bool(engine.config.statistics.comparisons)
        for p, checkpoint in found.items():
            state = checkpoint.state
            if publishes_statistics(engine.config) and p in chunks.get("statistics", {}):
                opened = self._open_shares(p, chunks["statistics"][p])
                state = dataclasses.replace(state, statistics=opened)
            if p in chunks.get("click_model", {}):
                held = checkpoint.state.click_model or {}
                model = {k: v for k, v in held.items() if k != "records"}  # its "log" kept
                model["snapshot"] = base64.b64encode(chunks["click_model"][p]).decode()
                state = dataclasses.replace(state, click_model=model)
            try:
                engine.resume(p, state, dict(checkpoint.consumed))
            except ValueError as exc:  # a loader's word for a damaged part (never retried)
                raise checks.Refusal(
                    f"the committed checkpoint of partition {p} holds engine state this evald "
                    f"cannot load: {exc}. Find what else writes to "
                    f"{self._topics.checkpoint_topic}, then {checks.ways_out(self._where, p)}"
                ) from None
            final = self._statistics_lost(p, checkpoint, state.statistics) if compares else None
            if final is not None:
                lost[p] = final
            credit = self._credit_lost(p, checkpoint, state.statistics)
            if credit is not None:
                credit_lost[p] = credit
            if p in chunks.get("snapshot", {}):
                try:
                    engine.load_snapshot(p, chunks["snapshot"][p])
                except ValueError as exc:
                    raise checks.Refusal(
                        f"the snapshot of partition {p}'s window aggregates does not fit this "
                        f"evald ({exc}): were engine.measures, engine.bucket, the label keys, "
                        "engine.windows, drilldown.capacity or drilldown.label_capacity "
                        "changed? Set them back, or start with a new daemon.group_id and new "
                        "results and checkpoint topics"
                    ) from None
        self._warn_lost(lost, credit_lost)
        return self._absorb(found, starts, read, progress)

    def _warn_lost(self, lost: Mapping[int, int], credit_lost: Mapping[int, int]) -> None:
        """Refuse (or warn about) the comparison shares and the credit shares the statistics
        topic lost (partition -> its final mark, its credit mark)."""
        topic = self._guard.statistics_name or ""
        if lost:
            config = self._engine.config.statistics
            warning = checks.statistics_lost(topic, lost, config.comparisons, config.window)
            log.warning("%s", warning)
        if credit_lost:
            inter = self._engine.config.interleaving
            log.warning("%s", checks.credit_lost(topic, credit_lost, inter.start, inter.window))

    def _chunks(
        self, found: Mapping[int, Checkpoint], read: dict[int, list[int]], progress: Progress
    ) -> dict[str, dict[int, bytes]]:
        """The snapshot and the open-shares records every checkpoint names, all read at once,
        joined and checked against the size and CRC-32 the checkpoint recorded."""
        refs: dict[tuple[str, int], SnapshotRef] = {}
        for p, checkpoint in found.items():
            if checkpoint.snapshot is not None:
                refs[("snapshot", p)] = checkpoint.snapshot
            for name, held in (
                ("statistics", checkpoint.statistics),
                ("click_model", checkpoint.state.click_model),
            ):
                if isinstance(held, dict) and "records" in held:
                    ref = SnapshotRef.from_json(held["records"])  # checked in step 3
                    if ref is not None:
                        refs[(name, p)] = ref
        spans: dict[TopicPartition, list[Span]] = {}
        for (_, p), ref in refs.items():
            spans.setdefault(self._ckpt(p), []).append((ref.offsets[0], ref.offsets[-1] + 1))
        parts: dict[tuple[int, int], bytes] = {}

        def keep(tp: TopicPartition, record: Any) -> None:
            read[tp.partition][0] += 1
            read[tp.partition][1] += len(record.value or b"") + len(record.key or b"")
            parts[(tp.partition, record.offset)] = record.value or b""

        read_spans(self._reader, spans, progress, keep)
        out: dict[str, dict[int, bytes]] = {}
        for (name, p), ref in refs.items():
            at = f"{self._topics.checkpoint_topic}:{p}"
            missing = [o for o in ref.offsets if (p, o) not in parts]
            try:
                if missing:
                    raise ValueError(f"no record at offsets {missing}")
                out.setdefault(name, {})[p] = whole([parts[(p, o)] for o in ref.offsets], ref)
            except ValueError as exc:
                raise checks.Refusal(
                    f"the {name} records {at}@{list(ref.offsets)} named by the committed "
                    f"checkpoint of partition {p} are damaged: {exc}. Find what else writes "
                    f"to that topic, then {checks.ways_out(self._where, p)}"
                ) from None
        return out

    def _open_shares(self, p: int, raw: bytes) -> Any:
        """The open comparison shares a checkpoint put in records of their own (JSON)."""
        try:
            shares = json.loads(raw)
            log.info(
                "partition %d: open comparison shares read from records (%d bytes)", p, len(raw)
            )
            return shares
        except ValueError as exc:
            raise checks.Refusal(
                f"the open comparison shares of partition {p}'s committed checkpoint are not "
                f"JSON ({exc}). Find what else writes to {self._topics.checkpoint_topic}, then "
                f"{checks.ways_out(self._where, p)}"
            ) from None

    def _statistics_lost(self, p: int, checkpoint: Checkpoint, statistics: Any) -> int | None:
        """p's final mark when the statistics topic is not the one its checkpoint was written
        against (its id changed): the shares p published up to the mark are gone."""
        final = statistics.get("final") if isinstance(statistics, dict) else None
        saved = (checkpoint.extra.get("topic_ids") or {}).get(self._guard.statistics_name)
        current = self._guard.statistics_id
        if final is None or not saved or not current or saved == current:
            return None
        return int(final)

    def _credit_lost(self, p: int, checkpoint: Checkpoint, statistics: Any) -> int | None:
        """p's credit mark when the statistics topic is not the one its checkpoint was written
        against (``_statistics_lost``), for credit shares the fold would have taken: those of
        another interleaving.window or number of replicates are ignored lost or not."""
        shares = self._engine.interleaving.shares
        doc = statistics.get("interleaving") if isinstance(statistics, dict) else None
        if (
            shares is None
            or not isinstance(doc, dict)
            or doc.get("width") != shares.width
            or doc.get("replicates") != shares.replicates
        ):
            return None
        return self._statistics_lost(p, checkpoint, doc)

    def _absorb(
        self,
        found: Mapping[int, Checkpoint],
        starts: Mapping[TopicPartition, int],
        read: dict[int, list[int]],
        progress: Progress,
    ) -> dict[int, int]:
        """Absorb the committed results of every checkpoint's ranges, read at once."""
        spans: dict[TopicPartition, list[Span]] = {}
        for p, checkpoint in found.items():
            tp, start = self._results(p), starts[self._results(p)]
            ranges = [(max(r.start, start), r.end) for r in checkpoint.results]
            gone = sum(min(r.end, start) - r.start for r in checkpoint.results if r.start < start)
            if gone > 0:
                log.warning(
                    "partition %d: %d committed results are no longer on %s (its log starts "
                    "at %d): the window aggregates lack them (results retention shorter than "
                    "engine.retention + window + lateness?)",
                    p,
                    gone,
                    tp.topic,
                    start,
                )
            spans[tp] = ranges
        absorbed = dict.fromkeys(found, 0)
        unreadable = dict.fromkeys(found, 0)
        pending: dict[int, list[Any]] = {p: [] for p in found}

        def flush(p: int) -> None:
            docs, pending[p] = pending[p], []
            took = self._engine.absorb_results(docs, p)
            absorbed[p] += took
            unreadable[p] += len(docs) - took

        def absorb(tp: TopicPartition, record: Any) -> None:
            p = tp.partition
            read[p][0] += 1
            read[p][1] += len(record.value or b"") + len(record.key or b"")
            try:
                pending[p].append(json.loads(record.value))
            except (ValueError, TypeError):  # not JSON, not UTF-8, or a tombstone
                unreadable[p] += 1
            if len(pending[p]) >= ABSORB_BATCH:
                flush(p)

        short = read_spans(self._reader, spans, progress, absorb)
        for p in found:
            flush(p)
        for tp, high in short.items():
            raise checks.Refusal(
                f"the committed checkpoint of partition {tp.partition} names results up to "
                f"offset {spans[tp][-1][1]} of {tp.topic}:{tp.partition}, but that partition "
                f"ends at {high} (truncated or recreated, or the broker lost data); "
                f"{checks.start_over(self._where)}"
            )
        for p, count in unreadable.items():
            if count:
                # only evald writes these ranges: a record that is not a result means another
                # writer
                log.warning(
                    "partition %d: %d records in the committed result ranges of %s are not "
                    "results; left out of the window aggregates (does another producer write "
                    "to that topic?)",
                    p,
                    count,
                    self._topics.results,
                )
        return absorbed

    # -- step 5: the inputs ---------------------------------------------------------------

    def _seek(self, p: int, start: dict[str, int], checkpoint: Checkpoint | None) -> Restored:
        """Seek both inputs of ``p`` to ``start``; with a checkpoint, records up to its
        consumed offsets are replayed to rebuild pending joins."""
        for kind in KINDS:
            consumer_tp = self._inputs.tp(kind, p)
            self._consumer.seek(consumer_tp, start[kind])
        replay_end = dict(start) if checkpoint is None else dict(checkpoint.consumed)
        return Restored(start, replay_end, checkpoint)

    def _note_expired(self, checkpoint: Checkpoint, starts: Mapping[TopicPartition, int]) -> None:
        """Warn when records to replay were deleted by the inputs' retention: the impressions
        pending among them are lost (their results never come)."""
        for kind in KINDS:
            tp = self._inputs.tp(kind, checkpoint.partition)
            if checkpoint.committed[kind] < starts[tp]:
                log.warning(
                    "partition %d: %s records %d..%d to replay are gone (the log starts at "
                    "%d): impressions pending among them are lost; keep the inputs' retention "
                    "above engine.window + lateness plus the longest time evald may be stopped",
                    checkpoint.partition,
                    tp.topic,
                    checkpoint.committed[kind],
                    starts[tp] - 1,
                    starts[tp],
                )

    def _log_restored(
        self, checkpoint: Checkpoint, absorbed: int, read: list[int], elapsed: float
    ) -> None:
        log.info(
            "partition %d restored: watermark %s, replay from %s to %s, snapshot of %s "
            "bytes, %d results absorbed, %d records (%d bytes) read in %.2fs",
            checkpoint.partition,
            event_time(checkpoint.watermark),
            checkpoint.committed,
            checkpoint.consumed,
            "no" if checkpoint.snapshot is None else checkpoint.snapshot.size,
            absorbed,
            read[0],
            read[1],
            elapsed,
        )
