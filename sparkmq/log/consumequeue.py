"""The ConsumeQueue: per (topic, queue), queue offset -> where the message lives.

Each entry is (queue_offset, batch_offset, row, size, tags_code,
store_timestamp): ``batch_offset`` is the physical offset of the record batch
and ``row`` the message's row in it (physical offset of the message =
``batch_offset + row``).

Recent entries live in memory (:class:`MemoryConsumeQueue`, one list of
chunks per queue; a chunk is the entries one appended batch gave a queue).
At each publish the entries not yet persisted are written as one small
Parquet file sorted by (topic_id, queue_id, queue_offset) and recorded in the
log with per-queue offset and time ranges; compaction later merges small files
into big ones with row groups of ``side_table_row_group_rows``. A seek by queue
offset picks files by their logged ranges and row groups by Parquet
statistics: it never scans the whole queue.

Thread-safety: ``MemoryConsumeQueue`` is guarded by its own lock.
"""
from __future__ import annotations

import bisect
import functools
import io
import threading
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import format as fmt
from .actions import AddFile, QueueStats
from . import sidefile
from .fs import StoreFS

ENTRY_COLUMNS = ["queue_offset", "batch_offset", "row", "size", "tags_code", "store_timestamp"]
_ENTRY_SCHEMA = pa.schema([fmt.CONSUMEQUEUE_SCHEMA.field(c) for c in ENTRY_COLUMNS])


#: what one chunk costs in memory beyond its entries (object, four arrays, list slots;
#: measured with tracemalloc by tests/log/test_memory_budget.py), and each entry
CHUNK_OVERHEAD_BYTES = 800
ENTRY_BYTES = 24


class _PyChunk:
    """:class:`Chunk` where sparkmq/_chunk.c is not built: the same read-only fields
    and ``end``, as a Python object (which the cyclic collector tracks)."""
    __slots__ = ("start", "batch_offset", "rows", "sizes", "tags_codes", "store_ts")

    def __init__(self, start: int, batch_offset: int, rows: np.ndarray, sizes: np.ndarray,
                 tags_codes: np.ndarray, store_ts: np.ndarray):
        set_ = object.__setattr__
        set_(self, "start", int(start))
        set_(self, "batch_offset", int(batch_offset))
        set_(self, "rows", rows)
        set_(self, "sizes", sizes)
        set_(self, "tags_codes", tags_codes)
        set_(self, "store_ts", store_ts)

    def __setattr__(self, name, value):
        raise AttributeError(f"Chunk.{name} is read-only")

    @property
    def end(self) -> int:
        return self.start + len(self.rows)


#: Chunk(start, batch_offset, rows, sizes, tags_codes, store_ts): the entries one
#: appended batch gave one queue. ``start``: queue offset of the first entry;
#: ``batch_offset``: the batch's physical offset; then each entry's row (int32), body
#: bytes (int32), tags code (int64) and store time (int64 ms), numpy arrays that must
#: hold no reference back to a chunk (sparkmq/_chunk.c says why). ``end``: the queue
#: offset after the last entry.
try:    # sparkmq/_chunk.c: a type the cyclic garbage collector does not track
    from .._chunk import Chunk
except ImportError:     # not built here
    Chunk = _PyChunk


def chunk_cost(chunk) -> int:
    """Bytes ``chunk`` holds in memory (estimated; see CHUNK_OVERHEAD_BYTES)."""
    return CHUNK_OVERHEAD_BYTES + ENTRY_BYTES * len(chunk.rows)


def empty_entries() -> pa.Table:
    return _ENTRY_SCHEMA.empty_table()


def _spans(chunks: list[Chunk], lo: int, hi: int) -> list[tuple[Chunk, int, int, int, int]]:
    """The parts of consecutive ``chunks`` in queue offsets [lo, hi): (chunk, from row,
    to row, from offset, to offset)."""
    spans = []
    for ch in chunks:
        a, b = max(lo, ch.start), min(hi, ch.end)
        if a < b:
            spans.append((ch, a - ch.start, b - ch.start, a, b))
    return spans


