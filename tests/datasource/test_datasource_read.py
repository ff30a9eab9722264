"""Reading a store with Spark: spark.read / spark.readStream .format("sparkmq").

Real local SparkSession (session fixture ``spark``), real stores in tmp dirs
written with sparkmq.Store.
"""
from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from helpers.clock import Clock
from helpers.waiting import wait_until

from sparkmq.log.store import Store


TOPIC = "Orders"
QUEUES = 4


def _rows(n: int, start: int = 0, *, keys_every: int = 0) -> pa.Table:
    bodies = [f"m{i}".encode() for i in range(start, start + n)]
    keys = [[f"k{i % keys_every}"] if keys_every else None for i in range(start, start + n)]
    return pa.table({"topic": [TOPIC] * n, "body": bodies,
                     "tags": ["even" if i % 2 == 0 else "odd" for i in range(start, start + n)],
                     "keys": pa.array(keys, pa.list_(pa.string()))})


def make_store(url: str, n: int = 40, *, keys_every: int = 0, batches: int = 1,
               **config) -> None:
    with Store.open(url, start_services=False, **config) as s:
        s.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        per = n // batches
        for b in range(batches):
            s.append_batch(_rows(per, b * per, keys_every=keys_every))


def read(spark, url, **opts):
    r = spark.read.format("sparkmq")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(url)


def bodies(df) -> list[str]:
    return sorted(r.body.decode() for r in df.select("body").collect())


@pytest.mark.spark
def test_batch_read_equals_what_was_written(spark, local_store_url):
    make_store(local_store_url, 40, keys_every=5)
    df = read(spark, local_store_url)
    rows = df.collect()
    assert len(rows) == 40
    assert sorted(bytes(r.body).decode() for r in rows) == sorted(f"m{i}" for i in range(40))
    assert {r.topic for r in rows} == {TOPIC}
    assert {r.broker_name for r in rows} == {"broker-a"}
    per_queue = {}
    for r in rows:
        per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    assert sorted(per_queue) == list(range(QUEUES))
    for offs in per_queue.values():
        assert sorted(offs) == list(range(len(offs)))
    assert all(len(r.message_id) == 32 for r in rows)
    assert rows[0].store_timestamp is not None


