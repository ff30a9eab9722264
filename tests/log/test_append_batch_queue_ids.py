"""Store.append_batch with a queue_id column that is partly null: the given ids
are kept (range-checked), only the null rows are chosen round robin. Both the
SEGMENT_SCHEMA fast path and the general (casting) path are covered."""
from __future__ import annotations

import pyarrow as pa
import pytest

from helpers.storetools import as_segment_batch
from sparkmq import Snapshot, Store
from sparkmq.errors import InvalidMessageError, QueueNotFoundError


@pytest.fixture
def store(store_url):
    s = Store.open(store_url, start_services=False)
    s.create_topic("t", read_queue_nums=4, write_queue_nums=4)
    s.create_topic("u", read_queue_nums=3, write_queue_nums=3)
    yield s
    s.close()


def _queues_of(store, topic):
    """body -> queue id, as a reader of the published version sees it."""
    store.flush()
    snap = Snapshot.load(store.url)
    out = {}
    for q in range(snap.topics()[topic]["writeQueueNums"]):
        for r in snap.read_table(topic, q, 0, columns=["body", "queue_id"]).to_pylist():
            out[r["body"]] = r["queue_id"]
    return out


@pytest.mark.parametrize("fast_path", [True, False])
def test_given_queue_ids_are_kept_and_null_rows_go_round_robin(store, fast_path):
    table = pa.table({"topic": ["t"] * 6,
                      "queue_id": pa.array([3, None, 3, None, None, 2], pa.int32()),
                      "body": [b"a", b"b", b"c", b"d", b"e", b"f"]})
    data = as_segment_batch(table) if fast_path else table
    r = store.append_batch(data)
    assert r.queue_ids.tolist() == [3, 0, 3, 1, 2, 2]
    assert _queues_of(store, "t") == {b"a": 3, b"b": 0, b"c": 3, b"d": 1, b"e": 2, b"f": 2}
    # the round robin goes on from where the null rows left it
    r = store.append_batch(as_segment_batch(pa.table({
        "topic": ["t"] * 2, "queue_id": pa.array([None, 0], pa.int32()), "body": [b"g", b"h"]})))
    assert r.queue_ids.tolist() == [3, 0]


@pytest.mark.parametrize("fast_path", [True, False])
def test_partly_null_queue_ids_with_two_topics(store, fast_path):
    table = pa.table({"topic": ["t", "u", "u", "t", "u"],
                      "queue_id": pa.array([None, 2, None, 1, None], pa.int64()),
                      "body": [b"t0", b"u0", b"u1", b"t1", b"u2"]})
    r = store.append_batch(as_segment_batch(table) if fast_path else table)
    assert r.queue_ids.tolist() == [0, 2, 0, 1, 1]
    assert _queues_of(store, "u") == {b"u0": 2, b"u1": 0, b"u2": 1}
    assert _queues_of(store, "t") == {b"t0": 0, b"t1": 1}


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_given_queue_id_out_of_range_is_refused_with_nulls_around(store, fast_path):
    # 3 is valid for "t" (4 queues) but not for "u" (3 queues)
    table = pa.table({"topic": ["t", "u", "t"],
                      "queue_id": pa.array([None, 3, 3], pa.int32()),
                      "body": [b"x", b"y", b"z"]})
    with pytest.raises(QueueNotFoundError, match="queue_id 3 is out of range for topic 'u'"):
        store.append_batch(as_segment_batch(table) if fast_path else table)
    table = table.set_column(1, "queue_id", pa.array([None, -1, None], pa.int32()))
    with pytest.raises(QueueNotFoundError, match="out of range"):
        store.append_batch(as_segment_batch(table) if fast_path else table)
    assert all(store.max_offset(t, q) == 0 for t, n in (("t", 4), ("u", 3)) for q in range(n))


def test_a_non_integer_queue_id_column_is_refused(store):
    table = pa.table({"topic": ["t", "t"], "queue_id": ["1", None], "body": [b"x", b"y"]})
    with pytest.raises(InvalidMessageError, match="queue_id"):
        store.append_batch(table)


