"""Log cleanup (logRetentionMs): commit files and checkpoints older than the retention
go at checkpoint time, but only below the newest checkpoint that is itself older, so
every version kept can be built. Injected clock."""
from __future__ import annotations

import pytest

from sparkmq import Message, Snapshot, Store
from sparkmq.errors import VersionNotFoundError
from sparkmq.log import format as fmt
from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TransactionLog

T0_MS = 1_700_000_000_000
PROTOCOL = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 1}}


class Clock:
    def __init__(self, start_ms: int = T0_MS):
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms


def _topic(i: int) -> dict:
    return {"topic": {"name": f"t{i}", "id": i, "readQueueNums": 1, "writeQueueNums": 1,
                      "perm": 6, "deleted": False}}


def _log_files(sfs):
    names = sfs.list_names(fmt.LOG_DIR)
    commits = sorted(v for v in map(fmt.parse_commit_file, names) if v is not None)
    cps = sorted(c for c in map(fmt.parse_checkpoint_file, names) if c is not None)
    return commits, cps


@pytest.fixture
def clock():
    return Clock()


def _txlog(url, clock, retention_ms=10_000):
    tl = TransactionLog(StoreFS(url), checkpoint_interval_versions=5, clock_ms=clock,
                        log_retention_ms=retention_ms)
    if not tl.exists():
        tl.create([PROTOCOL, {"metaData": {"storeId": "s1"}}])
    return tl


def _commit_topics(tl, clock, ids, step_ms=1_000):
    for i in ids:
        clock.now_ms += step_ms
        tl.commit(lambda s, i=i: [_topic(i)], operation="T")


def test_cleanup_keeps_everything_above_the_newest_old_checkpoint(store_url, clock):
    tl = _txlog(store_url, clock)
    _commit_topics(tl, clock, range(1, 10))          # versions 1..9, checkpoint 5
    assert _log_files(tl.sfs) == (list(range(10)), [5])
    ts5 = tl.commit_timestamp(5)
    clock.now_ms = ts5 + 10_000 - 1                   # checkpoint 5 not yet old enough
    _commit_topics(tl, clock, [10], step_ms=0)        # checkpoint 10: cleanup runs
    assert _log_files(tl.sfs) == (list(range(11)), [5, 10])
    clock.now_ms = ts5 + 11_000      # now 5 is old, 10 is not (and a cleanup interval passed)
    _commit_topics(tl, clock, range(11, 16), step_ms=0)   # checkpoint 15
    commits, cps = _log_files(tl.sfs)
    assert commits == list(range(5, 16)) and cps == [5, 10, 15]
    fresh = TransactionLog(StoreFS(store_url))
    assert set(fresh.snapshot().topics) == {f"t{i}" for i in range(1, 16)}
    for v in range(5, 16):                            # every kept version can be built
        assert set(fresh.snapshot(v).topics) == {f"t{i}" for i in range(1, v + 1)}
    assert fresh.oldest_version() == 5 and fresh.exists()
    with pytest.raises(VersionNotFoundError, match="oldest version available is 5"):
        fresh.snapshot(4)
    with pytest.raises(VersionNotFoundError, match="oldest version available is 5"):
        fresh.version_at(tl.commit_timestamp(5) - 1)
    assert fresh.version_at(tl.commit_timestamp(5)) == 5


def test_cleanup_never_deletes_the_checkpoint_it_keeps_nor_anything_young(store_url, clock):
    tl = _txlog(store_url, clock, retention_ms=1_000_000)
    _commit_topics(tl, clock, range(1, 21))           # 20 s of commits, retention 1000 s
    assert tl.cleanup_log() == []
    clock.now_ms += 1_000_000
    deleted = tl.cleanup_log()                        # newest old checkpoint: 20
    assert _log_files(tl.sfs) == ([20], [20])
    assert fmt.checkpoint_file(15) in deleted and fmt.commit_file(19) in deleted
    assert set(TransactionLog(StoreFS(store_url)).snapshot().topics) == {
        f"t{i}" for i in range(1, 21)}