@pytest.mark.spark
def test_declared_schema_reads_only_those_columns(spark, local_store_url, tmp_path):
    """A declared subset of the schema is what a read returns (batch and stream)."""
    make_store(local_store_url, 40)
    full = {(r.queue_id, r.queue_offset): (bytes(r.body), r.message_id)
            for r in read(spark, local_store_url).collect()}
    df = spark.read.format("sparkmq").schema("message_id string, body binary, queue_id int, "
                                             "queue_offset long").load(local_store_url)
    assert df.columns == ["message_id", "body", "queue_id", "queue_offset"]
    rows = df.collect()
    assert {(r.queue_id, r.queue_offset): (bytes(r.body), r.message_id) for r in rows} == full
    only_even = spark.read.format("sparkmq").schema("body binary, tags string") \
        .load(local_store_url).where("tags = 'even'")     # pushed down, applied per step
    assert sorted(bytes(r.body) for r in only_even.collect()) == \
        sorted(f"m{i}".encode() for i in range(0, 40, 2))
    names = spark.read.format("sparkmq").schema("broker_name string").load(local_store_url)
    assert [r.broker_name for r in names.collect()] == ["broker-a"] * 40
    stream = spark.readStream.format("sparkmq").schema("body binary") \
        .option("startingOffsets", "earliest").load(local_store_url)
    q = (stream.writeStream.format("memory").queryName("declared_schema")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
        got = spark.table("declared_schema").collect()
    finally:
        q.stop()
    assert sorted(bytes(r.body) for r in got) == sorted(b for b, _ in full.values())


@pytest.mark.spark
@pytest.mark.parametrize("schema, says", [
    ("bodyy binary", "not a sparkmq column"),
    ("body string", "binary in sparkmq, not string"),
    ("body binary, body binary", "twice"),
])
def test_declared_schema_mistakes_are_named(spark, schema, says):
    # (the session: pyspark parses a DDL string in the JVM. Without the fixture this
    # passed only where an earlier test of the same worker had started one)
    from pyspark.sql.types import _parse_datatype_string
    from sparkmq.datasource.reader import output_schema
    from sparkmq.errors import UserError
    with pytest.raises(UserError, match=says):
        output_schema(_parse_datatype_string(schema))


def snapshot_version(url) -> int:
    from sparkmq.log.reader import Snapshot
    return Snapshot.load(url).version


# -- batch options ----------------------------------------------------------------
@pytest.mark.spark
def test_topic_options_and_queues(spark, local_store_url):
    make_store(local_store_url, 40)
    with Store.open(local_store_url, start_services=False) as s:
        s.create_topic("Other", read_queue_nums=1, write_queue_nums=1)
        s.append_batch(pa.table({"topic": ["Other"] * 3, "body": [b"o0", b"o1", b"o2"]}))
    assert read(spark, local_store_url).count() == 43
    assert read(spark, local_store_url, topic="Other").count() == 3
    assert read(spark, local_store_url, topics=f"{TOPIC},Other").count() == 43
    assert read(spark, local_store_url, topicPattern="Ord.*").count() == 40
    q02 = read(spark, local_store_url, topic=TOPIC, queues="0,2")
    assert {r.queue_id for r in q02.select("queue_id").collect()} == {0, 2}
    assert q02.count() == 20
    js = read(spark, local_store_url, queues=json.dumps({TOPIC: [1]}))
    assert {(r.topic, r.queue_id) for r in js.select("topic", "queue_id").collect()} == {(TOPIC, 1)}
    with pytest.raises(Exception, match="do not exist"):
        read(spark, local_store_url, topic="Nope").count()


@pytest.mark.spark
def test_starting_and_ending_offsets(spark, local_store_url):
    make_store(local_store_url, 40)      # 10 per queue
    start = json.dumps({TOPIC: {"0": 5, "1": -1, "2": -2}})
    end = json.dumps({TOPIC: {"0": 8, "2": 3}})
    df = read(spark, local_store_url, startingOffsets=start, endingOffsets=end)
    got = sorted((r.queue_id, r.queue_offset) for r in df.collect())
    want = [(0, o) for o in range(5, 8)] + [(2, o) for o in range(0, 3)] + \
        [(3, o) for o in range(0, 10)]   # queue 1 starts latest; queue 3 defaults to all
    assert got == want
    assert read(spark, local_store_url, startingOffsets="latest").count() == 0


@pytest.mark.spark
def test_starting_and_ending_timestamp(spark, local_store_url):
    clock = Clock()
    with Store.open(local_store_url, start_services=False, clock_ms=clock) as s:
        s.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
        s.append_batch(_rows(5, 0))
        t1 = clock.advance(20)
        clock.advance(20)
        s.append_batch(_rows(5, 5))
        t2 = clock.advance(20)
        clock.advance(20)
        s.append_batch(_rows(5, 10))
    df = read(spark, local_store_url, startingTimestamp=str(t1), endingTimestamp=str(t2))
    assert bodies(df) == sorted(f"m{i}" for i in range(5, 10))


@pytest.mark.spark
def test_time_travel_returns_older_snapshot(spark, local_store_url):
    clock = Clock()
    make_store(local_store_url, 20, clock_ms=clock)
    v1 = snapshot_version(local_store_url)
    ts_between = clock.advance(20)
    clock.advance(20)
    with Store.open(local_store_url, start_services=False, clock_ms=clock) as s:
        s.append_batch(_rows(20, 20))
    assert read(spark, local_store_url).count() == 40
    assert bodies(read(spark, local_store_url, versionAsOf=str(v1))) == \
        sorted(f"m{i}" for i in range(20))
    assert read(spark, local_store_url, timestampAsOf=str(ts_between)).count() == 20


@pytest.mark.spark
def test_min_partitions_splits_queue_ranges(spark, local_store_url):
    from sparkmq.datasource.reader import SparkMQBatchReader
    make_store(local_store_url, 40)
    reader = SparkMQBatchReader({"path": local_store_url, "minPartitions": "10"})
    parts = reader.partitions()
    assert len(parts) >= 10
    covered = sorted((p.queue_id, o) for p in parts for o in range(p.start, p.end))
    assert covered == sorted((q, o) for q in range(QUEUES) for o in range(10))
    df = read(spark, local_store_url, minPartitions="10")
    assert df.rdd.getNumPartitions() >= 10
    assert bodies(df) == sorted(f"m{i}" for i in range(40))


# -- filter pushdown --------------------------------------------------------------
@pytest.mark.spark
def test_pushdown_filters_prune_and_are_exact(spark, local_store_url):
    from pyspark.sql import functions as F
    make_store(local_store_url, 40, keys_every=5)
    df = read(spark, local_store_url)
    keyed = df.filter(F.col("keys") == F.array(F.lit("k1"))).collect()
    assert sorted(bytes(r.body).decode() for r in keyed) == sorted(f"m{i}" for i in range(1, 40, 5))
    q = df.filter((F.col("queue_id").isin(1, 2)) & (F.col("queue_offset") >= 3)
                  & (F.col("queue_offset") < 6) & (F.col("tags") == "even"))
    got = q.collect()
    assert got and all(r.queue_id in (1, 2) and 3 <= r.queue_offset < 6 and r.tags == "even"
                       for r in got)
    full = [r for r in df.collect() if r.queue_id in (1, 2) and 3 <= r.queue_offset < 6
            and r.tags == "even"]
    assert sorted(r.message_id for r in got) == sorted(r.message_id for r in full)
    assert df.filter(F.col("topic") == "nope").count() == 0
    one = df.filter((F.col("queue_id") == 3) & (F.col("queue_offset") == 4)).collect()
    assert [(r.queue_id, r.queue_offset) for r in one] == [(3, 4)]
    some = df.filter(F.col("queue_offset").isin(1, 7) & (F.col("queue_id") == 0)).collect()
    assert sorted(r.queue_offset for r in some) == [1, 7]
    ts = sorted(r.store_timestamp for r in df.collect())
    assert df.filter(F.col("store_timestamp") >= ts[0]).count() == 40
    assert df.filter(F.col("store_timestamp") > ts[-1]).count() == 0


def test_pushdown_plans_only_index_hits(local_store_url):
    """The key filter is answered from the Index: the plan lists only keyed offsets."""
    from pyspark.sql.datasource import EqualTo, GreaterThan, In
    from sparkmq.datasource.reader import SparkMQBatchReader
    make_store(local_store_url, 40, keys_every=5)
    reader = SparkMQBatchReader({"path": local_store_url})
    body_filter = GreaterThan(("body",), b"x")
    left = list(reader.pushFilters([EqualTo(("keys",), ["k1"]), EqualTo(("queue_id",), 1),
                                    body_filter]))
    assert left == [body_filter]
    parts = reader.partitions()
    planned = sum(len(p.offsets) for p in parts)
    assert 0 < planned <= 40 // 5 and {p.queue_id for p in parts} == {1}
    rows = [r for p in parts for b in reader.read(p) for r in b.to_pylist()]
    assert rows and all(r["keys"] == ["k1"] and r["queue_id"] == 1 for r in rows)
    # IN on queue_offset prunes the plan to [min, max] and is left to Spark
    reader = SparkMQBatchReader({"path": local_store_url})
    in_filter = In(("queue_offset",), (2, 4))
    assert list(reader.pushFilters([in_filter, EqualTo(("queue_id",), 0)])) == [in_filter]
    assert [(p.queue_id, p.start, p.end) for p in reader.partitions()] == [(0, 2, 5)]


# -- data loss --------------------------------------------------------------------
@pytest.mark.spark
def test_fail_on_data_loss_both_ways(spark, local_store_url, tmp_path):
    with Store.open(local_store_url, start_services=False, mappedFileSizeCommitLog=8192) as s:
        s.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1)
        for b in range(12):
            s.append_batch(pa.table({"topic": [TOPIC] * 5, "body": [b"x" * 300] * 5}))
        segs = [x.path for x in s.commitlog.segments()]
        assert len(segs) > 2
        s.remove_segments(segs[:1])
        earliest = s.min_offset(TOPIC, 0)
    assert earliest > 0
    from_zero = json.dumps({TOPIC: {"0": 0}})
    with pytest.raises(Exception, match=f"earliest available offset is {earliest}"):
        read(spark, local_store_url, startingOffsets=from_zero).count()
    df = read(spark, local_store_url, startingOffsets=from_zero, failOnDataLoss="false")
    offs = sorted(r.queue_offset for r in df.select("queue_offset").collect())
    assert offs == list(range(earliest, 60))
    assert read(spark, local_store_url).count() == 60 - earliest   # earliest: no loss
    # streaming: a start below the earliest offset fails, or skips to it
    sdf = stream(spark, local_store_url, startingOffsets=from_zero)
    with pytest.raises(Exception, match=f"earliest available offset is {earliest}"):
        run_available_now(sdf, "loss_fail", tmp_path / "c1")
    sdf = stream(spark, local_store_url, startingOffsets=from_zero, failOnDataLoss="false")
    run_available_now(sdf, "loss_skip", tmp_path / "c2")
    got = sorted(r.queue_offset for r in spark.sql("select queue_offset from loss_skip").collect())
    assert got == list(range(earliest, 60))


