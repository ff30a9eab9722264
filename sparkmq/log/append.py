"""Appends: messages -> one record batch -> CommitLog -> dispatch -> flush wait.

RocketMQ's ``CommitLog.putMessage``: :class:`Appender` builds and validates a
batch with the store's :class:`~sparkmq.log.batch.BatchBuilder`, appends it to
the CommitLog and dispatches it under the store's append lock (stamping a
non-decreasing store time), then waits for the group-commit fsync
(SYNC_FLUSH) and makes the new offsets visible to readers and listeners.

On disk: the CommitLog's active segment. After a crash: bytes written and not
published are recovered (:mod:`sparkmq.log.recovery`). Thread-safety: safe
from several threads (the append lock serializes the CommitLog part).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np
import pyarrow as pa

from ..config import SYNC_FLUSH
from ..errors import (CorruptStoreError, DiskFullError, FencedError, InvalidMessageError,
                      StoreClosedError)
from . import format as fmt
from .batch import BatchBuilder, messages_to_batch, split_by_size
from .built import BuiltRows, stamp_store_time
from .dispatch import RowInfo
from .limits import MessageLimits, check_valid_arrow
from .message import Message, encode_message_id
from .status import AppendResult, BatchAppendResult, PutMessageStatus

if TYPE_CHECKING:
    from .store import Store


class Appender:
    """Appends to one writable store (see the module docstring). Owns the batch
    builder (and so the round-robin queue chooser) and the last store time."""

    def __init__(self, store: "Store"):
        self.store = store
        c = store.config
        self.batches = BatchBuilder(store.writable_topic,
                                    limits=MessageLimits.of(c),
                                    store_host=c.store_host, clock_ms=store.clock_ms)
        self._last_store_ts = 0

    def append(self, messages: Iterable[Message] | Message, *,
               limits_checked: bool = False) -> list[AppendResult]:
        """Append messages; one result per message, in order. Each message is held to
        the input limits (``log/limits.py``) unless ``limits_checked`` (the broker
        storing again what it accepted, e.g. into a DLQ, with properties of its own).

        All messages of one call are one record batch (split only past 256 MiB
        of bodies). Returns when the batch is written (ASYNC_FLUSH) or fsynced
        (SYNC_FLUSH; status FLUSH_DISK_TIMEOUT if the fsync took longer than
        ``sync_flush_timeout_ms`` — the messages are still stored).
        """
        self.require_space()
        self.hold_lease()
        if isinstance(messages, Message):
            messages = [messages]
        msgs = list(messages)
        if not msgs:
            return []
        for m in msgs:
            if not isinstance(m, Message):
                raise InvalidMessageError(
                    f"append takes sparkmq.Message objects, got {type(m).__name__}")
        results: list[AppendResult] = []
        for group in split_by_size(msgs):
            results.extend(self._append_group(group, not limits_checked))
        return results

    def _append_group(self, msgs: list[Message], check_limits: bool) -> list[AppendResult]:
        qids = self.batches.queue_ids_for(msgs)
        with self.store.append_lock:
            b = self.batches
            batch = messages_to_batch(msgs, queue_ids=qids, store_timestamp_ms=self._store_ts(),
                                      store_host=b.store_host, limits=b.limits,
                                      check_limits=check_limits)
            batch_offset, qos, updates = self._append_locked(batch)
            end = self.store.commitlog.written_offset
        self.hold_lease(written=True)
        status = self._await_flush(end)
        self.store.dispatcher.after_visible(updates)
        tag = self.store.state.id_tags.at(batch_offset)
        return [AppendResult(status, encode_message_id(tag, batch_offset, i), m.topic, q, qo,
                             batch_offset + i)
                for i, (m, q, qo) in enumerate(zip(msgs, qids, qos.tolist()))]

    def require_space(self) -> None:
        """Refuse an append (``DiskFullError``) while the disk is over
        ``diskSpaceWarningLevelRatio`` (RocketMQ's disk-full state), besides the
        store's own writability checks."""
        self.store.require_writable()
        pct = self.store.disk_full_percent
        if pct is not None:
            raise DiskFullError(
                f"store {self.store.url}: the disk is {pct:.1f}% full, over "
                f"diskSpaceWarningLevelRatio ({self.store.config.disk_space_warning_level_ratio}%):"
                " appends are refused until space is freed (retention removes the oldest "
                "segments past diskSpaceCleanForciblyRatio; or grow the disk); reads go on")

    def append_batch(self, data: pa.RecordBatch | pa.Table | BuiltRows, *,
                     limits_checked: bool = False, later: list | None = None
                     ) -> BatchAppendResult:
        """Columnar append: rows with at least ``topic`` and ``body`` (other
        segment columns optional; a row's ``queue_id`` is kept, range-checked,
        and where the column is missing or null it is ``crc32(message_group) %
        queues`` for a row with a message group, else chosen round robin).
        Everything is one record batch; per-row offsets come back as arrays. The fast path for bulk producers and benchmarks: a
        ``RecordBatch`` whose schema already equals ``SEGMENT_SCHEMA`` (field
        metadata aside) is validated without casting or copying any column.
        Every row is held to the input limits (``log/limits.py``: MessageLimitError);
        ``limits_checked``: the caller has held every row to them already (the broker,
        message by message before merging, or storing again what it accepted), so they
        are not checked twice. Data that is not valid Arrow in full (a string that is not
        UTF-8, an offset out of bounds) is refused first, whoever calls. ``BuiltRows``
        (``log/built.py``: rows the caller checked, built by the log's builder) skip the
        checks their caller made, and take the store time in place. ``later``: the caller
        waits for the flush itself (a coroutine: :meth:`flushed_async`) and then makes
        the rows visible (``Dispatcher.after_visible``), both as this method would; it
        gets ``(offset to flush to, the visibility updates)`` appended there and a
        PUT_OK it must correct if the flush fails."""
        self.require_space()
        self.hold_lease()
        built = data if isinstance(data, BuiltRows) else None
        info = None
        if built is not None:            # checked by its caller (log/built.py): not again
            batch, info = self.batches.check_segment_batch(built, limits_checked=True,
                                                           built=built)
        elif isinstance(data, pa.RecordBatch) and data.schema.equals(fmt.SEGMENT_SCHEMA):
            check_valid_arrow(data, "the appended batch")
            batch, info = self.batches.check_segment_batch(data, limits_checked=limits_checked)
        else:
            if isinstance(data, (pa.RecordBatch, pa.Table)):
                check_valid_arrow(data, "the appended batch")
            table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
            batch = self.batches.normalize(table, limits_checked=limits_checked)
        n = batch.num_rows
        with self.store.append_lock:
            c_array = None
            if built is not None:        # its column shares the buffer built.times views
                ts_ms = built.stamp(self._store_ts())
                c_array = built.c_array() if batch is built else None
            else:
                batch, ts_ms = stamp_store_time(batch, self._store_ts())
            batch_offset, qos, updates = self._append_locked(batch, info, ts_ms, c_array)
            end = self.store.commitlog.written_offset     # (this batch's: others' come after)
        self.hold_lease(written=True)
        if later is not None:            # the caller flushes, then makes them visible
            later.append((end, updates))
            status = PutMessageStatus.PUT_OK
        else:
            status = self._await_flush(end)
            self.store.dispatcher.after_visible(updates)
        qids = info.queue_ids if info is not None else batch.column("queue_id").to_numpy()
        return BatchAppendResult(status, batch_offset, qos, qids, n)

    def hold_lease(self, *, written: bool = False) -> None:
        """Make sure this writer still holds the store's lease where it may have lapsed
        (``WriterLease.lapsing``: a publish that did not run, a paused process): renew it
        now with a publish, which raises FencedError if another writer took it over.
        Before an append that refuses it; after one (``written``) it turns an answer of
        stored into FencedError, since its bytes may have landed after the new writer
        sealed this one's segment, where no reader looks (whether they did is not known:
        the message may be stored, or lost). In the usual case (the publish service
        renews the lease at half its timeout) this is one clock read."""
        store = self.store
        if not store.lease.lapsing(store.state):
            return
        try:
            store.publish(force=True)
        except FencedError as exc:
            if not written:
                raise
            raise FencedError(
                f"{exc.message}. An append ended after this writer's lease could have lapsed and "
                "another writer took the store over: it may not be stored; send it again "
                "to the store's new writer") from None

    def segment_taken(self, rel: str) -> None:
        """``CommitLog.segment_taken``: the segment this writer rolls to exists. Every
        file at the store's end was adopted at open, so a writer the store was taken from
        made it after (a late roll). That writer's lease has lapsed: ``hold_lease`` raises
        FencedError there, and the roll stops. For the lease's holder it returns, and the
        stray file is replaced. A replica's segments are its master's: not replaced."""
        if self.store.replica:
            raise FileExistsError(f"segment {rel} exists on this replica")
        self.hold_lease()
        if rel in self.store.state.segments:     # published: not a late roll's, never replaced
            raise CorruptStoreError(
                f"store {self.store.url}: segment {rel} is in the log but this writer's "
                "commit log ends before it (a segment before it is shorter than recorded?); "
                f"nothing is replaced: run 'sparkmq admin verify {self.store.url}'")

    def _store_ts(self) -> int:
        ts = max(self.store.clock_ms(), self._last_store_ts)
        self._last_store_ts = ts
        return ts

    def _append_locked(self, batch: pa.RecordBatch, info: "RowInfo | None" = None,
                       store_ts_ms: np.ndarray | None = None,
                       c_array: tuple | None = None) -> tuple[int, np.ndarray, list]:
        if self.store.closed:
            raise StoreClosedError(f"store {self.store.url} is closed")
        self.store.require_not_replica()
        rolls = self.store.commitlog.segments_created
        batch_offset = self.store.commitlog.append(batch, c_array=c_array)
        qos, updates = self.store.dispatcher.dispatch(batch, batch_offset, info, store_ts_ms)
        self.store.dispatcher.dispatched_offset = self.store.commitlog.written_offset
        if rolls != self.store.commitlog.segments_created:
            self.store.services.wake_publisher()   # publish at segment roll, not only on the interval
        return batch_offset, qos, updates

    async def flushed_async(self, offset: int) -> PutMessageStatus:
        """``_await_flush`` for a coroutine (``append_batch``'s ``later``): bytes below
        ``offset`` fsynced under SYNC_FLUSH, awaited (``GroupCommitService``)."""
        gc = self._group_commit()
        if gc is None:
            return PutMessageStatus.PUT_OK
        return _flushed(await gc.flushed_async(offset,
                                               self.store.config.sync_flush_timeout_ms))

    def make_visible(self, later: list) -> None:
        """Make visible what ``append_batch`` left for ``later`` (once flushed)."""
        for _, updates in later:
            self.store.dispatcher.after_visible(updates)

    def _await_flush(self, end: int) -> PutMessageStatus:
        """The bytes below ``end`` (an append's own end, taken under the append lock, as
        RocketMQ's group commit request waits for its own ``wroteOffset + wroteBytes``)
        fsynced under SYNC_FLUSH: not the bytes other appends wrote since, which would
        make it wait a group commit longer."""
        gc = self._group_commit()
        if gc is None:
            return PutMessageStatus.PUT_OK
        return _flushed(gc.wait_for(end, self.store.config.sync_flush_timeout_ms))

    def _group_commit(self):
        """The group commit to wait for, or None: nothing to wait for (under SYNC_FLUSH
        with the services not started, the fsync is made here, at once)."""
        gc = self.store.services.group_commit
        if gc is None and self.store.config.flush_disk_type == SYNC_FLUSH:
            self.store.commitlog.flush(sync=True)
        return gc


def _flushed(ok: bool) -> PutMessageStatus:
    """A group commit wait's answer as the append's status."""
    return PutMessageStatus.PUT_OK if ok else PutMessageStatus.FLUSH_DISK_TIMEOUT
