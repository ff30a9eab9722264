"""Message-id epochs (sparkmq/log/idtags.py, FORMAT.md "Message id"): after a crash took
acknowledged messages, the messages placed at their offsets get ids of a new tag, so a
lost message's id never names another; every surviving id still names its message."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkmq import ASYNC_FLUSH, Message, Snapshot, Store
from sparkmq.errors import InvalidMessageIdError, UnsupportedFormatError
from sparkmq.log import format as fmt
from sparkmq.log.actions import IdEpoch, MetaData, parse_action
from sparkmq.log.idtags import IdTags
from sparkmq.log.message import (decode_message_id, encode_message_id, message_id_array,
                                 message_ids, store_tag)

OPTS = dict(start_services=False, flushDiskType=ASYNC_FLUSH)


@pytest.fixture
def url(tmp_path) -> str:
    """A local store: a power loss is played on its files."""
    return str(tmp_path / "store")


def _crash(store: Store) -> None:
    """The process dies: nothing more is flushed, published or released."""
    store._crash()
    store.sfs.close()


def _lose_the_active_file(store: Store) -> None:
    """The process dies and a power loss takes the active segment's file whole (it was
    never fsynced, nor its folder)."""
    path = store.sfs.local_path(store.commitlog.active.rel_path)
    _crash(store)
    os.unlink(path)


def _append(store: Store, *bodies: bytes) -> list[str]:
    return [r.message_id for r in store.append([Message("t", b, queue_id=0) for b in bodies])]


def _read_ids(url: str) -> dict[bytes, str]:
    table = Snapshot.load(url).read_table("t", 0, 0)
    return dict(zip(table.column("body").to_pylist(), table.column("message_id").to_pylist()))


def test_a_crash_begins_an_epoch_and_a_lost_id_names_nothing(url):
    """The survivors are flushed and published; the lost message was acknowledged
    (ASYNC_FLUSH) in a segment rolled after them whose file a power loss took whole. The
    next append is placed where it was."""
    store = Store.open(url, mappedFileSizeCommitLog=4096, **OPTS)
    store.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    kept = _append(store, b"k1", b"k2")
    store.commitlog.flush(sync=True)
    store.publish(force=True)
    lost = _append(store, b"L" * 3000)       # does not fit: a new segment
    assert len(store.commitlog.segments()) == 2
    _lose_the_active_file(store)

    store = Store.open(url, **OPTS)
    try:
        meta, protocol = store.state.metadata, store.state.protocol
        assert [e.start_offset for e in meta.id_epochs] == [store.commitlog.written_offset]
        assert meta.id_epochs[0].start_offset < decode_message_id(lost[0])[1]
        assert meta.id_epochs[0].tag != store_tag(meta.store_id)
        assert (protocol.min_reader_version, protocol.min_writer_version) == \
            (fmt.ID_EPOCHS_READER_VERSION, fmt.ID_EPOCHS_WRITER_VERSION)
        # the survivors keep their ids, by lookup, by read, and in a snapshot
        assert [store.lookup(i).body for i in kept] == [b"k1", b"k2"]
        assert [m.message_id for m in store.read("t", 0, 0)] == kept
        assert store.lookup(lost[0]) is None
        new = _append(store, b"new", b"new2")
        assert decode_message_id(new[0])[1] == decode_message_id(lost[0])[1]   # same place
        assert lost[0] not in new
        assert store.lookup(lost[0]) is None
        assert store.lookup(new[0]).body == b"new"
        assert [m.message_id for m in store.read("t", 0, 0)] == kept + new
    finally:
        store.close()
    assert _read_ids(url) == dict(zip([b"k1", b"k2", b"new", b"new2"], kept + new))
    reader = Snapshot.load(url)
    assert reader.lookup(lost[0]) is None and reader.lookup(new[1]).body == b"new2"


def test_each_crash_begins_its_own_epoch_even_at_the_same_offset(url):
    """A second crash that took the first epoch's only message: the message placed
    there next gets a third tag, not the lost one's."""
    store = Store.open(url, **OPTS)
    store.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    _crash(store)
    store = Store.open(url, **OPTS)
    lost = _append(store, b"lost")          # the store's first segment, never fsynced
    _lose_the_active_file(store)
    store = Store.open(url, **OPTS)
    try:
        epochs = store.state.metadata.id_epochs
        assert len(epochs) == 2 and epochs[0].start_offset == epochs[1].start_offset
        assert len({e.tag for e in epochs} | {store_tag(store.store_id)}) == 3
        new = _append(store, b"new")
        assert decode_message_id(new[0])[1] == decode_message_id(lost[0])[1]   # same place
        assert new != lost and store.lookup(lost[0]) is None
        assert store.lookup(new[0]).body == b"new"
    finally:
        store.close()


