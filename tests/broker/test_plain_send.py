"""The plain SendMessage request read in C (``sparkmq._wire``, ``broker/plainsend.py``)
from the client's bytes: it reads what upb reads, accepts nothing upb refuses (a bad UTF-8
string, damaged bytes), never crashes on bytes it does not expect, and a request answered
by it gets the same answer and stores the same rows as the general path (hypothesis; one
in-process broker, a fresh pair of topics per example, the request handled in process)."""
from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from helpers.brokers import GrpcContext
from sparkmq.broker import plainsend
from sparkmq.broker.grpc_service import MessagingServicer
from sparkmq.broker.protocol import OK, send_response
from sparkmq.log.status import PutMessageStatus

pytestmark = pytest.mark.integration

_topics = itertools.count()
_ID = st.sampled_from(["", "0101A", "ID 1", "x" * 200]) | st.text(
    alphabet="0123456789ABCDEF", min_size=1, max_size=32)
_ANY = st.fixed_dictionaries({
    "topic": st.sampled_from(["$T"] * 6 + ["", "bad topic!", "$NOPE"]),
    "namespace": st.sampled_from(["", "ns"]),
    "body": st.sampled_from([b"", b"x", b"y" * 300]) | st.binary(min_size=1, max_size=40),
    "message_id": st.none() | _ID,
    "born_host": st.sampled_from([None, "", "10.0.0.1", "h\tx"]),
    "born": st.none() | st.sampled_from([(0, 0), (1_700_000_000, 123_000_000),
                                         (-5, 0), (1_700_000_000, 999_999_999),
                                         (300_000_000_000, 0)]),
    "message_type": st.sampled_from([pb.NORMAL] * 6 + [pb.MESSAGE_TYPE_UNSPECIFIED, pb.FIFO,
                                                       pb.DELAY, 99]),
    "encoding": st.sampled_from([None, pb.IDENTITY, pb.GZIP]),
    "extra": st.sampled_from([None] * 8 + ["tag", "empty tag", "keys", "group", "empty group",
                                           "property", "reserved property", "delivery",
                                           "queue_id", "trace", "digest"]),
})
# a message the C reader takes, but for its body and id (which may break a limit)
_PLAIN = st.fixed_dictionaries({
    "topic": st.just("$T"), "namespace": st.sampled_from(["", "ns"]),
    "body": st.one_of(*[st.binary(min_size=1, max_size=40)] * 6,
                      st.sampled_from([b"", b"y" * 300])),
    "message_id": st.sampled_from(["0101A", "ab12", "0202B"] * 3 + ["ID 1", "x" * 200]),
    "born_host": st.sampled_from(["10.0.0.1", "10.0.0.2"] * 4 + ["h\tx"]),
    "born": st.sampled_from([(1_700_000_000, 123_000_000), (1_700_000_001, 0)] * 4
                            + [(300_000_000_000, 0)]),
    "message_type": st.just(pb.NORMAL), "encoding": st.sampled_from([None, pb.IDENTITY]),
    "extra": st.sampled_from([None, "digest", "tag", "empty tag", "keys", "tag and keys",
                              "blank tag", "empty key"])})
_MESSAGE = st.one_of(_PLAIN, _PLAIN, _PLAIN, _ANY)


