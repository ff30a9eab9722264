"""sparkmq._ipc, the C writer of a record batch's IPC message: a segment batch written by it
reads back as the same batch, with the same body bytes as pyarrow's writer and a checksum
that verifies; what it does not lay out falls back to pyarrow; a Flight ack written from
buffers reads as the ack pyarrow writes, and one of the broker's ids is written whole
in one call (``id_ack``) as the same bytes."""
from __future__ import annotations

import crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from sparkmq import _ipc, _screen     # the suite requires the C writer: see the first test
from sparkmq.broker.flight import _ACK_SCHEMA_MESSAGE, ACK_SCHEMA, _ack_stream, _broker_ids_ack
from sparkmq.log import checksum, format as fmt, segment
from sparkmq.log.batch import build_segment_batch
from sparkmq.log.built import build_rows
from sparkmq.log.message import batch_message_ids, encode_message_id, id_prefix
from sparkmq.log.segment import EOS

_TEXT = st.text(alphabet=st.sampled_from(list("ab |\té\u3000")), max_size=6)
_ROW = st.fixed_dictionaries({
    "topic": st.sampled_from(["t", "topic-b"]), "body": st.binary(max_size=40),
    "queue_id": st.integers(0, 7), "tags": st.none() | _TEXT,
    "keys": st.none() | st.lists(_TEXT, max_size=3),
    "properties": st.none() | st.lists(st.tuples(_TEXT, st.none() | _TEXT), max_size=3),
    "born_timestamp": st.none() | st.integers(0, 2**41),
    "born_host": st.none() | _TEXT, "delivery_timestamp": st.none() | st.integers(0, 2**41),
    "message_group": st.none() | _TEXT, "transaction_id": st.none() | _TEXT,
    "unique_key": st.none() | _TEXT, "reconsume_times": st.integers(0, 16),
    "message_type": st.integers(0, 3)})


def _batch(rows: list[dict]) -> pa.RecordBatch:
    n = len(rows)
    cols = {name: [r[name] for r in rows] for name in rows[0]}
    cols["delivery_timestamp"] = pa.array(cols["delivery_timestamp"], fmt.TS)   # nulls
    return build_segment_batch(cols, n, store_host="10.0.0.9:10911", now_ms=1_700_000_000_000)


def _pyarrow_message(batch: pa.RecordBatch) -> bytes:
    """What serialize_batch writes without the C module."""
    sink = pa.BufferOutputStream()
    writer = pa.ipc.RecordBatchStreamWriter(sink, batch.schema)
    writer.write_batch(batch, custom_metadata=checksum.CUSTOM_METADATA)
    stream = sink.getvalue().to_pybytes()[len(segment.SCHEMA_BYTES):]
    return bytes(checksum.seal(stream))


def _decoded(msg) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(bytes(msg))),
                                    fmt.SEGMENT_SCHEMA)


def test_the_c_writer_is_built_and_serializes_segment_batches():
    """The suite runs with the C writer (setup.py builds it; ./dev reinstalls on change):
    serialize_batch's bytes are its, not pyarrow's (its metadata is laid out otherwise)."""
    assert segment._ipc is _ipc
    batch = _batch([{"topic": "t", "body": b"x", "queue_id": 0, "tags": None, "keys": None,
                     "properties": None, "born_timestamp": 5, "born_host": None,
                     "delivery_timestamp": None, "message_group": None,
                     "transaction_id": None, "unique_key": None, "reconsume_times": 0,
                     "message_type": 0}])
    ours = segment.serialize_batch(batch).to_pybytes()
    assert ours != _pyarrow_message(batch)
    assert _decoded(ours).equals(batch)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(_ROW, min_size=1, max_size=6), cut=st.integers(0, 6))
