"""sparkmq.client without a broker: endpoints, message conversion, queue choice."""
from __future__ import annotations

import time
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from sparkmq.client import Message, Producer, Queue
from sparkmq.client.core import MessageIds, now_timestamp, parse_endpoints
from sparkmq.errors import InvalidConfigError, UserError


def test_parse_endpoints():
    assert parse_endpoints("127.0.0.1:8081; 127.0.0.1:8091") == ["127.0.0.1:8081", "127.0.0.1:8091"]
    assert parse_endpoints(["h:1"]) == ["h:1"]
    for bad in ("", "nohost", "h:port"):
        with pytest.raises(InvalidConfigError):
            parse_endpoints(bad)


def test_message_to_pb_normal_and_fifo():
    ids = MessageIds()
    m = Message("T", b"x", tag="A", keys=["k"], properties={"p": "1"}).to_pb("h", ids.next(),
                                                                              now_timestamp())
    assert m.system_properties.message_type == pb.NORMAL and m.system_properties.tag == "A"
    assert list(m.system_properties.keys) == ["k"] and m.user_properties["p"] == "1"
    f = Message("T", b"x", message_group="g").to_pb("h", ids.next(), now_timestamp())
    assert f.system_properties.message_type == pb.FIFO and f.system_properties.message_group == "g"
    with pytest.raises(UserError):
        Message("T", "not bytes").to_pb("h", ids.next(), now_timestamp())


def test_message_ids_are_unique_and_fixed_width():
    ids = MessageIds()
    got = [ids.next() for _ in range(10_000)] + ids.many(5_000) + [ids.next() for _ in range(9)]
    assert len(set(got)) == len(got) and {len(x) for x in got} == {32}
    ids.take(2**48 - 10_000 - 5_000 - 9 - 2)                  # to just before the wrap
    assert [x[20:] for x in ids.many(4)] == ["FFFFFFFFFFFE", "FFFFFFFFFFFF", "000000000000",
                                             "000000000001"]
    assert ids.many(2)[0][:20] == ids.prefix and ids.next()[20:] == "000000000004"


def test_message_ids_taken_from_many_threads_at_once_never_repeat():
    """``take`` reserves a block under a lock: blocks and single ids taken together from
    eight threads are all distinct (a counter read and bumped apart would repeat some)."""
    import threading
    ids, out, start = MessageIds(), [], threading.Barrier(8)

    def work(k):
        start.wait()
        got = []
        for _ in range(300):
            got += ids.many(k % 3 + 1) if k % 2 else [ids.next()]
        out.append(got)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [x for got in out for x in got]
    assert len(every) == 300 * sum(k % 3 + 1 if k % 2 else 1 for k in range(8))
    assert len(set(every)) == len(every)


class FixedRoutes:
    """Stands in for the route cache (the network edge) with a fixed route."""

    def __init__(self, queues):
        self._queues = queues

    def queues(self, topic, refresh=False):
        return self._queues

    def writable(self, topic, refresh=False):
        return [q for q in self._queues if q.writable]

    def flight_endpoint(self, endpoint, topic):
        return None             # brokers without Arrow Flight: requests go over gRPC


def producer_with(queues) -> Producer:
    p = Producer("127.0.0.1:1")
    p.routes = FixedRoutes(queues)
    return p


QUEUES = [Queue("T", i, name, 0, ep, pb.READ_WRITE)
          for name, ep in (("a", "127.0.0.1:1"), ("b", "127.0.0.1:2")) for i in range(2)]


def test_round_robin_covers_every_broker_and_keys_are_stable():
    p = producer_with(QUEUES)
    try:
        assert {p._choose("T", None, [], False).broker_name for _ in range(4)} == {"a", "b"}
        for key in ("k1", "k2", "order-42"):
            assert len({p._choose("T", key, [], False) for _ in range(5)}) == 1
    finally:
        p.shutdown()