# -- streaming --------------------------------------------------------------------
def stream(spark, url, **opts):
    r = spark.readStream.format("sparkmq").option("startingOffsets", "earliest")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(url)


def run_available_now(df, name, checkpoint, *, foreach=None, timeout_s=120):
    w = df.writeStream.trigger(availableNow=True).option("checkpointLocation", str(checkpoint))
    if foreach is not None:
        w = w.foreachBatch(foreach)
    else:
        w = w.format("memory").queryName(name)
    q = w.start()
    try:
        assert q.awaitTermination(timeout_s), "query did not finish"
        assert q.exception() is None
        return q
    finally:
        q.stop()


def batch_rows(q) -> list[int]:
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


@pytest.mark.spark
def test_stream_max_messages_per_trigger_batch_by_batch(spark, local_store_url, tmp_path):
    make_store(local_store_url, 40)
    # (driverReadMaxMessages=0: no driver reads, so the progress reports latestOffset)
    df = stream(spark, local_store_url, maxMessagesPerTrigger="7", consumerGroup="spark-g",
                driverReadMaxMessages="0")
    q = run_available_now(df, "mmpt", tmp_path / "ckpt")
    assert batch_rows(q) == [7, 7, 7, 7, 7, 5]
    got = spark.sql("select body from mmpt").collect()
    assert sorted(bytes(r.body).decode() for r in got) == sorted(f"m{i}" for i in range(40))
    latest = json.loads(q.lastProgress["sources"][0]["latestOffset"])
    assert latest == {TOPIC: {str(qid): 10 for qid in range(QUEUES)}}
    from sparkmq.log.reader import Snapshot
    assert Snapshot.load(local_store_url).consumer_offsets("spark-g") == \
        {(TOPIC, qid): 10 for qid in range(QUEUES)}


