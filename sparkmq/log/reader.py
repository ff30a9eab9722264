"""Reading messages: from ConsumeQueue entries to Arrow record batches.

``MessageReader`` turns entries (queue offset -> batch, row) into a table of
messages: it decodes each referenced record batch from its segment (zero copy
from the memory map), slices contiguous rows (or takes scattered ones) and
adds the columns that live outside the segment: ``queue_offset``,
``physical_offset`` and ``message_id``.

``Snapshot`` is a read-only view of one committed version of the log: what a
Spark reader sees. It is immutable and thread-safe; it pickles as (URL,
version, storage options) and reloads exactly that version of that store
where it is unpickled.
"""
from __future__ import annotations

import bisect
import logging
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import (DataLossError, InvalidMessageIdError,
                      QueueNotFoundError, TopicNotFoundError, UserError)
from ..errors import SparkMQError, StoreIOError
from . import checksum
from . import format as fmt
from . import segment as seg
from .actions import AddFile, TopicConfig
from .built import composed_values
from .consumequeue import (ARRAY_COLUMNS, EntryArrays, entry_arrays, read_side_by_time,
                           read_side_entries)
from .fs import StoreFS
from .index import read_index
from .limits import timestamp_violation
from .messagetable import (MESSAGE_COLUMNS, MESSAGE_SCHEMA,  # noqa: F401  (re-exported)
                           composed_message_table, message_table, select_schema)
from .message import (StoredMessage, column_values, decode_message_id, message_ids,
                      messages_of)
from .txlog import LogState, TransactionLog

log = logging.getLogger("sparkmq.reader")


#: ConsumeQueue entries a read takes at a time (each step one table)
ENTRIES_PER_STEP = 65_536


