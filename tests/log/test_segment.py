"""Segments: the Arrow IPC stream framing, torn-tail scan, EOS, writer."""
from __future__ import annotations

import pyarrow as pa
import pytest

from sparkmq.errors import CorruptStoreError
from sparkmq.log import format as fmt
from sparkmq.log import segment as seg
from sparkmq.log.fs import StoreFS

from helpers.storetools import segment_batch


@pytest.fixture
def sfs(store_url):
    return StoreFS(store_url)


def _bytes(batches, eos=True) -> bytes:
    parts = [seg.SCHEMA_BYTES] + [seg.serialize_batch(b).to_pybytes() for b in batches]
    return b"".join(parts) + (seg.EOS if eos else b"")


def test_sealed_segment_is_a_readable_arrow_stream(sfs):
    batches = [segment_batch(3, prefix=b"a"), segment_batch(2, prefix=b"b")]
    size = seg.write_segment(sfs, fmt.segment_file(0), batches)
    data = sfs.read_bytes(fmt.segment_file(0))
    assert size == len(data)
    table = pa.ipc.open_stream(data).read_all()
    assert table.column("body").to_pylist() == [b"a0", b"a1", b"a2", b"b0", b"b1"]
    assert table.schema.equals(fmt.SEGMENT_SCHEMA)


def test_scan_finds_every_batch_and_the_eos(sfs):
    batches = [segment_batch(1), segment_batch(4), segment_batch(2)]
    seg.write_segment(sfs, fmt.segment_file(0), batches)
    buf = sfs.read_buffer(fmt.segment_file(0))
    res = seg.scan(buf)
    assert res.sealed
    assert len(res.positions) == 3
    assert res.positions[0] == seg.HEADER_SIZE
    assert res.valid_end + len(seg.EOS) == len(buf)
    rows = [seg.read_batch_at(buf, p).num_rows for p in res.positions]
    assert rows == [1, 4, 2]
    assert [p for p, _ in seg.iter_batches(buf, seg.HEADER_SIZE, res.valid_end)] == res.positions


def test_scan_stops_at_every_torn_length():
    batches = [segment_batch(2, prefix=b"x"), segment_batch(3, prefix=b"y")]
    data = _bytes(batches, eos=False)
    whole = seg.scan(pa.py_buffer(data))
    first_end = whole.positions[1]
    for cut in range(first_end, len(data)):
        res = seg.scan(pa.py_buffer(data[:cut]))
        assert res.positions == [seg.HEADER_SIZE], cut
        assert res.valid_end == first_end, cut
        assert not res.sealed
    assert seg.scan(pa.py_buffer(data)).valid_end == len(data)


def test_scan_of_a_torn_header_is_empty():
    for cut in (0, 10, seg.HEADER_SIZE - 1):
        res = seg.scan(pa.py_buffer(seg.SCHEMA_BYTES[:cut]))
        assert res.valid_end == 0 and res.positions == []


def test_scan_with_validate_stops_at_zeros_and_garbage():
    data = _bytes([segment_batch(2)], eos=False)
    end = len(data)
    for tail in (b"\x00" * 64, b"\xff\xff\xff\xff" + b"\x10\x00\x00\x00" + b"\x00" * 40,
                 bytes(range(256))):
        res = seg.scan(pa.py_buffer(data + tail), validate=True)
        assert res.valid_end == end
        assert len(res.positions) == 1


def test_read_batch_at_a_wrong_position_is_corrupt():
    data = _bytes([segment_batch(2)])
    with pytest.raises(CorruptStoreError):
        seg.read_batch_at(pa.py_buffer(data), 3)


def test_message_length_reports_eos_and_torn():
    data = _bytes([segment_batch(1)])
    buf = pa.py_buffer(data)
    res = seg.scan(buf)
    assert seg.message_length(buf, res.valid_end) == 0          # EOS
    assert seg.message_length(pa.py_buffer(data[:-3]), res.valid_end) is None
    assert seg.message_length(buf, seg.HEADER_SIZE) == res.lengths[0]


def test_writer_appends_flushes_and_reopens(sfs):
    rel = fmt.segment_file(4096)
    w = seg.SegmentWriter(sfs, rel, 4096, create=True)
    assert w.size == seg.HEADER_SIZE
    pos1 = w.append(seg.serialize_batch(segment_batch(2, prefix=b"p")))
    pos2 = w.append(seg.serialize_batch(segment_batch(1, prefix=b"q")))
    assert pos1 == seg.HEADER_SIZE and pos2 > pos1
    assert w.flush(sync=True) == w.size
    w.close()
    buf = sfs.read_buffer(rel)
    res = seg.scan(buf)
    assert res.positions == [pos1, pos2] and not res.sealed
    w2 = seg.SegmentWriter(sfs, rel, 4096, create=False)
    assert w2.size == len(buf)
    w2.append(seg.EOS)
    w2.flush(sync=True)
    w2.close()
    assert seg.scan(sfs.read_buffer(rel)).sealed