def chunks_to_table(chunks: list[Chunk], lo: int, hi: int,
                    columns: list[str] | None = None) -> pa.Table:
    """Entries with queue offset in [lo, hi) from consecutive chunks: all ENTRY_COLUMNS,
    or ``columns`` of them (``queue_offset`` always; only those are built)."""
    spans = _spans(chunks, lo, hi)
    names = _entry_columns(columns)
    if not spans:
        return empty_entries().select(names)
    return pa.Table.from_arrays([_entry_array(c, _ENTRY_NUMPY[c](spans)) for c in names],
                                schema=_entry_schema(tuple(names)))


class EntryArrays(NamedTuple):
    """A read's view of ConsumeQueue entries: the columns it uses as numpy arrays, one
    index per entry in queue-offset order (no Arrow table built and taken apart again:
    a long poll's read of one message spent ~14 of its ~56 us there)."""
    queue_offsets: np.ndarray          # int64
    batch_offsets: np.ndarray          # int64
    rows: np.ndarray                   # int32
    sizes: np.ndarray | None = None    # int32, where asked for

    def head(self, k: int) -> "EntryArrays":
        """The first ``k`` entries."""
        return EntryArrays(*(None if a is None else a[:k] for a in self))

    def groups(self) -> list[tuple[int, int, int, int, int]]:
        """(start, end, first row, last row, batch offset) of each run of entries in one
        batch, in order (entries ``start..end-1``). (Batch offsets ascend with queue
        offsets, and rows within a batch.)"""
        bos, rows = self.batch_offsets, self.rows
        n = len(rows)
        if not n:
            return []
        if int(bos[0]) == int(bos[-1]):      # one batch (a long poll's few messages)
            return [(0, n, int(rows[0]), int(rows[-1]), int(bos[0]))]
        cuts = (np.flatnonzero(bos[1:] != bos[:-1]) + 1).tolist()
        starts, ends = [0, *cuts], [*cuts, n]
        return list(zip(starts, ends, rows[starts].tolist(),
                        rows[np.asarray(ends) - 1].tolist(), bos[starts].tolist()))

    def runs(self) -> list[tuple[int, int, int]] | None:
        """(batch offset, first row, rows) of each of :meth:`groups` where every group's
        rows are contiguous in its batch (the rows puts stored), else None."""
        out = []
        for s, e, first, last, bo in self.groups():
            if last - first != e - s - 1:
                return None
            out.append((bo, first, e - s))
        return out or None


def entry_arrays(table: pa.Table, sizes: bool = False) -> EntryArrays:
    """``table`` (entries with at least queue_offset, batch_offset, row, and size if
    ``sizes``) as EntryArrays."""
    return EntryArrays(*(table.column(c).to_numpy() for c in ARRAY_COLUMNS[sizes]))


def _chunk_arrays(chunks: list[Chunk], lo: int, hi: int, sizes: bool) -> EntryArrays:
    spans = _spans(chunks, lo, hi)
    if not spans:
        return entry_arrays(empty_entries(), sizes)
    return EntryArrays(*(_ENTRY_NUMPY[c](spans) for c in ARRAY_COLUMNS[sizes]))


#: the entry columns of an EntryArrays without and with sizes
ARRAY_COLUMNS = {False: ("queue_offset", "batch_offset", "row"),
                 True: ("queue_offset", "batch_offset", "row", "size")}


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)   # (the usual read: one)