class MessageReader:
    """Shared read logic; subclasses provide entries and batches."""

    state: LogState          # (its metaData: the message ids' tags, ``state.id_tags``)

    # -- to implement ------------------------------------------------------
    def _topic_id(self, topic: str) -> int:
        raise NotImplementedError

    def _topic_conf(self, topic: str) -> TopicConfig:
        raise NotImplementedError

    def _entries(self, tid: int, qid: int, lo: int, hi: int,
                 columns: list[str] | None = None) -> pa.Table:
        """ConsumeQueue entries in [lo, hi): all ENTRY_COLUMNS, or ``columns`` of them
        (``queue_offset`` always)."""
        raise NotImplementedError

    def _entry_arrays(self, tid: int, qid: int, lo: int, hi: int,
                      sizes: bool = False) -> EntryArrays:
        """:meth:`_entries` as a read uses them (with their sizes if ``sizes``)."""
        return entry_arrays(self._entries(tid, qid, lo, hi, list(ARRAY_COLUMNS[sizes])), sizes)

    def _read_batch(self, batch_offset: int) -> pa.RecordBatch:
        raise NotImplementedError

    def _cached_rows(self, batch_offset: int):
        """What a writer's cache holds for the batch (``CommitLog.cached_rows``), or None."""
        return None

    def min_offset(self, topic: str, queue_id: int) -> int:
        raise NotImplementedError

    def max_offset(self, topic: str, queue_id: int) -> int:
        raise NotImplementedError

    def _index_hits(self, tid: int, key: str) -> pa.Table:
        raise NotImplementedError

    def _time_entries(self, tid: int, qid: int | None, start_ms: int, end_ms: int) -> pa.Table:
        raise NotImplementedError

    def _visible_offset(self) -> int:
        raise NotImplementedError

    # -- shared ------------------------------------------------------------
    def _check_queue(self, topic: str, queue_id: int) -> int:
        conf = self._topic_conf(topic)
        n = max(conf.read_queue_nums, conf.write_queue_nums)
        if not isinstance(queue_id, int) or not 0 <= queue_id < n:
            raise QueueNotFoundError(
                f"topic {topic!r} has queues 0..{n - 1}; queue {queue_id!r} does not exist")
        return conf.id

    def read_table(self, topic: str, queue_id: int, start: int, end: int | None = None, *,
                   columns: Sequence[str] | None = None, max_bytes: int | None = None,
                   on_removed: str = "error") -> pa.Table:
        """Messages with queue offsets in ``[start, end)`` as one Arrow table.

        ``end`` defaults to the queue's max offset. Offsets removed by retention
        raise DataLossError naming the earliest available offset, unless
        ``on_removed="skip"``, which starts at the earliest instead.
        """
        tables = list(self.iter_tables(topic, queue_id, start, end, columns=columns,
                                        max_bytes=max_bytes, on_removed=on_removed))
        if not tables:
            return select_schema(columns).empty_table()
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def iter_batches(self, topic: str, queue_id: int, start: int, end: int | None = None, *,
                     columns: Sequence[str] | None = None, max_bytes: int | None = None,
                     on_removed: str = "error", entries_per_step: int = ENTRIES_PER_STEP,
                     ) -> Iterator[pa.RecordBatch]:
        """Record batches of messages in ``[start, end)``, in queue-offset order.

        One batch per stored record batch touched (zero-copy slices of it), with the
        computed columns sliced from arrays built once per step of
        ``entries_per_step`` ConsumeQueue entries.
        """
        for table in self.iter_tables(topic, queue_id, start, end, columns=columns,
                                       max_bytes=max_bytes, on_removed=on_removed,
                                       entries_per_step=entries_per_step):
            yield from table.to_batches()

    def iter_tables(self, topic: str, queue_id: int, start: int, end: int | None = None, *,
                    columns: Sequence[str] | None = None, max_bytes: int | None = None,
                    on_removed: str = "error", entries_per_step: int = ENTRIES_PER_STEP,
                    ) -> Iterator[pa.Table]:
        """Messages in ``[start, end)`` as one table per step of up to ``entries_per_step``
        ConsumeQueue entries (arguments as for :meth:`read_table`).

        Stored columns are chunked by record batch (zero-copy slices of the memory
        maps); the computed ones are one chunk. For callers that convert whole
        steps at once (the Spark reader) instead of batch by batch.
        """
        return self._iter_steps(topic, queue_id, start, end,
                                lambda entries: self._materialize(entries, columns),
                                max_bytes=max_bytes, on_removed=on_removed,
                                entries_per_step=entries_per_step)

    def _iter_steps(self, topic: str, queue_id: int, start: int, end: int | None,
                    convert: Callable[[pa.Table], Any], *, max_bytes: int | None,
                    on_removed: str, entries_per_step: int) -> Iterator:
        """``convert(entries)`` of each step of up to ``entries_per_step`` ConsumeQueue
        entries in ``[start, end)`` (what it returns unless None): the one walk over a
        queue's entries behind :meth:`iter_tables` (tables) and :meth:`read` (messages)."""
        tid = self._check_queue(topic, queue_id)
        if not isinstance(start, (int, np.integer)) or start < 0:
            raise UserError(f"start offset must be a non-negative integer, got {start!r}")
        lo_avail = self.min_offset(topic, queue_id)
        hi_avail = self.max_offset(topic, queue_id)
        end = hi_avail if end is None else min(end, hi_avail)
        if start < lo_avail:
            if on_removed == "skip":
                start = lo_avail
            elif start < end:
                raise DataLossError(
                    f"offsets {start}..{min(end, lo_avail) - 1} of {topic}/{queue_id} were removed "
                    f"by retention; the earliest available offset is {lo_avail}",
                    earliest_offset=lo_avail)
        budget = max_bytes
        pos = start
        while pos < end:
            step_end = min(end, pos + entries_per_step)
            entries = self._entry_arrays(tid, queue_id, pos, step_end, budget is not None)
            if len(entries.queue_offsets) == 0:
                break
            if budget is not None:
                sizes = np.cumsum(entries.sizes)
                k = max(1 if budget == max_bytes else 0,
                        int(np.searchsorted(sizes, budget, "right")))
                if k < len(sizes):
                    entries = entries.head(k)
                    end = pos  # stop after this step
                if k == 0:
                    break
                budget -= int(sizes[k - 1])
            part = convert(entries)
            if part is not None:
                yield part
            pos = max(pos + 1, int(entries.queue_offsets[-1]) + 1)

    def _materialize(self, entries: EntryArrays, columns: Sequence[str] | None,
                     ) -> pa.Table | None:
        """The messages of ``entries`` (sorted by queue offset) as one table, or None.
        The computed columns are one array each for all entries."""
        bos = entries.batch_offsets
        if not columns and len(bos) and bos[-1] < self._visible_offset():
            cached = self._cached_rows(int(bos[0]))     # (a put's batch, still composed?)
            if cached is not None:
                table = composed_message_table(cached, entries,
                                               self.state.id_tags.at(int(bos[0])))
                if table is not None:
                    return table
        found = self._stored(entries)
        if found is None:
            return None
        stored, qos, bos, rows = found
        return message_table(stored, qos, bos, rows, self.state.id_tags.of(bos), columns)

    def _messages(self, entries: EntryArrays) -> list[StoredMessage] | None:
        """The messages of ``entries`` as StoredMessages, or None: the stored columns
        converted as they are, the computed ones made as Python values (no Arrow
        column built, inserted, then taken apart again). Rows of batches the writer's
        cache holds composed (a long poll's pop of what a put just stored) are read from
        their C structs in one pass (``built.composed_values``)."""
        bos, rows, qos = entries.batch_offsets, entries.rows, entries.queue_offsets
        values = None
        if len(bos) and bos[-1] < self._visible_offset():
            values = self._composed_values(entries.runs())
        if values is None:
            found = self._stored(entries)
            if found is None:
                return None
            table, qos, bos, rows = found
            values = column_values(table)
        return messages_of({**values,
                            "queue_offset": qos.tolist(),
                            "physical_offset": (bos + rows.astype(np.int64)).tolist(),
                            "message_id": message_ids(self.state.id_tags.of(bos), bos, rows)},
                           len(rows))

    def _composed_values(self, runs: list[tuple[int, int, int]] | None
                         ) -> dict[str, list] | None:
        """``built.composed_values`` of ``runs`` (``EntryArrays.runs``) where the writer's
        cache holds each run's batch, else None."""
        cached = []
        for batch_offset, first, k in runs or ():
            rows = self._cached_rows(batch_offset)
            if rows is None:
                return None
            cached.append((rows, first, k))
        return composed_values(cached) if cached else None

    def _stored(self, entries: EntryArrays) -> tuple[pa.Table, np.ndarray, np.ndarray,
                                                       np.ndarray] | None:
        """The stored rows of ``entries`` (sorted by queue offset; those past the visible
        offset cut) as one SEGMENT_SCHEMA table, with their queue offsets, batch offsets
        and rows; None if none is visible.

        Stored columns are zero-copy: each run of entries in one record batch becomes
        a slice of it (a ``take`` if its rows are not contiguous), and the slices are
        chunks of the table.
        """
        visible = self._visible_offset()
        qos, bos, rows = entries.queue_offsets, entries.batch_offsets, entries.rows
        if len(bos) and bos[-1] >= visible:
            keep = bos < visible
            bos, rows, qos = bos[keep], rows[keep], qos[keep]
        if len(bos) == 0:
            return None
        parts = []
        for s, e, first, last, bo in EntryArrays(qos, bos, rows).groups():
            batch = self._read_batch(bo)
            k = e - s
            if last - first == k - 1:
                parts.append(batch if first == 0 and k == batch.num_rows
                             else batch.slice(first, k))
            else:
                parts.append(batch.take(pa.array(rows[s:e])))
        try:
            stored = pa.Table.from_batches(parts, schema=fmt.SEGMENT_SCHEMA)
        except pa.ArrowInvalid:   # a cached batch whose schema differs in metadata only
            stored = pa.Table.from_batches(
                [pa.RecordBatch.from_arrays(p.columns, schema=fmt.SEGMENT_SCHEMA)
                 for p in parts], schema=fmt.SEGMENT_SCHEMA)
        return stored, qos, bos, rows

    def read(self, topic: str, queue_id: int, offset: int, max_messages: int = 32,
             ) -> list[StoredMessage]:
        """Up to ``max_messages`` messages from ``offset`` on, as Python objects (what
        ``stored_messages(read_table(...))`` gives, made without the table's computed
        columns)."""
        out: list[StoredMessage] = []
        for msgs in self._iter_steps(topic, queue_id, offset, offset + max(0, max_messages),
                                     self._messages, max_bytes=None, on_removed="error",
                                     entries_per_step=ENTRIES_PER_STEP):
            out += msgs
        return out

    def lookup(self, message_id: str) -> StoredMessage | None:
        """The message with this id, or None if it is no longer (or not yet) stored."""
        tag, batch_offset, row = decode_message_id(message_id)
        tags = self.state.id_tags
        if not tags.issued_here(tag):
            raise InvalidMessageIdError(
                f"message id {message_id} was issued by another store (tag {tag:08X})")
        if batch_offset >= self._visible_offset() or tags.at(batch_offset) != tag:
            return None     # (not yet stored; or a message a crash took: ``log/idtags.py``)
        try:
            batch = self._read_batch(batch_offset)
        except (DataLossError, FileNotFoundError):   # (its segment deleted since: retention)
            return None
        except StoreIOError:
            raise
        except Exception as exc:   # a forged id may point anywhere: what reading there raises
            #                        (Arrow, index, format errors) means the id is bad
            raise InvalidMessageIdError(
                f"message id {message_id} does not point at a message of this store: it was "
                f"not issued here, or it named a message a crash took before it was flushed "
                f"(ASYNC_FLUSH) (reading there: {type(exc).__name__})") from None
        if row >= batch.num_rows:
            raise InvalidMessageIdError(f"message id {message_id} points past its batch")
        one = batch.slice(row, 1)
        topic = one.column("topic")[0].as_py()
        qid = one.column("queue_id")[0].as_py()
        try:
            qo = self._queue_offset_of(topic, qid, batch_offset, row)
        except DataLossError:   # its queue's side table deleted since (retention)
            return None
        if qo < 0:
            return None   # not in its queue: removed by retention, or its topic deleted
        d = one.to_pylist()[0]
        d.update(queue_offset=qo, physical_offset=batch_offset + row, message_id=message_id)
        return StoredMessage.from_row(d)

    def _queue_offset_of(self, topic: str, qid: int, batch_offset: int, row: int) -> int:
        """Queue offset of a message from its location (binary search on the queue)."""
        try:
            tid = self._topic_id(topic)
        except TopicNotFoundError:
            return -1
        lo, hi = self.min_offset(topic, qid), self.max_offset(topic, qid)
        key = (batch_offset, row)
        while lo < hi:   # entries are sorted by location within a queue
            mid = (lo + hi) // 2
            e = self._entries(tid, qid, mid, mid + 1)
            if e.num_rows == 0:
                return -1
            here = (e.column("batch_offset")[0].as_py(), e.column("row")[0].as_py())
            if here == key:
                return mid
            if here < key:
                lo = mid + 1
            else:
                hi = mid
        return -1

    def query_by_key(self, topic: str, key: str, *, max_results: int = 64,
                     start_ms: int | None = None, end_ms: int | None = None,
                     ) -> list[StoredMessage]:
        """Messages of ``topic`` carrying ``key`` (via the Index; bodies are not scanned)."""
        tid = self._topic_id(topic)
        hits = self._index_hits(tid, key)
        if start_ms is not None or end_ms is not None:
            ts = hits.column("store_timestamp").cast(pa.int64())
            mask = pc.and_(pc.greater_equal(ts, start_ms if start_ms is not None else -(1 << 62)),
                           pc.less_equal(ts, end_ms if end_ms is not None else 1 << 62))
            hits = hits.filter(mask)
        return self._messages_at(topic, hits, max_results)

    def query_by_time(self, topic: str, start_ms: int, end_ms: int, *,
                      queue_id: int | None = None, max_results: int = 1024,
                      ) -> list[StoredMessage]:
        """Messages of ``topic`` stored within ``[start_ms, end_ms]`` (ConsumeQueue times)."""
        tid = self._topic_id(topic)
        hits = self._time_entries(tid, queue_id, start_ms, end_ms)
        return self._messages_at(topic, hits, max_results)

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset stored at or after ``timestamp_ms`` (max offset if none);
        a time outside 1970..9999 is refused (MessageLimitError, BAD_REQUEST)."""
        bad = timestamp_violation(timestamp_ms, "query timestamp")
        if bad is not None:
            raise bad
        tid = self._check_queue(topic, queue_id)
        hits = self._time_entries(tid, queue_id, timestamp_ms, 1 << 62)
        if hits.num_rows == 0:
            return self.max_offset(topic, queue_id)
        return max(int(pc.min(hits.column("queue_offset")).as_py()),
                   self.min_offset(topic, queue_id))

    def _messages_at(self, topic: str, hits: pa.Table, max_results: int) -> list[StoredMessage]:
        if hits.num_rows == 0:
            return []
        hits = hits.sort_by([("queue_id", "ascending"), ("queue_offset", "ascending")])
        out: list[StoredMessage] = []
        seen = set()
        for qid, qo in zip(hits.column("queue_id").to_pylist(),
                           hits.column("queue_offset").to_pylist()):
            if (qid, qo) in seen:
                continue
            seen.add((qid, qo))
            if qo < self.min_offset(topic, qid):
                continue
            out.extend(self.read(topic, qid, qo, 1))
            if len(out) >= max_results:
                break
        return out

    def queue_ranges(self, topic: str | None = None) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, queue) -> (min offset, max offset) for one topic or all."""
        out = {}
        for name in ([topic] if topic else self.topic_names()):
            conf = self._topic_conf(name)
            for q in range(max(conf.read_queue_nums, conf.write_queue_nums)):
                out[(name, q)] = (self.min_offset(name, q), self.max_offset(name, q))
        return out

    def topic_names(self) -> list[str]:
        raise NotImplementedError

    # -- the public lookups other layers build on (the data source's admission
    #    control and key pushdown): no caller outside log/ uses the hooks above
    def topic_id(self, topic: str) -> int:
        """The id of a live topic (``TopicNotFoundError`` naming the topics there are)."""
        return self._topic_id(topic)

    def queue_entries(self, tid: int, qid: int, lo: int, hi: int,
                      columns: list[str] | None = None) -> pa.Table:
        """ConsumeQueue entries of queue offsets [lo, hi) of queue (tid, qid), in order
        (FORMAT.md section 4's columns; ``columns`` narrows them)."""
        return self._entries(tid, qid, lo, hi, columns)

    def index_hits(self, tid: int, key: str) -> pa.Table:
        """Index rows (queue id, queue offset, ...) of messages of topic ``tid`` with ``key``."""
        return self._index_hits(tid, key)


