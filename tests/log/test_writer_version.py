"""protocol.minWriterVersion above what this code writes: reading works, every way
of writing refuses with UnsupportedFormatError, and nothing in the store changes."""
from __future__ import annotations

import pytest

from sparkmq import Message, Snapshot, Store
from sparkmq.errors import UnsupportedFormatError
from sparkmq.log import format as fmt
from sparkmq.log.committer import DirectCommitter, commit_consumer_offsets, committer_for
from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TransactionLog


def _files(sfs: StoreFS) -> dict[str, bytes]:
    return {f"{d}/{n}": sfs.read_bytes(f"{d}/{n}")
            for d in (fmt.LOG_DIR, fmt.COMMITLOG_DIR, fmt.CONSUMEQUEUE_DIR, fmt.INDEX_DIR)
            for n in sfs.list_names(d)}


@pytest.fixture
def newer_store(store_url):
    """A store with two messages, then a hand-written commit raising minWriterVersion."""
    with Store.open(store_url, start_services=False) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        s.append([Message("t", b"a", queue_id=0), Message("t", b"b", queue_id=0)])
    tl = TransactionLog(StoreFS(store_url))
    v = tl.latest_version() + 1
    protocol = {"protocol": {"minReaderVersion": 1,
                             "minWriterVersion": fmt.WRITER_VERSION + 1}}
    assert tl.try_commit(v, [protocol], previous_ts=tl.commit_timestamp(v - 1),
                         operation="UPGRADE PROTOCOL") is not None
    return store_url


def test_reading_a_store_of_a_newer_writer_version_works(newer_store):
    snap = Snapshot.load(newer_store)
    assert snap.read_table("t", 0, 0).column("body").to_pylist() == [b"a", b"b"]
    with Store.open(newer_store, mode="r") as s:
        assert s.max_offset("t", 0) == 2


def test_opening_for_write_refuses_and_changes_nothing(newer_store):
    sfs = StoreFS(newer_store)
    before = _files(sfs)
    with pytest.raises(UnsupportedFormatError, match=rf"writer version {fmt.WRITER_VERSION + 1}.*mode='r'"):
        Store.open(newer_store, mode="w", start_services=False)
    assert _files(sfs) == before
    assert not sfs.exists(fmt.abort_file())


def test_direct_commits_refuse_and_change_nothing(newer_store):
    sfs = StoreFS(newer_store)
    before = _files(sfs)
    with pytest.raises(UnsupportedFormatError):
        committer_for(newer_store)
    with pytest.raises(UnsupportedFormatError):
        DirectCommitter(newer_store).check()
    with pytest.raises(UnsupportedFormatError):
        commit_consumer_offsets(newer_store, "g", {("t", 0): 1})
    with pytest.raises(UnsupportedFormatError):
        TransactionLog(sfs).commit(lambda s: [], operation="ANYTHING")
    assert _files(sfs) == before
