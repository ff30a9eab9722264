"""The read path's building blocks: message ids, ConsumeQueue seeks, materialization."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sparkmq.log import format as fmt
from sparkmq.log import message
from sparkmq.log.consumequeue import (ENTRY_COLUMNS, consumequeue_add, read_side_entries,
                                      write_side_table)
from sparkmq.log.fs import StoreFS
from sparkmq.log.message import batch_message_ids, encode_message_id, message_id_array


def test_message_ids_match_the_encoding_for_runs_and_big_rows():
    rng = np.random.default_rng(7)
    bos = np.sort(rng.integers(0, 1 << 50, 60)).repeat(rng.integers(1, 40, 60))
    for rows in (rng.integers(0, 1000, len(bos)),              # small rows: table lookup
                 rng.integers(0, 1 << 24, len(bos)),           # rows past the table
                 np.zeros(len(bos), np.int64)):
        ids = message_id_array(0xDEADBEEF, bos, rows).to_pylist()
        assert ids == [encode_message_id(0xDEADBEEF, int(b), int(r))
                       for b, r in zip(bos, rows)]
    assert message_id_array(1, np.zeros(0, np.int64), np.zeros(0, np.int64)).to_pylist() == []
    for n in (1, 8, 9):                                     # both sides of the loop threshold
        ids = message_id_array(0xDEADBEEF, bos[:n], np.arange(n) * 70_001).to_pylist()
        assert ids == [encode_message_id(0xDEADBEEF, int(b), r * 70_001)
                       for b, r in zip(bos[:n], range(n))]


@pytest.mark.parametrize("c", [True, False], ids=["C", "numpy"])
def test_a_batch_s_ids_match_the_encoding_on_both_sides_of_the_loop_threshold(c, monkeypatch):
    if c and message._ipc is None:
        pytest.skip("sparkmq._ipc is not built here")
    if not c:
        monkeypatch.setattr(message, "_ipc", None)
    for n in (0, 1, 8, 9, 100, (1 << 16) + 3):              # loop, numpy, past the table
        for first in (0, 5, 0xFFFF_FFFF - n):               # (a merged put's later part)
            ids = batch_message_ids(0xCAFEF00D, 0x1234_5678_9ABC, n, first).to_pylist()
            assert ids == [encode_message_id(0xCAFEF00D, 0x1234_5678_9ABC, j)
                           for j in range(first, first + n)]


def _cq_table(rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows))
    return pa.table({
        "topic_id": pa.array(cols[0], pa.int32()), "queue_id": pa.array(cols[1], pa.int32()),
        "queue_offset": pa.array(cols[2], pa.int64()),
        "batch_offset": pa.array(cols[3], pa.int64()), "row": pa.array(cols[4], pa.int32()),
        "size": pa.array([10] * len(rows), pa.int32()),
        "tags_code": pa.array([0] * len(rows), pa.int64()),
        "store_timestamp": pa.array([1000 + o for o in cols[2]], pa.int64()).cast(fmt.TS),
    }, schema=fmt.CONSUMEQUEUE_SCHEMA)


def _write(sfs: StoreFS, name: str, table: pa.Table, row_group_rows: int = 4) -> dict:
    rel = f"consumequeue/{name}.parquet"
    size = write_side_table(sfs, rel, table, row_group_rows=row_group_rows)
    return consumequeue_add(rel, table, size)


def _expected(table: pa.Table, tid: int, qid: int, lo: int, hi: int) -> list[int]:
    f = table.filter((pc.field("topic_id") == tid) & (pc.field("queue_id") == qid) &
                     (pc.field("queue_offset") >= lo) & (pc.field("queue_offset") < hi))
    return sorted(set(f.column("queue_offset").to_pylist()))


def test_seek_in_sorted_files_spanning_row_groups(tmp_path, monkeypatch):
    """Sorted files (every writer's) are sought by binary search, never filtered."""
    import sparkmq.log.consumequeue as cq

    def no_filter(*args):
        raise AssertionError("a sorted file was filtered row by row")
    monkeypatch.setattr(cq, "_filter_queue_rows", no_filter)
    sfs = StoreFS(str(tmp_path))
    rows = [(t, q, o, 100 * o, o % 3) for t in (0, 1) for q in (0, 1, 2) for o in range(11)]
    table = _cq_table(rows)
    add = _write(sfs, "a", table)
    assert pq.ParquetFile(tmp_path / add.path).metadata.num_row_groups > 10
    for tid, qid, lo, hi in [(0, 0, 0, 11), (1, 1, 3, 9), (1, 2, 10, 20), (0, 2, 5, 5),
                             (1, 0, 0, 1)]:
        got = read_side_entries(sfs, [add], tid, qid, lo, hi)
        assert got.column_names == ENTRY_COLUMNS
        assert got.column("queue_offset").to_pylist() == _expected(table, tid, qid, lo, hi)
        assert got.column("batch_offset").to_pylist() == [100 * o for o in range(lo, min(hi, 11))]


def test_seek_in_an_unsorted_file_falls_back_to_filtering(tmp_path):
    """A file that breaks the required order still reads correctly (row-by-row filter)."""
    sfs = StoreFS(str(tmp_path))
    rows = [(t, q, o, 100 * o, 0) for o in range(8) for q in (1, 0) for t in (1, 0)]
    table = _cq_table(rows)             # offsets outermost: not sorted by (topic, queue)
    add = _write(sfs, "u", table, row_group_rows=1000)
    for tid, qid in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        got = read_side_entries(sfs, [add], tid, qid, 2, 7)
        assert got.column("queue_offset").to_pylist() == [2, 3, 4, 5, 6]


def test_overlapping_files_give_one_entry_per_offset(tmp_path):
    """After a crash re-dispatch two files may hold the same offsets: keep one of each."""
    sfs = StoreFS(str(tmp_path))
    a = _write(sfs, "a", _cq_table([(0, 0, o, 100 * o, 0) for o in range(0, 6)]))
    b = _write(sfs, "b", _cq_table([(0, 0, o, 100 * o, 0) for o in range(4, 9)]))
    for adds in ([a, b], [b, a]):
        got = read_side_entries(sfs, adds, 0, 0, 0, 100)
        assert got.column("queue_offset").to_pylist() == list(range(9))
        assert got.column("batch_offset").to_pylist() == [100 * o for o in range(9)]


def test_side_tables_use_delta_encoding_for_integers(tmp_path):
    sfs = StoreFS(str(tmp_path))
    add = _write(sfs, "d", _cq_table([(0, 0, o, 100 * o, 0) for o in range(100)]), 1000)
    md = pq.ParquetFile(tmp_path / add.path).metadata.row_group(0)
    names = [md.column(i).path_in_schema for i in range(md.num_columns)]
    assert "DELTA_BINARY_PACKED" in md.column(names.index("queue_offset")).encodings


def test_seek_reads_only_the_columns_asked(tmp_path):
    sfs = StoreFS(str(tmp_path))
    add = _write(sfs, "c", _cq_table([(0, 0, o, 100 * o, o) for o in range(10)]))
    got = read_side_entries(sfs, [add], 0, 0, 2, 5, ["row", "batch_offset"])
    assert got.column_names == ["queue_offset", "batch_offset", "row"]   # file order
    assert got.column("row").to_pylist() == [2, 3, 4]
    none = read_side_entries(sfs, [add], 0, 1, 0, 5, ["row"])
    assert none.num_rows == 0 and none.column_names == ["queue_offset", "row"]


def test_range_read_is_zero_copy_and_matches_the_entries(local_store_url):
    """Bodies of a contiguous range are slices of the memory-mapped segment (no copy);
    scattered rows (two queues interleaved in one batch) are taken; the computed
    columns match the ConsumeQueue."""
    from sparkmq import Snapshot, Store
    from sparkmq.log.message import decode_message_id, store_tag
    with Store.open(local_store_url, create=True, start_services=False) as s:
        s.create_topic("t", read_queue_nums=2, write_queue_nums=2)
        s.append_batch(pa.table({"topic": ["t"] * 100, "body": [b"b%d" % i for i in range(100)],
                                 "queue_id": pa.array([0] * 100, pa.int32())}))
        s.append_batch(pa.table({"topic": ["t"] * 200,
                                 "body": [b"b%d" % i for i in range(100, 300)],
                                 "queue_id": pa.array([i % 2 for i in range(200)], pa.int32())}))
        s.append_batch(pa.table({"topic": ["t"] * 50, "body": [b"c%d" % i for i in range(50)],
                                 "queue_id": pa.array([0] * 50, pa.int32())}))
    snap = Snapshot.load(local_store_url)
    table = snap.read_table("t", 0, 0)
    assert table.num_rows == 100 + 100 + 50
    expect = [b"b%d" % i for i in range(100)] + [b"b%d" % i for i in range(100, 300, 2)] + \
        [b"c%d" % i for i in range(50)]
    assert table.column("body").to_pylist() == expect
    assert table.column("queue_offset").to_pylist() == list(range(250))
    tag = store_tag(snap.store_id)
    for mid, phys in zip(table.column("message_id").to_pylist(),
                         table.column("physical_offset").to_pylist()):
        t, bo, row = decode_message_id(mid)
        assert t == tag and bo + row == phys
    seg_path = next(iter(snap.state.segments.values())).path
    mapped = snap.sfs.read_buffer(seg_path, cache=True)
    chunks = table.column("body").chunks
    assert [len(c) for c in chunks] == [100, 100, 50]

    def in_map(chunk):
        data = chunk.buffers()[2]
        return mapped.address <= data.address < mapped.address + mapped.size
    assert [in_map(c) for c in chunks] == [True, False, True]   # slices; the taken rows
    batches = list(snap.iter_batches("t", 0, 0))
    assert [b.num_rows for b in batches] == [100, 100, 50]
    assert pa.Table.from_batches(batches).equals(table)


def test_seek_never_skips_rows_of_an_unsorted_group(tmp_path):
    """Rows of the queue on both sides of another queue's rows: binary search alone
    would find one run; the reader must return all of them."""
    sfs = StoreFS(str(tmp_path))
    rows = [(0, 0, 0, 0, 0), (0, 1, 0, 0, 1), (0, 0, 1, 0, 2), (0, 0, 2, 0, 3)]
    add = _write(sfs, "x", _cq_table(rows), row_group_rows=1000)
    got = read_side_entries(sfs, [add], 0, 0, 0, 10)
    assert got.column("queue_offset").to_pylist() == [0, 1, 2]


def test_snapshot_on_an_object_store_reads_batches_not_whole_segments(monkeypatch):
    """On non-local backends a batch read fetches that batch's bytes, never the segment."""
    import uuid
    from sparkmq import Snapshot, Store
    from sparkmq.log.fs import StoreFS as FS
    url = f"memory://sparkmq-test-{uuid.uuid4().hex}"
    with Store.open(url, create=True, start_services=False) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        for i in range(3):
            s.append_batch(pa.table({"topic": ["t"] * 10,
                                     "body": [b"%d-%d" % (i, j) for j in range(10)]}))
    snap = Snapshot.load(url)
    real = FS.read_bytes

    def no_whole_segments(self, rel):
        assert not rel.startswith(fmt.COMMITLOG_DIR), f"downloaded all of {rel}"
        return real(self, rel)
    monkeypatch.setattr(FS, "read_bytes", no_whole_segments)
    assert snap.read_table("t", 0, 5, 25, columns=["body"]).column("body").to_pylist() == \
        [b"%d-%d" % (i, j) for i in range(3) for j in range(10)][5:25]
    mid = snap.read_table("t", 0, 12, 13).column("message_id")[0].as_py()
    assert snap.lookup(mid).body == b"1-2"


def test_a_whole_row_read_is_the_message_schema_as_a_column_by_column_read_builds_it(
        local_store_url):
    """Every column (the 3 computed ones inserted into the stored ones) gives exactly
    MESSAGE_SCHEMA and the same table as naming every column: for one message, for rows
    of several batches, and for scattered rows."""
    from sparkmq import Snapshot, Store
    from sparkmq.log.reader import MESSAGE_COLUMNS, MESSAGE_SCHEMA
    with Store.open(local_store_url, create=True, start_services=False) as s:
        s.create_topic("t", read_queue_nums=2, write_queue_nums=2)
        for k in range(3):
            s.append_batch(pa.table({"topic": ["t"] * 5, "body": [b"%d-%d" % (k, i)
                                                                 for i in range(5)],
                                     "tags": ["a", None, "b", "c", None],
                                     "queue_id": pa.array([0, 1, 0, 0, 1], pa.int32())}))
    snap = Snapshot.load(local_store_url)
    for lo, hi in ((0, 1), (3, 4), (1, 7), (0, 9)):
        whole = snap.read_table("t", 0, lo, hi)
        named = snap.read_table("t", 0, lo, hi, columns=MESSAGE_COLUMNS)
        assert whole.schema.equals(MESSAGE_SCHEMA, check_metadata=True)
        assert whole.num_rows == hi - lo and whole.equals(named)
    assert snap.read_table("t", 0, 0, 9).column("body").to_pylist() == [
        b"%d-%d" % (k, i) for k in range(3) for i in (0, 2, 3)]


def test_stored_messages_give_times_as_int_ms_across_chunks_nulls_and_units():
    from sparkmq.log.message import stored_messages
    ms = [1_700_000_000_123, 1_700_000_000_456, 1_700_000_000_789]
    born = pa.chunked_array([pa.array(ms[:2], fmt.TS), pa.array(ms[2:], fmt.TS)])
    due = pa.chunked_array([pa.array([None, ms[1]], fmt.TS), pa.array([None], fmt.TS)])
    stored = pa.array([v * 1000 for v in ms], pa.timestamp("us", tz="UTC"))  # another unit
    table = pa.table({"topic": ["T"] * 3, "body": [b"a", b"b", b"c"], "queue_id": [0] * 3,
                      "queue_offset": [0, 1, 2], "physical_offset": [0, 0, 0],
                      "message_id": ["a", "b", "c"], "born_timestamp": born,
                      "store_timestamp": stored, "delivery_timestamp": due})
    got = stored_messages(table)
    assert [m.born_timestamp for m in got] == ms
    assert [m.store_timestamp for m in got] == ms
    assert [m.delivery_timestamp for m in got] == [None, ms[1], None]


def test_stored_messages_read_every_field_as_from_row_does(store_url):
    """Messages with and without tags, keys, properties, groups, ids and hosts, a retried
    one (reconsume_times) and a delayed one, read back: ``stored_messages`` (column by
    column) gives what ``StoredMessage.from_row`` makes of each row."""
    from sparkmq import Message, Store
    from sparkmq.log.message import StoredMessage, stored_messages
    with Store.open(store_url) as store:
        store.create_topic("t", write_queue_nums=1, read_queue_nums=1)
        store.append([
            Message("t", b"plain"),
            Message("t", b"full", tags="TagA", keys=["k1", "k2"], properties={"a": "1"},
                    message_group="g", unique_key="U1", born_host="10.0.0.1:5",
                    born_timestamp=1_700_000_000_001, reconsume_times=3),
            Message("t", b"later", delivery_timestamp=4_102_444_800_000, keys=["k3"]),
        ])
        table = store.read_table("t", 0, 0)
    got = stored_messages(table)
    want = []
    for row in table.to_pylist():
        want.append(StoredMessage.from_row(row))
    assert got == want
    assert got[1].keys == ["k1", "k2"] and got[1].properties == {"a": "1"}
    assert got[1].reconsume_times == 3 and got[0].keys == [] and got[0].properties == {}
    assert got[2].delivery_timestamp == 4_102_444_800_000 and got[0].tags is None
    # a table of the required columns only (the rest missing: their defaults)
    bare = table.select(["topic", "queue_id", "queue_offset", "physical_offset",
                         "message_id", "body", "born_timestamp", "store_timestamp"])
    assert stored_messages(bare) == [StoredMessage.from_row(r) for r in bare.to_pylist()]
    assert {(m.reconsume_times, m.message_type) for m in stored_messages(bare)} == {(0, 0)}


def test_read_gives_what_the_table_read_gives_as_messages(store_url):
    """``read`` (messages straight from the stored rows and the entries) equals
    ``stored_messages(read_table(...))`` for every start and length: within one batch and
    across batches, for rows a queue holds scattered through a batch (a take) and in a
    run (a slice), past the end, and after a reopen (from the segments)."""
    from sparkmq import Message, Store
    from sparkmq.log.message import stored_messages
    with Store.open(store_url) as store:
        store.create_topic("t", write_queue_nums=2, read_queue_nums=2)
        for b in range(4):                      # row by row: each queue's rows scattered
            store.append([Message("t", b"%d-%d" % (b, i), tags="A" if i % 3 else None,
                                  keys=[f"k{i}"], properties={"i": str(i)})
                          for i in range(5)])
        store.append_batch(pa.table({"topic": ["t"] * 6, "body": [b"run"] * 6,
                                     "queue_id": pa.array([1] * 6, pa.int32())}))
        checked = 0
        for q in (0, 1):
            hi = store.max_offset("t", q)
            for start in range(hi + 1):
                for k in (0, 1, 2, 5, 32):
                    want = stored_messages(store.read_table("t", q, start, start + k))
                    assert store.read("t", q, start, k) == want
                    checked += bool(want)
        assert checked > 40
        url = store.url
    with Store.open(url, mode="r") as snap:
        assert snap.read("t", 1, 0, 32) == stored_messages(snap.read_table("t", 1, 0, 32))
