"""The dispatcher (RocketMQ's ReputMessageService): CommitLog batches -> ConsumeQueue + Index.

Every batch that joins a store's CommitLog -- appended, recovered, adopted from
Spark, replicated -- goes through :meth:`Dispatcher.dispatch`, which assigns its
rows their queue offsets (continuing each (topic id, queue id)) and adds their
ConsumeQueue and Index entries to the in-memory tables. :meth:`Dispatcher.after_visible`
then advances the visible max offsets and calls the arrival listeners (long
polling). :func:`assign_entries` is the same assignment for a committer that
builds side tables straight from a log state (no in-memory tables).

On disk: nothing of its own (the in-memory entries are published as
ConsumeQueue/Index side files by the store). After a crash: recovery rebuilds
the state by re-dispatching the unpublished CommitLog tail
(:mod:`sparkmq.log.recovery`).

Thread-safety: ``dispatch`` must be serialized by the caller (the store's
append lock, or single-threaded recovery/adoption, or the replica's dispatch
lock); ``after_visible``, the listener list and the offset getters are safe
from any thread.
"""
from __future__ import annotations

import functools
import logging
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import format as fmt
from .consumequeue import Chunk, MemoryConsumeQueue
from .index import MemoryIndex, index_entries
from .txlog import LogState

try:
    from .. import _screen as _c_screen      # sparkmq/_screen.c (body_sizes)
except ImportError:     # not built (a source checkout without a compiler): numpy measures
    _c_screen = None

_INT32 = struct.Struct("<i")
log = logging.getLogger("sparkmq.store")


@dataclass
class RowInfo:
    """What validating a batch learned about its rows, reused by dispatch."""

    topic_names: list[str]            # distinct topics of the batch
    topic_index: np.ndarray | None    # row -> index in topic_names (None: one topic)
    queue_ids: np.ndarray             # int32 per row
    body_sizes: np.ndarray            # int32 body bytes per row
    given: frozenset | None = None    # the columns a writer set (the rest: the defaults)
    queue: int | None = None          # every row's queue id, if its writer put them in one


def binary_lengths(arr: pa.Array) -> np.ndarray:
    """Byte length of each value of a binary array (int32), from its offsets (no kernel call)."""
    if arr.type == pa.binary() and arr.null_count == 0:
        return _offset_lengths(arr.buffers()[1], arr.offset, len(arr))
    return pc.binary_length(arr).fill_null(0).to_numpy().astype(np.int32)


def _offset_lengths(offsets, first: int, n: int) -> np.ndarray:
    """The byte lengths of values ``first..first+n-1`` whose int32 offsets are the buffer
    ``offsets`` (int32)."""
    o = np.frombuffer(offsets, np.int32, count=n + 1, offset=first * 4)
    return o[1:] - o[:-1]      # (np.diff costs ~8 us of Python per call)


def measured_bodies(arr: pa.Array) -> tuple[np.ndarray, tuple[int, int, int] | None]:
    """:func:`binary_lengths` of a send's bodies, and their (least, greatest, total) bytes
    where one C call (``sparkmq._screen.body_sizes``) measured them all (else None:
    ``BuiltRows.body_extent`` finds them when asked)."""
    if _c_screen is not None and len(arr) and arr.type == pa.binary() and not arr.null_count:
        return measured_offsets(arr.buffers()[1], arr.offset, len(arr))
    return binary_lengths(arr), None


def measured_offsets(offsets, first: int, n: int
                     ) -> tuple[np.ndarray, tuple[int, int, int] | None]:
    """:func:`measured_bodies` of ``n`` (>= 1) values whose int32 offsets are the buffer
    ``offsets`` from value ``first`` on (a binary array's, or a scanner's)."""
    if _c_screen is not None:
        data, least, greatest, total = _c_screen.body_sizes(offsets, first, n)
        return np.frombuffer(data, np.int32), (least, greatest, total)
    return _offset_lengths(offsets, first, n), None


