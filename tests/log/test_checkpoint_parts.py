"""Checkpoints in parts (issue 18 item 2, sparkmq/log/checkpoint.py): a checkpoint is a
manifest naming sidecars; the next one rewrites only the sidecars whose entries changed,
the interval stays checkpointInterval, a damaged sidecar makes the load fall back, and
log cleanup deletes only sidecars no kept checkpoint can name. Counted, not timed."""
from __future__ import annotations

import json
import logging
import threading

import pytest

from helpers.clock import Clock
from sparkmq.errors import CorruptStoreError, UnsupportedFormatError
from sparkmq.log import checkpoint
from sparkmq.log import format as fmt
from sparkmq.log.actions import Sidecar, parse_actions
from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TransactionLog

PROTOCOL = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
TOPICS = 2_000


def _topic(i: int, queues: int = 8) -> dict:
    return {"topic": {"name": f"t{i}", "id": i, "readQueueNums": queues,
                      "writeQueueNums": queues, "perm": 6, "deleted": False}}


class CountingFS(StoreFS):
    """A StoreFS that counts what is written under ``_log/_sidecars/`` and the commit
    files read."""

    def __init__(self, url):
        super().__init__(url)
        self.sidecars_written: list[tuple[str, int]] = []
        self.commits_read: list[int] = []

    def put_if_absent(self, rel, data):
        if rel.startswith(fmt.SIDECAR_DIR + "/"):
            self.sidecars_written.append((rel, len(data)))
        return super().put_if_absent(rel, data)

    def read_bytes(self, rel):
        v = fmt.parse_commit_file(rel) if rel.startswith(fmt.LOG_DIR + "/") else None
        if v is not None and "/" not in rel[len(fmt.LOG_DIR) + 1:]:
            self.commits_read.append(v)
        return super().read_bytes(rel)


@pytest.fixture
def big(store_url, monkeypatch):
    """A log with TOPICS topics (one commit of them all), checkpoints every 10 versions."""
    monkeypatch.setattr(checkpoint, "ENTRIES_PER_PART", 128)
    sfs = CountingFS(store_url)
    tl = TransactionLog(sfs, checkpoint_interval_versions=10, clock_ms=Clock(1_000_000))
    tl.create([PROTOCOL, {"metaData": {"storeId": "s1"}}])
    tl.commit(lambda s: [_topic(i) for i in range(TOPICS)], operation="TOPICS")
    while tl.snapshot().version < 10:                      # checkpoint 10: every part
        tl.commit(lambda s: [{"txn": {"appId": "a", "version": s.version}}], operation="T")
    return tl


def _manifest(tl, version) -> list:
    rel = fmt.checkpoint_file(version)
    return parse_actions(tl.sfs.read_bytes(rel), rel)


def _commit(tl, build, n=1):
    for _ in range(n):
        tl.commit(build, operation="T")


def test_a_change_to_one_topic_rewrites_one_sidecar(big):
    first = [a for a in _manifest(big, 10) if isinstance(a, Sidecar)]
    topic_parts = [sc for sc in first if sc.part == "topic"]
    assert len(topic_parts) == 16                         # 2,000 topics / 128 per part
    assert sum(sc.actions for sc in topic_parts) == TOPICS
    sfs = big.sfs
    sfs.sidecars_written.clear()
    changed = dict(_topic(777, queues=4))
    _commit(big, lambda s: [changed])
    _commit(big, lambda s: None)                          # (nothing: no version)
    while big.snapshot().version < 20:
        _commit(big, lambda s: [{"lease": {"owner": "h:1:x", "epoch": 1}}])
    assert [p for p, _ in sfs.sidecars_written] and len(sfs.sidecars_written) == 1
    rel, size = sfs.sidecars_written[0]
    second = [a for a in _manifest(big, 20) if isinstance(a, Sidecar)]
    assert len(second) == len(first)
    new = [sc for sc in second if sc not in first]
    assert [sc.path for sc in new] == [rel] and new[0].part == "topic"
    assert new[0].bucket == checkpoint.bucket_of("topic", 777, 16)
    state_bytes = sum(sc.size for sc in second)
    assert size < state_bytes / 10                       # one part, not the state
    fresh = TransactionLog(StoreFS(sfs.url)).snapshot()
    assert fresh.topics["t777"].write_queue_nums == 4
    assert fresh.live_actions() == big.snapshot().live_actions()


