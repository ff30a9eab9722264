"""Per-trigger cost of the read path, counted: a snapshot advanced from a cached one reads
only the commits after it (no checkpoint, sidecar or ``_last_checkpoint``), a stream's
second trigger reads only the new commits, a small micro-batch is read in the driver, and
a pinned version keeps reading exactly its version while the cache moves on.

Counts are the files the log layer reads (``StoreFS.read_bytes``, wrapped), not times."""
from __future__ import annotations

import pyarrow as pa
import pytest

from sparkmq.datasource import prefetch, snapshots
from sparkmq.datasource.options import parse_options
from sparkmq.errors import UserError
from sparkmq.datasource import stream as stream_mod
from sparkmq.datasource.snapshots import SnapshotCache
from sparkmq.datasource.stream import QueueRanges, SparkMQStreamReader
from sparkmq.log import format as fmt
from sparkmq.log.actions import RemoveFile
from sparkmq.log.fs import StoreFS
from sparkmq.log.reader import Snapshot
from sparkmq.log.store import Store

TOPIC = "t"


def _store(url) -> Store:
    s = Store.open(url, start_services=False, checkpointInterval=10)
    s.create_topic(TOPIC, read_queue_nums=2, write_queue_nums=2)
    return s


def _publish(store: Store, n: int, start: int = 0) -> None:
    """``n`` publishes of one message each (one or more versions each)."""
    for i in range(start, start + n):
        store.append_batch(pa.table({"topic": [TOPIC], "body": [b"m%d" % i],
                                     "queue_id": pa.array([i % 2], pa.int32())}))
        store.flush()
        store.publish(force=True)


@pytest.fixture
def reads(monkeypatch):
    """The store-relative paths ``StoreFS.read_bytes`` reads, in order."""
    seen: list[str] = []
    real = StoreFS.read_bytes

    def counted(self, rel):
        seen.append(rel)
        return real(self, rel)
    monkeypatch.setattr(StoreFS, "read_bytes", counted)
    return seen


@pytest.fixture
def cache(monkeypatch):
    c = SnapshotCache()
    monkeypatch.setattr(snapshots, "CACHE", c)
    return c


def commits(lo: int, hi: int) -> list[str]:
    """The commit files of versions lo..hi."""
    return [fmt.commit_file(v) for v in range(lo, hi + 1)]


def _bodies(batches) -> list[bytes]:
    return sorted(b for batch in batches for b in batch.column("body").to_pylist())


def test_advance_replays_only_the_new_commits(local_store_url, reads):
    store = _store(local_store_url)
    _publish(store, 3)
    old = Snapshot.load(local_store_url)
    _publish(store, 12, start=3)       # past a checkpoint (every 10 versions)
    latest = store.snapshot().version
    assert any((fmt.parse_checkpoint_file(n) or -1) > old.version
               for n in store.sfs.list_names(fmt.LOG_DIR))
    reads.clear()
    new = old.advance()
    assert new.version == latest
    # its own version's commit once more (the same store still: see the next test),
    # then the new commits
    assert reads == commits(old.version, latest)
    # the new one sees every message; the old one still exactly its version
    assert sum(new.max_offset(TOPIC, q) for q in (0, 1)) == 15
    assert sum(old.max_offset(TOPIC, q) for q in (0, 1)) == 3
    assert sorted(r["body"] for q in (0, 1) for r in old.read_table(TOPIC, q, 0).to_pylist()) \
        == [b"m0", b"m1", b"m2"]
    reads.clear()
    assert new.advance() is new and reads == commits(new.version, new.version)  # nothing new
    assert new.advance(old.version).version == old.version   # older: a fresh load
    store.close()


def test_advance_from_a_store_deleted_and_made_again_is_a_fresh_load(local_store_url):
    """A snapshot cached in a long-lived process must not replay another store's
    commits onto its state, nor pass for the newest of a store with fewer versions."""
    import shutil
    store = _store(local_store_url)
    _publish(store, 5)
    old = Snapshot.load(local_store_url)
    store.close()
    shutil.rmtree(local_store_url)
    again = Store.open(local_store_url, start_services=False)      # fewer versions
    again.create_topic("other", read_queue_nums=1, write_queue_nums=1)
    new = old.advance()
    assert new is not old and new.topic_names() == ["other"]
    for _ in range(old.version + 3 - again.snapshot().version):    # more versions
        again.commit_consumer_offsets("G", {("other", 0): 0})
    newer = old.advance()
    assert newer.topic_names() == ["other"] and newer.version == again.snapshot().version
    again.close()


def test_advance_unmaps_segments_the_new_version_removed(local_store_url):
    store = _store(local_store_url)
    _publish(store, 2)
    old = Snapshot.load(local_store_url)
    assert old.read_table(TOPIC, 0, 0).num_rows == 1        # maps its segment
    (path,) = old.state.segments
    assert old.sfs.full(path) in old.sfs._maps
    store.txlog.commit(lambda st: [RemoveFile(path=path, deletion_timestamp=0)],
                       operation="TEST RETENTION")
    new = old.advance()
    assert path not in new.state.segments and path in old.state.segments
    assert old.sfs.full(path) not in new.sfs._maps
    assert old.read_table(TOPIC, 0, 0).num_rows == 1        # the old one maps it again
    store.close()


