"""The writer's memory is bounded in bytes under any send pattern (issue 18 item 4):
the in-memory ConsumeQueue counts what its small chunks really cost and evicts persisted
ones past ``memoryConsumeQueueBytes``; the in-memory Index holds only keys not yet
published. Counted, not timed: tracemalloc measures the chunks, the budget and the
Index's rows are checked on a store fed one-message appends to many queues."""
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