def test_the_interval_stays_10_and_a_load_replays_at_most_9_commits(store_url, monkeypatch):
    monkeypatch.setattr(checkpoint, "ENTRIES_PER_PART", 64)
    sfs = CountingFS(store_url)
    tl = TransactionLog(sfs, checkpoint_interval_versions=10)
    tl.create([PROTOCOL, {"metaData": {"storeId": "s1"}}])
    for n in range(1, 401):                               # the state grows each commit
        tl.commit(lambda s, n=n: [_topic(n), {"consumerOffset": {
            "group": "g", "topicId": n, "queueId": 0, "offset": n}}], operation="T")
    names = sfs.list_names(fmt.LOG_DIR)
    cps = sorted(c for c in map(fmt.parse_checkpoint_file, names) if c is not None)
    assert cps == list(range(10, 401, 10))
    for extra in range(12):
        reader = CountingFS(store_url)
        state = TransactionLog(reader).snapshot()
        assert len(reader.commits_read) == state.version % 10 <= 9
        assert len(state.topics) == 400 + extra
        tl.commit(lambda s, n=401 + extra: [_topic(n)], operation="T")


def test_a_damaged_sidecar_falls_back_and_is_named(big, caplog):
    _commit(big, lambda s: [_topic(5, queues=2)], n=10)  # checkpoint 20 rewrites t5's part
    expected = big.snapshot()
    sc = next(a for a in _manifest(big, 20) if isinstance(a, Sidecar)
              and a not in _manifest(big, 10))
    data = big.sfs.read_bytes(sc.path)
    big.sfs.replace(sc.path, data.replace(b'"readQueueNums":8', b'"readQueueNums":9', 1))
    with caplog.at_level(logging.WARNING, logger="sparkmq.txlog"):
        fresh = TransactionLog(StoreFS(big.sfs.url)).snapshot()
    assert fresh.live_actions() == expected.live_actions()   # from checkpoint 10 on
    assert any(sc.path in r.getMessage() and fmt.checkpoint_file(20) in r.getMessage()
               and "checksum mismatch" in r.getMessage() for r in caplog.records)
    big.sfs.delete(sc.path)                                  # missing: the same
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparkmq.txlog"):
        fresh = TransactionLog(StoreFS(big.sfs.url)).snapshot()
    assert fresh.live_actions() == expected.live_actions()
    assert any(sc.path in r.getMessage() and "missing" in r.getMessage()
               for r in caplog.records)


def test_a_damaged_sidecar_shared_by_every_checkpoint_falls_back_to_full_replay(big):
    expected = big.snapshot()
    _commit(big, lambda s: [{"txn": {"appId": "b", "version": 1}}], n=10)
    shared = next(a for a in _manifest(big, 20) if isinstance(a, Sidecar)
                  and a.part == "topic")
    assert shared in _manifest(big, 10)                      # reused by name
    big.sfs.replace(shared.path, b"")
    fresh = TransactionLog(StoreFS(big.sfs.url)).snapshot()
    assert fresh.topics == expected.topics and fresh.version == big.snapshot().version


def test_cleanup_keeps_named_sidecars_and_deletes_unnamed_old_ones(store_url, monkeypatch):
    monkeypatch.setattr(checkpoint, "ENTRIES_PER_PART", 4)
    clock = Clock(1_000_000)
    tl = TransactionLog(StoreFS(store_url), checkpoint_interval_versions=5, clock_ms=clock,
                        log_retention_ms=10_000, sidecar_max_age_versions=40)
    tl.create([PROTOCOL, {"metaData": {"storeId": "s1"}}])
    tl.commit(lambda s: [_topic(i) for i in range(32)], operation="TOPICS")  # 8 parts
    for n in range(2, 121):
        clock.now_ms += 1_000
        tl.commit(lambda s, n=n: [_topic(n % 32, queues=1 + n % 7)], operation="T")
    sfs = tl.sfs
    kept = sorted(c for c in map(fmt.parse_checkpoint_file, sfs.list_names(fmt.LOG_DIR))
                  if c is not None)
    named = {a.path.rsplit("/", 1)[-1] for c in kept for a in _manifest(tl, c)
             if isinstance(a, Sidecar)}
    on_disk = set(sfs.list_names(fmt.SIDECAR_DIR))
    assert named <= on_disk                                  # every named one is there
    assert kept[0] > 40                                      # the log was cleaned
    versions = {fmt.parse_sidecar_file(n) for n in on_disk}
    assert min(versions) > kept[0] - 40                      # old unnamed ones are gone
    # every sidecar a kept checkpoint names is younger than the age bound
    for c in kept:
        assert all(c - a.version < 40 for a in _manifest(tl, c) if isinstance(a, Sidecar))
    # and an unnamed stray one (a writer that lost its checkpoint) goes once old enough
    stray = fmt.sidecar_file(kept[0] - 1, "topic", 0)
    sfs.put_if_absent(stray, b"")
    for _ in range(60):
        clock.now_ms += 1_000
        tl.commit(lambda s: [{"txn": {"appId": "x", "version": 1}}], operation="T")
    clock.now_ms += 20_000
    tl.cleanup_log()
    assert stray.rsplit("/", 1)[-1] not in sfs.list_names(fmt.SIDECAR_DIR)
    fresh = TransactionLog(StoreFS(store_url))
    assert fresh.snapshot().live_actions() == tl.snapshot().live_actions()


