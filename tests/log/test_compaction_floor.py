"""Compaction drops side-table entries below the retention floor (FORMAT.md section 13):
readers see the same messages before and after, and the merged files hold no entry
retention already removed."""
from __future__ import annotations

import pyarrow.parquet as pq

from sparkmq import Store

from helpers.storetools import SMALL_SEGMENT_BYTES, bodies, msg


def _rows(store, paths):
    out = []
    for p in paths:
        with store.sfs.open_input(p) as f:
            out += pq.read_table(f).to_pylist()
    return out


def _fill(store, topics, per_publish=5, publishes=6):
    for p in range(publishes):
        for t in topics:
            for q in (0, 1):
                store.append([msg(t, b"%s-%d-%d-%d" % (t.encode(), q, p, i), q,
                                  keys=[f"{t}-{q}-{p}-{i}"]) for i in range(per_publish)])
        store.flush()                                  # one CQ and one Index file each


def test_compaction_drops_entries_below_the_queue_floors(store_url):
    with Store.open(store_url, start_services=False, compact_after_files=1000,
                    mappedFileSizeCommitLog=SMALL_SEGMENT_BYTES) as s:
        for t in ("a", "b"):
            s.create_topic(t, read_queue_nums=2, write_queue_nums=2)
        _fill(s, ("a", "b"))
        ta, tb = s.topics()["a"]["id"], s.topics()["b"]["id"]
        s.remove_segments([], queue_floors={(ta, 0): 12, (ta, 1): 3, (tb, 1): 29})
        before = {(t, q): bodies(s, t, q, s.min_offset(t, q)) for t in "ab" for q in (0, 1)}
        assert [len(v) for v in before.values()] == [18, 27, 30, 1]
        assert s.query_by_key("a", "a-0-0-0") == [] and s.query_by_key("b", "b-1-5-4")
        assert len(s.state.consumequeue_files) == 6 and len(s.state.index_files) == 6
        s.compact()
        assert len(s.state.consumequeue_files) == 1 and len(s.state.index_files) == 1
        floors = {(ta, 0): 12, (ta, 1): 3, (tb, 0): 0, (tb, 1): 29}
        for files in (s.state.consumequeue_files, s.state.index_files):
            rows = _rows(s, files)
            assert len(rows) == 18 + 27 + 30 + 1
            assert all(r["queue_offset"] >= floors[(r["topic_id"], r["queue_id"])]
                       for r in rows)
        after = {(t, q): bodies(s, t, q, s.min_offset(t, q)) for t in "ab" for q in (0, 1)}
        assert after == before
        assert s.query_by_key("a", "a-0-2-2") and s.query_by_key("a", "a-0-2-1") == []
        assert s.min_offset("a", 0) == 12 and s.max_offset("a", 0) == 30


def test_compaction_of_files_wholly_below_the_floor_adds_nothing(store_url):
    with Store.open(store_url, start_services=False, compact_after_files=1000,
                    mappedFileSizeCommitLog=SMALL_SEGMENT_BYTES) as s:
        s.create_topic("a", read_queue_nums=2, write_queue_nums=2)
        _fill(s, ("a",), publishes=3)
        tid = s.topics()["a"]["id"]
        s.remove_segments([], queue_floors={(tid, 0): 15, (tid, 1): 15})
        s.compact()
        assert s.state.index_files == {}
        assert s.min_offset("a", 0) == s.max_offset("a", 0) == 15
        s.append([msg("a", b"next", 0)])
        assert s.append([msg("a", b"next2", 0)])[0].queue_offset == 16
    with Store.open(store_url, start_services=False) as s:    # the floor survives reopen
        assert s.min_offset("a", 1) == s.max_offset("a", 1) == 15
        assert s.append([msg("a", b"next3", 1)])[0].queue_offset == 15


def test_retention_removes_index_files_wholly_below_the_physical_floor(store_url):
    with Store.open(store_url, start_services=False, compact_after_files=1000,
                    mappedFileSizeCommitLog=SMALL_SEGMENT_BYTES) as s:
        s.create_topic("a", read_queue_nums=2, write_queue_nums=2)
        _fill(s, ("a",), publishes=6)
        segs = s.commitlog.segments()
        assert len(segs) > 3
        floor = segs[2].end_offset
        below = {p for p, a in s.state.index_files.items() if a.max_batch_offset < floor}
        assert below and below != set(s.state.index_files)
        s.remove_segments([r.path for r in segs[:3]])
        assert not below & set(s.state.index_files) and below <= set(s.state.tombstones)
        for p, a in s.state.index_files.items():
            assert a.max_batch_offset >= floor
        q0 = s.min_offset("a", 0)
        # keys of kept messages are still found (a body is its key), removed ones are not
        kept_key = bodies(s, "a", 0, q0, q0 + 1)[0].decode()
        assert s.query_by_key("a", kept_key)
        assert s.query_by_key("a", "a-0-0-0") == []