@pytest.mark.spark
def test_a_spark_write_with_a_partly_null_queue_id_column_lands_where_asked(spark, tmp_path):
    """The data source writer picks queue ids in its tasks (not through append_batch);
    this guards the same contract there: given ids kept, nulls spread."""
    url = str(tmp_path / "store")
    with Store.open(url, start_services=False) as s:
        s.create_topic("t", read_queue_nums=4, write_queue_nums=4)
    spark.range(40, numPartitions=2).selectExpr(
        "cast(id as string) as body",
        "case when id % 2 = 0 then cast(3 as int) else null end as queue_id") \
        .write.format("sparkmq").mode("append").option("topic", "t").save(url)
    snap = Snapshot.load(url)
    where = {}
    for q in range(4):
        for r in snap.read_table("t", q, 0, columns=["body"]).to_pylist():
            where[int(r["body"])] = q
    assert sorted(where) == list(range(40))
    assert all(where[i] == 3 for i in range(0, 40, 2))
    assert len({where[i] for i in range(1, 40, 2)}) > 1       # the nulls are spread


@pytest.mark.parametrize("fast", [True, False])
def test_null_queue_rows_with_a_message_group_go_where_append_puts_the_group(store, fast):
    """A row without a queue_id but with a message_group (sharding key) goes to
    crc32(group) % queues like Store.append: every message of a group in one queue,
    in order; rows with neither go round robin; given ids are kept."""
    import zlib
    n = 60
    groups = [f"order-{i % 5}" if i % 3 else None for i in range(n)]
    qids = [2 if i == 7 else None for i in range(n)]
    table = pa.table({"topic": ["t"] * n, "body": [b"b%03d" % i for i in range(n)],
                      "queue_id": pa.array(qids, pa.int32()),
                      "message_group": pa.array(groups, pa.string())})
    store.append_batch(as_segment_batch(table) if fast else table)
    where = _queues_of(store, "t")
    for i in range(n):
        if i == 7:
            assert where[b"b%03d" % i] == 2
        elif groups[i] is not None:
            assert where[b"b%03d" % i] == zlib.crc32(groups[i].encode()) % 4
    ungrouped = {where[b"b%03d" % i] for i in range(n) if groups[i] is None and i != 7}
    assert len(ungrouped) == 4                     # round robin still spreads the rest
    from sparkmq import Message
    r = store.append([Message("t", b"via-append", message_group="order-1")])[0]
    assert r.queue_id == zlib.crc32(b"order-1") % 4


def test_a_message_group_column_of_the_wrong_type_is_refused(store):
    table = pa.table({"topic": ["t"], "body": [b"x"], "message_group": [7]})
    with pytest.raises(InvalidMessageError, match="message_group"):
        store.append_batch(table)


def test_a_send_built_from_column_lists_gets_the_one_queue_choice(store):
    """batch.build_segment_batch (the broker's entry point): a given queue id is kept,
    a message group hashes to crc32(group) % queues, the rest go round robin."""
    import zlib

    from sparkmq.log.batch import build_segment_batch
    batch = build_segment_batch(
        {"topic": ["t", "t", "u", "t"], "body": [b"a", b"b", b"c", b"d"],
         "queue_id": [2, None, None, None], "message_group": [None, "g", None, None],
         "born_timestamp": [None, 5, None, None]}, 4, store_host="h:1", now_ms=100)
    r = store.append_batch(batch)
    assert r.queue_ids.tolist() == [2, zlib.crc32(b"g") % 4, 0, 0]
    got = _queues_of(store, "t")
    assert got == {b"a": 2, b"b": zlib.crc32(b"g") % 4, b"d": 0}


@pytest.mark.parametrize("by_block", [False, True])
def test_one_rows_queue_is_what_the_round_robin_of_one_gives(by_block):
    """``next_queue`` (one row or one request, as an int) takes the same turn as
    ``round_robin`` of one row, between calls for several rows."""
    from sparkmq.log.batch import QueueChooser
    one, many = QueueChooser(start=2, by_block=by_block), QueueChooser(start=2, by_block=by_block)
    for count in (1, 3, 1, 1, 2, 1, 5, 1):
        if count == 1:
            assert one.next_queue("t", 3) == int(many.round_robin("t", 1, 3)[0])
        else:
            assert one.round_robin("t", count, 3).tolist() == \
                many.round_robin("t", count, 3).tolist()
