"""Transaction log: put-if-absent versions, commit retry, snapshots, checkpoints."""
from __future__ import annotations

import json
import threading

import pytest

from helpers.clock import Clock
from sparkmq.errors import (CommitConflictError, CorruptStoreError, StoreNotFoundError,
                            UnsupportedFormatError, VersionNotFoundError)
from sparkmq.log import format as fmt
from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TransactionLog

PROTOCOL = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 1}}


def _topic(i: int) -> dict:
    return {"topic": {"name": f"t{i}", "id": i, "readQueueNums": 1, "writeQueueNums": 1,
                      "perm": 6, "deleted": False}}


@pytest.fixture
def clock():
    return Clock(1_000_000)


@pytest.fixture
def txlog(store_url, clock):
    log = TransactionLog(StoreFS(store_url), checkpoint_interval_versions=5, clock_ms=clock)
    log.create([PROTOCOL, {"metaData": {"storeId": "s1"}}])
    return log


def _add_topic(log, i):
    return log.commit(lambda s: [_topic(i)], operation="T")


def test_create_writes_version_zero_once(txlog):
    assert txlog.exists() and txlog.versions() == [0]
    assert txlog.snapshot().store_id == "s1"
    with pytest.raises(CommitConflictError):
        txlog.create([PROTOCOL])


def test_put_if_absent_exactly_one_of_two_writers_wins(store_url):
    sfs = StoreFS(store_url)
    wins = []
    barrier = threading.Barrier(8)

    def writer(i):
        barrier.wait(5)
        wins.append((i, sfs.put_if_absent("_log/x.json", f"writer {i}".encode())))
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    winners = [i for i, won in wins if won]
    assert len(wins) == 8 and len(winners) == 1
    assert sfs.read_bytes("_log/x.json") == f"writer {winners[0]}".encode()


def test_try_commit_same_version_one_winner(txlog, store_url, clock):
    other = TransactionLog(StoreFS(store_url), clock_ms=clock)
    a = txlog.try_commit(1, [_topic(1)], previous_ts=0, operation="A")
    b = other.try_commit(1, [_topic(2)], previous_ts=0, operation="B")
    assert a is not None and b is None
    assert set(txlog.snapshot(1).topics) == {"t1"}


def test_commit_retries_on_conflict_and_rebuilds_from_winner(txlog, store_url, clock):
    other = TransactionLog(StoreFS(store_url), clock_ms=clock)
    seen_versions = []

    def build(state):
        seen_versions.append(state.version)
        if len(seen_versions) == 1:
            _add_topic(other, 1)         # another writer wins the version we are building
        return [_topic(state.next_topic_id() if state.topics else 2)]
    new = txlog.commit(build, operation="T")
    assert seen_versions == [0, 1]       # ran again on the winner's state
    assert new.version == 2 and set(new.topics) == {"t1", "t2"}
    assert txlog.versions() == [0, 1, 2]
    assert set(TransactionLog(StoreFS(store_url)).snapshot().topics) == {"t1", "t2"}


def test_commit_gives_up_after_retries(txlog, store_url, monkeypatch):
    monkeypatch.setattr(txlog, "try_commit", lambda *a, **k: None)
    with pytest.raises(CommitConflictError):
        txlog.commit(lambda s: [_topic(1)], operation="T", retries=2)


def test_build_returning_none_commits_nothing(txlog):
    state = txlog.commit(lambda s: None, operation="NOOP")
    assert state.version == 0 and txlog.versions() == [0]


def test_snapshot_by_version(txlog):
    for i in range(1, 4):
        _add_topic(txlog, i)
    assert set(txlog.snapshot(2).topics) == {"t1", "t2"}
    assert set(txlog.snapshot().topics) == {"t1", "t2", "t3"}
    assert txlog.snapshot(0).topics == {}


def test_snapshot_by_timestamp(txlog, clock):
    stamps = {}
    for i in range(1, 4):
        clock.now_ms += 1000
        _add_topic(txlog, i)
        stamps[i] = clock.now_ms
    assert set(txlog.snapshot(timestamp_ms=stamps[2]).topics) == {"t1", "t2"}
    assert set(txlog.snapshot(timestamp_ms=stamps[2] + 999).topics) == {"t1", "t2"}
    assert txlog.snapshot(timestamp_ms=stamps[3] + 10**9).version == 3
    with pytest.raises(VersionNotFoundError):
        txlog.snapshot(timestamp_ms=1)


def test_commit_timestamps_are_monotonic_when_the_clock_goes_back(txlog, clock):
    clock.now_ms += 5000
    _add_topic(txlog, 1)
    clock.now_ms -= 4000
    _add_topic(txlog, 2)
    assert txlog.commit_timestamp(2) >= txlog.commit_timestamp(1)


def test_unknown_version_errors(txlog):
    with pytest.raises(VersionNotFoundError):
        txlog.snapshot(7)
    with pytest.raises(VersionNotFoundError):
        txlog.snapshot(-1)
    with pytest.raises(VersionNotFoundError):
        txlog.read_version(7)


def test_missing_store(store_url):
    log = TransactionLog(StoreFS(store_url + "-none"))
    assert not log.exists()
    with pytest.raises(StoreNotFoundError):
        log.snapshot()


def test_checkpoint_every_n_versions(txlog):
    for i in range(1, 12):
        _add_topic(txlog, i)
    sfs = txlog.sfs
    names = sfs.list_names(fmt.LOG_DIR)
    cps = sorted(fmt.parse_checkpoint_file(n) for n in names
                 if fmt.parse_checkpoint_file(n) is not None)
    assert cps == [5, 10]
    last = json.loads(sfs.read_bytes(fmt.last_checkpoint_file()))
    assert last == {"version": 10}


