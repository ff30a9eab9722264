"""Recovery, one test per crash point: the store is stopped as a killed process
would stop it (``Store._crash``), files are damaged on purpose, and what a
reopened store sees is compared with what was appended before."""
from __future__ import annotations

import os
import shutil

import pytest

from sparkmq import SYNC_FLUSH, Snapshot, Store
from sparkmq.log import format as fmt
from sparkmq.log import segment as seg
from sparkmq.log.fs import StoreFS

from helpers.storetools import SMALL_SEGMENT_BYTES, batch_ends, bodies, msg, segment_paths

OPTS = dict(start_services=False, flushDiskType=SYNC_FLUSH,
            mappedFileSizeCommitLog=SMALL_SEGMENT_BYTES)


def _open(url, **kw):
    return Store.open(url, **{**OPTS, **kw})


def _new_store(url, queues=2):
    s = _open(url)
    s.create_topic("t", read_queue_nums=queues, write_queue_nums=queues)
    return s


def _append_n(s, n, start=0, queue_id=0, size=100):
    return [s.append([msg("t", b"b%05d" % i + b"." * size, queue_id)])[0]
            for i in range(start, start + n)]


def _expected(n, start=0, size=100):
    return [b"b%05d" % i + b"." * size for i in range(start, start + n)]


def _newest_segment(sfs: StoreFS) -> str:
    names = [n for n in sfs.list_names(fmt.COMMITLOG_DIR) if fmt.parse_segment_file(n) is not None]
    return f"{fmt.COMMITLOG_DIR}/{max(names)}"


def test_crash_after_flush_sees_everything(store_url):
    s = _new_store(store_url)
    res = _append_n(s, 20, queue_id=1)
    s._crash()
    assert StoreFS(store_url).exists(fmt.abort_file())
    with _open(store_url) as s2:
        assert s2.recovered_from_crash
        assert bodies(s2, "t", 1) == _expected(20)
        assert [s2.lookup(r.message_id).queue_offset for r in res] == list(range(20))
        assert s2.append([msg("t", b"next", 1)])[0].queue_offset == 20
    assert not StoreFS(store_url).exists(fmt.abort_file())
    with _open(store_url) as s3:
        assert not s3.recovered_from_crash
        assert bodies(s3, "t", 1)[-1] == b"next"


def test_crash_after_publish_and_more_appends(store_url):
    s = _new_store(store_url)
    _append_n(s, 10)
    s.flush()                       # published
    published = s.version
    _append_n(s, 10, start=10)      # flushed, not published
    s._crash()
    assert Snapshot.load(store_url).max_offset("t", 0) == 10
    with _open(store_url) as s2:
        assert bodies(s2, "t", 0) == _expected(20)
        assert s2.version > published
    assert Snapshot.load(store_url).max_offset("t", 0) == 20


def test_crash_twice_in_a_row(store_url):
    s = _new_store(store_url)
    _append_n(s, 5)
    s._crash()
    s2 = _open(store_url)
    _append_n(s2, 5, start=5)
    s2._crash()
    s3 = _open(store_url)
    s3._crash()
    with _open(store_url) as s4:
        assert bodies(s4, "t", 0) == _expected(10)


def test_crash_across_rolls_before_publish(store_url):
    s = _new_store(store_url)
    _append_n(s, 3)
    s.flush()
    n_published = len(Snapshot.load(store_url).state.segments)
    _append_n(s, 60, start=3, size=300)       # rolls several segments, none published
    assert len(s.commitlog.segments()) > n_published + 2
    s._crash()
    with _open(store_url) as s2:
        assert s2.recovered_from_crash
        assert bodies(s2, "t", 0) == _expected(3) + _expected(60, start=3, size=300)
        _append_n(s2, 1, start=63)
        assert s2.max_offset("t", 0) == 64