def test_concurrent_committers_give_one_winner_and_a_consistent_checkpoint(store_url):
    setup = TransactionLog(StoreFS(store_url), checkpoint_interval_versions=5)
    setup.create([PROTOCOL, {"metaData": {"storeId": "s1"}}])
    setup.commit(lambda s: [_topic(i) for i in range(300)], operation="TOPICS")
    logs = [TransactionLog(StoreFS(store_url), checkpoint_interval_versions=5)
            for _ in range(2)]
    barrier = threading.Barrier(2)
    errors = []

    def writer(w):
        try:
            barrier.wait(5)
            for i in range(20):
                logs[w].commit(lambda s, i=i: [_topic((w * 20 + i) % 300, queues=1 + w),
                                               {"txn": {"appId": f"w{w}", "version": i}}],
                               operation="T")
        except Exception as exc:    # noqa: BLE001  (reported by the assertion below)
            errors.append(exc)
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    tl = TransactionLog(StoreFS(store_url))
    assert tl.versions() == list(range(42))                # every commit, one winner each
    cps = sorted(c for c in map(fmt.parse_checkpoint_file, tl.sfs.list_names(fmt.LOG_DIR))
                 if c is not None)
    assert cps == list(range(5, 42, 5))
    full = tl.snapshot(0)                                  # replay every commit
    for v in range(1, 42):
        for a in tl.read_actions(v):
            full.apply(a)
        if v in cps:                                       # each checkpoint is that state
            assert _same(tl._load_checkpoint(v), full)
    assert _same(tl.snapshot(), full)
    assert {tl.snapshot().txns[k].version for k in ("w0", "w1")} == {19}


def _same(a, b) -> bool:
    import json
    return sorted(json.dumps(x.to_json(), sort_keys=True) for x in a.live_actions()[:-1]) \
        == sorted(json.dumps(x.to_json(), sort_keys=True) for x in b.live_actions()[:-1])


def test_the_first_commit_of_this_code_upgrades_the_reader_version(store_url):
    tl = TransactionLog(StoreFS(store_url))
    tl.create([PROTOCOL, {"metaData": {"storeId": "s1"}}])
    assert tl.snapshot().protocol.min_reader_version == 1
    state = tl.commit(lambda s: [_topic(1)], operation="T")
    assert state.protocol.min_reader_version == fmt.MIN_READER_VERSION == 3
    assert state.protocol.min_writer_version == 2
    assert "protocol" in tl.read_version(1)[0]
    tl.commit(lambda s: [_topic(2)], operation="T")
    assert "protocol" not in str(tl.read_version(2))       # once


def test_a_reader_of_version_2_would_refuse_a_manifest(big, monkeypatch):
    """What the reader-version bump buys: an older reader stops at the manifest's
    protocol line instead of skipping its sidecar lines and missing the topics."""
    monkeypatch.setattr(fmt, "READER_VERSION", 2)
    with pytest.raises(UnsupportedFormatError, match="reader version 3"):
        TransactionLog(StoreFS(big.sfs.url)).snapshot()


def test_a_file_decoded_in_one_pass_still_names_a_bad_line_and_catches_run_together_lines():
    """parse_actions decodes a many-line file (a sidecar) with one json.loads; a bad line
    is still named, and two lines whose text runs together into one JSON value (a
    single decode would accept it) are refused as the line-by-line reading does."""
    good = [_topic(i) for i in range(3)]
    data = "\n".join(json.dumps(a) for a in good).encode()
    assert [a.name for a in parse_actions(data, "f")] == ["t0", "t1", "t2"]
    bad = data + b'\n{"topic": {"name": oops}}'
    with pytest.raises(CorruptStoreError, match="f line 4 is not JSON"):
        parse_actions(bad, "f")
    run_together = b'{"topic":{"name":"a","x":[{"c":1}\n{"b":2}]}}\n' + data
    with pytest.raises(CorruptStoreError, match="f line 1 is not JSON"):
        parse_actions(run_together, "f")


def test_loading_a_checkpoint_pauses_the_cycle_collector_and_resumes_it(big, monkeypatch):
    """Building a checkpoint's entries runs with gc off (checkpoint._NoCycleCollection)
    and gc is on again afterwards, also when the load fails."""
    import gc
    seen = []
    real = checkpoint.part_key

    def spy(a):
        seen.append(gc.isenabled())
        return real(a)
    monkeypatch.setattr(checkpoint, "part_key", spy)
    assert gc.isenabled()
    TransactionLog(StoreFS(big.sfs.url)).snapshot()
    assert seen and not any(seen)
    assert gc.isenabled()
    with pytest.raises(OSError):                # nested, the inner one failing
        with checkpoint._NoCycleCollection():
            try:
                with checkpoint._NoCycleCollection():
                    raise OSError("x")
            finally:
                assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()                                # off before: left off
    try:
        with checkpoint._NoCycleCollection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
