"""The CommitLog: every segment of a store as one physical address space.

A segment's base offset is the physical offset of its first byte; the next
segment starts where the previous one ends. Broker-written segments are named
by their base offset; segments written by Spark tasks keep their own names and
get a base offset when adopted (recorded in the ``add`` action).

Appends go to the active segment, which is rolled when the next batch would
take it past ``segment_size_bytes``. Reads locate a batch by physical offset
(bisect over segment bases) and decode it from a memory map; batches appended
by this process stay in a bounded cache so fresh reads do not touch the disk.

Thread-safety: ``append``/``roll`` must be serialized by the caller (the
store's append lock); ``read_batch`` and ``segment_for`` are safe concurrently
with appends; ``flush`` may run on the flush service's thread.
"""
from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

from ..errors import CorruptStoreError, DataLossError
from . import checksum
from . import format as fmt
from . import segment as seg
from .fs import StoreFS

log = logging.getLogger("sparkmq.commitlog")

# The active segment's blocks are allocated this far ahead of its end (given back when it
# closes): an append then only copies its bytes (bench/README.md, "allocated ahead").
ALLOCATE_AHEAD_BYTES = 8 << 20


@dataclass
class SegmentRef:
    """Where a segment lives in the address space."""

    path: str
    base_offset: int
    size: int            # bytes readable (the committed or written size)
    sealed: bool

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size


