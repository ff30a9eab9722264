"""The broker's two send paths hold a message to one set of rules: the same messages sent
as a RocketMQ SendMessage request and as a Flight DoPut batch are both refused whole (the
row Flight names gets the same status alone over RocketMQ) or stored as the same rows
(hypothesis; one in-process broker, a fresh pair of topics per example, the RocketMQ
request handled in process)."""
from __future__ import annotations

import itertools
import re

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from helpers.brokers import GrpcContext
from helpers.net import free_port
from sparkmq.broker.grpc_service import MessagingServicer
from sparkmq.broker.protocol import Code
from sparkmq.log import format as fmt

pytestmark = pytest.mark.integration

BORN_MS = 1_700_000_000_123
_TEXT = st.text(alphabet=st.sampled_from(list("ab |\t\u3000é")), max_size=5)
_MESSAGE = st.fixed_dictionaries({
    "body": st.binary(max_size=12), "tag": st.none() | _TEXT,
    "keys": st.lists(_TEXT, max_size=2),
    "properties": st.dictionaries(_TEXT | st.sampled_from(["KEYS", "UNIQ_KEY", "TRACE_ON"]),
                                  _TEXT, max_size=2),
    "group": st.none() | _TEXT})
_topics = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    from helpers.brokers import broker_config
    from sparkmq.broker import Broker
    b = Broker(broker_config(tmp_path_factory.mktemp("paths"), "paths", flightEnable="true",
                             flightPort=free_port(), autoCreateTopicEnable="false")).start()
    yield b
    b.stop()


def _rocketmq(broker, topic: str, msgs: list[dict]) -> str | None:
    """Send as one SendMessage request; None, or the status name refusing it (a bad
    message refuses the whole request, as the proxy)."""
    out = []
    for i, m in enumerate(msgs):
        p = pb.Message(topic=pb.Resource(name=topic), body=m["body"])
        s = p.system_properties
        s.message_id, s.born_host = f"ID-{i}", "h"
        s.born_timestamp.FromMilliseconds(BORN_MS)
        s.message_type = pb.FIFO if m["group"] else pb.NORMAL   # (an empty group is none)
        if m["tag"] is not None:
            s.tag = m["tag"]
        if m["group"] is not None:
            s.message_group = m["group"]
        s.keys.extend(m["keys"])
        p.user_properties.update(m["properties"])
        out.append(p)
    resp = MessagingServicer(broker).send_message(spb.SendMessageRequest(messages=out),
                                                  GrpcContext("paths"))
    if resp.status.code == Code.OK:
        assert len(resp.entries) == len(msgs)
        return None
    assert not resp.entries, resp
    return Code.Name(resp.status.code)


def _flight(broker, topic: str, msgs: list[dict]) -> str | None:
    """Send as one DoPut batch; None, or the error's text."""
    n = len(msgs)
    batch = pa.RecordBatch.from_pydict({
        "topic": [topic] * n, "body": [m["body"] for m in msgs],
        "tags": pa.array([m["tag"] for m in msgs], pa.string()),
        "keys": pa.array([m["keys"] or None for m in msgs], pa.list_(pa.string())),
        "properties": pa.array([list(m["properties"].items()) or None for m in msgs],
                               pa.map_(pa.string(), pa.string())),
        "message_group": pa.array([m["group"] for m in msgs], pa.string()),
        "unique_key": [f"ID-{i}" for i in range(n)], "born_host": ["h"] * n,
        "born_timestamp": pa.array([BORN_MS] * n, pa.int64()).cast(fmt.TS)})
    return _flight_batch(broker, batch)


def _flight_batch(broker, batch: pa.RecordBatch) -> str | None:
    """Send ``batch`` as one DoPut batch; None, or the error's text."""
    client = fl.FlightClient(f"grpc+tcp://127.0.0.1:{broker.flight_port}")
    try:
        writer, reader = client.do_put(fl.FlightDescriptor.for_path("send"), batch.schema)
        writer.write_batch(batch)
        reader.read()
        writer.done_writing()
        writer.close()
    except (pa.ArrowException, fl.FlightError) as e:
        return str(e)
    finally:
        client.close()
    return None


def _rows(broker, topic: str) -> list[dict]:
    got = broker.store.read_table(topic, 0, 0).to_pylist()
    return [{k: dict(v) if k == "properties" and v else v for k, v in r.items()   # a map's
             if k not in ("topic", "physical_offset", "message_id", "store_timestamp")}
            for r in got]                                                      # order: none


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(msgs=st.lists(_MESSAGE, min_size=1, max_size=3))
def test_the_rocketmq_and_flight_paths_refuse_or_store_alike(broker, msgs):
    k = next(_topics)
    for topic in (f"R{k}", f"F{k}"):
        broker.store.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
    refused = _rocketmq(broker, f"R{k}", msgs)
    failed = _flight(broker, f"F{k}", msgs)
    if not refused:
        assert failed is None
        assert _rows(broker, f"R{k}") == _rows(broker, f"F{k}")
    else:     # both refuse the whole batch, Flight for a row the RocketMQ path refuses alike
        assert failed is not None
        found = re.search(r"SPARKMQ_MESSAGE_LIMIT: (\w+): row (\d+):", failed)
        assert found, failed
        assert _rocketmq(broker, f"R{k}", [msgs[int(found[2])]]) == found[1], (refused, failed)
        assert _rows(broker, f"F{k}") == [] and _rows(broker, f"R{k}") == []


