"""The writer's memory is bounded in bytes under any send pattern (issue 18 item 4):
the in-memory ConsumeQueue and Index count what their small chunks and tables really
cost and evict persisted ones past ``memoryConsumeQueueBytes`` / ``memoryIndexBytes``.
Counted, not timed: tracemalloc measures the chunks, the budgets are checked on a
store fed one-message appends to many queues."""
from __future__ import annotations

import tracemalloc

import numpy as np

from sparkmq import Message, Store
from sparkmq.log.consumequeue import CHUNK_OVERHEAD_BYTES, Chunk, MemoryConsumeQueue


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
    assert measured <= _chunk(0).cost <= 2 * measured, (measured, CHUNK_OVERHEAD_BYTES)


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
    cq_budget, index_budget = 400_000, 300_000
    with Store.open(str(tmp_path / "s"), mode="w", start_services=False,
                    memoryConsumeQueueBytes=cq_budget, memoryIndexBytes=index_budget) as s:
        for t in range(20):
            s.create_topic(f"T{t}", read_queue_nums=4, write_queue_nums=4)
        for rnd in range(6):
            for i in range(400):      # one message per append: one chunk and index table each
                s.append([Message(f"T{i % 20}", b"x", keys=[f"k{rnd}-{i}"])])
            s.flush()                 # publishes: persisted chunks become evictable
            cq, index = s.dispatcher.cq, s.dispatcher.index
            assert cq.bytes <= cq_budget and index.bytes <= index_budget, (rnd, cq.bytes,
                                                                          index.bytes)
        # what was evicted is still read, from the Parquet side tables
        assert [m.body for m in s.read("T0", 0, 0, 1000)]
        assert len(s.query_by_key("T3", "k0-3")) == 1
        assert sum(len(s.read(f"T{t}", q, 0, 10_000)) for t in range(20)
                   for q in range(4)) == 2400