def test_writer_refuses_to_create_over_an_existing_local_file(local_store_url):
    sfs = StoreFS(local_store_url)
    rel = fmt.segment_file(0)
    seg.SegmentWriter(sfs, rel, 0, create=True).close()
    with pytest.raises(FileExistsError):
        seg.SegmentWriter(sfs, rel, 0, create=True)


def test_a_writer_allocates_ahead_without_growing_the_file_and_gives_it_back(local_store_url):
    """With ``reserve``, the blocks ahead of the end are allocated (``st_blocks``) while the
    file's size is its bytes, which read back as a plain segment; closing gives the
    blocks back. Where this file system cannot preallocate, appends go on without."""
    import os

    from sparkmq.log.fs import preallocate
    sfs = StoreFS(local_store_url)
    rel = fmt.segment_file(0)
    reserve = 4 << 20
    w = seg.SegmentWriter(sfs, rel, 0, create=True, reserve=reserve)
    path = sfs.local_path(rel)
    first = seg.serialize_batch(segment_batch(3, prefix=b"a"))
    w.append(first)
    with open(path + ".probe", "wb") as probe:               # (ext4, xfs, tmpfs: yes)
        supported = preallocate(probe.fileno(), 0, 4096)
    os.unlink(path + ".probe")
    positions = [seg.HEADER_SIZE] + [w.append(seg.serialize_batch(segment_batch(2, prefix=b"b")))
                                     for _ in range(3)]
    st = os.stat(path)
    assert st.st_size == w.size                          # the size is the bytes, no more
    if supported:
        assert st.st_blocks * 512 >= reserve             # the blocks ahead are the file's
    res = seg.scan(sfs.read_buffer(rel))
    assert res.positions == positions and not res.sealed
    w.flush(sync=True)
    w.close()
    st = os.stat(path)
    assert st.st_size == res.valid_end and st.st_blocks * 512 < reserve    # given back
    assert seg.scan(sfs.read_buffer(rel)).positions == positions


def test_a_writer_that_cannot_allocate_ahead_appends_as_before(local_store_url, monkeypatch):
    """A file system without ``fallocate`` (or without space for the blocks ahead): the
    writer stops asking for this segment and every append still lands."""
    asked = []
    monkeypatch.setattr(seg, "preallocate", lambda fd, off, n: asked.append(n) or False)
    sfs = StoreFS(local_store_url)
    w = seg.SegmentWriter(sfs, fmt.segment_file(0), 0, create=True, reserve=1 << 20)
    positions = [w.append(seg.serialize_batch(segment_batch(1, prefix=b"x"))) for _ in range(5)]
    w.close()
    assert asked == [1 << 20]                             # asked once, then not again
    assert seg.scan(sfs.read_buffer(fmt.segment_file(0))).positions == positions


def test_message_extent_needs_only_the_header():
    """The replica's walk: a message's length from its prefix and metadata alone,
    equal to message_length's; None while the header is cut; 0 at the EOS;
    NOT_A_MESSAGE for other bytes."""
    import struct
    data = _bytes([segment_batch(1), segment_batch(300, prefix=b"x" * 50), segment_batch(7)])
    buf = pa.py_buffer(data)
    assert seg.message_extent(data, 0) == seg.header_length(buf)
    pos = seg.HEADER_SIZE
    seen = 0
    while True:
        n = seg.message_length(buf, pos)
        if n == 0:
            break
        meta = 8 + struct.unpack_from("<i", data, pos + 4)[0]
        assert seg.message_extent(data[:pos + meta], pos) == n     # no body needed
        assert seg.message_extent(memoryview(data)[:pos + meta - 1], pos) is None
        assert seg.message_extent(data[:pos + 7], pos) is None
        pos += n
        seen += 1
    assert seen == 3 and seg.message_extent(data, pos) == 0
    assert seg.message_extent(b"\x00" * 64, 0) == seg.NOT_A_MESSAGE
    assert seg.message_extent(b"\xff\xff\xff\xff\x10\x00\x00\x00" + b"\xff" * 16, 0) == \
        seg.NOT_A_MESSAGE