def _pb(m: dict, topic: str) -> pb.Message:
    p = pb.Message(topic=pb.Resource(name=m["topic"].replace("$T", topic).replace(
        "$NOPE", f"NOPE{topic}"), resource_namespace=m["namespace"]), body=m["body"])
    s = p.system_properties
    s.message_type = m["message_type"]
    if m["message_id"] is not None:
        s.message_id = m["message_id"]
    if m["born_host"] is not None:
        s.born_host = m["born_host"]
    if m["born"] is not None:
        s.born_timestamp.seconds, s.born_timestamp.nanos = m["born"]
    if m["encoding"] is not None:
        s.body_encoding = m["encoding"]
    extra = m["extra"]
    if extra in ("tag", "empty tag", "blank tag", "tag and keys"):
        s.tag = {"empty tag": "", "blank tag": " "}.get(extra, "TagA")
    if extra in ("keys", "tag and keys", "empty key"):
        s.keys.extend(["k1", "k2"] if extra != "empty key" else [""])
    if extra in ("group", "empty group"):
        s.message_group = "g" if extra == "group" else ""
    elif extra in ("property", "reserved property"):
        p.user_properties["UNIQ_KEY" if extra == "reserved property" else "a"] = "b"
    elif extra == "delivery":
        s.delivery_timestamp.seconds = 1_700_000_000
    elif extra == "queue_id":
        s.queue_id = 3
    elif extra == "trace":
        s.trace_context = "t"
    elif extra == "digest":
        s.body_digest.type, s.body_digest.checksum = pb.CRC32, "1234"
    return p


@pytest.fixture(autouse=True)
def every_request(monkeypatch):
    """The C path for requests of any length (``MIN_MESSAGES``, 1 now, may rise again
    if the column path's fixed cost does), so that examples of 1-4 messages exercise it."""
    monkeypatch.setattr(plainsend, "MIN_MESSAGES", 1)


def test_short_requests_take_the_general_path(monkeypatch):
    """Fewer than ``MIN_MESSAGES`` (today: none, an empty request) go the general way."""
    monkeypatch.undo()
    n = plainsend.MIN_MESSAGES
    plain = pb.Message(topic=pb.Resource(name="T"), body=b"x")
    s = plain.system_properties
    s.message_id, s.message_type, s.born_host = "01AB", pb.NORMAL, "10.1.2.3"
    s.born_timestamp.seconds = 1_700_000_000
    assert plainsend.plain_columns(spb.SendMessageRequest(messages=[plain] * (n - 1))) is None
    assert plainsend.plain_columns(spb.SendMessageRequest(messages=[plain] * n)) is not None


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    from helpers.brokers import broker_config
    from sparkmq.broker import Broker
    b = Broker(broker_config(tmp_path_factory.mktemp("plain"), "plain", maxMessageSize=256,
                             autoCreateTopicEnable="false")).start()
    yield b
    b.stop()


def test_the_c_reader_is_built_and_takes_the_clients_plain_requests():
    """The README's install builds the extension (gcc and the Python headers are on a
    fresh machine); a plain request as the official client and sparkmq's Producer send
    it is read by it. Without this, the tests below would only test the general path."""
    from sparkmq import _wire                        # noqa: F401  (fails if not built)
    from sparkmq.client.core import MessageIds
    from sparkmq.client.producer import _encode_plain
    from sparkmq.client import Message
    official = pb.Message(topic=pb.Resource(name="T"), body=b"hello")
    s = official.system_properties
    s.message_id, s.message_type, s.born_host = "01AB", pb.NORMAL, "10.1.2.3"
    s.born_timestamp.seconds, s.body_encoding = 1_700_000_000, pb.IDENTITY
    tagged = pb.Message()
    tagged.CopyFrom(official)
    tagged.system_properties.tag = "TagA"
    tagged.system_properties.keys.extend(["order-1", "user-2"])
    plain = plainsend.plain_columns(spb.SendMessageRequest(messages=[official, tagged]))
    batch, topic = plain.batch(), plain.topic
    assert topic == "T" and batch.column("unique_key").to_pylist() == ["01AB", "01AB"]
    assert batch.column("tags").to_pylist() == [None, "TagA"]
    assert batch.column("keys").to_pylist() == [None, ["order-1", "user-2"]]
    ids = MessageIds()
    own = _encode_plain([Message("T", b"a"), Message("T", b"bc")], "10.0.0.9", ids,
                        ids.take(2), 1_700_000_000_123)
    plain = plainsend.plain_columns(spb.SendMessageRequest.FromString(own.data))
    batch = plain.batch()
    assert batch.column("body").to_pylist() == [b"a", b"bc"]
    assert plain.body_sizes.tolist() == [1, 2] and plain.n == 2
    assert batch.column("unique_key").to_pylist() == ids.strings(0, 2)


