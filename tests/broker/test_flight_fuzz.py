"""Any batch a Flight client can send (hypothesis: columns of the send schema and others, of
any of a dozen types, strings that are not UTF-8, nulls, empty values, zero rows) is either
stored and acked row for row, or refused with a clear error (INVALID_ARGUMENT, or a
protocol status: never INTERNAL, never a traceback in the broker's log) that stores
nothing; the next good batch is stored either way. Driven with plain ``pyarrow.flight``
against the broker's real Flight server on 127.0.0.1."""
from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.brokers import ErrorRecords
from helpers.net import free_port

pytestmark = pytest.mark.integration

SEND = fl.FlightDescriptor.for_path("send")
NAMES = ["topic", "body", "tags", "keys", "properties", "message_group", "unique_key",
         "born_timestamp", "born_host", "queue_id", "colour"]
TEXT = st.text(alphabet=st.sampled_from(list("Tab |\t\u3000é-_%")), max_size=6)
RAW = st.binary(max_size=6) | st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80"])


def _raw_strings(values: list[bytes]) -> pa.Array:
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


@st.composite
def _column(draw, n: int) -> pa.Array:
    kind = draw(st.sampled_from(["text", "raw", "binary", "int", "ts", "list", "map",
                                 "null", "dict", "topic"]))
    maybe = lambda s: st.none() | s   # noqa: E731
    if kind == "text":
        return pa.array(draw(st.lists(maybe(TEXT), min_size=n, max_size=n)), pa.string())
    if kind == "raw":
        return _raw_strings(draw(st.lists(RAW, min_size=n, max_size=n)))
    if kind == "binary":
        return pa.array(draw(st.lists(maybe(st.binary(max_size=8)), min_size=n, max_size=n)),
                        pa.binary())
    if kind == "int":
        return pa.array(draw(st.lists(maybe(st.integers(-2**63, 2**63 - 1)),
                                      min_size=n, max_size=n)), pa.int64())
    if kind == "ts":
        return pa.array(draw(st.lists(maybe(st.integers(-2**62, 2**62)), min_size=n,
                                      max_size=n)), pa.timestamp("ms", tz="UTC"))
    if kind == "list":
        return pa.array(draw(st.lists(maybe(st.lists(TEXT, max_size=2)), min_size=n,
                                      max_size=n)), pa.list_(pa.string()))
    if kind == "map":
        return pa.array(draw(st.lists(maybe(st.lists(st.tuples(TEXT, TEXT), max_size=2)),
                                      min_size=n, max_size=n)), pa.map_(pa.string(), pa.string()))
    if kind == "null":
        return pa.nulls(n)
    if kind == "dict":
        return pa.array(draw(st.lists(st.sampled_from(["T", "a"]), min_size=n, max_size=n)),
                        pa.string()).dictionary_encode()
    return pa.array(draw(st.lists(st.sampled_from(["T", "Nope", "", "RMQ_SYS_X", "T"]),
                                  min_size=n, max_size=n)), pa.string())


@st.composite
def _batches(draw) -> pa.RecordBatch:
    n = draw(st.integers(0, 5))
    names = draw(st.lists(st.sampled_from(NAMES), max_size=5))
    if draw(st.booleans()):          # mostly a batch that could be right
        names = ["topic", "body"] + names
    cols = []
    for name in names:
        if name == "topic" and draw(st.booleans()):
            cols.append(pa.array(["T"] * n, pa.string()))
        elif name == "body" and draw(st.booleans()):
            cols.append(pa.array(draw(st.lists(st.binary(max_size=8), min_size=n,
                                               max_size=n)), pa.binary()))
        else:
            cols.append(draw(_column(n)))
    return pa.RecordBatch.from_arrays(cols, names=names) if names else \
        pa.RecordBatch.from_arrays([pa.array(["T"] * n)], names=["tags"])


@pytest.fixture
def broker(make_broker):
    b = make_broker(flightEnable="true", flightPort=free_port(), autoCreateTopicEnable="false")
    b.store.create_topic("T", read_queue_nums=2, write_queue_nums=2)
    return b


def _put(client, batch: pa.RecordBatch) -> pa.Table:
    writer, reader = client.do_put(SEND, batch.schema,
                                   options=fl.FlightCallOptions(timeout=30))
    try:
        writer.write_batch(batch)
        ack = reader.read()
        writer.done_writing()
    finally:
        writer.close()
    return pa.ipc.open_stream(ack).read_all()


@settings(deadline=None, max_examples=150,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=_batches())
def test_any_batch_is_stored_row_for_row_or_refused_clearly(broker, batch):
    client = fl.FlightClient(f"grpc+tcp://127.0.0.1:{broker.flight_port}")
    errors = ErrorRecords()
    logging.getLogger("sparkmq").addHandler(errors)
    try:
        before = broker.store.commitlog.written_offset
        try:
            ack = _put(client, batch)
        except (fl.FlightInternalError, fl.FlightServerError) as e:
            pytest.fail(f"an internal error for a client's batch: {e}")
        except pa.ArrowException as e:   # a refusal: INVALID_ARGUMENT or a protocol status
            assert "SPARKMQ_" in str(e) or "descriptor" in str(e), e
            assert broker.store.commitlog.written_offset == before
        else:
            assert ack.num_rows == batch.num_rows > 0
            assert broker.store.commitlog.written_offset > before
        assert _put(client, pa.RecordBatch.from_pydict(
            {"topic": ["T"], "body": [b"good"]})).num_rows == 1
        assert errors.records == []
    finally:
        logging.getLogger("sparkmq").removeHandler(errors)
        client.close()
