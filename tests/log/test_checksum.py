"""Every stored record batch carries a CRC32C checksum (format 2) and every read path checks
it before decoding: a damaged byte is a CorruptStoreError naming the file, the byte position
and what to do, never a wrong body."""
from __future__ import annotations

import pyarrow as pa
import pytest

from sparkmq import Snapshot, Store
from sparkmq.errors import CorruptStoreError
from sparkmq.log import checksum
from sparkmq.log import format as fmt
from sparkmq.log import segment as seg
from sparkmq.log.fs import StoreFS

from helpers.storetools import msg, segment_batch


def _store_with_messages(url: str) -> str:
    """A store with one sealed segment of 3 batches; returns that segment's path."""
    with Store.open(url, start_services=False) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        for i in range(3):
            s.append([msg("t", b"body-%d-%d" % (i, j) + b"x" * 50) for j in range(4)])
        s.flush()
        s.commitlog.roll()
        s.flush()
        return s.commitlog.segments()[0].path


def _flip(url: str, rel: str, pos: int) -> None:
    sfs = StoreFS(url)
    data = bytearray(sfs.read_bytes(rel))
    data[pos] ^= 0x10
    sfs.write(rel, bytes(data))
    sfs.forget(rel)


def _body_position(url: str, rel: str, body: bytes) -> tuple[int, int]:
    """(byte position of ``body`` in the file, position of the batch message holding it)."""
    data = StoreFS(url).read_bytes(rel)
    at = data.index(body)
    res = seg.scan(pa.py_buffer(data))
    return at, max(p for p in res.positions if p < at)


def test_every_batch_carries_a_checksum_and_plain_pyarrow_still_reads_it(store_url):
    rel = _store_with_messages(store_url)
    data = StoreFS(store_url).read_bytes(rel)
    buf = pa.py_buffer(data)
    res = seg.scan(buf)
    assert len(res.positions) == 3 and res.sealed
    for p, n in zip(res.positions, res.lengths):
        assert checksum.verify(buf.slice(p, n), rel, p) is True
    assert seg.segment_format(buf) == fmt.FORMAT_VERSION == 2
    assert pa.ipc.open_stream(data).read_all().num_rows == 12


@pytest.mark.parametrize("how", ["Store.read", "Store.read_table", "Snapshot.read_table"])
def test_a_flipped_body_byte_is_a_corrupt_store_error(store_url, how):
    rel = _store_with_messages(store_url)
    at, batch_pos = _body_position(store_url, rel, b"body-1-2")
    _flip(store_url, rel, at)
    with Store.open(store_url, mode="r") as s:
        with pytest.raises(CorruptStoreError) as exc:
            if how == "Store.read":
                s.read("t", 0, 0, 100)
            elif how == "Store.read_table":
                s.read_table("t", 0, 0)
            else:
                Snapshot.load(store_url).read_table("t", 0, 0)
        # the undamaged batch before it still reads
        assert [m.body[:8] for m in s.read("t", 0, 0, 4)] == [b"body-0-%d" % j for j in range(4)]
    text = str(exc.value)
    assert rel in text and f"byte {batch_pos}" in text
    assert "sparkmq admin verify" in text and "replica" in text


def test_a_flipped_header_byte_is_caught_before_pyarrow_parses_it(local_store_url):
    rel = _store_with_messages(local_store_url)
    _, batch_pos = _body_position(local_store_url, rel, b"body-1-2")
    for delta in (5, 24, 60):               # metadata length, flatbuffer offsets, buffers
        _flip(local_store_url, rel, batch_pos + delta)
        with Store.open(local_store_url, mode="r") as s:
            with pytest.raises(CorruptStoreError, match=rel):
                s.read_table("t", 0, 0)
        _flip(local_store_url, rel, batch_pos + delta)     # flip back
    with Store.open(local_store_url, mode="r") as s:
        assert s.read_table("t", 0, 0).num_rows == 12


def test_a_format_2_batch_without_a_checksum_is_refused(tmp_path):
    sfs = StoreFS(str(tmp_path))
    rel = fmt.segment_file(0)
    raw = segment_batch(2).serialize().to_pybytes()        # no checksum metadata
    sfs.write(rel, seg.SCHEMA_BYTES + raw + seg.EOS)
    buf = sfs.read_buffer(rel)
    with pytest.raises(CorruptStoreError, match="checksum is missing"):
        seg.read_batch_at(buf, seg.HEADER_SIZE, rel)


def test_a_format_1_segment_reads_without_checksums(tmp_path):
    v1_schema = fmt.SEGMENT_SCHEMA.with_metadata({b"sparkmq.format": b"1"})
    header = v1_schema.serialize().to_pybytes()
    raw = segment_batch(2, prefix=b"old").serialize().to_pybytes()
    buf = pa.py_buffer(header + raw + seg.EOS)
    assert seg.segment_format(buf) == 1
    batch = seg.read_batch_at(buf, len(header), "old.arrow")
    assert batch.column("body").to_pylist() == [b"old0", b"old1"]


def test_the_remote_read_path_checks_too(store_url):
    rel = _store_with_messages(store_url)
    at, batch_pos = _body_position(store_url, rel, b"body-2-0")
    _flip(store_url, rel, at)
    sfs = StoreFS(store_url)
    with pytest.raises(CorruptStoreError, match=f"byte {batch_pos}"):
        seg.read_remote_batch(sfs, rel, batch_pos)
    batch, _ = seg.read_remote_batch(sfs, rel, seg.HEADER_SIZE)
    assert batch.num_rows == 4


def test_the_in_memory_active_segment_checks_too():
    """Object stores keep the active segment in the writer's buffer: reads from it are
    checked and name the batch's real position."""
    import uuid
    sfs = StoreFS(f"memory://sparkmq-test-{uuid.uuid4().hex}")
    w = seg.SegmentWriter(sfs, fmt.segment_file(0), 0, create=True)
    first = w.append(seg.serialize_batch(segment_batch(2, prefix=b"a")))
    second = w.append(seg.serialize_batch(segment_batch(2, prefix=b"b")))
    assert w.read_buffered_batch(second)[0].column("body").to_pylist() == [b"b0", b"b1"]
    w._buffer[len(w._buffer) - 20] ^= 0x01           # a body byte of the second batch
    with pytest.raises(CorruptStoreError, match=f"byte {second}"):
        w.read_buffered_batch(second)
    assert w.read_buffered_batch(first)[0].num_rows == 2
    w.close()