def test_snapshot_from_checkpoint_needs_no_older_commits(txlog):
    for i in range(1, 12):
        _add_topic(txlog, i)
    expected = txlog.snapshot()
    for v in range(0, 10):          # clean up the commits the checkpoint covers
        txlog.sfs.delete(fmt.commit_file(v))
    fresh = TransactionLog(txlog.sfs).snapshot()
    assert fresh.version == 11
    assert set(fresh.topics) == set(expected.topics)
    assert fresh.live_actions() == expected.live_actions()
    with pytest.raises(VersionNotFoundError):
        TransactionLog(txlog.sfs).snapshot(3)


def test_incremental_snapshot_from_base_equals_full_replay(txlog):
    base = txlog.snapshot()
    for i in range(1, 7):
        _add_topic(txlog, i)
    a = txlog.snapshot(base=base)
    b = TransactionLog(txlog.sfs).snapshot()
    assert a.live_actions() == b.live_actions() and a.version == b.version


def test_newer_reader_version_is_refused(txlog):
    assert txlog.try_commit(1, [{"protocol": {"minReaderVersion": 99, "minWriterVersion": 99}}],
                            previous_ts=0, operation="UPGRADE") is not None
    with pytest.raises(UnsupportedFormatError):
        TransactionLog(txlog.sfs).snapshot()


def test_corrupt_commit_file_is_reported(txlog):
    txlog.sfs.put_if_absent(fmt.commit_file(1), b"{not json\n")
    with pytest.raises(CorruptStoreError):
        txlog.snapshot()


def test_unknown_actions_are_ignored(txlog):
    txlog.commit(lambda s: [{"futureThing": {"x": 1}}, _topic(1)], operation="FUTURE")
    assert set(txlog.snapshot().topics) == {"t1"}


def test_consumer_offsets_and_removes_replay(txlog):
    add = {"add": {"path": "commitlog/a.arrow", "kind": "segment", "baseOffset": 0,
                   "size": 10, "sealed": True}}
    txlog.commit(lambda s: [add, {"consumerOffset": {"group": "g", "topicId": 0,
                                                     "queueId": 1, "offset": 7}}],
                 operation="X")
    s = txlog.snapshot()
    assert "commitlog/a.arrow" in s.segments and s.consumer_offsets[("g", 0, 1, "")] == 7
    txlog.commit(lambda s: [{"remove": {"path": "commitlog/a.arrow"}}], operation="Y")
    assert txlog.snapshot().segments == {}
    assert txlog.snapshot(1).segments != {}


def _cq_add(path: str, tid: int, lo: int, hi: int) -> dict:
    return {"add": {"path": path, "kind": "consumequeue", "size": 1, "rows": hi - lo,
                    "queues": [{"topicId": tid, "queueId": 0, "minOffset": lo, "maxOffset": hi}]}}


def test_states_of_versions_stay_apart_and_their_views_follow_their_actions(txlog):
    """A commit's new state copies the containers (not the actions): the older
    state does not change, and cached offset views are per state."""
    s1 = txlog.commit(lambda s: [_topic(0), _cq_add("consumequeue/a.parquet", 0, 0, 10)],
                      operation="T")
    assert s1.queue_max_offsets() == {(0, 0): 10} and s1.queue_min_offsets() == {(0, 0): 0}
    s2 = txlog.commit(lambda s: [_cq_add("consumequeue/b.parquet", 0, 10, 25),
                                 {"remove": {"path": "consumequeue/a.parquet"}}],
                      operation="T", state=s1)
    assert s2.queue_max_offsets() == {(0, 0): 25} and s2.queue_min_offsets() == {(0, 0): 10}
    assert sorted(s1.consumequeue_files) == ["consumequeue/a.parquet"]
    assert s1.queue_max_offsets() == {(0, 0): 10} and s1.queue_min_offsets() == {(0, 0): 0}
    assert txlog.snapshot(base=s2) is s2                 # up to date: nothing replayed
    assert txlog.snapshot(base=s1).queue_max_offsets() == {(0, 0): 25}
    assert txlog.snapshot(s1.version).queue_min_offsets() == {(0, 0): 0}


def test_snapshot_from_base_finds_versions_of_other_writers_without_listing(txlog, monkeypatch):
    base = txlog.snapshot()
    other = TransactionLog(txlog.sfs)
    for i in range(1, 4):
        other.commit(lambda s, i=i: [_topic(i)], operation="T")
    monkeypatch.setattr(txlog, "latest_version", lambda: pytest.fail("listed _log/"))
    fresh = txlog.snapshot(base=base)
    assert fresh.version == base.version + 3 and sorted(fresh.topics) == ["t1", "t2", "t3"]
    assert txlog.commit(lambda s: [_topic(9)], operation="T", state=base).version == \
        base.version + 4                      # a stale state still commits at the next version


def test_logstate_copy_keeps_every_field():
    """copy() must carry every persisted field (a field added later and left out of
    copy() would silently vanish at the next commit)."""
    import dataclasses

    from sparkmq.log.txlog import LogState

    state = LogState()
    for f in dataclasses.fields(LogState):
        if f.name.startswith("_"):
            continue
        if f.type in ("int",) or f.name in ("version", "timestamp_ms"):
            setattr(state, f.name, 7)
        elif getattr(state, f.name) is None:
            setattr(state, f.name, {"marker": f.name})
        else:
            getattr(state, f.name)["marker"] = {"field": f.name}
    copied = state.copy()
    for f in dataclasses.fields(LogState):
        if not f.name.startswith("_"):
            assert getattr(copied, f.name) == getattr(state, f.name), f.name