def test_isolated_broker_is_avoided_and_read_only_queues_are_not_written():
    p = producer_with(QUEUES + [Queue("T", 9, "c", 0, "127.0.0.1:3", pb.READ)])
    try:
        p._isolate("127.0.0.1:1")
        assert {p._choose("T", None, [], False).endpoint for _ in range(6)} == {"127.0.0.1:2"}
        assert p.isolated_endpoints() == ["127.0.0.1:1"]
        # every broker isolated: still try one rather than fail without trying
        p._isolate("127.0.0.1:2")
        assert p._choose("T", None, [], False).endpoint in {"127.0.0.1:1", "127.0.0.1:2"}
    finally:
        p.shutdown()


def test_a_lapsed_isolation_is_forgotten():
    """Once its isolation has lapsed a broker is chosen again, and the producer forgets
    it (a send with no broker avoided takes the short way: ``_choose``)."""
    p = producer_with(QUEUES)
    try:
        p.isolation_s = -1.0                 # lapsed as soon as made
        p._isolate("127.0.0.1:1")
        assert {p._choose("T", None, [], False).endpoint for _ in range(4)} == {
            "127.0.0.1:1", "127.0.0.1:2"}
        assert p._isolated == {} and p.isolated_endpoints() == []
        p.isolation_s = 60.0
        p._isolate("127.0.0.1:1")
        assert {p._choose("T", None, [], False).endpoint for _ in range(4)} == {"127.0.0.1:2"}
    finally:
        p.shutdown()


def test_send_batch_checks_its_input():
    p = producer_with(QUEUES)
    try:
        with pytest.raises(UserError):
            p.send_batch([])
        with pytest.raises(UserError, match="one topic"):
            p.send_batch([Message("T", b"a", message_group="x"), Message("T", b"b")])
    finally:
        p.shutdown()
    with pytest.raises(UserError, match="shut down"):
        p.send(Message("T", b"a"))


def test_subscription_filters():
    from sparkmq.client.consumer import _filter_of
    assert _filter_of("TagA || TagB") == (pb.TAG, "TagA || TagB")
    assert _filter_of(("SQL92", "a > 1")) == (pb.SQL, "a > 1")
    for bad in (("XPATH", "x"), 42, ("SQL92",)):
        with pytest.raises(UserError):
            _filter_of(bad)


def test_send_batch_request_carries_every_field_of_plain_and_rich_messages():
    """The request is built from a shared template for plain messages and field by field
    for the others: both must give the same protocol messages as Message.to_pb."""
    p = producer_with(QUEUES)
    sent = []
    p._send_to = lambda queue, request: sent.append(request) or []
    try:
        batch = [Message("T", b"plain-1"), Message("T", b"rich", tag="A", keys=["k"],
                                                    properties={"p": "1"}),
                 Message("T", bytearray(b"plain-2")), Message("T", b"plain-3")]
        p.send_batch(batch)
        (request,) = sent
        got = list(request.messages)
        assert len(got) == 4
        assert len({m.system_properties.message_id for m in got}) == 4
        born = got[0].system_properties.born_timestamp
        for m, g in zip(batch, got):
            want = m.to_pb(p._host, g.system_properties.message_id, born)
            assert g == want
        assert got[2].body == b"plain-2" and got[1].user_properties["p"] == "1"
        p.send_batch([Message("T", b"f1", message_group="g"), Message("T", b"f2",
                                                                    message_group="g")])
        assert [m.system_properties.message_group for m in sent[1].messages] == ["g", "g"]
        assert {m.system_properties.message_type for m in sent[1].messages} == {pb.FIFO}
        # delayed messages each keep their own delivery time (never the template's)
        due = [1_900_000_000_000, 1_900_000_005_000]
        p.send_batch([Message("T", b"d1", delivery_timestamp_ms=due[0]),
                      Message("T", b"d2", delivery_timestamp_ms=due[1])])
        got = [m.system_properties for m in sent[2].messages]
        assert [sp.delivery_timestamp.ToMilliseconds() for sp in got] == due
        assert {sp.message_type for sp in got} == {pb.DELAY}
        # ``_request`` alone (``_send`` gives it one topic and message group): messages of
        # two groups or topics are not encoded with the first one's shared fields
        for mixed in ([Message("T", b"m1", message_group="g1"),
                       Message("T", b"m2", message_group="g2")],
                      [Message("T", b"m1"), Message("U", b"m2")]):
            got = list(p._request(mixed).messages)
            assert [(m.topic.name, m.system_properties.message_group) for m in got] == \
                [(m.topic, m.message_group or "") for m in mixed]
    finally:
        p.shutdown()