#: each entry column of spans (``_spans``) as a numpy array
_ENTRY_NUMPY = {
    "queue_offset": lambda spans: _joined(
        [np.arange(a, b, dtype=np.int64) for _, _, _, a, b in spans]),
    "batch_offset": lambda spans: _joined(
        [np.full(e - s, ch.batch_offset, dtype=np.int64) for ch, s, e, _, _ in spans]),
    "row": lambda spans: _joined([ch.rows[s:e] for ch, s, e, _, _ in spans]),
    "size": lambda spans: _joined([ch.sizes[s:e] for ch, s, e, _, _ in spans]),
    "tags_code": lambda spans: _joined([ch.tags_codes[s:e] for ch, s, e, _, _ in spans]),
    "store_timestamp": lambda spans: _joined([ch.store_ts[s:e] for ch, s, e, _, _ in spans]),
}
_ENTRY_TYPES = {c: _ENTRY_SCHEMA.field(c).type for c in ENTRY_COLUMNS}


def _entry_array(name: str, values: np.ndarray) -> pa.Array:
    """Entry column ``name``'s ``values`` as an Arrow array."""
    if name == "store_timestamp":
        return fmt.ts_array(values)
    return pa.array(values, _ENTRY_TYPES[name])


@functools.lru_cache(maxsize=16)
def _entry_schema(names: tuple[str, ...]) -> pa.Schema:
    return pa.schema([_ENTRY_SCHEMA.field(c) for c in names])


class MemoryConsumeQueue:
    """The hot tail of every queue, plus the entries not yet persisted. Persisted chunks
    are evicted, a queue's oldest first, while more than ``max_entries`` entries or ``max_bytes``
    bytes (``memoryConsumeQueueBytes``: small sends make many small chunks, each costing
    far more than its entries) are held; a queue keeps its newest chunk."""

    def __init__(self, max_entries: int, max_bytes: int = 1 << 62):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._queues: dict[tuple[int, int], list[Chunk]] = {}
        self._starts: dict[tuple[int, int], list[int]] = {}
        self._unpersisted: list[tuple[int, int, Chunk]] = []   # (tid, qid, chunk) in append order
        self._entries = 0
        self.bytes = 0
        self._lock = threading.Lock()

    def _over(self) -> bool:
        return self._entries > self.max_entries or self.bytes > self.max_bytes

    def add(self, tid: int, qid: int, chunk: Chunk) -> None:
        key, k = (tid, qid), len(chunk.rows)
        with self._lock:
            chunks = self._queues.get(key)     # (setdefault made two lists an add)
            if chunks is None:
                chunks = self._queues[key] = []
                self._starts[key] = []
            chunks.append(chunk)
            self._starts[key].append(chunk.start)
            self._unpersisted.append((tid, qid, chunk))
            self._entries += k
            self.bytes += chunk_cost(chunk)

    def covers(self, tid: int, qid: int, offset: int) -> bool:
        with self._lock:
            starts = self._starts.get((tid, qid))
            return bool(starts) and starts[0] <= offset

    def first_offset(self, tid: int, qid: int) -> int | None:
        with self._lock:
            starts = self._starts.get((tid, qid))
            return starts[0] if starts else None

    def entries(self, tid: int, qid: int, lo: int, hi: int,
                columns: list[str] | None = None) -> pa.Table:
        """Entries in [lo, hi) held in memory (callers check ``covers`` for lo): all
        ENTRY_COLUMNS or ``columns`` of them, as ``chunks_to_table`` builds them."""
        return chunks_to_table(self._picked(tid, qid, lo, hi), lo, hi, columns)

    def entry_arrays(self, tid: int, qid: int, lo: int, hi: int,
                     sizes: bool = False) -> EntryArrays:
        """:meth:`entries` as a read uses them (``EntryArrays``)."""
        return _chunk_arrays(self._picked(tid, qid, lo, hi), lo, hi, sizes)

    def _picked(self, tid: int, qid: int, lo: int, hi: int) -> list[Chunk]:
        """The chunks of (tid, qid) that may hold offsets in [lo, hi)."""
        with self._lock:
            key = (tid, qid)
            chunks = self._queues.get(key)
            if not chunks:
                return []
            starts = self._starts[key]
            i = max(0, bisect.bisect_right(starts, lo) - 1)
            return chunks[i:bisect.bisect_left(starts, hi)]

    def all_chunks(self, tid: int, qid: int) -> list[Chunk]:
        with self._lock:
            return list(self._queues.get((tid, qid), ()))

    def take_unpersisted(self, upto_physical: int) -> list[tuple[int, int, Chunk]]:
        """Remove and return the unpersisted chunks whose batch starts before ``upto_physical``."""
        with self._lock:
            n = 0
            while n < len(self._unpersisted) and self._unpersisted[n][2].batch_offset < upto_physical:
                n += 1
            taken, self._unpersisted = self._unpersisted[:n], self._unpersisted[n:]
            return taken

    def restore_unpersisted(self, taken: list[tuple[int, int, Chunk]]) -> None:
        """Put chunks back after a failed publish (they go first again)."""
        with self._lock:
            self._unpersisted = list(taken) + self._unpersisted

    def unpersisted_count(self) -> int:
        with self._lock:
            return len(self._unpersisted)

    def evict(self) -> None:
        """Drop the oldest persisted chunks while over ``max_entries`` or ``max_bytes``."""
        with self._lock:
            if not self._over():
                return
            pending = {id(c) for _, _, c in self._unpersisted}
            for key in list(self._queues):
                chunks = self._queues[key]
                n = 0
                while n < len(chunks) - 1 and self._over() and id(chunks[n]) not in pending:
                    self._entries -= len(chunks[n].rows)
                    self.bytes -= chunk_cost(chunks[n])
                    n += 1
                if n:
                    del chunks[:n]
                    del self._starts[key][:n]
                if not self._over():
                    return

    def drop_queue(self, tid: int) -> None:
        with self._lock:
            for key in [k for k in self._queues if k[0] == tid]:
                self._entries -= sum(len(c.rows) for c in self._queues[key])
                self.bytes -= sum(map(chunk_cost, self._queues[key]))
                del self._queues[key]
                del self._starts[key]

    def clear(self) -> None:
        with self._lock:
            self._queues.clear()
            self._starts.clear()
            self._unpersisted.clear()
            self._entries = 0
            self.bytes = 0