def test_a_plain_flight_batch_is_composed_in_c_and_stored_as_built(broker):
    # the usual send (one topic, no message group or queue id) is composed in C
    # (log/built.py); one with a message group is built in pyarrow: both store alike
    pytest.importorskip("sparkmq._compose", reason="the C module is not built here")
    from sparkmq.broker.batchsend import typed
    k = next(_topics)
    broker.store.create_topic(f"C{k}", read_queue_nums=1, write_queue_nums=1)
    plain = typed(pa.RecordBatch.from_pydict({"topic": [f"C{k}"] * 2, "body": [b"a", b"b"],
                                              "tags": ["t", None]}))
    grouped = plain.append_column("message_group", pa.array(["g", None]))
    core = broker.batch_sender
    composed, built = core.check(plain, [f"C{k}"]), core.check(grouped, [f"C{k}"])
    assert composed.composed and not built.composed
    core.store(composed, [f"C{k}"])
    core.store(built, [f"C{k}"])
    rows = _rows(broker, f"C{k}")
    assert [(r["body"], r["tags"], r["message_type"]) for r in rows] == \
        [(b"a", "t", 0), (b"b", None, 0), (b"a", "t", 1), (b"b", None, 0)]


def test_a_producer_queue_named_by_every_row_is_composed_and_kept(broker):
    # a queue id the producer set, the same on every row (as a selector picks one), is
    # composed like the usual send; rows naming several queues, or some none, are built;
    # each row lands in the queue it named, and a queue the topic lacks is refused alike
    pytest.importorskip("sparkmq._compose", reason="the C module is not built here")
    from sparkmq.broker.batchsend import typed
    from sparkmq.errors import QueueNotFoundError
    k = next(_topics)
    topic = f"Q{k}"
    broker.store.create_topic(topic, read_queue_nums=3, write_queue_nums=3)
    core = broker.batch_sender

    def send(queues: list, *, offset: int = 0) -> bool:
        n = len(queues)
        batch = typed(pa.RecordBatch.from_pydict({
            "topic": [topic] * (n + offset), "body": [b"q%s" % str(q).encode()
                                                    for q in [None] * offset + queues],
            "queue_id": pa.array([None] * offset + queues, pa.int32())})).slice(offset)
        rows = core.check(batch, [topic])
        core.store(rows, [topic])
        return rows.composed

    assert send([2, 2, 2])
    assert not send([1], offset=2)          # a slice is built, its queue read at its offset
    assert not send([0, 2]) and not send([0, None])
    bodies = {q: broker.store.read_table(topic, q, 0).column("body").to_pylist()
              for q in range(3)}
    for q, named in ((0, 2), (1, 1), (2, 4)):         # each row in the queue it named
        assert [b for b in bodies[q] if b != b"qNone"] == [b"q%d" % q] * named
    assert sum(v.count(b"qNone") for v in bodies.values()) == 1   # placed by the broker
    for queues in ([3], [3, 3], [-1]):
        with pytest.raises(QueueNotFoundError, match="queue_id out of range"):
            core.store(core.check(typed(pa.RecordBatch.from_pydict(
                {"topic": [topic] * len(queues), "body": [b"x"] * len(queues),
                 "queue_id": pa.array(queues, pa.int32())})), [topic]), [topic])
    assert sum(broker.store.max_offset(topic, q) for q in range(3)) == 8


def test_a_usual_flight_batch_is_read_in_one_call_and_stored_as_the_long_way_stores_it(
        broker, monkeypatch):
    # the Flight put reads the usual batch with send_shape (one C call), not the pyarrow
    # path (_typed_send): the rows stored are those the pyarrow path stores
    pytest.importorskip("sparkmq._screen", reason="the C module is not built here")
    from sparkmq.broker import flight
    from sparkmq.broker.batchsend import send_shape, typed
    k = next(_topics)
    for t in (f"S{k}", f"L{k}"):
        broker.store.create_topic(t, read_queue_nums=2, write_queue_nums=2)

    def batch(topic: str) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({
            "topic": [topic] * 3, "body": [b"a", b"bb", b"ccc"],
            "tags": pa.array(["t", None, "u"]), "unique_key": ["I1", "I2", "I3"],
            "born_timestamp": pa.array([BORN_MS] * 3, fmt.TS),
            "queue_id": pa.array([0, 0, 0], pa.int32()),
            "born_host": pa.array([None] * 3, pa.string())})

    long_way = flight._typed_send
    monkeypatch.setattr(flight, "_typed_send", lambda b: pytest.fail("read in pyarrow"))
    assert _flight_batch(broker, batch(f"S{k}")) is None
    monkeypatch.setattr(flight, "_typed_send", long_way)
    assert send_shape(batch(f"S{k}")).given == ("topic", "body", "tags", "unique_key",
                                                "born_timestamp", "queue_id")
    core = broker.batch_sender
    core.store(core.check(typed(batch(f"L{k}")), [f"L{k}"]), [f"L{k}"])
    shaped = _rows(broker, f"S{k}")
    assert [(r["body"], r["tags"]) for r in shaped] == [(b"a", "t"), (b"bb", None),
                                                         (b"ccc", "u")]
    assert shaped == _rows(broker, f"L{k}")