def test_a_plain_batch_is_encoded_by_hand_and_parses_to_the_protocol_messages():
    """Plain batches, and a plain message sent alone, skip the protocol objects: the
    hand-encoded bytes must parse to exactly what Message.to_pb gives, born when sent,
    for bodies whose lengths need 1 to 3 varint bytes. A message with a tag is filled
    field by field."""
    from sparkmq.client.producer import EncodedSendRequest, _varint
    assert [_varint(n) for n in (0, 1, 127, 128, 300, 16384)] == [
        b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xac\x02", b"\x80\x80\x01"]
    p = producer_with(QUEUES)
    sent = []
    p._send_to = lambda queue, request: sent.append(request) or [None]
    try:
        bodies = [b"x", b"y" * 127, b"z" * 128, bytes(range(256)) * 70, b"w" * 20_000]
        for group in (None, "g"):
            batch = [Message("T", b, message_group=group) for b in bodies]
            p.send_batch(batch)
            request = sent[-1]
            assert type(request) is EncodedSendRequest and request.count == len(batch)
            got = list(request.messages)
            assert len({m.system_properties.message_id for m in got}) == len(batch)
            born = got[0].system_properties.born_timestamp
            for m, g in zip(batch, got):
                assert len(g.system_properties.message_id) == 32
                assert g == m.to_pb(p._host, g.system_properties.message_id, born)
        for group in (None, "g"):
            alone = Message("T", b"one", message_group=group)
            before = int(time.time() * 1000)
            p.send(alone)
            after = int(time.time() * 1000)
            request = sent[-1]
            assert type(request) is EncodedSendRequest and request.count == 1
            (got,) = request.messages
            born = got.system_properties.born_timestamp
            assert before <= born.ToMilliseconds() <= after
            assert got == alone.to_pb(p._host, got.system_properties.message_id, born)
        p.send(Message("T", b"tagged", tag="A"))
        assert type(sent[-1]) is spb.SendMessageRequest
        assert sent[-1].messages[0].system_properties.tag == "A"
    finally:
        p.shutdown()


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 127, 128, 300, 16383, 16384, 70_000]) |
                      st.integers(0, 3000), min_size=1, max_size=12),
       start=st.integers(0, 2**48 + 10) | st.just(2**48 - 3),
       topic=st.text(min_size=1, max_size=40), host=st.text(max_size=300),
       born=st.sampled_from([0, 1, 999, 1000, 1001, 1_700_000_000_000]) |
       st.integers(0, 2**42), group=st.none() | st.text(min_size=1, max_size=20))
def test_the_c_encoder_writes_the_python_encoders_bytes(sizes, start, topic, host, born,
                                                        group):
    """``_wire.encode_plain`` (ids: prefix + counter, wrapping at 2**48) and the Python
    loop give the same bytes for any bodies, topic, group, host and born time (epoch ms:
    a whole second, no seconds, ...); those bytes parse to what ``Message.to_pb`` gives,
    born at that time."""
    from sparkmq import _wire
    from sparkmq.client import producer
    if _wire is None:
        pytest.skip("sparkmq._wire is not built here")
    messages = [Message(topic, bytes([i % 251]) * n, message_group=group)
                for i, n in enumerate(sizes)]
    ids = MessageIds()
    made = [f"{ids.prefix}{(start + i) & 0xFFFFFFFFFFFF:012X}" for i in range(len(sizes))]
    assert ids.strings(start, len(sizes)) == made
    in_c = producer._encode_plain(messages, host, ids, start, born)
    with mock.patch.object(producer, "_wire", None):
        in_python = producer._encode_plain(messages, host, ids, start, born)
    assert in_c.data == in_python.data and in_c.count == in_python.count == len(sizes)
    got = list(in_c.messages)
    assert [g.system_properties.message_id for g in got] == made
    stamp = now_timestamp()
    stamp.FromMilliseconds(born)
    for m, g in zip(messages, got):
        assert g == m.to_pb(host, g.system_properties.message_id, stamp)