@pytest.mark.spark
def test_stream_max_bytes_per_trigger(spark, local_store_url, tmp_path):
    with Store.open(local_store_url, start_services=False) as s:
        s.create_topic(TOPIC, read_queue_nums=2, write_queue_nums=2)
        s.append_batch(pa.table({"topic": [TOPIC] * 10, "body": [b"y" * 100] * 10}))
    df = stream(spark, local_store_url, maxBytesPerTrigger="350")
    q = run_available_now(df, "mbpt", tmp_path / "ckpt")
    assert batch_rows(q) == [3, 3, 3, 1]


@pytest.mark.spark
def test_available_now_stops_at_backlog_seen_at_start(spark, local_store_url, tmp_path):
    make_store(local_store_url, 40)
    seen = []

    def each(batch_df, batch_id):
        seen.extend(bytes(r.body).decode() for r in batch_df.select("body").collect())
        if batch_id == 0:   # new messages arrive while the query runs
            with Store.open(local_store_url, start_services=False) as s:
                s.append_batch(_rows(20, 100))
    df = stream(spark, local_store_url, maxMessagesPerTrigger="10")
    q = run_available_now(df, None, tmp_path / "ckpt", foreach=each)
    assert len(batch_rows(q)) == 4
    assert sorted(seen) == sorted(f"m{i}" for i in range(40))