class CommitLog:
    """The segments of one store as one address space (see the module docstring).

    On disk: ``commitlog/<20-digit base offset>.arrow`` per broker segment (and
    adopted ``commitlog/w-...`` Spark segments). After a crash: the store's
    recovery (:mod:`sparkmq.log.recovery`) cuts a torn tail and loads the refs.
    Thread-safety: see the module docstring."""

    def __init__(self, sfs: StoreFS, *, segment_size_bytes: int,
                 cache_bytes: int = 64 << 20):
        self.sfs = sfs
        self.segment_size_bytes = segment_size_bytes
        self._segments: list[SegmentRef] = []
        self._bases: list[int] = []
        self._lock = threading.RLock()        # guards the segment list
        self.active: seg.SegmentWriter | None = None
        # batch offset -> the batch (or BuiltRows), oldest first; and -> its bytes, apart:
        # a dict of ints only is one the cyclic collector never tracks, where a tuple of
        # (batch, bytes) per batch was one more tracked object each (bench_gc.py)
        self._cache: OrderedDict[int, pa.RecordBatch] = OrderedDict()
        self._cache_sizes: dict[int, int] = {}
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._verified = checksum.VerifiedBatches()   # batches whose checksum was checked
        self._flush_lock = threading.RLock()   # also held while a segment is sealed
        self.flushed_offset = 0               # physical offset up to which bytes are flushed
        self.written_offset = 0               # physical offset after the last appended byte
        self.segments_created = 0             # rolls by this process (publish wakes on a roll)
        self._active_ref: SegmentRef | None = None   # the active segment's ref (found once)
        # called with (segment ref, position, bytes) after each append, under the
        # caller's append lock (the HA master sends them to replicas: ha/master.py)
        self.written_hook: Callable[[SegmentRef, int, "bytearray | pa.Buffer"], None] | None = None
        # called with a new segment's path when a file of that name exists (every file at
        # the end was adopted at open, so a writer the store was taken from made it): raises
        # if this writer may not replace it (FencedError: it is that writer), else returns
        self.segment_taken: Callable[[str], None] | None = None

    # -- segment list ------------------------------------------------------
    def load(self, refs: list[SegmentRef]) -> None:
        with self._lock:
            self._segments = sorted(refs, key=lambda r: r.base_offset)
            self._active_ref = None
            self._bases = [r.base_offset for r in self._segments]
            end = self._segments[-1].end_offset if self._segments else 0
            self.written_offset = self.flushed_offset = max(self.written_offset, end)

    def segments(self) -> list[SegmentRef]:
        with self._lock:
            return list(self._segments)

    def add_segment(self, ref: SegmentRef) -> None:
        with self._lock:
            self._segments.append(ref)
            self._active_ref = None
            self._segments.sort(key=lambda r: r.base_offset)
            self._bases = [r.base_offset for r in self._segments]
            self.written_offset = max(self.written_offset, ref.end_offset)

    def drop_segments(self, paths: set[str]) -> None:
        with self._lock:
            self._segments = [r for r in self._segments if r.path not in paths]
            self._active_ref = None
            self._bases = [r.base_offset for r in self._segments]
        for p in paths:
            self.sfs.forget(p)

    def segment_for(self, physical_offset: int) -> SegmentRef | None:
        with self._lock:
            i = bisect.bisect_right(self._bases, physical_offset) - 1
            if i < 0:
                return None
            ref = self._segments[i]
            if physical_offset >= ref.base_offset + max(ref.size, 1) and not (
                    self.active is not None and ref.path == self.active.rel_path):
                return None
            return ref

    def min_offset(self) -> int:
        with self._lock:
            return self._segments[0].base_offset if self._segments else 0

    # -- appending ---------------------------------------------------------
    def writer(self, rel_path: str, base_offset: int, *, create: bool) -> seg.SegmentWriter:
        """The writer of segment ``rel_path`` (new or continued; the master's appends and
        a replica's copies alike), its blocks allocated ``ALLOCATE_AHEAD_BYTES`` ahead
        (at most the segment size)."""
        return seg.SegmentWriter(self.sfs, rel_path, base_offset, create=create,
                                 reserve=min(ALLOCATE_AHEAD_BYTES, self.segment_size_bytes))

    def open_active(self, ref: SegmentRef) -> None:
        """Continue appending to an existing (recovered) segment."""
        self.active = self.writer(ref.path, ref.base_offset, create=False)
        with self._lock:
            ref.size = self.active.size
            ref.sealed = False
        self.written_offset = self.flushed_offset = ref.base_offset + self.active.size

    def _new_segment(self, base: int) -> None:
        rel = fmt.segment_file(base)
        try:
            self.active = self.writer(rel, base, create=True)
        except FileExistsError:
            if self.segment_taken is None:
                raise
            self.segment_taken(rel)
            log.warning("segment %s exists though this writer's log ends before it: made by a "
                        "writer this store was taken from (its late bytes, never read); "
                        "replaced", rel)
            self.sfs.delete(rel)
            self.active = self.writer(rel, base, create=True)
        self.segments_created += 1
        self.add_segment(SegmentRef(rel, base, self.active.size, False))
        self.written_offset = base + self.active.size

    def needs_roll(self, nbytes: int) -> bool:
        a = self.active
        return a is None or (a.size > seg.HEADER_SIZE
                             and a.size + nbytes > self.segment_size_bytes)

    def roll(self) -> SegmentRef | None:
        """Seal the active segment and start a new one right after it.

        Returns the sealed segment's ref (or None if there was none).
        """
        sealed = self.seal_active()
        if self.active is None:
            self._new_segment(self.written_offset)
        return sealed

    def seal_active(self) -> SegmentRef | None:
        """Seal the active segment without starting a new one (adoption, close)."""
        if self.active is None:
            return None
        with self._flush_lock:
            a = self.active
            a.append(seg.EOS)    # even an empty segment is sealed: nothing may land after it
            self.flush(sync=True)
            with self._lock:
                ref = self._ref(a.rel_path)
                ref.size = a.size
                ref.sealed = True
            a.close()
            self.active = None
            self.written_offset = ref.end_offset
            return ref

    def ref(self, path: str) -> SegmentRef:
        """The ref of segment ``path`` (CorruptStoreError if the CommitLog has none)."""
        with self._lock:
            return self._ref(path)

    def set_size(self, ref: SegmentRef, size: int, *, sealed: bool | None = None) -> None:
        """Record ``ref``'s readable size (and sealed flag) under the segment-list lock."""
        with self._lock:
            ref.size = size
            if sealed is not None:
                ref.sealed = sealed

    def seal_written(self, writer: seg.SegmentWriter, ref: SegmentRef) -> None:
        """``writer`` (the active segment) got its end-of-stream marker from elsewhere
        (a replica copying its master): fsync it, mark ``ref`` sealed, close it."""
        with self._flush_lock:
            writer.flush(sync=True)
            with self._lock:
                ref.sealed = True
            writer.close()
            self.active = None
            self.flushed_offset = max(self.flushed_offset, ref.end_offset)

    def clear_cache(self) -> None:
        """Forget every cached batch (their offsets now hold other bytes: a truncation)."""
        with self._lock:
            self._cache.clear()
            self._cache_sizes.clear()
            self._cache_bytes = 0
            self._verified = checksum.VerifiedBatches()

    def _ref(self, path: str) -> SegmentRef:
        for r in self._segments:
            if r.path == path:
                return r
        raise CorruptStoreError(f"segment {path} is not in the commit log of {self.sfs.url}")

    def append(self, batch, data: "bytearray | bytes | pa.Buffer | None" = None, *,
               c_array: tuple | None = None) -> int:
        """Append one batch (a record batch, or BuiltRows: kept in the cache as they are,
        read as a batch when first read; ``data``: its bytes if made; ``c_array``: its
        ``__arrow_c_array__()`` if exported); its physical offset. Caller serializes
        appends."""
        if data is None:
            data = seg.message_bytes(batch, c_array)
        if self.needs_roll(len(data)):
            self.roll()
        a = self.active
        pos = a.append(data)
        offset = a.base_offset + pos
        with self._lock:
            ref = self._active_ref
            if ref is None or ref.path != a.rel_path:
                ref = self._active_ref = self._ref(a.rel_path)
            ref.size = a.size
        self.written_offset = a.base_offset + a.size
        if self.written_hook is not None:
            try:
                self.written_hook(ref, pos, data)
            except Exception:   # the bytes are written: a hook's failure must not fail the append
                log.exception("commit log written hook failed")
        self._cache_put(offset, batch, len(data))
        return offset

    def flush(self, *, sync: bool) -> int:
        """Flush the active segment; returns the physical offset flushed up to."""
        with self._flush_lock:
            a = self.active
            if a is None:
                self.flushed_offset = self.written_offset
                return self.flushed_offset
            target = a.base_offset + a.size
            a.flush(sync=sync)
            self.flushed_offset = max(self.flushed_offset, target)
            return self.flushed_offset

    def close(self) -> None:
        """Flush and close the active segment; closed even when the flush raises."""
        try:
            if self.active is not None:
                self.flush(sync=True)
        finally:
            if self.active is not None:
                self.active.close()
                self.active = None
            self._cache.clear()
            self._cache_sizes.clear()
            self._cache_bytes = 0

    # -- reading -----------------------------------------------------------
    def _cache_put(self, offset: int, batch: pa.RecordBatch, size: int) -> None:
        """Keep ``batch`` (``size`` bytes serialized; ``RecordBatch.nbytes`` is slow)."""
        if size > self._cache_limit:
            return
        with self._lock:
            self._cache[offset] = batch
            self._cache_bytes += size - self._cache_sizes.get(offset, 0)   # (kept again)
            self._cache_sizes[offset] = size
            while self._cache_bytes > self._cache_limit and self._cache:
                old, _ = self._cache.popitem(last=False)
                self._cache_bytes -= self._cache_sizes.pop(old)

    def cached_rows(self, batch_offset: int):
        """What the cache holds for the batch at ``batch_offset`` (a record batch, or the
        BuiltRows an append left, still composed until first read as a batch), or None."""
        with self._lock:
            return self._cache.get(batch_offset)

    def read_batch(self, batch_offset: int) -> pa.RecordBatch:
        with self._lock:
            cached = self._cache.get(batch_offset)
        if cached is not None:
            return fmt.record_batch(cached)    # (BuiltRows: read as a batch once)
        ref = self.segment_for(batch_offset)
        if ref is None:
            first = self.min_offset()
            raise DataLossError(
                f"physical offset {batch_offset} is not in any segment (earliest is {first}); "
                "it was removed by retention or never existed", earliest_offset=first)
        pos = batch_offset - ref.base_offset
        if not self.sfs.is_local:
            # object stores: fetch this batch's message only (the whole segment was
            # downloaded per batch before), or copy it from the active segment's buffer
            a = self.active
            if a is not None and a.rel_path == ref.path and a.in_memory:
                batch, size = a.read_buffered_batch(pos)
            else:
                batch, size = seg.read_remote_batch(self.sfs, ref.path, pos)
            self._cache_put(batch_offset, batch, size)
            return batch
        if ref.sealed:
            buf = self.sfs.read_buffer(ref.path, cache=True, min_size=ref.size)
        else:
            # The active segment grows: keep its map while it covers the whole batch
            # (mapping a segment anew for every read cost ~0.3 ms per batch), map again
            # once a batch lies past the mapped end.
            buf = self.sfs.read_buffer(ref.path, cache=True, min_size=pos + 8)
            n = seg.message_length(buf, pos)
            if n is None or pos + n > len(buf):
                buf = self.sfs.read_buffer(ref.path, cache=True, min_size=len(buf) + 1)
        if pos >= len(buf):
            raise CorruptStoreError(
                f"segment {ref.path} has {len(buf)} bytes; batch at {pos} is past its end")
        return seg.read_batch_at(buf, pos, ref.path, verified=self._verified)