def test_a_segment_batch_written_in_c_reads_back_as_pyarrows(rows, cut):
    """Decoded, the batch is the one given and passes pyarrow's full validation (every
    offset within its data); the checksum verifies, and is where a reader looks; the
    header gives the message's length; a segment of such messages reads with pyarrow's
    stream reader and with the store's reader. A slice (an offset into its arrays) takes
    pyarrow's path and reads back the same. (The bodies are pyarrow's but for the
    offsets buffer of an empty array, which pyarrow writes as the array holds it.)"""
    batch = _batch(rows)
    for b in (batch, batch.slice(min(cut, len(rows) - 1))):
        msg = segment.serialize_batch(b).to_pybytes()
        decoded = _decoded(msg)
        decoded.validate(full=True)
        assert decoded.equals(b)
        assert _decoded(_pyarrow_message(b)).equals(decoded)
        assert checksum.verify(memoryview(msg), "test", 0)
        assert segment.message_extent(msg, 0) == len(msg) and len(msg) % 8 == 0
        whole = segment.SCHEMA_BYTES + msg + msg + segment.EOS
        assert pa.ipc.open_stream(whole).read_all().equals(pa.Table.from_batches([b, b]))
        assert segment.read_batch_at(pa.py_buffer(whole), len(segment.SCHEMA_BYTES)).equals(b)
    assert _ipc.record_batch_message(*batch.slice(1).__arrow_c_array__(),
                                     *checksum.SEAL_ARGS) is None


def test_a_damaged_c_written_message_fails_its_checksum():
    batch = _batch([dict(topic="t", body=b"payload", queue_id=1, tags="a", keys=["k"],
                         properties=[("p", "v")], born_timestamp=1, born_host="h",
                         delivery_timestamp=None, message_group=None, transaction_id=None,
                         unique_key="id", reconsume_times=0, message_type=0)])
    msg = bytearray(segment.serialize_batch(batch).to_pybytes())
    msg[-9] ^= 0x01                                 # a bit of the body
    with pytest.raises(Exception, match="CRC32C mismatch"):
        checksum.verify(memoryview(bytes(msg)), "seg", 0)


def test_what_the_c_writer_does_not_lay_out_is_refused_not_guessed():
    """A type it does not know, a dictionary, or checksum digits a reader would not find
    there (the mark's text earlier in the metadata) give None: the caller uses pyarrow."""
    for col in (pa.array(["a", "b"], pa.large_string()),
                pa.array(["a", "a"]).dictionary_encode(), pa.array([1, 2], pa.decimal128(4, 1))):
        b = pa.RecordBatch.from_arrays([col], names=["c"])
        assert _ipc.record_batch_message(*b.__arrow_c_array__(), None, None) is None
    b = pa.RecordBatch.from_arrays([pa.array([1, 2], pa.int32())], names=["c"])
    assert _ipc.record_batch_message(*b.__arrow_c_array__(), b"crc32c:", b"crc32c:00000000",
                                     crc32c.crc32c) is None
    unsealed = _ipc.record_batch_message(*b.__arrow_c_array__(), None, None)
    assert pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(bytes(unsealed))),
                                    b.schema).equals(b)


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.text(max_size=40), min_size=0, max_size=8),
       late=st.booleans())
def test_a_flight_ack_written_from_buffers_is_the_one_pyarrow_writes(ids, late):
    n = len(ids)
    qids = np.arange(n, dtype=np.int64) % 4            # (as a send's results carry them)
    qos = np.arange(n, dtype=np.int64) * 7 + 2**40
    schema = _ACK_SCHEMA_MESSAGE if not late else ACK_SCHEMA.with_metadata(
        {"status": "MASTER_PERSISTENCE_TIMEOUT", "message": "late"}).serialize()
    got = pa.ipc.open_stream(_ack_stream(schema, qids, qos, pa.array(ids, pa.string())))
    want = pa.RecordBatch.from_arrays([pa.array(qids, pa.int32()), pa.array(qos),
                                       pa.array(ids, pa.string())], schema=ACK_SCHEMA)
    assert got.read_all().equals(pa.Table.from_batches([want]))
    assert (got.schema.metadata or {}).get(b"message") == (b"late" if late else None)
    sliced = pa.array(["x"] + ids, pa.string()).slice(1)    # an offset: pyarrow's path
    assert pa.ipc.open_stream(_ack_stream(schema, qids, qos, sliced)).read_all().equals(
        pa.Table.from_batches([want]))


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 300), first=st.integers(0, 2**32 - 301), late=st.booleans(),
       batch_offset=st.integers(0, 2**63 - 1), tag=st.integers(0, 2**32 - 1))