@pytest.mark.spark
def test_stream_restart_from_checkpoint_exactly_once(spark, local_store_url, tmp_path):
    make_store(local_store_url, 40)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def start(trigger):
        df = stream(spark, local_store_url, maxMessagesPerTrigger="10").select("body", "queue_id",
                                                                             "queue_offset")
        return (df.writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(ckpt)).trigger(**trigger).start())
    q = start({"processingTime": "0 seconds"})
    try:
        def two_batches() -> bool:
            assert q.exception() is None
            return len(batch_rows(q)) >= 2
        wait_until(two_batches, "two micro-batches of the stream", timeout_s=120,
                   interval_s=0.2)
    finally:
        q.stop()
    with Store.open(local_store_url, start_services=False) as s:
        s.append_batch(_rows(20, 40))
    q = start({"availableNow": True})
    try:
        assert q.awaitTermination(120)
    finally:
        q.stop()
    got = spark.read.parquet(str(out)).collect()
    assert sorted(bytes(r.body).decode() for r in got) == sorted(f"m{i}" for i in range(60))


@pytest.mark.spark
def test_reader_sees_only_whole_committed_versions(spark, local_store_url):
    """Reads while a writer commits batches of 7: each read is a whole number of
    batches and every queue is a gap-free prefix."""
    import threading
    with Store.open(local_store_url, start_services=False) as s:
        s.create_topic(TOPIC, read_queue_nums=2, write_queue_nums=2)
        s.append_batch(_rows(7))
    stop = threading.Event()
    errors = []

    def write():
        try:
            with Store.open(local_store_url) as s:   # services on: publishes on its interval
                for b in range(1, 400):
                    if stop.is_set():
                        break
                    s.append_batch(_rows(7, 7 * b))
                    if b % 5 == 0:
                        s.publish()
                    time.sleep(0.005)   # the point: pace the writer so reads interleave
        except Exception as exc:   # surfaced below
            errors.append(exc)
    t = threading.Thread(target=write)
    t.start()
    counts = []

    def committed_messages() -> int:
        from sparkmq.log.reader import Snapshot
        snap = Snapshot.load(local_store_url)
        return sum(hi - lo for lo, hi in snap.queue_ranges(TOPIC).values())

    try:
        for i in range(3):
            if i:
                # let the writer commit more before the next read (a bounded wait, not a
                # timing assertion): the next read must then see the newer versions
                wait_until(lambda: committed_messages() > counts[-1],
                           f"the writer to commit more than {counts[-1]} messages",
                           interval_s=0.05)
            rows = read(spark, local_store_url).select("queue_id", "queue_offset").collect()
            counts.append(len(rows))
            assert len(rows) % 7 == 0
            for qid in (0, 1):
                offs = sorted(r.queue_offset for r in rows if r.queue_id == qid)
                assert offs == list(range(len(offs)))
    finally:
        stop.set()
        t.join(60)
    assert not errors and not t.is_alive()
    assert counts == sorted(counts) and counts[-1] > 7


# -- admission control (no Spark) ---------------------------------------------------
def _admit_store(url, sizes_per_queue):
    with Store.open(url, start_services=False) as s:
        s.create_topic(TOPIC, read_queue_nums=len(sizes_per_queue),
                       write_queue_nums=len(sizes_per_queue))
        for qid, sizes in enumerate(sizes_per_queue):
            if sizes:
                s.append_batch(pa.table({"topic": [TOPIC] * len(sizes),
                                         "queue_id": pa.array([qid] * len(sizes), pa.int32()),
                                         "body": [b"z" * n for n in sizes]}))