def test_the_c_encoder_refuses_what_it_cannot_write():
    from sparkmq import _wire
    if _wire is None:
        pytest.skip("sparkmq._wire is not built here")
    with pytest.raises(TypeError, match="body 1 is not bytes"):
        _wire.encode_plain(b"t", b"f", [b"a", bytearray(b"b")], b"P" * 20, 0, 0)
    with pytest.raises(ValueError, match="20 bytes"):
        _wire.encode_plain(b"t", b"f", [b"a"], b"P" * 19, 0, 0)


def test_a_send_answer_is_taken_only_with_an_entry_a_message_each_stored():
    """The answer to a SendMessage (the network edge faked with the broker's bytes): an OK
    with an entry a message gives one receipt each; an OK missing an entry, or an entry
    of MULTIPLE_RESULTS that was not stored, is refused with what was wrong."""
    from sparkmq.client import ClientError
    ok = pb.Status(code=pb.OK, message="OK")

    def answer(*entries, code=pb.OK):
        return lambda endpoint, method, data, response_class, timeout_s=None: \
            response_class.FromString(spb.SendMessageResponse(
                status=pb.Status(code=code, message=pb.Code.Name(code)),
                entries=list(entries)).SerializeToString())
    p = producer_with(QUEUES)
    p.max_retries = 0
    try:
        p.conns.call_encoded = answer(spb.SendResultEntry(status=ok, message_id="M1",
                                                          offset=7))
        r = p.send(Message("T", b"x"))
        assert (r.message_id, r.queue_offset, r.status_code) == ("M1", 7, pb.OK)
        p.conns.call_encoded = answer()
        with pytest.raises(ClientError, match="OK"):
            p.send(Message("T", b"x"))
        p.conns.call_encoded = answer(spb.SendResultEntry(
            status=pb.Status(code=pb.MESSAGE_BODY_TOO_LARGE, message="too big")),
            code=pb.MULTIPLE_RESULTS)
        with pytest.raises(ClientError, match="MESSAGE_BODY_TOO_LARGE: too big"):
            p.send(Message("T", b"x"))
    finally:
        p.shutdown()


def test_call_encoded_racing_a_close_is_a_clear_broker_unavailable_error():
    from rocketmq.grpc_protocol import service_pb2

    from sparkmq.client.core import BrokerUnavailableError, Connections
    conns = Connections()
    real_stub = conns.stub

    def stub_then_closed(endpoint):               # close() lands right after the open
        real_stub(endpoint)
        conns.close()
    conns.stub = stub_then_closed
    with pytest.raises(BrokerUnavailableError, match="closed"):
        conns.call_encoded("127.0.0.1:1", "SendMessage", b"", service_pb2.SendMessageResponse)


def test_a_retry_policy_from_the_settings_gives_the_official_clients_delays():
    """Customized: step ``attempt`` (1-based), the last repeated; exponential: initial *
    multiplier ** (attempt - 1), capped (the Java client's RetryPolicy classes)."""
    from google.protobuf.duration_pb2 import Duration
    from sparkmq.client.retry import RetryPolicy
    custom = RetryPolicy.from_pb(pb.RetryPolicy(
        max_attempts=5, customized_backoff=pb.CustomizedBackoff(next=[
            Duration(seconds=1), Duration(seconds=5), Duration(nanos=250_000_000)])))
    assert [custom.delay_s(a) for a in (1, 2, 3, 4, 9)] == [1, 5, 0.25, 0.25, 0.25]
    assert custom.max_attempts == 5
    exp = RetryPolicy.from_pb(pb.RetryPolicy(
        max_attempts=3, exponential_backoff=pb.ExponentialBackoff(
            initial=Duration(seconds=2), max=Duration(seconds=20), multiplier=3.0)))
    assert [exp.delay_s(a) for a in (1, 2, 3, 4)] == [2, 6, 18, 20]
    assert RetryPolicy.from_pb(pb.RetryPolicy(max_attempts=3)) is None


