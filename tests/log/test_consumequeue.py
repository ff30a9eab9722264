"""ConsumeQueue side tables built from in-memory chunks (the publish path)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from sparkmq.log import format as fmt
from sparkmq.log.consumequeue import Chunk, chunks_to_side_table

SORT_KEYS = [("topic_id", "ascending"), ("queue_id", "ascending"), ("queue_offset", "ascending")]


def _chunk(start: int, n: int, batch_offset: int) -> Chunk:
    return Chunk(start, batch_offset, np.arange(n, dtype=np.int32),
                 np.full(n, 7, np.int32), np.arange(n, dtype=np.int64) * 3,
                 np.full(n, 1_700_000_000_000 + batch_offset, np.int64))


def _reference(taken) -> pa.Table:
    rows = []
    for tid, qid, ch in taken:
        for i in range(len(ch.rows)):
            rows.append({"topic_id": tid, "queue_id": qid, "queue_offset": ch.start + i,
                         "batch_offset": ch.batch_offset, "row": int(ch.rows[i]),
                         "size": int(ch.sizes[i]), "tags_code": int(ch.tags_codes[i]),
                         "store_timestamp": int(ch.store_ts[i])})
    t = pa.Table.from_pylist(rows)
    t = t.set_column(7, "store_timestamp", t.column("store_timestamp").cast(fmt.TS))
    return t.cast(fmt.CONSUMEQUEUE_SCHEMA).sort_by(SORT_KEYS)


def test_chunks_of_many_queues_in_append_order_come_out_sorted():
    rng = np.random.default_rng(5)
    nxt: dict[tuple[int, int], int] = {}
    taken = []
    for b in range(60):                       # appends interleave queues of two topics
        tid, qid = int(rng.integers(0, 2)), int(rng.integers(0, 3))
        n = int(rng.integers(0, 5))           # empty chunks are skipped
        start = nxt.get((tid, qid), 0)
        nxt[(tid, qid)] = start + n
        taken.append((tid, qid, _chunk(start, n, 1000 * b)))
    got = chunks_to_side_table(taken)
    assert got.schema == fmt.CONSUMEQUEUE_SCHEMA
    assert got.equals(_reference(taken))


def test_chunks_out_of_offset_order_are_sorted_by_rows():
    # a restored publish can put a queue's later chunk before an earlier one
    taken = [(0, 0, _chunk(4, 2, 300)), (0, 1, _chunk(0, 3, 200)), (0, 0, _chunk(0, 4, 100))]
    got = chunks_to_side_table(taken)
    assert got.column("queue_offset").to_pylist() == [0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert got.equals(_reference(taken))


def test_no_chunks_give_an_empty_table():
    assert chunks_to_side_table([]).num_rows == 0
    assert chunks_to_side_table([(0, 0, _chunk(0, 0, 5))]).schema == fmt.CONSUMEQUEUE_SCHEMA


# ---------------------------------------------------------------- the in-memory tail's reads
from hypothesis import given, settings, strategies as st  # noqa: E402

from sparkmq.log.consumequeue import (ENTRY_COLUMNS, MemoryConsumeQueue,  # noqa: E402
                                      entry_arrays)


@settings(deadline=None, max_examples=150)
@given(sizes=st.lists(st.integers(0, 6), min_size=0, max_size=6),
       lo=st.integers(0, 40), width=st.integers(0, 40),
       columns=st.one_of(st.none(), st.lists(st.sampled_from(ENTRY_COLUMNS), unique=True)),
       with_sizes=st.booleans())
def test_a_read_of_the_memory_tail_gives_the_entries_asked_for(sizes, lo, width, columns,
                                                                with_sizes):
    """Entries [lo, hi) of one queue's chunks, all columns or the ones asked for (queue
    offset always, in ENTRY_COLUMNS order), whether the range falls in one chunk, spans
    several or none: the same values as the chunks row by row. A read's numpy view of
    them (``entry_arrays``, sizes where asked) holds the same values."""
    cq, start, ref = MemoryConsumeQueue(1 << 20), 0, []
    for b, n in enumerate(sizes):
        ch = Chunk(start, 1000 * b, np.arange(n, dtype=np.int32) * 2,
                   np.full(n, 7 + b, np.int32), np.arange(n, dtype=np.int64) * 3,
                   np.full(n, 1_700_000_000_000 + b, np.int64))
        cq.add(1, 0, ch)
        ref += [{"queue_offset": start + i, "batch_offset": 1000 * b, "row": 2 * i,
                 "size": 7 + b, "tags_code": 3 * i, "store_timestamp": 1_700_000_000_000 + b}
                for i in range(n)]
        start += n
    hi = lo + width
    got = cq.entries(1, 0, lo, hi, columns)
    names = [c for c in ENTRY_COLUMNS if columns is None or c in columns or c == "queue_offset"]
    assert got.schema.names == names
    want = [{c: r[c] for c in names} for r in ref if lo <= r["queue_offset"] < hi]
    if "store_timestamp" in names:              # (compared as int64 milliseconds)
        got = got.set_column(names.index("store_timestamp"), "store_timestamp",
                             got.column("store_timestamp").cast(pa.int64()))
    assert got.to_pylist() == want
    got = cq.entries(1, 0, lo, hi, columns)
    assert got.schema == pa.schema([fmt.CONSUMEQUEUE_SCHEMA.field(c) for c in names])
    arrays = cq.entry_arrays(1, 0, lo, hi, with_sizes)
    want = [r for r in ref if lo <= r["queue_offset"] < hi]
    for field, column, dtype in (("queue_offsets", "queue_offset", np.int64),
                                 ("batch_offsets", "batch_offset", np.int64),
                                 ("rows", "row", np.int32), ("sizes", "size", np.int32)):
        values = getattr(arrays, field)
        if field == "sizes" and not with_sizes:
            assert values is None
            continue
        assert values.dtype == dtype and values.tolist() == [r[column] for r in want]
    def lists(a, k=None):
        return [None if v is None else v[:k].tolist() for v in a]
    assert lists(arrays) == lists(entry_arrays(cq.entries(1, 0, lo, hi), with_sizes))
    k = len(want) // 2
    assert lists(arrays.head(k)) == lists(arrays, k)