def chunks_to_side_table(taken: list[tuple[int, int, Chunk]]) -> pa.Table:
    """Unpersisted chunks as a ConsumeQueue side table sorted by (topic, queue, offset)."""
    taken = [t for t in taken if len(t[2].rows)]
    if not taken:
        return fmt.CONSUMEQUEUE_SCHEMA.empty_table()
    # Chunks of one queue come in append order, so their offsets already ascend: a
    # stable sort of the chunks by queue orders the rows (no row-level sort; it
    # was most of a publish's time). Checked below, with a row sort as fallback.
    chunk_keys = np.array([(t << 32) | q for t, q, _ in taken], dtype=np.int64)
    if len(taken) > 1 and (chunk_keys[1:] < chunk_keys[:-1]).any():
        taken = [taken[i] for i in np.argsort(chunk_keys, kind="stable")]
    lens = np.array([len(ch.rows) for _, _, ch in taken], dtype=np.int64)
    firsts = np.cumsum(lens) - lens                      # row of each chunk's first entry
    starts = np.array([ch.start for _, _, ch in taken], dtype=np.int64)
    offsets = np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - firsts, lens)
    tids = np.repeat(np.array([t for t, _, _ in taken], np.int32), lens)
    qids = np.repeat(np.array([q for _, q, _ in taken], np.int32), lens)
    table = pa.table({
        "topic_id": pa.array(tids),
        "queue_id": pa.array(qids),
        "queue_offset": pa.array(offsets),
        "batch_offset": pa.array(np.repeat(
            np.array([ch.batch_offset for _, _, ch in taken], np.int64), lens)),
        "row": pa.array(np.concatenate([ch.rows for _, _, ch in taken]).astype(np.int32)),
        "size": pa.array(np.concatenate([ch.sizes for _, _, ch in taken]).astype(np.int32)),
        "tags_code": pa.array(
            np.concatenate([ch.tags_codes for _, _, ch in taken]).astype(np.int64)),
        "store_timestamp": fmt.ts_array(np.concatenate([ch.store_ts for _, _, ch in taken])),
    }, schema=fmt.CONSUMEQUEUE_SCHEMA)
    if len(offsets) > 1:
        key = (tids.astype(np.int64) << 32) | qids
        same = key[1:] == key[:-1]
        if not ((key[1:] > key[:-1]) | (same & (offsets[1:] > offsets[:-1]))).all():
            return table.sort_by([("topic_id", "ascending"), ("queue_id", "ascending"),
                                  ("queue_offset", "ascending")])
    return table