class Snapshot(MessageReader):
    """One committed version of a store, read-only.

    Sees exactly the messages, topics and offsets of that version: segments up
    to their committed sizes and the ConsumeQueue/Index files it lists.
    """

    def __init__(self, url: str, state: LogState, *, storage_options: dict | None = None,
                 sfs: StoreFS | None = None,
                 verified: checksum.VerifiedBatches | None = None):
        self.url = url
        self.sfs = sfs or StoreFS(url, storage_options)
        # the options travel with the snapshot when it is pickled: take them from the
        # StoreFS when the caller (Store.snapshot) passed only that
        self.storage_options = storage_options if storage_options is not None \
            else self.sfs.storage_options
        self.state = state
        self.store_id = state.store_id
        self._segments = sorted(state.segments.values(), key=lambda a: a.base_offset)
        self._bases = [a.base_offset for a in self._segments]
        self._cq_files = list(state.consumequeue_files.values())
        self._index_files = list(state.index_files.values())
        self._max = state.queue_max_offsets()
        self._min = state.queue_min_offsets()
        # batches whose checksum was checked (shared with the snapshots advanced from this
        # one: a batch's bytes never change while a version lists them)
        self._verified = verified if verified is not None else checksum.VerifiedBatches()

    @classmethod
    def load(cls, url: str, *, version: int | None = None, timestamp_ms: int | None = None,
             storage_options: dict | None = None) -> "Snapshot":
        sfs = StoreFS(url, storage_options)
        state = TransactionLog(sfs).snapshot(version, timestamp_ms=timestamp_ms)
        return cls(url, state, storage_options=storage_options, sfs=sfs)

    def advance(self, version: int | None = None) -> "Snapshot":
        """The snapshot of ``version`` (default: the newest) of the same store, built from
        this one: only the commits after this version are read and replayed onto a copy of
        its state (no ``_last_checkpoint``, checkpoint or sidecar read), and the newest
        version is found by probing the commit files after this one, not by listing
        ``_log/``. This snapshot is not changed (states are immutable): a reader holding
        it keeps reading exactly its version. ``self`` when ``version`` is this one.

        An older ``version``, or one whose commits log cleanup already deleted, is a
        fresh load (:meth:`load`). The new snapshot shares this one's file handle (its
        memory maps, less those of segments the new version removed) and checksum cache.
        Thread-safe."""
        if version == self.version:
            return self
        if version is not None and version < self.version:
            return Snapshot.load(self.url, version=version,
                                 storage_options=self.storage_options)
        tl = TransactionLog(self.sfs)
        if not self._same_store(tl):
            return Snapshot.load(self.url, version=version, storage_options=self.storage_options)
        state = tl.snapshot(version, base=self.state)
        if state is self.state:
            return self
        # (a state new here, handed to no one yet) readers write no checkpoints: drop the
        # changed-keys set a checkpoint load starts, which would grow with every advance
        state.dirty = None
        # the shared file handle outlives this snapshot: unmap segments the new version
        # removed (retention), or a long chain of advances would keep every deleted
        # segment's disk space mapped (an older snapshot still reading one maps it again)
        for path in self.state.segments.keys() - state.segments.keys():
            self.sfs.forget(path)
        return Snapshot(self.url, state, storage_options=self.storage_options, sfs=self.sfs,
                        verified=self._verified)

    def _same_store(self, tl: TransactionLog) -> bool:
        """This version's commit file is still the one this snapshot was built from
        (same commit time): the store at the URL was not deleted and made again, whose
        commits must not be replayed onto this state. One small read."""
        try:
            return tl.commit_timestamp(self.version) == self.state.timestamp_ms
        except (FileNotFoundError, SparkMQError):   # gone (cleaned up, or another store)
            return False

    def __reduce__(self):
        # pickles as (url, version, storage options): the copy reopens the same
        # committed version of the same store, wherever it is unpickled
        return (_load_snapshot, (self.url, self.state.version, self.storage_options))

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def timestamp_ms(self) -> int:
        return self.state.timestamp_ms

    def topic_names(self) -> list[str]:
        return sorted(self.state.topics)

    def topics(self) -> dict[str, TopicConfig]:
        return dict(self.state.topics)

    def _topic_conf(self, topic: str) -> TopicConfig:
        conf = self.state.topics.get(topic)
        if conf is None:
            raise TopicNotFoundError(
                f"topic {topic!r} does not exist in version {self.state.version} of "
                f"{self.url}; topics: {sorted(self.state.topics) or 'none'}")
        return conf

    def _topic_id(self, topic: str) -> int:
        return self._topic_conf(topic).id

    def min_offset(self, topic: str, queue_id: int) -> int:
        tid = self._topic_id(topic)
        return self._min.get((tid, queue_id), self._max.get((tid, queue_id), 0))

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._max.get((self._topic_id(topic), queue_id), 0)

    def _entries(self, tid, qid, lo, hi, columns=None):
        return read_side_entries(self.sfs, self._cq_files, tid, qid, lo, hi, columns)

    def _visible_offset(self) -> int:
        return 1 << 62

    def _segment(self, batch_offset: int) -> AddFile:
        i = bisect.bisect_right(self._bases, batch_offset) - 1
        if i < 0 or batch_offset >= self._segments[i].base_offset + self._segments[i].size:
            first = self._bases[0] if self._bases else 0
            raise DataLossError(
                f"physical offset {batch_offset} is in no segment of version "
                f"{self.state.version} (earliest is {first})", earliest_offset=first)
        return self._segments[i]

    def _read_batch(self, batch_offset: int) -> pa.RecordBatch:
        add = self._segment(batch_offset)
        pos = batch_offset - add.base_offset
        try:
            if not self.sfs.is_local:   # object stores: fetch this batch's bytes only
                return seg.read_remote_batch(self.sfs, add.path, pos)[0]
            buf = self.sfs.read_buffer(add.path, cache=True, min_size=add.size)
        except FileNotFoundError:
            raise DataLossError(
                f"segment {add.path} of version {self.state.version} was deleted by "
                "retention after that version; read a newer version",
                earliest_offset=None) from None
        return seg.read_batch_at(buf, pos, add.path, verified=self._verified)

    def _index_hits(self, tid, key):
        return read_index(self.sfs, self._index_files, tid, key)

    def _time_entries(self, tid, qid, start_ms, end_ms):
        return read_side_by_time(self.sfs, self._cq_files, tid, qid, start_ms, end_ms)

    def consumer_offsets(self, group: str) -> dict[tuple[str, int], int]:
        names = {t.id: t.name for t in self.state.topics_by_id.values()}
        return {(names.get(tid, str(tid)), qid): off
                for (g, tid, qid, cid), off in self.state.consumer_offsets.items()
                if g == group and not cid}


def _load_snapshot(url: str, version: int, storage_options: dict | None) -> Snapshot:
    """Unpickle a :class:`Snapshot` at the version it was pickled at."""
    return Snapshot.load(url, version=version, storage_options=storage_options)