def _scanned_as_upb_reads(data: bytes) -> None:
    """``scan_plain(data)`` returns None or the columns upb reads from the same bytes."""
    from sparkmq import _wire
    got = _wire.scan_plain(data)
    if got is None:
        return
    req = spb.SendMessageRequest.FromString(data)       # a tuple: the bytes decode
    plain = plainsend.PlainColumns(got)
    batch, topic = plain.batch(), plain.topic
    batch.validate(full=True)
    # the C struct a send composes from (no pyarrow object) is the same batch
    exported = plain.exported()
    assert exported.names == tuple(batch.schema.names)
    struct = pa.RecordBatch._import_from_c_capsule(batch.schema.__arrow_c_schema__(),
                                                   exported.array)
    struct.validate(full=True)
    assert struct.equals(batch)
    assert plain.body_sizes.tolist() == [len(b) for b in batch.column("body").to_pylist()]
    ms = list(req.messages)
    assert all(m.topic.name == topic for m in ms)
    borns = batch.column("born_timestamp").cast(pa.int64()).to_pylist()   # (past 9999 too)
    rows = batch.drop_columns(["born_timestamp"]).to_pylist()
    assert len(rows) == len(ms)
    for row, born, m in zip(rows, borns, ms):
        sp = m.system_properties
        assert born == sp.born_timestamp.seconds * 1000 + sp.born_timestamp.nanos // 1_000_000
        assert row["body"] == m.body and row["unique_key"] == sp.message_id
        assert row["born_host"] == sp.born_host
        assert row.get("tags") == (sp.tag or None)              # empty: none
        assert row.get("keys") == (list(sp.keys) or None)


@settings(max_examples=300, deadline=None)
@given(msgs=st.lists(_MESSAGE, min_size=1, max_size=4), cut=st.integers(0, 400),
       flip=st.integers(0, 400), byte=st.integers(0, 255))
def test_the_c_reader_reads_what_upb_reads_and_survives_damaged_bytes(msgs, cut, flip, byte):
    data = spb.SendMessageRequest(messages=[_pb(m, "T") for m in msgs]).SerializeToString()
    _scanned_as_upb_reads(data)
    damaged = bytearray(data[:max(1, len(data) - cut)])            # truncated,
    damaged[flip % len(damaged)] = byte                            # and a byte changed
    try:
        spb.SendMessageRequest.FromString(bytes(damaged))
    except Exception:   # upb refuses it: so must the reader (it reads the client's bytes
        from sparkmq import _wire                       # before upb does)
        assert _wire.scan_plain(bytes(damaged)) is None
        return
    _scanned_as_upb_reads(bytes(damaged))


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    return bytes(out + bytes([v]))


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field, encoded by hand (upb will not encode a bad string)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _raw_plain(raw: dict) -> bytes:
    """A one-message SendMessageRequest, plain but for whatever ``raw`` puts in its
    string fields (bytes, any; field numbers: definition.proto)."""
    get = {"name": b"T", "namespace": b"ns", "tag": b"TagA", "key": b"k1", "id": b"01AB",
           "host": b"10.0.0.1", "checksum": b"1234", **raw}.get
    digest = _varint(1 << 3) + _varint(pb.CRC32) + _field(2, get("checksum"))
    system = (_field(1, get("tag")) + _field(2, get("key")) + _field(3, get("id"))
              + _field(4, digest) + _varint(6 << 3) + _varint(pb.NORMAL)
              + _field(7, _varint(1 << 3) + _varint(1_700_000_000)) + _field(8, get("host")))
    message = (_field(1, _field(1, get("namespace")) + _field(2, get("name")))
               + _field(3, system) + _field(4, b"body"))
    return _field(1, message)