def _delta_columns(schema: pa.Schema) -> list[str]:
    """Integer and timestamp columns: DELTA_BINARY_PACKED suits their sorted or repeated
    values (a ConsumeQueue's queue_offset is 0, 1, 2, ...): 40x smaller than dictionary
    encoding, and 5x faster to decode."""
    return [f.name for f in schema
            if pa.types.is_integer(f.type) or pa.types.is_timestamp(f.type)]


def write_side_table(sfs: StoreFS, rel: str, table: pa.Table, *, row_group_rows: int) -> int:
    """Write a Parquet side table; returns its size in bytes.

    Integer and timestamp columns (offsets, sizes, times: most of a ConsumeQueue
    file) are DELTA_BINARY_PACKED, never dictionary-encoded (dictionaries of such
    columns overflow and fall back, doubling the write time); the others keep
    dictionaries."""
    sink = io.BytesIO()
    delta = _delta_columns(table.schema)
    pq.write_table(sidefile.with_placeholder(table), sink, row_group_size=row_group_rows,
                   compression="zstd", write_statistics=True, write_page_checksum=True,
                   use_dictionary=[n for n in table.schema.names if n not in delta],
                   column_encoding={n: "DELTA_BINARY_PACKED" for n in delta})
    data = sidefile.seal(sink.getvalue())       # footer checksum (format 2)
    sfs.write(rel, data)
    return len(data)


def consumequeue_add(rel: str, table: pa.Table, size: int) -> AddFile:
    """The ``add`` action of a ConsumeQueue file, with per-queue ranges."""
    queues = []
    if table.num_rows:
        grouped = table.group_by(["topic_id", "queue_id"]).aggregate([
            ("queue_offset", "min"), ("queue_offset", "max"),
            ("store_timestamp", "min"), ("store_timestamp", "max"),
            ("batch_offset", "min"), ("batch_offset", "max")])
        for r in grouped.to_pylist():
            queues.append(QueueStats(
                topic_id=r["topic_id"], queue_id=r["queue_id"],
                min_offset=r["queue_offset_min"], max_offset=r["queue_offset_max"] + 1,
                min_timestamp=_ms(r["store_timestamp_min"]),
                max_timestamp=_ms(r["store_timestamp_max"]),
                min_batch_offset=r["batch_offset_min"], max_batch_offset=r["batch_offset_max"]))
    return AddFile(path=rel, kind="consumequeue", size=size, rows=table.num_rows,
                   queues=tuple(queues))


def _ms(v) -> int:
    if v is None:
        return 0
    if isinstance(v, int):
        return v
    return int(v.timestamp() * 1000)


def read_side_entries(sfs: StoreFS, adds: list[dict], tid: int, qid: int, lo: int, hi: int,
                      columns: list[str] | None = None) -> pa.Table:
    """Entries of (tid, qid) with queue offset in [lo, hi) from persisted files.

    ``columns`` (a subset of ENTRY_COLUMNS, default all) are the columns read and
    returned; ``queue_offset`` is always among them.

    Files are sorted by (topic_id, queue_id, queue_offset) (FORMAT.md section 4),
    so the wanted entries of a row group are one slice found by binary search;
    a row group that breaks the order is filtered row by row instead.
    """
    tables = []
    for add in adds:
        q = _queue_stats(add, tid, qid)
        if q is None or q.max_offset <= lo or q.min_offset >= hi:
            continue
        tables.extend(_read_queue_slices(sfs, add.path, tid, qid, lo, hi, columns))
    if not tables:
        return empty_entries().select(_entry_columns(columns))
    t = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    if t.num_rows > 1:
        offs = t.column("queue_offset").to_numpy()
        if not (offs[1:] > offs[:-1]).all():
            # files may overlap after a crash re-dispatch; keep one entry per offset
            t = t.sort_by("queue_offset")
            offs = t.column("queue_offset").to_numpy()
            keep = np.concatenate([[True], offs[1:] != offs[:-1]])
            if not keep.all():
                t = t.filter(pa.array(keep))
    return t