@settings(max_examples=200, deadline=None)
@given(bodies=st.lists(st.binary(max_size=300) | st.sampled_from([b"", b"x" * 5000]),
                       min_size=1, max_size=20),
       topic=st.text(min_size=1, max_size=40), group=st.none() | st.text(max_size=20),
       host=st.text(max_size=60), born=st.integers(0, 2**42),
       start=st.integers(0, 2**48 + 10) | st.just(2**48 - 2))
def test_the_c_flight_batch_is_the_pyarrow_one(bodies, topic, group, host, born, start):
    """``plain_send_batch`` (``_wire.send_struct``) makes the batch ``send_batch`` makes
    of the same plain messages and ids, valid Arrow in full, for any bodies (empty ones
    too), topic, message group (none, or empty), host, born time and id block (wrapping
    at 2**48); it outlives what it was made of."""
    import gc
    from sparkmq import _wire
    from sparkmq.client.flight import PLAIN_SEND_SCHEMA, plain_send_batch, send_batch
    if _wire is None:
        pytest.skip("sparkmq._wire is not built here")
    ids = MessageIds()
    messages = [Message(topic, bytes(b), message_group=group) for b in bodies]
    try:
        expected = send_batch(messages, ids.strings(start, len(bodies)), born, host)
    except (UnicodeEncodeError, pa.ArrowException):    # text that is not UTF-8
        assert plain_send_batch(messages, ids.prefix_ascii, start, born, host) is None
        return
    got = plain_send_batch(messages, ids.prefix_ascii, start, born, host)
    del messages
    gc.collect()
    got.validate(full=True)
    assert got.schema.equals(PLAIN_SEND_SCHEMA, check_metadata=True)
    assert got.equals(expected) and got.to_pydict() == expected.to_pydict()


def test_the_c_flight_batch_is_made_only_of_plain_messages():
    from sparkmq import _wire
    from sparkmq.client.flight import plain_send_batch
    if _wire is None:
        pytest.skip("sparkmq._wire is not built here")
    prefix = MessageIds().prefix_ascii
    for odd in (Message("T", b"x", tag="A"), Message("T", b"x", keys=["k"]),
                Message("T", b"x", properties={"p": "1"}), Message("T", bytearray(b"x")),
                Message("T\ud800", b"x")):
        assert plain_send_batch([odd, Message("T", b"y")], prefix, 0, 1, "h") is None
        assert plain_send_batch([Message("T", b"y"), odd], prefix, 0, 1, "h") is None \
            or odd.topic != "T"            # (the batch's topic is the first message's)
    with pytest.raises(TypeError, match="body 1 is not bytes"):
        _wire.send_struct(b"T", None, b"h", [b"a", bytearray(b"b")], prefix, 0, 1)
    with pytest.raises(ValueError, match="20 bytes"):
        _wire.send_struct(b"T", None, b"h", [b"a"], prefix[:19], 0, 1)
    with pytest.raises(ValueError, match="20 bytes"):
        _wire.send_struct(b"T", None, b"h", [], prefix, 0, 1)