def test_admit_rows_and_bytes_exact_and_fair(local_store_url):
    from sparkmq.datasource.stream import admit
    from sparkmq.log.reader import Snapshot
    _admit_store(local_store_url, [[10] * 9, [10] * 2, [50] * 5])
    snap = Snapshot.load(local_store_url)
    start = {(TOPIC, 0): 0, (TOPIC, 1): 0, (TOPIC, 2): 0}
    avail = {(TOPIC, 0): 9, (TOPIC, 1): 2, (TOPIC, 2): 5}
    assert admit(snap, start, avail, None, None) == avail
    # rows: round robin, queue 1 runs dry and the rest share what is left
    assert admit(snap, start, avail, 7, None) == {(TOPIC, 0): 3, (TOPIC, 1): 2, (TOPIC, 2): 2}
    assert admit(snap, start, avail, 100, None) == avail
    # bytes: order q0,q1,q2,q0,q1,q2 = 10,10,50,10,10,50 -> 90 fits the first 5
    assert admit(snap, start, avail, None, 90) == {(TOPIC, 0): 2, (TOPIC, 1): 2, (TOPIC, 2): 1}
    # a message bigger than the limit is still admitted alone (no stall)
    only2 = {(TOPIC, 0): 9, (TOPIC, 1): 2, (TOPIC, 2): 0}
    assert admit(snap, only2, avail, None, 5) == {(TOPIC, 0): 9, (TOPIC, 1): 2, (TOPIC, 2): 1}
    # both limits: the tighter one wins
    assert admit(snap, start, avail, 4, 1000) == {(TOPIC, 0): 2, (TOPIC, 1): 1, (TOPIC, 2): 1}


def test_offset_options_parse_and_reject(local_store_url):
    from sparkmq.datasource.options import parse_options, resolve_offsets
    from sparkmq.errors import UserError
    from sparkmq.log.reader import Snapshot
    make_store(local_store_url, 8)
    snap = Snapshot.load(local_store_url)
    pairs = [(TOPIC, q) for q in range(QUEUES)]
    got = resolve_offsets(snap, pairs, json.dumps({TOPIC: {"0": 1, "1": -1}}), None,
                          "earliest", "startingOffsets")
    assert got == {(TOPIC, 0): 1, (TOPIC, 1): 2, (TOPIC, 2): 0, (TOPIC, 3): 0}
    with pytest.raises(UserError, match="startingOffsets"):
        resolve_offsets(snap, pairs, "{bad", None, "earliest", "startingOffsets")
    with pytest.raises(UserError, match="one of topic"):
        parse_options({"path": local_store_url, "topic": "a", "topicPattern": "b"})
    with pytest.raises(UserError, match="maxMessagesPerTrigger"):
        parse_options({"path": local_store_url, "maxMessagesPerTrigger": "0"})
    with pytest.raises(UserError, match="no store"):
        parse_options({})


@pytest.mark.spark
def test_stream_topic_pattern_picks_up_new_topic_from_earliest(spark, local_store_url, tmp_path):
    with Store.open(local_store_url, start_services=False) as s:
        s.create_topic("Other", read_queue_nums=1, write_queue_nums=1)
    ckpt = tmp_path / "ckpt"
    df = spark.readStream.format("sparkmq").option("topicPattern", "Ord.*").load(local_store_url)
    seen = []

    def each(batch_df, batch_id):
        seen.extend(bytes(r.body).decode() for r in batch_df.select("body").collect())
    run_available_now(df, None, ckpt, foreach=each)
    assert seen == []
    make_store(local_store_url, 12)     # topic Orders appears after the query started
    run_available_now(df, None, ckpt, foreach=each)
    assert sorted(seen) == sorted(f"m{i}" for i in range(12))
