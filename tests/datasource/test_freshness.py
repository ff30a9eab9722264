"""Freshness: a running stream asks the store's writer to publish at ``publishMinGapMs``
(its ``_readers/`` marker), and batch reads still see one committed version.

The writer here publishes at a 60 s interval, so a message a stream sees within the
test's bounded wait was published by the fast cadence: the assertions count offsets
and versions, not milliseconds."""
from __future__ import annotations

import threading
import time

import pytest

from helpers.waiting import wait_until
from sparkmq import SYNC_FLUSH, Message, Snapshot, Store
from sparkmq.log import publish as pub

SLOW_MS = 60_000
GAP_MS = 50
WAIT_S = 30.0            # well under SLOW_MS


def _writer(url) -> Store:
    s = Store.open(url, publishIntervalMs=SLOW_MS, publishMinGapMs=GAP_MS,
                   flushDiskType=SYNC_FLUSH)
    s.create_topic("t", read_queue_nums=2, write_queue_nums=2)
    s.append(Message("t", b"m0", queue_id=0))
    s.flush()
    return s


def _wait(cond, what: str) -> None:
    wait_until(cond, what, timeout_s=WAIT_S, interval_s=0.05)


def _count(spark, name) -> int:
    return spark.sql(f"select count(*) from {name}").collect()[0][0]


@pytest.mark.spark
def test_stream_sees_sends_without_an_interval_publish(spark, local_store_url, tmp_path):
    store = _writer(local_store_url)
    q = (spark.readStream.format("sparkmq").option("startingOffsets", "earliest")
         .load(local_store_url).writeStream.format("memory").queryName("fresh_stream")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        _wait(lambda: _count(spark, "fresh_stream") == 1, "m0 not read")
        # the query's latestOffset wrote its marker; the writer's next interval pass
        # (forced here: the interval is 60 s) finds it
        assert pub.live_readers(store.sfs, store.clock_ms()) == 1
        store.services.readers_checked_s = None
        store.publish()
        assert store.services.publish_gap_ms == GAP_MS
        for i in range(1, 4):
            store.append(Message("t", b"m%d" % i, queue_id=i % 2))
            _wait(lambda: _count(spark, "fresh_stream") == i + 1, f"m{i} not read")
        got = sorted(r.body for r in spark.sql("select body from fresh_stream").collect())
        assert got == [b"m0", b"m1", b"m2", b"m3"]
    finally:
        q.stop()
        store.close()


@pytest.mark.spark
def test_batch_read_sees_one_committed_version_while_publishing_fast(spark, local_store_url):
    store = _writer(local_store_url)
    pub.touch_reader_marker(store.sfs, "someone", store.clock_ms())
    store.services.readers_checked_s = None
    store.publish()
    assert store.services.publish_gap_ms == GAP_MS
    stop = threading.Event()

    def send():
        i = 1
        while not stop.is_set():
            store.append(Message("t", b"m%d" % i, queue_id=i % 2))
            i += 1
            time.sleep(0.002)

    start = Snapshot.load(local_store_url).version
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        wait_until(lambda: Snapshot.load(local_store_url).version > start + 2,
                   "fast publishes under way", timeout_s=WAIT_S)
        v0 = Snapshot.load(local_store_url).version
        rows = spark.read.format("sparkmq").load(local_store_url) \
            .groupBy("queue_id").count().collect()
        v1 = Snapshot.load(local_store_url).version
    finally:
        stop.set()
        sender.join(5)
        store.close()
    counts = {r["queue_id"]: r["count"] for r in rows}
    assert v1 > v0 + 2          # several fast publishes while the read ran
    # the rows of every queue are exactly those of one version between v0 and v1
    matches = [v for v in range(v0, v1 + 1)
               if {q: Snapshot.load(local_store_url, version=v).max_offset("t", q)
                   for q in (0, 1)} == {q: counts.get(q, 0) for q in (0, 1)}]
    assert matches, (counts, v0, v1)
    # and a batch read leaves no reader marker (batch-only stores keep the interval)
    assert pub.live_readers(store.sfs, store.clock_ms()) == 1     # only "someone"