def test_the_flight_send_batch_holds_every_field_in_the_schema_its_messages_need():
    """A plain batch leaves tags, keys and properties out (PLAIN_SEND_SCHEMA), a batch
    with any of them has every column (SEND_SCHEMA); shared columns come from a cache
    and ids of MessageIds' width are joined, others converted: the values are the same."""
    import pyarrow as pa
    from sparkmq.client.flight import PLAIN_SEND_SCHEMA, SEND_SCHEMA, send_batch
    ids = MessageIds().many(3)
    plain = [Message("T", b"a"), Message("T", bytearray(b"b")), Message("T", b"c")]
    b = send_batch(plain, ids, 1_700_000_000_123, "10.0.0.1")
    assert b.schema.equals(PLAIN_SEND_SCHEMA)
    b.validate(full=True)
    assert b.to_pydict() == {
        "topic": ["T"] * 3, "body": [b"a", b"b", b"c"], "message_group": [None] * 3,
        "unique_key": ids, "born_timestamp": b.column("born_timestamp").to_pylist(),
        "born_host": ["10.0.0.1"] * 3}
    assert b.column("born_timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123] * 3
    assert send_batch(plain[:2], ids[:2], 1, "h").column("topic").to_pylist() == ["T", "T"]
    odd = ["short", "a-longer-id-than-thirty-two-characters!", "ünïcode-id"]
    rich = [Message("T", b"x", tag="A"), Message("T", b"y", keys=["k"], message_group=None),
            Message("T", b"z", properties={"p": "1"})]
    b = send_batch(rich, odd, 5, "h")
    assert b.schema.equals(SEND_SCHEMA)
    b.validate(full=True)
    assert b.column("unique_key").to_pylist() == odd
    uneven = ["a" * 31, "b" * 33]                 # 64 bytes, but not two of 32
    assert send_batch(plain[:2], uneven, 5, "h").column("unique_key").to_pylist() == uneven
    assert b.column("tags").to_pylist() == ["A", None, None]
    assert b.column("keys").to_pylist() == [None, ["k"], None]
    assert b.column("properties").to_pylist() == [None, None, [("p", "1")]]
    grouped = send_batch([Message("T", b"x", message_group="g")] * 2, ids[:2], 5, "h")
    assert grouped.column("message_group").to_pylist() == ["g", "g"]
    big = send_batch([Message("T", b"x")] * 1500, MessageIds().many(1500), 5, "h")
    assert big.column("topic").to_pylist() == ["T"] * 1500     # (over the cached size)
    assert len(set(big.column("unique_key").to_pylist())) == 1500
    with pytest.raises(UserError, match="must be bytes, got str"):
        send_batch([Message("T", b"x"), Message("T", "text")], ids[:2], 5, "h")


def test_an_ack_is_read_with_its_own_status_whatever_came_before():
    """``parse_ack`` keeps the last ack's schema message and reads the next ack's batch
    against it only where the next has the same one: a status (schema metadata) is never
    taken from an earlier ack, and a stream of more than one batch is read whole."""
    from sparkmq.client.flight import ack_status, parse_ack

    def ack(rows, status=None, batches=1):
        schema = pa.schema([("queue_id", pa.int32()), ("queue_offset", pa.int64()),
                            ("message_id", pa.string())],
                           metadata=None if status is None else {"status": status})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as w:
            for _ in range(batches):
                w.write_batch(pa.record_batch([pa.array([q for q, _, _ in rows], pa.int32()),
                                               pa.array([o for _, o, _ in rows], pa.int64()),
                                               pa.array([m for _, _, m in rows])],
                                              schema=schema))
        return sink.getvalue()
    ok = [(1, 5, "A" * 32), (1, 6, "B" * 32)]
    late = [(2, 9, "C" * 32)]
    for buf, rows, code in ((ack(ok), ok, pb.Code.OK),
                            (ack(late, "MASTER_PERSISTENCE_TIMEOUT"), late,
                             pb.Code.MASTER_PERSISTENCE_TIMEOUT),
                            (ack(ok), ok, pb.Code.OK), (ack(late), late, pb.Code.OK)):
        got = parse_ack(buf)
        assert ack_status(got) == code
        assert list(zip(*got.to_pydict().values())) == rows
    assert parse_ack(ack(ok, batches=2)).num_rows == 4
    assert parse_ack(ack(ok, batches=0)).num_rows == 0
