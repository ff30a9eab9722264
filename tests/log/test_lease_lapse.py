"""A writer whose lease may have lapsed does not answer an append as stored before it
knows the lease is still its own: a paused process (its publish did not run) whose lease
another writer took over used to write into the segment the new writer had sealed, answer
PUT_OK, and lose the message."""
from __future__ import annotations

import os

import pyarrow as pa
import pytest

from sparkmq import SYNC_FLUSH, PutMessageStatus, Store
from sparkmq.errors import CorruptStoreError, FencedError

from helpers.clock import Clock
from helpers.storetools import as_segment_batch, bodies, msg, pause_before_the_write

OPTS = dict(start_services=False, flushDiskType=SYNC_FLUSH)


def _rows(body: bytes) -> pa.Table:
    return pa.table({"topic": ["t"], "queue_id": pa.array([0], pa.int32()), "body": [body]})


def _take_over(a: Store, store_url: str, clock: Clock, opts: dict = OPTS):
    """What B does while A is paused: A's lease expires, B opens (takes the store over)."""
    def during() -> Store:
        clock.advance(a.config.lease_timeout_ms + 1)
        return Store.open(store_url, clock_ms=Clock(clock.now_ms), **opts)
    return during


@pytest.mark.parametrize("columnar", [False, True])
def test_an_append_that_ends_after_a_takeover_is_not_answered_as_stored(
        store_url, columnar):
    clock = Clock()
    a = Store.open(store_url, clock_ms=clock, **OPTS)
    a.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    a.append([msg("t", b"a0")])
    taken = pause_before_the_write(a, _take_over(a, store_url, clock))
    refused = r"^\[SPARKMQ_FENCED\] store .*may not be stored; send it"   # (the code once)
    with pytest.raises(FencedError, match=refused):
        if columnar:
            a.append_batch(as_segment_batch(_rows(b"late")))
        else:
            a.append([msg("t", b"late")])
    b = taken[0]
    assert b.epoch == a.epoch + 1
    assert bodies(b, "t", 0) == [b"a0"]          # where the bytes went, no one reads
    with pytest.raises(FencedError):
        a.append([msg("t", b"after")])
    b.append([msg("t", b"b1")])
    a.close()
    b.close()
    with Store.open(store_url, clock_ms=Clock(clock.now_ms + 1), **OPTS) as c:
        assert bodies(c, "t", 0) == [b"a0", b"b1"]


def test_a_lapsed_lease_no_one_took_is_renewed_and_the_append_stored(store_url):
    clock = Clock()
    with Store.open(store_url, clock_ms=clock, **OPTS) as a:
        a.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        version = a.state.version
        clock.advance(a.config.lease_timeout_ms * 10)     # no publish ran (a paused process)
        r = a.append([msg("t", b"m")])
        assert r[0].status == PutMessageStatus.PUT_OK
        assert a.state.version > version                   # renewed before the write
        assert a.state.lease.expires_time > clock.now_ms
        assert not a.lease.fenced and bodies(a, "t", 0) == [b"m"]


def test_a_fresh_lease_costs_an_append_no_commit(store_url):
    clock = Clock()
    with Store.open(store_url, clock_ms=clock, **OPTS) as a:
        a.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        version = a.state.version
        clock.advance(a.config.lease_timeout_ms // 2)       # renewal due, not lapsing
        a.append([msg("t", b"m")])
        a.append_batch(as_segment_batch(_rows(b"n")))
        assert a.state.version == version


def test_a_writer_whose_lease_was_taken_refuses_before_it_writes(local_store_url):
    clock = Clock()
    a = Store.open(local_store_url, clock_ms=clock, **OPTS)
    a.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    a.append([msg("t", b"a0")])
    clock.advance(a.config.lease_timeout_ms + 1)              # A paused; B takes over
    b = Store.open(local_store_url, clock_ms=Clock(clock.now_ms), **OPTS)
    sealed = {r.path: r.size for r in b.commitlog.segments() if r.sealed}
    assert sealed
    with pytest.raises(FencedError, match="must stop"):
        a.append([msg("t", b"late")])
    assert bodies(a, "t", 0) == [b"a0"]          # not dispatched, even in A's own view
    for path, size in sealed.items():            # nothing written past B's seal
        assert os.path.getsize(os.path.join(local_store_url, path)) == size
    a.close()
    b.close()


def test_a_late_roll_onto_the_new_writers_segment_is_fenced_and_harmless(store_url):
    """A stops before an append that rolls to a new segment; B takes over and appends
    first, making the segment A's roll would make (the same name: A's end plus its seal).
    A's roll finds it taken: A is told it is fenced, and B's segment is left as it is (on
    an object store A's create used to overwrite it)."""
    opts = dict(OPTS, mappedFileSizeCommitLog=4096)
    clock = Clock()
    a = Store.open(store_url, clock_ms=clock, **opts)
    a.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    kept = []
    while a.commitlog.active is None or not a.commitlog.needs_roll(2000):
        kept.append(b"a%d" % len(kept) + b"." * 200)
        a.append([msg("t", kept[-1])])
    def take_over_and_append() -> Store:
        b = _take_over(a, store_url, clock, opts)()
        b.append([msg("t", b"b1")])
        b.flush()
        return b
    taken = pause_before_the_write(a, take_over_and_append)
    with pytest.raises(FencedError, match="must stop"):
        a.append([msg("t", b"late" + b"." * 1500)])
    b = taken[0]
    b.append([msg("t", b"b2")])
    assert bodies(b, "t", 0) == kept + [b"b1", b"b2"]
    a.close()
    b.close()
    with Store.open(store_url, clock_ms=Clock(clock.now_ms + 1), **opts) as c:
        assert bodies(c, "t", 0) == kept + [b"b1", b"b2"]


def test_a_published_segment_is_never_replaced_as_a_late_roll(local_store_url):
    """The holder replaces a taken segment name only when the log does not list the file
    (a former holder's late roll); a published one means damage before it: refused."""
    with Store.open(local_store_url, clock_ms=Clock(), **OPTS) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        s.append([msg("t", b"m")])
        s.flush()
        rel = next(iter(s.state.segments))
        with pytest.raises(CorruptStoreError, match="nothing is replaced"):
            s.appender.segment_taken(rel)
        assert os.path.exists(os.path.join(local_store_url, rel))
        assert bodies(s, "t", 0) == [b"m"]