def test_cache_advances_the_newest_and_keeps_pinned_versions(local_store_url, reads, cache):
    store = _store(local_store_url)
    _publish(store, 2)
    first = cache.get(local_store_url)
    assert cache.stats == {"hits": 0, "advances": 0, "loads": 1}
    _publish(store, 4, start=2)
    reads.clear()
    second = cache.get(local_store_url)
    assert cache.stats["advances"] == 1 and cache.stats["loads"] == 1
    assert reads == commits(first.version, second.version)
    # a batch read pinned at the first version gets it as it was (snapshot isolation)
    reads.clear()
    assert cache.get(local_store_url, first.version) is first
    assert reads == [] and cache.stats["hits"] == 1
    assert sum(first.max_offset(TOPIC, q) for q in (0, 1)) == 2
    # an older version no longer pinned is a load (never built from a newer one)
    small = SnapshotCache(max_pinned=1)
    small.get(local_store_url, first.version)
    small.get(local_store_url)
    reads.clear()
    again = small.get(local_store_url, first.version)
    assert again.version == first.version and small.stats["loads"] == 2
    assert sum(again.max_offset(TOPIC, q) for q in (0, 1)) == 2
    # the store option key: other storage options are another entry
    assert len({snapshots.options_key(None), snapshots.options_key({"a": 1})}) == 2
    store.close()


def _trigger(reader: SparkMQStreamReader, start):
    end = reader.latestOffset(start, None)
    parts = reader.partitions(start, end)
    return end, parts, reader.prefetched(start, end)


def test_a_second_trigger_reads_only_the_new_commits(local_store_url, reads, cache):
    store = _store(local_store_url)
    _publish(store, 2)
    reader = SparkMQStreamReader({"path": local_store_url, "topic": TOPIC,
                                  "startingOffsets": "earliest"})
    start = reader.initialOffset()
    end, parts, rows = _trigger(reader, start)
    assert len(parts) == 1 and isinstance(parts[0], QueueRanges)
    assert _bodies(rows) == [b"m0", b"m1"]
    assert reader.driver_reads == 1
    before = store.snapshot().version
    _publish(store, 12, start=2)       # crosses a checkpoint
    after = store.snapshot().version
    reads.clear()
    end2, parts, rows = _trigger(reader, end)
    assert _bodies(rows) == sorted(b"m%d" % i for i in range(2, 14))
    # the trigger's log reads: the new commits, once (the driver's snapshot is advanced;
    # the read of the micro-batch finds its version pinned)
    # (and the newest version's commit once more when the micro-batch's read asks for
    # the newest: the same-store check)
    assert reads == commits(before, after) + commits(after, after)
    reads.clear()
    end3, parts, rows = _trigger(reader, end2)  # idle: the check (twice), nothing planned
    assert reads == 2 * commits(after, after) and parts == [] and rows is None
    store.close()


def test_big_or_heavy_micro_batches_are_left_to_executors(local_store_url, cache, monkeypatch):
    store = _store(local_store_url)
    _publish(store, 6)
    opts = {"path": local_store_url, "topic": TOPIC, "startingOffsets": "earliest"}
    big = SparkMQStreamReader({**opts, "driverReadMaxMessages": "5"})
    start = big.initialOffset()
    end, parts, rows = _trigger(big, start)
    assert rows is None and len(parts) == 2 and not isinstance(parts[0], QueueRanges)
    assert _bodies(b for p in parts for b in big.read(p)) == [b"m%d" % i for i in range(6)]
    # small in messages, over the byte bound: planned as one piece, read by an executor
    monkeypatch.setattr(stream_mod, "DRIVER_READ_MAX_BYTES", 1)
    heavy = SparkMQStreamReader(opts)
    end, parts, rows = _trigger(heavy, heavy.initialOffset())
    assert rows is None and len(parts) == 1 and heavy.driver_reads == 0
    assert _bodies(heavy.read(parts[0])) == [b"m%d" % i for i in range(6)]
    # the data source wraps the reader for Spark's prefetch path unless told not to
    if prefetch.AVAILABLE:
        assert isinstance(prefetch.stream_reader(SparkMQStreamReader(opts)),
                          prefetch.DriverReads)
    assert parse_options(opts).driver_read_max_messages == 1000
    with pytest.raises(UserError, match="driverReadMaxMessages"):
        parse_options({**opts, "driverReadMaxMessages": "-1"})
    off = SparkMQStreamReader({**opts, "driverReadMaxMessages": "0"})
    assert prefetch.stream_reader(off) is off
    end, parts, rows = _trigger(off, off.initialOffset())
    assert rows is None and len(parts) == 2
    store.close()


@pytest.mark.spark
def test_stream_rows_are_the_same_read_in_the_driver_or_on_executors(spark, local_store_url,
                                                                     tmp_path):
    store = _store(local_store_url)
    _publish(store, 8)
    store.close()
    got = {}
    for name, limit in (("in_driver", "1000"), ("on_executors", "3")):
        q = (spark.readStream.format("sparkmq").option("startingOffsets", "earliest")
             .option("driverReadMaxMessages", limit).load(local_store_url)
             .writeStream.trigger(availableNow=True).format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / name)).start())
        try:
            assert q.awaitTermination(120), "query did not finish"
            assert q.exception() is None
        finally:
            q.stop()
        got[name] = sorted((r.queue_id, r.queue_offset, bytes(r.body)) for r in
                           spark.sql(f"select queue_id, queue_offset, body from {name}").collect())
    assert got["in_driver"] == got["on_executors"]
    assert len(got["in_driver"]) == 8
