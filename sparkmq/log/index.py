"""The Index: message key -> where the message lives.

Keys come from the ``keys`` column of segments. Recent keys live in memory as
small Arrow tables (one per appended batch that had keys); at each publish
they are written as one Parquet file sorted by (topic_id, key) and recorded in
the log with the topics and time range it covers; compaction merges files.
A key lookup reads only row groups whose key statistics contain the key.
Time-range queries use the ConsumeQueue's ``store_timestamp`` column, which
is already per queue and recorded with ranges in the log.

Thread-safety: ``MemoryIndex`` is guarded by its own lock.
"""
from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import format as fmt
from .actions import AddFile
from .consumequeue import _ms, _read_filtered
from .fs import StoreFS


def index_entries(batch: pa.RecordBatch, topic_ids: np.ndarray, queue_offsets: np.ndarray,
                  batch_offset: int) -> pa.Table | None:
    """Index rows for the keys of one appended batch (None if it has no keys)."""
    keys = batch.column("keys")
    if keys.null_count == len(keys):
        return None
    flat = pc.list_flatten(keys)
    if len(flat) == 0:
        return None
    parents = pc.list_parent_indices(keys).to_numpy()
    valid = ~np.asarray(pc.is_null(flat).to_numpy(zero_copy_only=False))
    parents = parents[valid]
    flat = flat.filter(pa.array(valid))
    qids = batch.column("queue_id").to_numpy()
    ts = batch.column("store_timestamp").cast(pa.int64()).to_numpy()
    return pa.table({
        "topic_id": pa.array(topic_ids[parents], pa.int32()),
        "key": flat,
        "queue_id": pa.array(qids[parents], pa.int32()),
        "queue_offset": pa.array(queue_offsets[parents], pa.int64()),
        "batch_offset": pa.array(np.full(len(parents), batch_offset, np.int64)),
        "row": pa.array(parents.astype(np.int32)),
        "store_timestamp": pa.array(ts[parents], pa.int64()).cast(fmt.TS),
    }, schema=fmt.INDEX_SCHEMA)


def table_cost(table: pa.Table) -> int:
    """Bytes a small in-memory table holds: its buffers plus the objects around each
    column (about 1 KiB a column and 1 KiB a table, measured: a one-row table of three
    columns costs ~6.5 KiB of RSS)."""
    return table.nbytes + 1024 * (1 + 2 * table.num_columns)


class MemoryIndex:
    """Key entries not yet persisted, and the recently persisted ones. The tables one
    publish persisted are kept as the one sorted table it wrote (small appends make many
    tiny tables, each costing kilobytes); the oldest persisted tables are dropped while
    more than ``max_rows`` rows or ``max_bytes`` bytes (``memoryIndexBytes``) are held."""

    def __init__(self, max_rows: int = 1_000_000, max_bytes: int = 1 << 62):
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._tables: list[tuple[int, pa.Table, bool]] = []   # (batch_offset, table, persisted)
        self._rows = 0
        self.bytes = 0
        self._taken: list[pa.Table] = []          # the originals of the last take
        self._lock = threading.Lock()

    def add(self, batch_offset: int, table: pa.Table) -> None:
        with self._lock:
            self._tables.append((batch_offset, table, False))
            self._rows += table.num_rows
            self.bytes += table_cost(table)

    def take_unpersisted(self, upto_physical: int) -> pa.Table:
        """The unpersisted entries of batches before ``upto_physical``, as one table sorted
        by (topic, key); they count as persisted from now on (``restore_unpersisted`` on a
        failed publish, ``settle`` after a committed one)."""
        with self._lock:
            out = []
            for i, (bo, t, done) in enumerate(self._tables):
                if not done and bo < upto_physical:
                    out.append(t)
                    self._tables[i] = (bo, t, True)
            self._taken = out
        if not out:
            return fmt.INDEX_SCHEMA.empty_table()
        return pa.concat_tables(out).sort_by([("topic_id", "ascending"), ("key", "ascending")])

    def restore_unpersisted(self, table: pa.Table) -> None:
        """Mark the tables of a failed publish as unpersisted again."""
        if table.num_rows == 0:
            return
        with self._lock:
            ids = {id(t) for t in self._taken}
            self._tables = [(bo, t, False if id(t) in ids else d) for bo, t, d in self._tables]
            self._taken = []

    def settle(self, table: pa.Table) -> None:
        """After a committed publish: the taken tables become ``table`` (what it wrote,
        combined into one chunk), then the oldest persisted go while over the limits."""
        with self._lock:
            ids = {id(t) for t in self._taken}
            self._taken = []
            if ids and table.num_rows:
                kept, first = [], None
                for entry in self._tables:
                    if id(entry[1]) in ids:
                        first = entry[0] if first is None else first
                        self.bytes -= table_cost(entry[1])
                        continue
                    kept.append(entry)
                combined = table.combine_chunks()
                kept.insert(0, (first, combined, True))
                kept.sort(key=lambda e: (not e[2], e[0]))   # persisted first, in log order
                self._tables = kept
                self.bytes += table_cost(combined)
            while (self._rows > self.max_rows or self.bytes > self.max_bytes) \
                    and self._tables and self._tables[0][2]:
                _, t, _ = self._tables.pop(0)
                self._rows -= t.num_rows
                self.bytes -= table_cost(t)

    def lookup(self, tid: int, key: str, *, persisted: bool | None = None) -> pa.Table:
        """Entries for (tid, key); ``persisted`` False returns only unpersisted ones."""
        with self._lock:
            tables = [t for _, t, done in self._tables
                      if persisted is None or done == persisted]
        hits = []
        for t in tables:
            mask = pc.and_(pc.equal(t.column("topic_id"), tid), pc.equal(t.column("key"), key))
            if pc.any(mask).as_py():
                hits.append(t.filter(mask))
        if not hits:
            return fmt.INDEX_SCHEMA.empty_table()
        return pa.concat_tables(hits)

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._rows = 0


def index_add(rel: str, table: pa.Table, size: int) -> AddFile:
    """The ``add`` action of an Index file."""
    tids = sorted(set(pc.unique(table.column("topic_id")).to_pylist())) if table.num_rows else []
    ts = table.column("store_timestamp")
    n = table.num_rows
    return AddFile(
        path=rel, kind="index", size=size, rows=n, topic_ids=tuple(tids),
        min_timestamp=_ms(pc.min(ts).as_py()) if n else 0,
        max_timestamp=_ms(pc.max(ts).as_py()) if n else 0,
        min_batch_offset=int(pc.min(table.column("batch_offset")).as_py() or 0) if n else 0,
        max_batch_offset=int(pc.max(table.column("batch_offset")).as_py() or 0) if n else 0)


def read_index(sfs: StoreFS, adds: list[dict], tid: int, key: str) -> pa.Table:
    tables = []
    for add in adds:
        if tid not in (add.topic_ids or ()):
            continue
        t = _read_filtered(sfs, add.path, [("topic_id", "=", tid), ("key", "=", key)])
        if t.num_rows:
            tables.append(t.cast(fmt.INDEX_SCHEMA))
    if not tables:
        return fmt.INDEX_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def live_index_hits(sfs: StoreFS, state, index: MemoryIndex, tid: int, key: str) -> pa.Table:
    """Index rows of ``key`` in topic ``tid`` as a writer sees them: the persisted side
    files of ``state`` and the unpersisted rows of ``index``."""
    persisted = read_index(sfs, list(state.index_files.values()), tid, key)
    recent = index.lookup(tid, key, persisted=False)
    return pa.concat_tables([persisted, recent], promote_options="permissive")
