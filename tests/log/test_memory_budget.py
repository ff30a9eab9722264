"""The writer's memory is bounded in bytes under any send pattern (issue 18 item 4):
the in-memory ConsumeQueue counts what its small chunks really cost and evicts persisted
ones past ``memoryConsumeQueueBytes``; the in-memory Index holds only keys not yet
published. Counted, not timed: tracemalloc measures the chunks, the budget and the
Index's rows are checked on a store fed one-message appends to many queues. The chunks
kept are no work for CPython's cyclic collector: neither they nor what they hold are
tracked (sparkmq/_chunk.c says why)."""
from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from sparkmq import Message, Store
from sparkmq._chunk import Chunk as CChunk     # (required: see the chunks' tests)
from sparkmq.log.fs import StoreFS
from sparkmq.log.batch import build_segment_batch
from sparkmq.log.built import build_rows
from sparkmq.log.commitlog import CommitLog
from sparkmq.log.consumequeue import (CHUNK_OVERHEAD_BYTES, Chunk, MemoryConsumeQueue, _PyChunk,
                                      chunk_cost)


def _chunk(i: int, rows: int = 1) -> Chunk:
    return Chunk(i, i * 10, np.zeros(rows, np.int32), np.zeros(rows, np.int32),
                 np.zeros(rows, np.int64), np.zeros(rows, np.int64))


def test_a_chunk_costs_no_more_than_it_is_counted():
    n = 5000
    tracemalloc.start()
    try:
        cq = MemoryConsumeQueue(10 ** 9)
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            cq.add(i % 100, 0, _chunk(i))
        measured = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert measured <= chunk_cost(_chunk(0)) <= 2 * measured, (measured, CHUNK_OVERHEAD_BYTES)


def test_persisted_chunks_are_evicted_past_the_byte_budget():
    budget = 200_000
    cq = MemoryConsumeQueue(10 ** 9, budget)           # entries alone would keep them all
    for i in range(2000):
        cq.add(1, i % 4, _chunk(i))
    assert cq.bytes > budget
    cq.take_unpersisted(1 << 62)                        # published
    cq.evict()
    assert cq.bytes <= budget
    assert all(cq.all_chunks(1, q) for q in range(4))   # each queue keeps its newest


def test_a_store_fed_small_appends_stays_within_its_budgets(tmp_path):
    cq_budget = 400_000
    with Store.open(str(tmp_path / "s"), mode="w", start_services=False,
                    memoryConsumeQueueBytes=cq_budget) as s:
        for t in range(20):
            s.create_topic(f"T{t}", read_queue_nums=4, write_queue_nums=4)
        for rnd in range(6):
            for i in range(400):      # one message per append: one chunk and index table each
                s.append([Message(f"T{i % 20}", b"x", keys=[f"k{rnd}-{i}"])])
            s.flush()                 # publishes: persisted chunks become evictable
            assert s.dispatcher.cq.bytes <= cq_budget, (rnd, s.dispatcher.cq.bytes)
            assert s.dispatcher.index.rows == 0        # every key is in a side file now
        # what was evicted is still read, from the Parquet side tables
        assert [m.body for m in s.read("T0", 0, 0, 1000)]
        assert len(s.query_by_key("T3", "k0-3")) == 1
        assert sum(len(s.read(f"T{t}", q, 0, 10_000)) for t in range(20)
                   for q in range(4)) == 2400


def test_a_key_stays_findable_while_its_publish_is_under_way(tmp_path):
    with Store.open(str(tmp_path / "s"), mode="w", start_services=False) as s:
        s.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        s.append([Message("T", b"x", keys=["k"])])
        index = s.dispatcher.index
        taken = index.take_unpersisted(1 << 62)      # a publish has taken it, not committed
        assert taken.num_rows == 1
        assert len(s.query_by_key("T", "k")) == 1
        index.restore_unpersisted(taken)             # that publish failed
        s.flush()                                    # the next one commits it
        assert index.rows == 0
        assert len(s.query_by_key("T", "k")) == 1    # from the side file, once


@pytest.mark.parametrize("kind", [CChunk, _PyChunk])
def test_a_chunk_reads_back_what_it_was_made_of_and_cannot_be_changed(kind):
    rows, sizes = np.arange(3, dtype=np.int32), np.array([5, 6, 7], np.int32)
    tags, ts = np.zeros(3, np.int64), np.full(3, 9, np.int64)
    for ch in (kind(10, 4096, rows, sizes, tags, ts),
               kind(start=10, batch_offset=4096, rows=rows, sizes=sizes, tags_codes=tags,
                    store_ts=ts)):
        assert (ch.start, ch.batch_offset, ch.end) == (10, 4096, 13)
        assert ch.rows is rows and ch.sizes is sizes
        assert ch.tags_codes is tags and ch.store_ts is ts
        with pytest.raises(AttributeError):
            ch.start = 11
    with pytest.raises(TypeError):
        kind(10, 4096, rows, sizes, tags)                   # one field short


def test_a_chunk_is_not_tracked_by_the_cyclic_collector():
    assert Chunk is CChunk                                  # what the store makes
    ch = Chunk(0, 0, np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int64),
               np.zeros(1, np.int64))
    assert not gc.is_tracked(ch)
    assert gc.is_tracked(_PyChunk(0, 0, ch.rows, ch.sizes, ch.tags_codes, ch.store_ts))


def test_what_a_store_keeps_of_each_append_is_no_work_for_the_cyclic_collector(tmp_path):
    """A full pass of the collector visits every tracked object with the GIL held, and
    the in-memory ConsumeQueue keeps a chunk per append and queue: a chunk, its arrays
    and what they view must not be tracked (a store time that viewed the stamped
    bytearray held a tracked memoryview per chunk)."""
    with Store.open(str(tmp_path / "s"), mode="w", start_services=False) as s:
        s.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        s.append([Message("T", b"x")])                                  # a record batch
        s.append_batch(build_rows({"topic": ["T"] * 2, "body": [b"a", b"b"]}, 2,
                                  store_host=s.config.store_host, now_ms=1))   # BuiltRows
        chunks = s.dispatcher.cq.all_chunks(s.state.topics["T"].id, 0)
        assert [ch.end for ch in chunks] == [1, 3]
        for ch in chunks:
            assert not gc.is_tracked(ch)
            for arr in (ch.rows, ch.sizes, ch.tags_codes, ch.store_ts):
                held = arr
                while held is not None:                 # the array and what it views
                    assert not gc.is_tracked(held), (arr, held)
                    held = getattr(held, "base", None)


def test_the_commit_log_cache_keeps_the_newest_batches_within_its_bytes(tmp_path):
    batch = build_segment_batch({"topic": ["t"], "queue_id": [0], "body": [b"x" * 1000]}, 1,
                                store_host="h", now_ms=1)
    probe = CommitLog(StoreFS(str(tmp_path / "probe")), segment_size_bytes=1 << 20)
    size = -probe.append(batch) + probe.append(batch)          # one batch's bytes
    log = CommitLog(StoreFS(str(tmp_path / "log")), segment_size_bytes=1 << 20,
                    cache_bytes=3 * size + size // 2)
    offsets = [log.append(batch) for _ in range(8)]
    assert [log.cached_rows(o) is batch for o in offsets] == [False] * 5 + [True] * 3
    assert log.read_batch(offsets[0]).equals(batch)             # (from the segment)
    log.clear_cache()
    assert all(log.cached_rows(o) is None for o in offsets)
    offsets = [log.append(batch) for _ in range(4)]             # counted from nothing again
    assert [log.cached_rows(o) is batch for o in offsets] == [False] + [True] * 3