def test_a_reader_whose_base_version_was_cleaned_up_catches_up(store_url, clock):
    tl = _txlog(store_url, clock)
    reader = TransactionLog(StoreFS(store_url))
    old = reader.snapshot()                           # version 0, held for a long time
    _commit_topics(tl, clock, range(1, 11))
    clock.now_ms += 20_000
    _commit_topics(tl, clock, range(11, 16))          # cleanup below checkpoint 10
    assert _log_files(tl.sfs)[0][0] == 10
    new = reader.snapshot(base=old)
    assert new.version == 15 and set(new.topics) == {f"t{i}" for i in range(1, 16)}


def test_a_half_done_cleanup_still_reads_and_names_the_oldest_version(store_url, clock):
    tl = _txlog(store_url, clock)
    _commit_topics(tl, clock, range(1, 12))           # checkpoints 5, 10
    for v in (0, 1, 2):                               # a cleanup killed after 3 deletes
        tl.sfs.delete(fmt.commit_file(v))
    fresh = TransactionLog(StoreFS(store_url))
    assert fresh.oldest_version() == 5
    assert fresh.snapshot().version == 11 and fresh.snapshot(6).version == 6
    with pytest.raises(VersionNotFoundError, match="oldest version available is 5"):
        fresh.snapshot(3)
    clock.now_ms += 10_000_000
    tl.cleanup_log()                                  # finishes: checkpoint 10 is old now
    assert _log_files(tl.sfs) == ([10, 11], [10])


def test_a_store_whose_log_was_cleaned_opens_reads_and_time_travels(store_url, clock):
    conf = dict(clock_ms=clock, start_services=False, checkpointInterval=4, logRetentionMs=60_000)
    with Store.open(store_url, **conf) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        first = s.version
        for i in range(12):
            clock.now_ms += 10_000
            s.append([Message("t", b"m%d" % i, queue_id=0)])
            s.flush()
        assert s.version >= 12
    commits, cps = _log_files(StoreFS(store_url))
    assert 0 not in commits and commits[0] == cps[0]  # cleaned up to a checkpoint
    oldest = commits[0]
    with Store.open(store_url, **conf) as s:          # not taken for a new store
        assert s.store_id and s.max_offset("t", 0) == 12
        s.append([Message("t", b"after", queue_id=0)])
    snap = Snapshot.load(store_url)
    assert snap.read_table("t", 0, 0).column("body").to_pylist()[-1] == b"after"
    assert Snapshot.load(store_url, version=oldest).version == oldest
    with pytest.raises(VersionNotFoundError, match=f"oldest version available is {oldest}"):
        Snapshot.load(store_url, version=first)


def test_a_committer_without_the_lease_holders_settings_cleans_nothing(store_url, clock):
    """A Spark driver's DirectCommitter does not know logRetentionMs or
    deletedFileRetentionMs: its checkpoints keep every tombstone and the log stays."""
    tl = TransactionLog(StoreFS(store_url), checkpoint_interval_versions=5, clock_ms=clock)
    tl.create([PROTOCOL, {"metaData": {"storeId": "s1"}}])
    tl.commit(lambda s: [{"remove": {"path": "index/x.parquet", "deletionTimestamp": 1}}],
              operation="T")
    clock.now_ms += 400 * 24 * 3_600_000
    _commit_topics(tl, clock, range(2, 12))
    assert _log_files(tl.sfs) == (list(range(12)), [5, 10])
    assert "index/x.parquet" in TransactionLog(StoreFS(store_url)).snapshot().tombstones


def test_retention_settings_take_rocketmq_style_names_and_are_checked():
    from sparkmq.config import StoreConfig
    from sparkmq.errors import InvalidConfigError
    c = StoreConfig.from_options({"deletedFileRetentionMs": "5000", "logRetentionMs": "1000"})
    assert (c.deleted_file_retention_ms, c.log_retention_ms) == (5000, 1000)
    assert StoreConfig().deleted_file_retention_ms == 60_000
    assert StoreConfig().log_retention_ms == 30 * 24 * 3_600_000
    with pytest.raises(InvalidConfigError, match="logRetentionMs"):
        StoreConfig.from_options({"logRetentionMs": 0})
    with pytest.raises(InvalidConfigError, match="deletedFileRetentionMs"):
        StoreConfig.from_options({"deletedFileRetentionMs": -1})