@pytest.mark.parametrize("keep_bytes", [0, seg.HEADER_SIZE // 2, seg.HEADER_SIZE])
def test_crash_right_after_roll_new_segment_empty_or_torn_header(store_url, keep_bytes):
    s = _new_store(store_url)
    _append_n(s, 40, size=300)
    s.flush()
    before = s.max_offset("t", 0)
    newest = _newest_segment(s.sfs)
    n_segments = len(s.commitlog.segments())
    while _newest_segment(s.sfs) == newest:   # append until the next roll
        _append_n(s, 1, start=before, size=300)
        before += 1
    s._crash()
    sfs = StoreFS(store_url)
    rolled = _newest_segment(sfs)
    sfs.truncate(rolled, keep_bytes)          # the roll's first batch never reached disk
    with _open(store_url) as s2:
        got = bodies(s2, "t", 0)
        assert got == _expected(40, size=300) + _expected(before - 40, start=40, size=300)[:-1]
        assert len(s2.commitlog.segments()) >= n_segments
        r = s2.append([msg("t", b"after", 0)])[0]
        assert r.queue_offset == before - 1
        assert s2.lookup(r.message_id).body == b"after"
    with _open(store_url) as s3:
        assert bodies(s3, "t", 0)[-1] == b"after"


def _write_then_crash(url, n_before, last_batch_size):
    s = _new_store(url, queues=1)
    _append_n(s, n_before, size=20)
    s.append([msg("t", b"L%d" % i, 0) for i in range(last_batch_size)])
    s._crash()


@pytest.fixture
def ram_tmp(tmp_path):
    """A local folder on tmpfs when there is one (the every-byte test reopens the
    store ~1,500 times; fsync on tmpfs is cheap), else pytest's tmp_path."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        import tempfile
        folder = tempfile.mkdtemp(prefix="sparkmq-recovery-", dir="/dev/shm")
        yield __import__("pathlib").Path(folder)
        shutil.rmtree(folder, ignore_errors=True)
    else:
        yield tmp_path


def _reopen_cut(pristine: str, work: str, cut: int) -> Store:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work)
    os.truncate(segment_paths(work)[-1], cut)
    return _open(work)


def _check_cut(pristine, work, cut, file_end, *, reopen_again: bool) -> None:
    s = _reopen_cut(pristine, work, cut)
    got = bodies(s, "t", 0)
    expected = _expected(3, size=20) + ([b"L0", b"L1"] if cut == file_end else [])
    assert got == expected, cut
    r = s.append([msg("t", b"after", 0)])[0]
    assert r.queue_offset == len(expected), cut
    assert bodies(s, "t", 0) == expected + [b"after"], cut
    s._crash()
    if reopen_again:
        with _open(work) as s2:
            assert bodies(s2, "t", 0) == expected + [b"after"], cut


def _cut_points(pristine):
    path = segment_paths(pristine)[-1]
    ends = batch_ends(path)
    assert os.path.getsize(path) == ends[-1]
    return ends[-2], ends[-1]


@pytest.mark.slow
def test_torn_tail_cut_at_every_byte_of_the_last_batch(ram_tmp):
    """Truncate the active segment to every length between the end of the
    previous batch and the end of the file; each reopen sees exactly the whole
    batches, and appends continue right after them (checked again after a
    second reopen at every 50th cut)."""
    pristine, work = str(ram_tmp / "pristine"), str(ram_tmp / "work")
    _write_then_crash(pristine, 3, 2)
    prev_end, file_end = _cut_points(pristine)
    for i, cut in enumerate(range(prev_end, file_end + 1)):
        _check_cut(pristine, work, cut, file_end, reopen_again=(i % 50 == 0 or cut == file_end))


def test_torn_tail_cut_at_sampled_bytes_of_the_last_batch(tmp_path):
    """The fast tier of the test above: the framing boundaries and a stride."""
    pristine, work = str(tmp_path / "pristine"), str(tmp_path / "work")
    _write_then_crash(pristine, 3, 2)
    prev_end, file_end = _cut_points(pristine)
    cuts = sorted({prev_end, prev_end + 1, prev_end + 4, prev_end + 7, prev_end + 8,
                   prev_end + 9, file_end - 8, file_end - 1, file_end,
                   *range(prev_end, file_end, 97)})
    for cut in cuts:
        _check_cut(pristine, work, cut, file_end, reopen_again=True)


def _store_with_last_batch(url):
    s = _new_store(url, queues=1)
    _append_n(s, 3, size=20)
    s.append([msg("t", b"L0", 0), msg("t", b"L1", 0)])
    s._crash()
    sfs = StoreFS(url)
    rel = _newest_segment(sfs)
    data = sfs.read_bytes(rel)
    import pyarrow as pa
    return sfs, rel, data, seg.scan(pa.py_buffer(data)).positions[-1]


def test_torn_tail_on_every_backend(store_url):
    """The same on every backend (memory:// included), at a sample of cut points."""
    _sfs, _rel, data, prev_end = _store_with_last_batch(store_url + "-probe")
    for cut in (prev_end, prev_end + 1, prev_end + 8, (prev_end + len(data)) // 2,
                len(data) - 1, len(data)):
        url = f"{store_url}-{cut}"
        sfs, rel, data, _ = _store_with_last_batch(url)
        sfs.write(rel, data[:cut])
        with _open(url) as s:
            tail = [b"L0", b"L1"] if cut == len(data) else []
            assert bodies(s, "t", 0) == _expected(3, size=20) + tail, cut
            assert s.append([msg("t", b"after", 0)])[0].queue_offset == 3 + len(tail)
        with _open(url) as s:
            assert bodies(s, "t", 0)[-1] == b"after"


@pytest.mark.parametrize("tail", [b"\x00" * 4096, b"\xff\xff\xff\xff\x40\x00\x00\x00" + b"\x00" * 200,
                                  os.urandom(777), seg.EOS[:5]])
def test_garbage_or_zeros_after_the_tail(store_url, tail):
    s = _new_store(store_url, queues=1)
    res = _append_n(s, 7)
    s._crash()
    sfs = StoreFS(store_url)
    rel = _newest_segment(sfs)
    good = sfs.read_bytes(rel)
    sfs.write(rel, good + tail)                # preallocated zeros, a torn write, junk
    with _open(store_url) as s2:
        assert bodies(s2, "t", 0) == _expected(7)
        assert sfs.read_bytes(rel) == good + seg.EOS   # tail cut; sealed for the new writer
        r = s2.append([msg("t", b"after", 0)])[0]
        assert r.queue_offset == 7
        base = fmt.parse_segment_file(rel.rsplit("/", 1)[-1])
        assert r.physical_offset > base + len(good) > res[-1].physical_offset
    with _open(store_url) as s3:
        assert bodies(s3, "t", 0) == _expected(7) + [b"after"]


def test_abort_marker_without_lease_loss(store_url):
    """A clean close that died right before deleting ``abort``: recovery runs and loses nothing."""
    with _new_store(store_url) as s:
        _append_n(s, 4)
    StoreFS(store_url).write(fmt.abort_file(), b"left behind")
    with _open(store_url) as s2:
        assert s2.recovered_from_crash
        assert bodies(s2, "t", 0) == _expected(4)


def test_readers_of_a_crashed_store_see_the_published_version(store_url):
    s = _new_store(store_url)
    _append_n(s, 4)
    s.flush()
    _append_n(s, 4, start=4)
    s._crash()
    with Store.open(store_url, mode="r") as r:
        assert bodies(r, "t", 0) == _expected(4)


def test_crash_after_retention(store_url):
    clock = [1_700_000_000_000]
    s = _new_store(store_url)
    s.clock_ms = s.txlog.clock_ms = lambda: clock[0]
    _append_n(s, 60, size=300)
    s.flush()
    clock[0] += 400 * 3600 * 1000
    removed = s.run_retention(force_hour=True)
    assert removed
    floor = s.min_offset("t", 0)
    _append_n(s, 5, start=60, size=300)
    s._crash()
    with _open(store_url) as s2:
        assert s2.min_offset("t", 0) == floor
        assert bodies(s2, "t", 0, floor) == _expected(65 - floor, start=floor, size=300)


def test_crash_between_seal_and_new_segment(store_url):
    """The active segment got its end-of-stream marker (roll) but the next
    segment was never created: reopen treats it as sealed and rolls on append."""
    s = _new_store(store_url, queues=1)
    _append_n(s, 5)
    s.flush()
    _append_n(s, 3, start=5)
    s._crash()
    sfs = StoreFS(store_url)
    rel = _newest_segment(sfs)
    sfs.write(rel, sfs.read_bytes(rel) + seg.EOS)
    with _open(store_url) as s2:
        assert bodies(s2, "t", 0) == _expected(8)
        r = s2.append([msg("t", b"after", 0)])[0]
        assert r.queue_offset == 8
        assert _newest_segment(sfs) != rel          # appended into a new segment
        assert seg.scan(sfs.read_buffer(rel)).sealed
    with _open(store_url) as s3:
        assert bodies(s3, "t", 0) == _expected(8) + [b"after"]


def test_crash_around_adoption_of_staged_segments(store_url):
    """A staged segment written but not adopted is invisible after a crash; once
    adopted it survives the next crash, and a replayed adoption is skipped."""
    from helpers.storetools import segment_batch
    s = _new_store(store_url, queues=1)
    _append_n(s, 3)
    rel = fmt.staged_segment_file("job1", "task0")
    seg.write_segment(s.sfs, rel, [segment_batch(2, prefix=b"st")])
    s._crash()
    s = _open(store_url)
    assert bodies(s, "t", 0) == _expected(3)
    assert s.adopt([rel], app_id="job1", app_version=1).num_messages == 2
    s.append([msg("t", b"post", 0)])
    s._crash()
    with _open(store_url) as s2:
        assert bodies(s2, "t", 0) == _expected(3) + [b"st0", b"st1", b"post"]
        assert s2.adopt([rel], app_id="job1", app_version=1).skipped
        assert s2.append([msg("t", b"post2", 0)])[0].queue_offset == 6


def test_segment_files_removed_by_retention_are_deleted_after_a_crash(store_url):
    """Retention committed, then the writer died before deleting the files: the
    next writer deletes them once deletedFileRetentionMs has passed since the
    remove (the tombstones are in the log)."""
    clock = [1_700_000_000_000]
    s = _open(store_url, clock_ms=lambda: clock[0])
    s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    _append_n(s, 40, size=300)
    s.flush()
    clock[0] += 400 * 3600 * 1000
    removed = s.run_retention(force_hour=True)
    assert removed
    s._crash()
    sfs = StoreFS(store_url)
    assert all(sfs.exists(p) for p in removed)      # the crash left them behind
    clock[0] += 60_000                              # deletedFileRetentionMs (default)
    with _open(store_url, clock_ms=lambda: clock[0]) as s2:
        floor = s2.min_offset("t", 0)
        assert bodies(s2, "t", 0, floor) == _expected(40 - floor, start=floor, size=300)
    assert not any(sfs.exists(p) for p in removed)
    with _open(store_url) as s3:
        assert s3.min_offset("t", 0) == floor


def test_crash_after_a_publish_that_ran_between_write_and_dispatch(store_url, monkeypatch):
    """Crash point: the flush and publish services run after an append wrote its
    bytes but before it dispatched them (ASYNC_FLUSH threads can). The publish
    must not commit those bytes, or recovery skips them and shifts offsets."""
    from sparkmq import ASYNC_FLUSH
    s = _open(store_url, flushDiskType=ASYNC_FLUSH)
    s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    _append_n(s, 3)
    real_dispatch = s.dispatcher.dispatch

    def dispatch_late(batch, batch_offset, *hints):
        s.commitlog.flush(sync=True)      # the flush service ...
        s.publish()                       # ... and the publish service got in first
        return real_dispatch(batch, batch_offset, *hints)
    monkeypatch.setattr(s.dispatcher, "dispatch", dispatch_late)
    res = _append_n(s, 2, start=3)
    monkeypatch.setattr(s.dispatcher, "dispatch", real_dispatch)
    s.commitlog.flush(sync=True)
    s._crash()
    with _open(store_url) as s2:
        assert bodies(s2, "t", 0) == _expected(5)
        assert [s2.lookup(r.message_id).queue_offset for r in res] == [3, 4]
        assert s2.append([msg("t", b"next", 0)])[0].queue_offset == 5