_UTF8_EDGES = [b"\x7f", b"\xc2\x80", b"\xc1\xbf", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xe0\x9f\xbf",
               b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xef\xbf\xbf", b"\xf0\x90\x80\x80",
               b"\xf0\x8f\xbf\xbf", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
               b"\x80", b"\xc2", b"\xe1\x80", b"\xf1\x80\x80", b"\xff", b"\x00"]


@settings(max_examples=400, deadline=None)
@given(field=st.sampled_from(["name", "namespace", "tag", "key", "id", "host", "checksum"]),
       parts=st.lists(st.sampled_from(_UTF8_EDGES) | st.binary(max_size=4)
                      | st.text(max_size=4).map(str.encode), max_size=4),
       pad=st.integers(0, 9))
def test_the_reader_takes_a_string_exactly_when_upb_does(field, parts, pad):
    """Every string field the reader takes is held to UTF-8 as upb holds it (and as the
    Unicode standard defines it: Python's codec), including past the eight-byte ASCII
    step: the reader reads the client's bytes, so it may accept nothing upb refuses."""
    from sparkmq import _wire
    raw = b"a" * pad + b"".join(parts)                  # a leading run of ASCII, or none
    raw = raw or b"a"                                   # (empty: declined for other reasons)
    data = _raw_plain({field: raw})
    try:
        raw.decode("utf-8")
        unicode_ok = True
    except UnicodeDecodeError:
        unicode_ok = False
    try:
        spb.SendMessageRequest.FromString(data)
        upb_ok = True
    except Exception:   # what upb raises differs by protobuf version; refused is refused
        upb_ok = False
    assert upb_ok == unicode_ok
    assert (_wire.scan_plain(data) is not None) == upb_ok
    _scanned_as_upb_reads(data)


def test_the_deserializer_reads_a_plain_request_without_upb():
    """The server's SendMessage deserializer: a plain request of ``MIN_MESSAGES`` or more
    becomes a ``PlainRequest`` (upb parses it only on demand, to the same request); a
    shorter or not plain one is upb's; bytes upb refuses are ``Malformed`` either way."""
    from sparkmq.broker.grpc_server import Malformed
    from sparkmq.broker.grpc_service import request_reader
    read, data = request_reader("SendMessage"), _raw_plain({})
    got = read(data)
    assert isinstance(got, plainsend.PlainRequest) and got.topic == "T"
    assert got.parsed() == spb.SendMessageRequest.FromString(data)
    assert plainsend.plain_columns(got).batch().column("tags").to_pylist() == ["TagA"]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(plainsend, "MIN_MESSAGES", 2)
        assert isinstance(read(data), spb.SendMessageRequest)          # too short
        assert isinstance(read(data * 2), plainsend.PlainRequest)
    assert isinstance(read(_raw_plain({"name": b"T", "id": b""})), spb.SendMessageRequest)
    bad = read(_raw_plain({"tag": b"Tag\xff"}))
    assert isinstance(bad, Malformed) and "does not decode" in bad.error


@given(st.binary(max_size=300))
@settings(max_examples=300, deadline=None)
def test_the_c_reader_never_crashes_on_arbitrary_bytes(data):
    from sparkmq import _wire
    got = _wire.scan_plain(data)
    assert got is None or len(got) == 18


@given(ids=st.lists(st.text(alphabet="0123456789ABCDEFé", max_size=40), max_size=5),
       offsets=st.lists(st.sampled_from([0, 1, 127, 128, 300, 1 << 40, (1 << 63) - 1]),
                        min_size=5, max_size=5))