def test_a_clean_close_begins_no_epoch_and_leaves_the_protocol(url):
    with Store.open(url, **OPTS) as store:
        store.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        ids = _append(store, b"a")
    with Store.open(url, **OPTS) as store:
        assert store.state.metadata.id_epochs is None
        assert store.state.protocol.min_reader_version == fmt.MIN_READER_VERSION
        assert store.state.protocol.min_writer_version == fmt.MIN_WRITER_VERSION
        assert _append(store, b"b")[0][:8] == ids[0][:8]
    assert '"idEpochs"' not in "".join(
        open(os.path.join(url, fmt.LOG_DIR, n)).read()
        for n in os.listdir(os.path.join(url, fmt.LOG_DIR)) if n.endswith(".json"))


def test_an_older_reader_or_writer_refuses_a_store_with_epochs(url, monkeypatch):
    store = Store.open(url, **OPTS)
    store.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    _crash(store)
    Store.open(url, **OPTS).close()
    monkeypatch.setattr(fmt, "WRITER_VERSION", fmt.ID_EPOCHS_WRITER_VERSION - 1)
    with pytest.raises(UnsupportedFormatError, match="writer version"):
        Store.open(url, **OPTS)
    monkeypatch.setattr(fmt, "READER_VERSION", fmt.ID_EPOCHS_READER_VERSION - 1)
    with pytest.raises(UnsupportedFormatError, match="reader version"):
        Snapshot.load(url)


def test_an_id_of_another_store_is_refused_and_of_an_epoch_tag_is_not(url):
    store = Store.open(url, **OPTS)
    store.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    _crash(store)
    store = Store.open(url, **OPTS)
    try:
        mid = _append(store, b"a")[0]
        tag, bo, row = decode_message_id(mid)
        assert tag == store.state.metadata.id_epochs[-1].tag
        with pytest.raises(InvalidMessageIdError, match="another store"):
            store.lookup(encode_message_id(tag ^ 1, bo, row))
        # the store's first tag at an offset of the newer epoch: a message a crash took
        assert store.lookup(encode_message_id(store_tag(store.store_id), bo, row)) is None
    finally:
        store.close()


def test_metadata_with_epochs_round_trips_and_without_stays_without():
    body = {"storeId": "ab", "createdTime": 1, "formatVersion": 2, "configuration": {},
            "idEpochs": [{"startOffset": 10, "tag": 7}, {"startOffset": 99, "tag": 8}]}
    meta = parse_action({"metaData": body})
    assert meta.id_epochs == (IdEpoch(10, 7), IdEpoch(99, 8))
    assert meta.to_json() == {"metaData": body}
    del body["idEpochs"]
    meta = parse_action({"metaData": body})
    assert meta.id_epochs is None and meta.to_json() == {"metaData": body}


epochs_st = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 2**32 - 1)),
                     max_size=5).map(lambda es: sorted(es, key=lambda e: e[0]))


@settings(max_examples=200, deadline=None)
@given(epochs=epochs_st, offsets=st.lists(st.integers(0, 1200), max_size=30),
       rows=st.data())
def test_a_tag_is_the_last_epoch_at_or_below_the_offset(epochs, offsets, rows):
    """``IdTags.at`` and ``of`` against the rule said plainly; ids built with the tags
    of several epochs at once equal ids built one by one."""
    meta = MetaData(store_id="s", id_epochs=tuple(IdEpoch(s, t) for s, t in epochs) or None)
    tags = IdTags(meta)

    def expected(offset):
        found = [t for s, t in epochs if s <= offset]
        return found[-1] if found else store_tag("s")
    assert [tags.at(b) for b in offsets] == [expected(b) for b in offsets]
    bos = np.asarray(sorted(offsets), np.int64)
    of = tags.of(bos)
    assert np.broadcast_to(of, bos.shape).tolist() == [expected(b) for b in bos.tolist()]
    row = np.asarray(rows.draw(st.lists(st.integers(0, 70_000), min_size=len(bos),
                                        max_size=len(bos))), np.int64)
    one_by_one = [encode_message_id(expected(b), b, r) for b, r in zip(bos.tolist(),
                                                                     row.tolist())]
    assert message_id_array(of, bos, row).to_pylist() == one_by_one
    assert message_ids(of, bos, row) == one_by_one


def test_the_epochs_survive_checkpoints(url):
    """The epochs live in metaData: a checkpoint carries them, so a reader that starts
    from the newest (no commit after it has a metaData) still tags and refuses ids by them."""
    store = Store.open(url, checkpointInterval=2, **OPTS)
    store.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    lost = _append(store, b"lost")
    _lose_the_active_file(store)
    store = Store.open(url, checkpointInterval=2, **OPTS)
    try:
        epochs = store.state.metadata.id_epochs
        new = _append(store, b"new")
        for i in range(6):                  # commits past a few checkpoints
            store.create_group(f"GID_{i}")
    finally:
        store.close()
    names = os.listdir(os.path.join(url, fmt.LOG_DIR))
    assert any("checkpoint" in n for n in names)
    reader = Snapshot.load(url)
    assert reader.state.metadata.id_epochs == epochs and epochs
    assert reader.lookup(lost[0]) is None and reader.lookup(new[0]).body == b"new"