def _entry_columns(columns: list[str] | None) -> list[str]:
    if columns is None:
        return ENTRY_COLUMNS
    unknown = set(columns) - set(ENTRY_COLUMNS)
    assert not unknown, f"not ConsumeQueue entry columns: {sorted(unknown)}"
    return [c for c in ENTRY_COLUMNS if c in columns or c == "queue_offset"]


def _read_queue_slices(sfs: StoreFS, rel: str, tid: int, qid: int, lo: int, hi: int,
                       columns: list[str] | None = None) -> list[pa.Table]:
    """Entries of (tid, qid) in [lo, hi) of one ConsumeQueue file, one table per row group
    (zero-copy slices of the decoded row groups)."""
    wanted = _entry_columns(columns)
    filters = [("topic_id", "=", tid), ("queue_id", "=", qid),
               ("queue_offset", ">=", lo), ("queue_offset", "<", hi)]
    out = []
    with sidefile.open_listed(sfs, rel) as f:
        pf = pq.ParquetFile(f, page_checksum_verification=True)
        for g in _row_groups(pf, filters):
            t = pf.read_row_group(g, columns=["topic_id", "queue_id", *wanted])
            part = _sorted_slice(t, tid, qid, lo, hi)
            if part is None:   # not in the order the format requires: filter row by row
                part = _filter_queue_rows(t, tid, qid, lo, hi)
            if part.num_rows:
                out.append(part.select(wanted))
    return out


def _filter_queue_rows(t: pa.Table, tid: int, qid: int, lo: int, hi: int) -> pa.Table:
    return t.filter((pc.field("topic_id") == tid) & (pc.field("queue_id") == qid) &
                    (pc.field("queue_offset") >= lo) &
                    (pc.field("queue_offset") < hi)).sort_by("queue_offset")


def _sorted_slice(t: pa.Table, tid: int, qid: int, lo: int, hi: int) -> pa.Table | None:
    """The rows of (tid, qid) in [lo, hi) of a row group sorted by (topic, queue, offset),
    by binary search; None if the rows found are not sorted that way."""
    tids = t.column("topic_id").to_numpy()
    qids = t.column("queue_id").to_numpy()
    a, b = np.searchsorted(tids, tid, "left"), np.searchsorted(tids, tid, "right")
    c = a + np.searchsorted(qids[a:b], qid, "left")
    d = a + np.searchsorted(qids[a:b], qid, "right")
    # the run found must hold every row of the queue (else the group is not sorted and
    # binary search may have missed some): one vectorized count, no row is ever skipped
    if int(np.count_nonzero((tids == tid) & (qids == qid))) != d - c:
        return None
    if c == d:
        return t.slice(0, 0)
    offs = t.column("queue_offset").to_numpy()[c:d]
    if tids[c] != tid or tids[d - 1] != tid or qids[c] != qid or qids[d - 1] != qid \
            or not (offs[1:] > offs[:-1]).all():
        return None
    e, f = np.searchsorted(offs, lo, "left"), np.searchsorted(offs, hi, "left")
    return t.slice(int(c + e), int(f - e))


_MIN_DATETIME_MS = -62_135_596_800_000 + 86_400_000   # 0001-01-02
_MAX_DATETIME_MS = 253_402_300_799_999 - 86_400_000   # 9999-12-30