@settings(max_examples=100, deadline=None)
def test_the_encoded_answer_is_the_general_paths(ids, offsets):
    from sparkmq import _wire
    offsets = offsets[:len(ids)]
    data = "".join(ids).encode()
    ends = np.cumsum([0] + [len(i.encode()) for i in ids]).astype(np.int32)
    got = _wire.encode_ok(OK.SerializeToString(), data, ends.tobytes(),
                          np.array(offsets, np.int64).tobytes())
    want = send_response([(PutMessageStatus.PUT_OK, i, o, None) for i, o in zip(ids, offsets)])
    assert spb.SendMessageResponse.FromString(got) == want if ids else \
        spb.SendMessageResponse.FromString(got).entries == want.entries


def _send(broker, topic: str, msgs: list[dict], plain: bool, monkeypatch) -> list:
    with monkeypatch.context() as m:
        if not plain:
            m.setattr(plainsend, "_wire", None)
        resp = MessagingServicer(broker).send_message(
            spb.SendMessageRequest(messages=[_pb(x, topic) for x in msgs]), GrpcContext())
    return [resp.status.code] + [
        (e.status.code, e.status.message.replace(topic, "$T"), e.offset,
         e.message_id if msgs[i]["message_id"] else None) for i, e in enumerate(resp.entries)]


def _rows(broker, topic: str, msgs: list[dict]) -> list[dict]:
    """The stored rows, but what the broker sets (a born time it fills in: now)."""
    if topic not in broker.store.topics():
        return []
    own_born = all(m["born"] and m["born"][0] > 0 for m in msgs)
    return [{k: v for k, v in r.items()
             if k not in ("topic", "physical_offset", "message_id", "store_timestamp")
             and (own_born or k != "born_timestamp")}
            for r in broker.store.read_table(topic, 0, 0).to_pylist()]


def _composed_here() -> bool:
    try:
        from sparkmq import _compose  # noqa: F401
    except ImportError:
        return False
    return True


_GOOD = {"topic": "$T", "namespace": "", "body": b"hello", "message_id": "0101A",
         "born_host": "10.0.0.1", "born": (1_700_000_000, 5_000_000),
         "message_type": pb.NORMAL, "encoding": pb.IDENTITY, "extra": None}


def test_a_plain_request_is_answered_by_the_c_path(broker, monkeypatch):
    broker.store.create_topic("PLAIN", read_queue_nums=1, write_queue_nums=1)
    msgs = [_GOOD, {**_GOOD, "message_id": "0202B", "body": b"x" * 200}]
    core, composed = broker.batch_sender, []
    store = core.store
    monkeypatch.setattr(core, "store", lambda rows, topics: (
        composed.append(rows.composed), store(rows, topics))[1])
    arrays = plainsend._arrays
    built: list = []
    monkeypatch.setattr(plainsend, "_arrays", lambda *a: built.append(a) or arrays(*a))
    answer = plainsend.send_plain(broker, spb.SendMessageRequest(
        messages=[_pb(m, "PLAIN") for m in msgs]), GrpcContext())
    assert isinstance(answer, bytes)
    # its segment batch composed in C (log/built.py) where that module is built, from
    # the scanner's buffers: no pyarrow array of the request's columns made
    assert composed == [_composed_here()]
    assert len(built) == (0 if _composed_here() else 1)
    resp = spb.SendMessageResponse.FromString(answer)
    assert [(e.message_id, e.offset) for e in resp.entries] == [("0101A", 0), ("0202B", 1)]
    assert [r["body"] for r in broker.store.read_table("PLAIN", 0, 0).to_pylist()] == \
        [b"hello", b"x" * 200]
    assert broker.metrics.get("sparkmq_messages_sent_total", topic="PLAIN") == 2  # counted
    assert broker.metrics.get("sparkmq_bytes_sent_total", topic="PLAIN") == 205   # as ever


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(msgs=st.lists(_MESSAGE, min_size=1, max_size=3))
@example(msgs=[_GOOD, {**_GOOD, "message_id": "0202B", "body": b"y" * 9}])
@example(msgs=[_GOOD, {**_GOOD, "born_host": "h\tx"}])
@example(msgs=[{**_GOOD, "namespace": "ns", "extra": "digest"}])
def test_the_c_path_answers_and_stores_as_the_general_path(broker, msgs, monkeypatch):
    k = next(_topics)
    for topic in (f"C{k}", f"G{k}"):
        broker.store.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
    fast = _send(broker, f"C{k}", msgs, True, monkeypatch)
    general = _send(broker, f"G{k}", msgs, False, monkeypatch)
    assert fast == general
    assert _rows(broker, f"C{k}", msgs) == _rows(broker, f"G{k}", msgs)