def test_a_flight_ack_of_the_brokers_ids_is_written_whole_in_one_call(n, first, late,
                                                                      batch_offset, tag):
    # _ipc.id_ack writes the same bytes as the ack of batch_message_ids' array (rows up to
    # 0xFFFFFFFF: the ids' 8 row digits; id_ack leaves rows past it to that path)
    qids = np.arange(n, dtype=np.int64) % 4
    qos = np.arange(n, dtype=np.int64) * 3 + 5
    schema = _ACK_SCHEMA_MESSAGE if not late else ACK_SCHEMA.with_metadata(
        {"status": "MASTER_PERSISTENCE_TIMEOUT", "message": "late"}).serialize()
    got = _broker_ids_ack(schema, qids, qos, tag, batch_offset, first)
    want = _ack_stream(schema, qids, qos, batch_message_ids(tag, batch_offset, n, first))
    assert got.equals(want)
    assert _ipc.id_ack(schema, EOS, qids.astype(np.int32), qos,
                       id_prefix(tag, batch_offset).encode(), first) == want.to_pybytes()
    if n:                                        # a row past 0xFFFFFFFF: not written here
        assert _ipc.id_ack(schema, EOS, qids.astype(np.int32), qos, b"0" * 24,
                           2**32 - n + 1) is None
    table = pa.ipc.open_stream(got).read_all()
    assert table.column("message_id").to_pylist() == [
        encode_message_id(tag, batch_offset, first + j) for j in range(n)]


def test_id_ack_refuses_columns_of_different_lengths():
    prefix = id_prefix(1, 2).encode()
    assert _ipc.id_ack(_ACK_SCHEMA_MESSAGE, EOS, np.zeros(3, np.int32), np.zeros(2, np.int64),
                       prefix, 0) is None
    with pytest.raises(ValueError, match="24-byte prefix"):
        _ipc.id_ack(_ACK_SCHEMA_MESSAGE, EOS, np.zeros(1, np.int32), np.zeros(1, np.int64),
                    b"short", 0)


def test_a_batch_over_a_mib_is_written_whole():
    """(Its body is copied with the GIL released: the same bytes.)"""
    n = 1200
    batch = build_segment_batch({"topic": ["t"] * n, "body": [bytes([i % 251]) * 1000
                                                            for i in range(n)]},
                                n, store_host="h", now_ms=1)
    msg = segment.serialize_batch(batch)
    assert len(msg) > 1 << 20 and checksum.verify(memoryview(msg), "big", 0)
    assert _decoded(msg.to_pybytes()).equals(batch)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(_ROW, min_size=1, max_size=4))
def test_the_arrays_exported_alone_write_the_same_message(rows):
    """BuiltRows exports a batch's arrays alone into ``array_capsule`` beside the segment
    schema's export made once: the C writer and the screen read it as the full export."""
    cols = {name: [r[name] for r in rows] for name in rows[0]}
    cols["delivery_timestamp"] = pa.array(cols["delivery_timestamp"], fmt.TS)
    built = build_rows(cols, len(rows), store_host="10.0.0.9:10911", now_ms=1_700_000_000_000)
    alone, full = built.c_array(), built.batch.__arrow_c_array__()
    assert alone[1] is not full[1]
    assert _ipc.record_batch_message(*alone, *checksum.SEAL_ARGS) == \
        _ipc.record_batch_message(*full, *checksum.SEAL_ARGS)
    limits = (4 << 20, 16 << 10, 128, 64, 128)
    assert _screen.screen(*alone, limits, ()) == _screen.screen(*full, limits, ())
    capsule, address = _ipc.array_capsule()      # never filled: goes without a release
    assert address and type(capsule).__name__ == "PyCapsule"
    del capsule