def read_side_by_time(sfs: StoreFS, adds: list[dict], tid: int, qid: int | None,
                      start_ms: int, end_ms: int) -> pa.Table:
    """Entries of topic ``tid`` (one queue or all) stored within [start_ms, end_ms]."""
    # open-ended bounds (1 << 62) do not fit a Python datetime: clamp to years 1..9999
    start_ms = max(start_ms, _MIN_DATETIME_MS)
    end_ms = min(end_ms, _MAX_DATETIME_MS)
    tables = []
    for add in adds:
        for q in add.queues or ():
            if q.topic_id != tid or (qid is not None and q.queue_id != qid):
                continue
            if q.max_timestamp < start_ms or q.min_timestamp > end_ms:
                continue
            filters = [("topic_id", "=", tid),
                       ("store_timestamp", ">=", pa.scalar(start_ms, fmt.TS)),
                       ("store_timestamp", "<=", pa.scalar(end_ms, fmt.TS))]
            if qid is not None:
                filters.append(("queue_id", "=", qid))
            tables.append(_read_filtered(sfs, add.path, filters))
            break
    if not tables:
        return fmt.CONSUMEQUEUE_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def _queue_stats(add: AddFile, tid: int, qid: int) -> QueueStats | None:
    """The stats of (tid, qid) in a ConsumeQueue file's add, through an index built once
    per add (a scan of its queue list per lookup made cold reads grow with the number
    of queues in the file)."""
    index = add.__dict__.get("_queue_index")
    if index is None:
        index = {(q.topic_id, q.queue_id): q for q in add.queues or ()}
        object.__setattr__(add, "_queue_index", index)   # a cache, not a field
    return index.get((tid, qid))


def _read_filtered(sfs: StoreFS, rel: str, filters: list) -> pa.Table:
    expr = None
    for col, op, val in filters:
        field = pc.field(col)
        e = {"=": field == val, ">=": field >= val, "<": field < val, "<=": field <= val}[op]
        expr = e if expr is None else expr & e
    with sidefile.open_listed(sfs, rel) as f:
        pf = pq.ParquetFile(f, page_checksum_verification=True)
        groups = _row_groups(pf, filters)
        if not groups:
            return fmt.CONSUMEQUEUE_SCHEMA.empty_table() if "consumequeue" in rel \
                else pf.schema_arrow.empty_table()
        t = pf.read_row_groups(groups)
    return t.filter(expr)


def _row_groups(pf: pq.ParquetFile, filters: list) -> list[int]:
    """Row groups whose min/max statistics may satisfy every filter."""
    md = pf.metadata
    names = [md.schema.column(i).name for i in range(md.num_columns)]
    out = []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        ok = True
        for col, op, val in filters:
            if col not in names:
                continue
            st = rg.column(names.index(col)).statistics
            if st is None or not st.has_min_max:
                continue
            v = val.as_py() if isinstance(val, pa.Scalar) else val
            lo, hi = st.min, st.max
            if hasattr(v, "timestamp") and not hasattr(lo, "timestamp"):
                v = int(v.timestamp() * 1000)
            if hasattr(lo, "timestamp") and not hasattr(v, "timestamp"):
                lo, hi = int(lo.timestamp() * 1000), int(hi.timestamp() * 1000)
            if (op == "=" and (v < lo or v > hi)) or (op == ">=" and hi < v) or \
                    (op == "<" and lo >= v) or (op == "<=" and lo > v):
                ok = False
                break
        if ok:
            out.append(g)
    return out


def compact_side_tables(sfs: StoreFS, adds: list[dict], sort_keys: list[str],
                        schema: pa.Schema) -> pa.Table:
    """Read side-table files and merge them into one table sorted by ``sort_keys``."""
    tables = []
    for add in adds:
        with sidefile.open_checked(sfs, add.path) as f:
            tables.append(pq.read_table(f, page_checksum_verification=True).cast(schema))
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables).sort_by([(k, "ascending") for k in sort_keys])