def distinct_strings(arr: pa.Array) -> list:
    """The distinct values of a string (or binary) array, in first-seen order, as
    ``pc.unique`` gives them. The usual batch has one topic: that is found from the
    buffers (its offsets evenly spaced from 0, its data the first value repeated), two
    byte compares, not a hash kernel, whose fixed cost is a few us warm and several
    times that when its code has left the caches between requests."""
    n = len(arr)
    if n == 1:
        return arr.to_pylist()           # (a quarter of a scalar's as_py)
    if n and arr.null_count == 0 and arr.offset == 0 and arr.type in _ONE_VALUE_TYPES:
        _, offsets, data = arr.buffers()
        width = _INT32.unpack_from(offsets, 4)[0]
        if _INT32.unpack_from(offsets, 0)[0] == 0 and width > 0 \
                and offsets.to_pybytes()[:4 * (n + 1)] == _even_offsets(n, width):
            values = data.to_pybytes()[:width * n]
            if values == values[:width] * n:
                return arr.slice(0, 1).to_pylist()
    return pc.unique(arr).to_pylist()


_ONE_VALUE_TYPES = (pa.string(), pa.binary())


@functools.lru_cache(maxsize=64)
def _even_offsets(n: int, width: int) -> bytes:
    return np.arange(0, (n + 1) * width, width, dtype=np.int32).tobytes()


def row_info(batch: pa.RecordBatch) -> RowInfo:
    """:class:`RowInfo` of a segment batch (topic and queue_id have no nulls)."""
    enc = pc.dictionary_encode(batch.column("topic"))
    names = enc.dictionary.to_pylist()
    idx = enc.indices.to_numpy() if len(names) > 1 else None
    return RowInfo(names, idx, batch.column("queue_id").to_numpy(),
                   binary_lengths(batch.column("body")))


def tags_codes(tags: pa.Array) -> np.ndarray:
    """The ConsumeQueue ``tags_code`` (int64) of each row's tags (0 for none)."""
    n = len(tags)
    if tags.null_count == n:
        return np.zeros(n, np.int64)
    enc = pc.dictionary_encode(tags)
    codes = np.asarray([fmt.tags_code(t) for t in enc.dictionary.to_pylist()] + [0], np.int64)
    return codes[enc.indices.fill_null(len(codes) - 1).to_numpy()]


def queue_groups(tids: list[int], info: RowInfo, n: int
                 ) -> tuple[list[tuple[int, int, np.ndarray | None]], np.ndarray | None]:
    """The (topic id, queue id, rows) groups of a batch (rows None: every row; ``tids``
    the id of each of ``info.topic_names``) and the topic id per row (None when it was
    not needed: one queue)."""
    qids = info.queue_ids
    if info.topic_index is None and (n == 1 or info.queue is not None
                                     or qids.min() == qids.max()):
        return [(tids[0], int(qids[0]), None)], None
    tnp = topic_ids_per_row(tids, info, n)
    key = (tnp << 32) | qids.astype(np.int64)
    # one stable sort, then runs of equal keys: O(rows log rows), whatever the number of
    # queues (a scan of every row per queue was O(rows x queues)); rows keep batch order
    order = np.argsort(key, kind="stable")
    sk = key[order]
    cuts = (np.flatnonzero(sk[1:] != sk[:-1]) + 1).tolist()
    starts, ends = [0] + cuts, cuts + [len(sk)]
    return [(int(sk[a]) >> 32, int(sk[a]) & 0xFFFFFFFF, order[a:b])
            for a, b in zip(starts, ends)], tnp


def topic_ids_per_row(tids: list[int], info: RowInfo, n: int) -> np.ndarray:
    return np.asarray(tids, np.int64)[info.topic_index] if info.topic_index is not None \
        else np.full(n, tids[0], np.int64)


#: the most rows whose arrays batches share (cached once, read-only); a longer batch's
#: are its own (a chunk's rows and tags here; a segment batch's defaults, log/batch.py)
SHARED_ROWS = 1024


def _every_row(n: int) -> np.ndarray:
    """Rows ``0..n-1`` (int32): the rows of a chunk that takes a whole batch."""
    return _shared(n)[0] if n <= SHARED_ROWS else np.arange(n, dtype=np.int32)


def _no_tags(n: int) -> np.ndarray:
    """``n`` rows' tags codes where no row has tags (int64 zeros)."""
    return _shared(n)[1] if n <= SHARED_ROWS else np.zeros(n, np.int64)


