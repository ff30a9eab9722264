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


class MemoryIndex:
    """Index entries a reader cannot find in the side files yet: those of batches not
    yet published, and those of the publish under way (until its commit, ``settle``).
    Once committed they are read from their Parquet file only, so memory holds at most
    a publish interval's worth of keys."""

    def __init__(self):
        self._tables: list[tuple[int, pa.Table, bool]] = []   # (batch_offset, table, taken)
        self._lock = threading.Lock()

    def add(self, batch_offset: int, table: pa.Table) -> None:
        with self._lock:
            self._tables.append((batch_offset, table, False))

    def take_unpersisted(self, upto_physical: int) -> pa.Table:
        """The entries of batches before ``upto_physical`` not yet taken, as one table
        sorted by (topic, key), for the publish to write. They stay visible to lookups
        until ``settle`` (committed) or ``restore_unpersisted`` (failed)."""
        with self._lock:
            out = []
            for i, (bo, t, taken) in enumerate(self._tables):
                if not taken and bo < upto_physical:
                    out.append(t)
                    self._tables[i] = (bo, t, True)
        if not out:
            return fmt.INDEX_SCHEMA.empty_table()
        return pa.concat_tables(out).sort_by([("topic_id", "ascending"), ("key", "ascending")])

    def restore_unpersisted(self, table: pa.Table) -> None:
        """After a failed publish: the taken entries are to be taken again."""
        with self._lock:
            self._tables = [(bo, t, False) for bo, t, _ in self._tables]

    def settle(self, table: pa.Table) -> None:
        """After a committed publish: the taken entries are in the log's side files now."""
        with self._lock:
            self._tables = [e for e in self._tables if not e[2]]

    @property
    def rows(self) -> int:
        with self._lock:
            return sum(t.num_rows for _, t, _ in self._tables)

    def lookup(self, tid: int, key: str) -> pa.Table:
        """Entries for (tid, key) held here."""
        with self._lock:
            tables = [t for _, t, _ in self._tables]
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


def live_index_hits(sfs: StoreFS, current_state, index: MemoryIndex, tid: int,
                    key: str) -> pa.Table:
    """Index rows of ``key`` in topic ``tid`` as a writer sees them: the rows ``index``
    holds, then the side files of the state ``current_state()`` gives. In this order a
    publish committing in between is seen at least once (deduplicated below)."""
    recent = index.lookup(tid, key)
    persisted = read_index(sfs, list(current_state().index_files.values()), tid, key)
    hits = pa.concat_tables([persisted, recent], promote_options="permissive")
    if persisted.num_rows and recent.num_rows:   # a publish committed between the two reads
        seen, keep = set(), []
        for i, k in enumerate(zip(hits.column("queue_id").to_pylist(),
                                  hits.column("queue_offset").to_pylist())):
            keep.append(k not in seen)
            seen.add(k)
        hits = hits.filter(pa.array(keep))
    return hits
