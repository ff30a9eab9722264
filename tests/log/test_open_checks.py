"""What a store checks when it opens (issue 12 item 4): every file the current version
references exists with its recorded size, and a damaged or truncated checkpoint falls
back to an older checkpoint plus the commits after it."""
from __future__ import annotations

import logging

import pytest

from sparkmq import Message, Store
from sparkmq.errors import CorruptStoreError
from sparkmq.log import format as fmt
from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TransactionLog

from tests.helpers.clock import Clock

PROTOCOL = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 1}}


def _topic(i: int) -> dict:
    return {"topic": {"name": f"t{i}", "id": i, "readQueueNums": 1, "writeQueueNums": 1,
                      "perm": 6, "deleted": False}}


@pytest.fixture
def txlog(store_url):
    log = TransactionLog(StoreFS(store_url), checkpoint_interval_versions=5,
                         clock_ms=Clock(1_000_000))
    log.create([PROTOCOL, {"metaData": {"storeId": "s1"}}])
    for i in range(1, 13):                       # checkpoints at versions 5 and 10
        log.commit(lambda s, i=i: [_topic(i)], operation="T")
    return log


DAMAGE = {
    "cut mid-line": lambda data: data[:len(data) // 2],
    "cut at a line boundary": lambda data: b"".join(data.splitlines(True)[:-1]),
    "not text": lambda data: b"\xff\xfe" + data[2:],
    "empty": lambda data: b"",
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(txlog, damage, caplog):
    expected = txlog.snapshot()
    rel = fmt.checkpoint_file(10)
    txlog.sfs.replace(rel, DAMAGE[damage](txlog.sfs.read_bytes(rel)))
    with caplog.at_level(logging.WARNING, logger="sparkmq.txlog"):
        fresh = TransactionLog(txlog.sfs).snapshot()
    assert fresh.version == 12
    assert fresh.live_actions() == expected.live_actions()
    assert sorted(fresh.topics) == sorted(f"t{i}" for i in range(1, 13))
    assert any(rel in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)


def test_with_every_checkpoint_damaged_the_state_is_replayed_from_version_zero(txlog):
    expected = txlog.snapshot()
    for v in (5, 10):
        txlog.sfs.replace(fmt.checkpoint_file(v), b'{"topic": {"name"')
    fresh = TransactionLog(txlog.sfs).snapshot()
    assert fresh.live_actions() == expected.live_actions()


@pytest.fixture
def closed_store(store_url):
    with Store.open(store_url, start_services=False) as s:
        s.create_topic("T", read_queue_nums=2, write_queue_nums=2)
        s.append([Message("T", b"x" * 200, keys=[f"k{i}"]) for i in range(20)])
    return store_url, TransactionLog(StoreFS(store_url)).snapshot()


@pytest.mark.parametrize("mode", ["w", "r"])
def test_open_names_a_missing_side_table(closed_store, mode):
    url, state = closed_store
    gone = next(iter(state.consumequeue_files))
    StoreFS(url).delete(gone)
    with pytest.raises(CorruptStoreError) as err:
        Store.open(url, mode=mode, create=False, start_services=False)
    msg = str(err.value)
    assert gone in msg and "missing" in msg and "sparkmq admin verify" in msg


@pytest.mark.parametrize("mode", ["w", "r"])
def test_open_names_a_short_segment_and_a_resized_index_file(closed_store, mode):
    url, state = closed_store
    sfs = StoreFS(url)
    seg = next(iter(state.segments))
    idx = next(iter(state.index_files))
    sfs.replace(seg, sfs.read_bytes(seg)[:100])
    sfs.replace(idx, sfs.read_bytes(idx) + b"\0")
    with pytest.raises(CorruptStoreError) as err:
        Store.open(url, mode=mode, create=False, start_services=False)
    msg = str(err.value)
    assert "2 file(s)" in msg and seg in msg and idx in msg and "100 bytes" in msg


def test_an_intact_store_opens_and_reads(closed_store):
    url, _ = closed_store
    with Store.open(url, create=False, start_services=False) as s:
        assert sum(len(s.read("T", q, 0, 100)) for q in (0, 1)) == 20


def test_a_checkpoint_changed_where_it_still_parses_is_found_by_its_checksum(txlog, caplog):
    expected = txlog.snapshot()
    rel = fmt.checkpoint_file(10)
    data = txlog.sfs.read_bytes(rel)
    assert b'"checksum":"crc32c:' in data
    assert b'"storeId":"s1"' in data                 # (the topics are in its sidecars)
    txlog.sfs.replace(rel, data.replace(b'"storeId":"s1"', b'"storeId":"s2"', 1))  # still JSON
    with caplog.at_level(logging.WARNING, logger="sparkmq.txlog"):
        fresh = TransactionLog(txlog.sfs).snapshot()
    assert fresh.live_actions() == expected.live_actions()
    assert any("checksum mismatch" in r.getMessage() for r in caplog.records)
