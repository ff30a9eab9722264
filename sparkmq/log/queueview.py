"""The ConsumeQueue as a writer sees it: a queue's persisted side files (``state``'s)
up to the first offset the memory tail (``MemoryConsumeQueue``) still holds, then that
tail. The store's reads, searches by time and per-queue stats go through here.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import format as fmt
from .consumequeue import (ARRAY_COLUMNS, EntryArrays, MemoryConsumeQueue, entry_arrays,
                           read_side_by_time, read_side_entries)
from .fs import StoreFS


def live_entries(sfs: StoreFS, state, cq: MemoryConsumeQueue, tid: int, qid: int, lo: int,
                 hi: int, columns: list[str] | None = None) -> pa.Table:
    """Entries [lo, hi) of queue (tid, qid) as a writer sees them: the persisted side
    files of ``state`` up to the first offset still in memory, then ``cq``."""
    first = cq.first_offset(tid, qid)
    if first is not None and first <= lo:
        return cq.entries(tid, qid, lo, hi, columns)
    persisted = read_side_entries(sfs, list(state.consumequeue_files.values()),
                                  tid, qid, lo, hi if first is None else min(hi, first), columns)
    if first is None or hi <= first:
        return persisted
    recent = cq.entries(tid, qid, first, hi, columns)
    return pa.concat_tables([persisted, recent], promote_options="permissive")


def live_entry_arrays(sfs: StoreFS, state, cq: MemoryConsumeQueue, tid: int, qid: int,
                      lo: int, hi: int, sizes: bool = False) -> EntryArrays:
    """:func:`live_entries` as a read uses them: straight from ``cq`` where it holds
    ``lo`` (a long poll's read at a queue's tail)."""
    first = cq.first_offset(tid, qid)
    if first is not None and first <= lo:
        return cq.entry_arrays(tid, qid, lo, hi, sizes)
    return entry_arrays(live_entries(sfs, state, cq, tid, qid, lo, hi,
                                     list(ARRAY_COLUMNS[sizes])), sizes)


def live_time_entries(sfs: StoreFS, state, cq: MemoryConsumeQueue, keys: list[tuple[int, int]],
                      tid: int, qid: int | None, start_ms: int, end_ms: int) -> pa.Table:
    """(queue_id, queue_offset, store_timestamp) of the entries stored in
    [start_ms, end_ms]: persisted ones of ``state``, then those in ``cq`` for ``keys``."""
    persisted = read_side_by_time(sfs, list(state.consumequeue_files.values()),
                                  tid, qid, start_ms, end_ms)
    parts = [persisted.select(["queue_id", "queue_offset", "store_timestamp"])]
    for t, q in keys:
        for ch in cq.all_chunks(t, q):
            sel = (ch.store_ts >= start_ms) & (ch.store_ts <= end_ms)
            if sel.any():
                offs = np.arange(ch.start, ch.end)[sel]
                parts.append(pa.table({
                    "queue_id": pa.array(np.full(len(offs), q, np.int32)),
                    "queue_offset": pa.array(offs, pa.int64()),
                    "store_timestamp": fmt.ts_array(ch.store_ts[sel])}))
    return pa.concat_tables(parts, promote_options="permissive")


def queues_stored_since(state, cq: MemoryConsumeQueue, keys: list[tuple[int, int]],
                        since_ms: int) -> set[tuple[int, int]]:
    """(topic id, queue id) of every queue holding an entry stored at or after
    ``since_ms``: from the per-queue stats of the persisted ConsumeQueue files of
    ``state`` and the chunks ``cq`` holds for ``keys``. Lets a search by time skip the
    queues that cannot match instead of looking into each (a broker with 400,000
    queues restarting looked into every one)."""
    out: set[tuple[int, int]] = set()
    for add in state.consumequeue_files.values():
        for q in add.queues or ():
            if q.max_timestamp is None or q.max_timestamp >= since_ms:
                out.add((q.topic_id, q.queue_id))
    for key in keys:
        if key in out:
            continue
        if any(len(ch.store_ts) and int(ch.store_ts.max()) >= since_ms
               for ch in cq.all_chunks(*key)):
            out.add(key)
    return out
