"""A SYNC_FLUSH append waits for its own bytes to be fsynced, not for the bytes other
appends wrote after it (RocketMQ's group commit request waits for the message's own
``wroteOffset + wroteBytes``). Another producer's append is made to land between this
append's write and its wait, where the store releases the append lock."""
from __future__ import annotations

import pyarrow as pa
import pytest

from sparkmq import SYNC_FLUSH, Message, PutMessageStatus, Store


@pytest.mark.parametrize("path", ["append", "append_batch", "append_batch_later"])
def test_an_append_waits_for_its_own_end_not_a_later_append(tmp_path, monkeypatch, path):
    with Store.open(str(tmp_path / "s"), flushDiskType=SYNC_FLUSH,
                    flushIntervalCommitLog=10) as store:
        store.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        gc = store.services.group_commit
        assert gc is not None
        waited, real_wait = [], gc.wait_for
        monkeypatch.setattr(gc, "wait_for",
                            lambda offset, ms: waited.append(offset) or real_wait(offset, ms))
        # another producer's append, once this one's bytes are written and the lock is free
        other, real_hold = [], store.appender.hold_lease

        def hold(*, written: bool = False) -> None:
            real_hold(written=written)
            if written and not other:
                other.append(None)               # (once: the other append holds it too)
                other[0] = store.append([Message("t", b"other" * 50)])[0]
        monkeypatch.setattr(store.appender, "hold_lease", hold)

        batch = pa.table({"topic": ["t", "t"], "body": [b"mine" * 50, b"mine"]})
        if path == "append":
            mine = store.append([Message("t", b"mine" * 50)])[0]
            start, status = mine.physical_offset, mine.status
        elif path == "append_batch":
            r = store.append_batch(batch)
            start, status = r.batch_offset, r.status
        else:                          # the caller waits (a coroutine's flushed_async)
            later: list = []
            r = store.append_batch(batch, later=later)
            start, status = r.batch_offset, r.status
            waited.append(later[0][0])
            store.appender.make_visible(later)
        assert status is PutMessageStatus.PUT_OK and other
        theirs = other[0].physical_offset          # the other batch starts where mine ends
        assert start < theirs < store.commitlog.written_offset
        # the other append waited for its end, the whole log; mine for its own end only
        assert waited == [store.commitlog.written_offset, theirs]
        assert [m.body for m in store.read("t", 0, 0)][-1] == b"other" * 50