@functools.lru_cache(maxsize=64)
def _shared(n: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_every_row` and :func:`_no_tags` of ``n`` rows, read-only: one pair shared
    by the chunks of every batch of ``n`` rows (no chunk writes its arrays)."""
    rows, codes = np.arange(n, dtype=np.int32), np.zeros(n, np.int64)
    rows.flags.writeable = codes.flags.writeable = False
    return rows, codes


def next_queue_offsets(state: LogState) -> dict[tuple[int, int], int]:
    """(topic_id, queue_id) -> next queue offset, never below a retention floor."""
    out = dict(state.queue_max_offsets())
    for q in state.retention.queues if state.retention else ():
        key = (q.topic_id, q.queue_id)
        out[key] = max(out.get(key, 0), int(q.min_offset))
    return out


def assign_entries(state: LogState, batch: pa.RecordBatch, batch_offset: int,
                   nxt: dict[tuple[int, int], int]) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """ConsumeQueue entries, queue offsets and topic ids of one batch's rows whose
    topics all exist in ``state`` (offsets continue ``nxt``, which is advanced).
    The stateless form of :meth:`Dispatcher.dispatch` for committers."""
    n = batch.num_rows
    info = row_info(batch)
    tids = [state.topics[t].id for t in info.topic_names]
    qos = np.zeros(n, np.int64)
    groups, tnp = queue_groups(tids, info, n) if n else ([], None)
    for tid, qid, rows in groups:
        start = nxt.get((tid, qid), 0)
        count = n if rows is None else len(rows)
        nxt[(tid, qid)] = start + count
        qos[slice(None) if rows is None else rows] = np.arange(start, start + count)
    tnp = topic_ids_per_row(tids, info, n) if n else np.zeros(0, np.int64)
    entries = pa.table([
        pa.array(tnp.astype(np.int32)), pa.array(info.queue_ids.astype(np.int32)),
        pa.array(qos), pa.array(np.full(n, batch_offset, np.int64)),
        pa.array(np.arange(n, dtype=np.int32)), pa.array(info.body_sizes.astype(np.int32)),
        pa.array(tags_codes(batch.column("tags"))), batch.column("store_timestamp"),
    ], schema=fmt.CONSUMEQUEUE_SCHEMA)
    return entries, qos, tnp


class Dispatcher:
    """Owns a writable store's queue offsets and in-memory ConsumeQueue/Index.

    * ``next_offsets``: (topic id, queue id) -> next queue offset to assign;
    * ``visible_next``: the same, as readers may see it (advanced by
      :meth:`after_visible`, after the flush the append waited for);
    * ``dispatched_offset``: every batch below this physical offset has its
      entries; publish never commits segment bytes past it.

    ``topics()`` returns the store's current topic configs (name -> config).
    See the module docstring for thread-safety.
    """

    def __init__(self, topics: Callable[[], dict], memory_entries: int, *,
                 cq_bytes: int = 64 << 20):
        self._topics = topics
        self._memory_entries = memory_entries
        self._cq_bytes = cq_bytes
        self.cq = MemoryConsumeQueue(memory_entries, cq_bytes)
        self.index = MemoryIndex()
        self.next_offsets: dict[tuple[int, int], int] = {}
        self.visible_next: dict[tuple[int, int], int] = {}
        self.dispatched_offset = 0
        self._listeners: list[Callable[[str, int, int], None]] = []

    # -- state ---------------------------------------------------------------
    def reset_offsets(self, state: LogState) -> None:
        """Queue offsets continue the published ones of ``state``."""
        self.next_offsets = dict(state.queue_max_offsets())
        self.visible_next = dict(self.next_offsets)

    def show_all(self) -> None:
        """Every assigned offset becomes visible (after recovery)."""
        for key, nxt in self.next_offsets.items():
            self.visible_next[key] = nxt

    def clear(self, state: LogState, dispatched_offset: int) -> None:
        """Forget every in-memory entry (they are all published) and restart the
        offsets from ``state`` (a truncation)."""
        self.cq = MemoryConsumeQueue(self._memory_entries, self._cq_bytes)
        self.index = MemoryIndex()
        self.reset_offsets(state)
        self.dispatched_offset = dispatched_offset

    def drop_topic(self, tid: int) -> None:
        for key in [k for k in self.next_offsets if k[0] == tid]:
            self.next_offsets.pop(key, None)
            self.visible_next.pop(key, None)
        self.cq.drop_queue(tid)

    def queue_keys(self) -> list[tuple[int, int]]:
        return list(self.next_offsets)

    # -- listeners -------------------------------------------------------------
    def add_listener(self, fn: Callable[[str, int, int], None]) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn) -> None:
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    def after_visible(self, updates: list[tuple[str, int, int, int]]) -> None:
        """Advance the visible max offsets and tell the arrival listeners.

        ``updates``: (topic, topic_id, queue_id, next queue offset) per queue a
        dispatched batch touched (what :meth:`dispatch` returns)."""
        for t, tid, q, nxt in updates:
            key = (tid, q)
            if nxt > self.visible_next.get(key, 0):
                self.visible_next[key] = nxt
            for fn in list(self._listeners):
                try:
                    fn(t, q, nxt)
                except Exception:   # a listener callback must not fail the append that woke it
                    log.exception("arrival listener failed")

    # -- dispatch ------------------------------------------------------------
    def dispatch(self, batch, batch_offset: int, info: RowInfo | None = None,
                 store_ts_ms: np.ndarray | None = None) -> tuple[np.ndarray, list]:
        """Assign queue offsets to a batch's rows; add ConsumeQueue and Index entries.

        ``batch``: a record batch, or BuiltRows (``log/built.py``: read as a batch only
        for columns it gives). ``info`` (what validation learned about the rows) and
        ``store_ts_ms`` (the store_timestamp column as int64 ms) are computed from the
        batch when not given. Returns the queue offsets per row (-1 for rows of a
        deleted topic) and the (topic, topic_id, queue_id, next offset) of each
        queue touched, for :meth:`after_visible`. Serialized by the caller."""
        n = batch.num_rows
        if info is None or store_ts_ms is None:
            batch = fmt.record_batch(batch)
        if info is None:
            info = row_info(batch)
        if store_ts_ms is None:   # a copy: chunks must not pin (memory-mapped) segment bytes
            store_ts_ms = np.array(batch.column("store_timestamp").cast(pa.int64()).to_numpy(),
                                   dtype=np.int64)
        topics, names = self._topics(), info.topic_names
        tids = [topics[t].id if t in topics else -1 for t in names]
        sizes = info.body_sizes
        given = info.given
        tcodes = tags_codes(fmt.record_batch(batch).column("tags")) \
            if given is None or "tags" in given else _no_tags(n)
        groups, tnp = queue_groups(tids, info, n)
        qos = None
        updates = []
        for tid, qid, rows in groups:
            if tid < 0:
                log.warning("batch at %d has messages for a deleted topic; not dispatched",
                            batch_offset)
                continue
            count = n if rows is None else len(rows)
            start = self.next_offsets.get((tid, qid), 0)
            self.next_offsets[(tid, qid)] = start + count
            if rows is None:
                qos = np.arange(start, start + n, dtype=np.int64)
                chunk = Chunk(start, batch_offset, _every_row(n), sizes, tcodes, store_ts_ms)
            else:
                if qos is None:
                    qos = np.full(n, -1, dtype=np.int64)
                qos[rows] = np.arange(start, start + count)
                chunk = Chunk(start, batch_offset, rows.astype(np.int32), sizes[rows],
                              tcodes[rows], store_ts_ms[rows])
            self.cq.add(tid, qid, chunk)
            updates.append((names[0] if len(names) == 1 else names[tids.index(tid)], tid,
                            qid, start + count))
        if qos is None:
            qos = np.full(n, -1, dtype=np.int64)
        if (given is None or "keys" in given) and \
                fmt.record_batch(batch).column("keys").null_count != n:
            if tnp is None:
                tnp = topic_ids_per_row(tids, info, n)
            itable = index_entries(fmt.record_batch(batch), tnp, qos, batch_offset)
            if itable is not None:
                keep = pc.greater_equal(itable.column("topic_id"), 0)
                self.index.add(batch_offset, itable.filter(keep))
        return qos, updates