def test_over_the_wire_a_plain_request_is_read_from_the_clients_bytes(broker):
    """Through the broker's gRPC server: a plain request with multi-byte UTF-8 is stored as
    sent; the same request with one bad UTF-8 byte in one tag is BAD_REQUEST, as upb
    answers it, and nothing of it is stored; the server goes on serving."""
    import grpc
    broker.store.create_topic("WIRE", read_queue_nums=1, write_queue_nums=1)
    tags = [f"tag-é-日本-{i}".encode() for i in range(plainsend.MIN_MESSAGES + 3)]
    ok = b"".join(_raw_plain({"name": b"WIRE", "tag": t, "id": b"%04d" % i})
                  for i, t in enumerate(tags))
    bad = ok.replace("tag-é-日本-2".encode(), "tag-é-日本-2".encode()[:-1] + b"\xff")
    assert len(bad) == len(ok) and bad != ok
    with grpc.insecure_channel(broker.endpoint) as channel:
        send = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
                                   response_deserializer=spb.SendMessageResponse.FromString)
        refused = send(bad, timeout=30)
        assert refused.status.code == pb.Code.BAD_REQUEST
        assert "does not decode" in refused.status.message and not refused.entries
        assert "WIRE" not in broker.store.topics() or \
            broker.store.read_table("WIRE", 0, 0).num_rows == 0
        stored = send(ok, timeout=30)
    assert stored.status.code == pb.Code.OK
    assert [e.message_id for e in stored.entries] == ["%04d" % i for i in range(len(tags))]
    rows = broker.store.read_table("WIRE", 0, 0).to_pylist()
    assert [r["tags"] for r in rows] == [t.decode() for t in tags]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(msgs=st.lists(_PLAIN, min_size=1, max_size=3), cut=st.integers(0, 60),
       flip=st.integers(0, 2000), byte=st.integers(0, 255))
def test_over_the_wire_damaged_plain_requests_get_a_status_and_store_what_upb_reads(
        broker, msgs, cut, flip, byte):
    """Damaged plain requests through the real server: every one gets a protocol
    status (never a transport error), and a stored one stores exactly the messages upb
    reads from the same bytes; the server goes on serving."""
    import grpc
    topic = f"D{next(_topics)}"
    broker.store.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
    data = bytearray(spb.SendMessageRequest(
        messages=[_pb(m, topic) for m in msgs]).SerializeToString())
    data = data[:max(1, len(data) - cut)]
    data[flip % len(data)] = byte
    try:
        upb = spb.SendMessageRequest.FromString(bytes(data))
    except Exception:   # refused by upb: the server must answer BAD_REQUEST
        upb = None
    with grpc.insecure_channel(broker.endpoint) as channel:
        send = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
                                   response_deserializer=spb.SendMessageResponse.FromString)
        answer = send(bytes(data), timeout=30)
        if upb is None:
            assert answer.status.code == pb.Code.BAD_REQUEST, answer.status
        stored = (broker.store.read_table(topic, 0, 0).to_pylist()
                  if topic in broker.store.topics() else [])
        if answer.status.code == pb.Code.OK:
            want = [m for m in upb.messages if m.topic.name == topic]
            assert [r["body"] for r in stored] == [m.body for m in want]
            assert [r["tags"] for r in stored] == [m.system_properties.tag or None
                                                   for m in want]
        else:
            assert stored == []
        good = _raw_plain({"name": topic.encode()})
        assert send(good, timeout=30).status.code == pb.Code.OK
