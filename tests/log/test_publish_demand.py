"""Publish on demand: a live stream reader's ``_readers/`` marker switches the publish
service from ``publishIntervalMs`` to ``publishMinGapMs`` (sparkmq/log/publish.py).

The stores here publish at a 60 s interval, so any publish a test sees within its
bounded wait is a fast-cadence publish: the assertions count versions and offsets,
never wall-clock latency."""
from __future__ import annotations

import time

import pytest

from helpers.waiting import wait_until
from sparkmq import ASYNC_FLUSH, SYNC_FLUSH, Message, Snapshot, Store
from sparkmq.log import publish as pub
from sparkmq.log.fs import StoreFS

SLOW_MS = 60_000          # interval publishes (and ASYNC_FLUSH flushes) never come in a test
GAP_MS = 50
WAIT_S = 10.0


def _open(url, flush=SYNC_FLUSH):
    s = Store.open(url, publishIntervalMs=SLOW_MS, publishMinGapMs=GAP_MS,
                   flushDiskType=flush, flushIntervalCommitLog=SLOW_MS)
    s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    # the first append opens the first segment, and a roll wakes the publisher at once
    # (racing the fsync): get that pass out of the way, and publish m0 for sure
    s.append(Message("t", b"m0", queue_id=0))
    time.sleep(0.2)
    s.flush()
    return s


def _interval_pass(store) -> None:
    """What the publish service does at the interval, looking at _readers/ now."""
    store.services.readers_checked_s = None
    store.publish()


def _published(url) -> tuple[int, int]:
    snap = Snapshot.load(url)
    return snap.version, snap.max_offset("t", 0)


def _wait_published(url, offset: int) -> int:
    """The version in which ``offset`` messages became visible (bounded wait)."""
    seen = []
    wait_until(lambda: seen.append(_published(url)) or seen[-1][1] >= offset,
               f"offset {offset} published", timeout_s=WAIT_S)
    return seen[-1][0]


@pytest.mark.parametrize("flush", [SYNC_FLUSH, ASYNC_FLUSH])
def test_live_reader_publishes_each_append_at_the_gap(store_url, flush):
    store = _open(store_url, flush)
    try:
        pub.touch_reader_marker(store.sfs, "r1", store.clock_ms())
        _interval_pass(store)           # it finds the marker
        assert store.services.publish_gap_ms == GAP_MS
        versions = []
        for i in range(2, 5):
            store.append(Message("t", b"m%d" % i, queue_id=0))
            versions.append(_wait_published(store_url, i))
        # three appends, three fast publishes (no interval publish is due for 60 s);
        # under ASYNC_FLUSH the fast pass fsynced first (no flush is due for 60 s either)
        assert versions == sorted(set(versions)) and len(versions) == 3
    finally:
        store.close()


def test_no_reader_keeps_the_interval(store_url):
    store = _open(store_url)
    try:
        _interval_pass(store)
        assert store.services.publish_gap_ms is None
        before = _published(store_url)
        store.append(Message("t", b"m", queue_id=0))
        time.sleep(20 * GAP_MS / 1000.0)      # 20 gaps: a fast cadence would have published
        assert _published(store_url) == before
    finally:
        store.close()


def test_reader_gone_returns_to_the_interval(store_url):
    store = _open(store_url)
    try:
        pub.touch_reader_marker(store.sfs, "r1", store.clock_ms())
        _interval_pass(store)
        assert store.services.publish_gap_ms == GAP_MS
        pub.remove_reader_marker(store.sfs, "r1")
        _interval_pass(store)
        assert store.services.publish_gap_ms is None
    finally:
        store.close()


def test_idle_fast_cadence_commits_nothing(store_url):
    """A live reader and no appends: the short cadence adds no _log/ versions."""
    store = _open(store_url)
    try:
        pub.touch_reader_marker(store.sfs, "r1", store.clock_ms())
        _interval_pass(store)
        before = _published(store_url)
        time.sleep(20 * GAP_MS / 1000.0)
        assert _published(store_url) == before
    finally:
        store.close()


def test_markers_expire_and_stale_ones_are_removed(store_url):
    sfs = StoreFS(store_url)
    now = 1_700_000_000_000
    pub.touch_reader_marker(sfs, "live", now)
    pub.touch_reader_marker(sfs, "dead", now - pub.READER_MARKER_TTL_MS - 1)
    pub.touch_reader_marker(sfs, "stale", now - pub.READER_MARKER_TTL_MS
                            - pub.STALE_MARKER_GRACE_MS - 1)
    sfs.replace(f"{pub.READERS_DIR}/junk.json", b"{not json")
    assert pub.live_readers(sfs, now) == 1
    assert pub.live_readers(sfs, now, clean=True) == 1
    # the stale marker and the unreadable one go; the dead one waits out its grace
    assert sorted(sfs.list_names(pub.READERS_DIR)) == ["dead.json", "live.json"]
    assert pub.live_readers(sfs, now + pub.READER_MARKER_TTL_MS) == 0
