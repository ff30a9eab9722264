"""Every RPC of ``apache.rocketmq.v2.MessagingService`` (the unary ones, ReceiveMessage's and
PullMessage's server streams, the Telemetry stream) fuzzed against one real broker on
127.0.0.1 with authentication on (hypothesis): raw bytes (random, a valid request cut or
changed, another RPC's request), and well-formed requests with adversarial fields (names
empty, huge, unicode, with control characters; numbers negative or enormous; missing
resources; receipt and recall handles random, altered or of another group and topic;
batch sizes and durations out of range; malformed filters), signed as the official clients
sign. Each call must answer a RocketMQ status before its client-side deadline, never an
INTERNAL_* one nor a traceback (nor an ERROR in the broker's log), while a good producer
and consumer run alongside and get exactly what they sent; the messages stored before are
read back unchanged and the broker still serves after. Without a valid credential every
RPC is refused UNAUTHORIZED (Telemetry: UNAUTHENTICATED) whatever the body, and nothing
changes. Two sharper properties: an illegal topic or group name gets the code naming
that one (ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP), and a long poll of any length answers
before the client's deadline. The NameServer's HTTP API gets the same, smaller: every
request answered (a JSON 4xx with the reason), unsigned writes refused, its routes
unchanged."""
from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import uuid

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from helpers.brokers import ErrorRecords, broker_config, signed_headers
from sparkmq.broker import Broker
from sparkmq.errors import InvalidNameError
from sparkmq.log.names import validate_group, validate_topic

pytestmark = pytest.mark.integration
Code = pb.Code

AK, SK = "fuzz", "fuzz-secret-key"
SERVICE = spb.DESCRIPTOR.services_by_name["MessagingService"]
METHODS = {m.name: m for m in SERVICE.methods}
UNARY_S, STREAM_S = 10.0, 2.5      # client deadlines: a long poll must answer before them
INTERNAL = {Code.INTERNAL_ERROR, Code.INTERNAL_SERVER_ERROR, Code.CODE_UNSPECIFIED}
MAX_BODY = 1024


def _metadata(ak: str | None = AK, sk: str = SK, cid: str = "fuzz-client") -> list:
    """An official client's request headers (rocketmq-clients ``Signature.metadata``)."""
    return [("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-client-id", cid), ("x-mq-request-id", str(uuid.uuid4())),
            *signed_headers(ak, sk)]


def _cls(descriptor):
    return message_factory.GetMessageClass(descriptor)


def _call(channel, method: str, request, md, raw: bool = False) -> list:
    """The responses of one call (a list for every kind of RPC); grpc.RpcError escapes."""
    m = METHODS[method]
    path = f"/{SERVICE.full_name}/{method}"
    ser = (lambda b: b) if raw else (lambda r: r.SerializeToString())
    de = _cls(m.output_type).FromString
    if m.client_streaming:
        call = channel.stream_stream(path, request_serializer=ser, response_deserializer=de)
        return list(call(iter(request), timeout=STREAM_S, metadata=md))
    if m.server_streaming:
        call = channel.unary_stream(path, request_serializer=ser, response_deserializer=de)
        return list(call(request, timeout=STREAM_S, metadata=md))
    call = channel.unary_unary(path, request_serializer=ser, response_deserializer=de)
    return [call(request, timeout=UNARY_S, metadata=md)]


def _statuses(responses: list) -> list[pb.Status]:
    """Every status the responses carry (the top one and each entry's)."""
    out = []
    for r in responses:
        if r.HasField("status"):
            out.append(r.status)
        for e in getattr(r, "entries", ()):
            out.append(e.status)
    return out


# ---------------------------------------------------------------- the broker and its data
def _raw_message(topic: str, body: bytes, **sp) -> pb.Message:
    """A message as the official Producer builds it (``Producer.__send_req``)."""
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    s = m.system_properties
    s.message_id, s.born_host, s.body_encoding = uuid.uuid4().hex.upper(), "127.0.0.1", pb.IDENTITY
    s.born_timestamp.seconds = int(time.time())
    s.message_type = sp.pop("message_type", pb.NORMAL)
    for k, v in sp.items():
        if k == "delivery_ms":
            s.delivery_timestamp.FromMilliseconds(v)
        elif k == "keys":
            s.keys.extend(v)
        else:
            setattr(s, k, v)
    return m


def _receive_request(group: str, topic: str, *, batch=16, invisible_s=30, poll_ms=0):
    req = spb.ReceiveMessageRequest(group=pb.Resource(name=group), message_queue=pb.MessageQueue(
        topic=pb.Resource(name=topic), id=-1), batch_size=batch,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    req.invisible_duration.seconds = invisible_s
    req.long_polling_timeout.FromMilliseconds(poll_ms)
    return req


class Env:
    """The module's broker, what was stored before the fuzz, and real handles."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.channel = grpc.insecure_channel(broker.endpoint)
        self.stored_before: list = []
        self.handles: list[str] = []
        self.recall_handles: list[str] = []

    def send(self, *messages) -> spb.SendMessageResponse:
        out = _call(self.channel, "SendMessage", spb.SendMessageRequest(messages=messages),
                    _metadata())[0]
        assert out.status.code == Code.OK, out.status
        return out

    def handles_of(self, group: str, topic: str) -> list[str]:
        got = _call(self.channel, "ReceiveMessage", _receive_request(
            group, topic, invisible_s=12 * 3600, poll_ms=500), _metadata())
        return [r.message.system_properties.receipt_handle for r in got if r.HasField("message")]

    def stored(self, topic: str) -> list:
        return [m for q in range(self.broker.store.topics()[topic]["writeQueueNums"])
                for m in self.broker.store.read(topic, q, 0, 1000)]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    b = Broker(broker_config(
        tmp_path_factory.mktemp("grpcfuzz"), authenticationEnabled="true",
        initAuthenticationUser=json.dumps({"username": AK, "password": SK}),
        autoCreateTopicEnable="false", maxMessageSize=MAX_BODY,
        enablePropertyFilter="true")).start()
    try:
        for topic, queues in (("T", 2), ("Stored", 1), ("Other", 1), ("Good", 2), ("Empty", 1)):
            b.store.create_topic(topic, read_queue_nums=queues, write_queue_nums=queues)
        e = Env(b)
        e.send(*[_raw_message("Stored", b"kept-%d" % i, tag="A", keys=["k%d" % i])
                 for i in range(3)])
        e.send(_raw_message("Stored", b"delayed", message_type=pb.DELAY,
                            delivery_ms=int(time.time() * 1000) + 3_600_000))
        e.send(*[_raw_message("T", b"t-%d" % i) for i in range(4)])
        e.send(*[_raw_message("Other", b"o-%d" % i) for i in range(2)])
        recall = e.send(_raw_message("T", b"recall-me", message_type=pb.DELAY,
                                     delivery_ms=int(time.time() * 1000) + 3_600_000))
        e.recall_handles = [recall.entries[0].recall_handle]
        e.handles = e.handles_of("G", "T")[:2] + e.handles_of("GO", "Other")[:1]
        assert len(e.handles) == 3 and e.recall_handles[0]
        e.stored_before = e.stored("Stored")
        assert len(e.stored_before) == 3
        yield e
        e.channel.close()
    finally:
        b.stop()


# ---------------------------------------------------------------- adversarial values
def _tampered(handle: str) -> str:
    i = len(handle) // 2
    return handle[:i] + ("A" if handle[i] != "A" else "B") + handle[i + 1:]


TEXT = (st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
        | st.sampled_from(["", " ", "\x00", "a\nb", "\t", "é", "名", "\u200b", "a" * 300,
                           "*", "%", "|", "${x}", "../x"]))
NAMES = st.sampled_from([
    "T", "T", "Stored", "Other", "Nope", "G", "GO", "", " ", "a" * 127, "a" * 128, "g" * 256,
    "T\n", "T\x00", "Tö", "名字", "%RETRY%G", "%DLQ%G", "RMQ_SYS_TRANS_HALF_TOPIC",
    "SCHEDULE_TOPIC_XXXX", "TBW102", "../T", "T*", "bad group!", "my-group\n", "grouped\t"])
NAMES = st.one_of(NAMES, NAMES, TEXT)
FILTERS = st.sampled_from([
    "*", "", "A", "A || B", "||", "A ||", "a|b", "(", "a > ", "a = 'x' AND", "a IN ()",
    "TAGS is not null", "a BETWEEN 3 AND", "'unterminated", "a = 1 OR " * 50 + "b = 2",
    "\x00", "1/0 = 1", "a > 9223372036854775808"]) | TEXT
INT32 = st.sampled_from([0, 1, -1, 2, 32, 1024, 1025, 2**31 - 1, -2**31]) \
    | st.integers(-2**31, 2**31 - 1)
INT64 = st.sampled_from([0, 1, -1, 2**63 - 1, -2**63, 2**62]) | st.integers(-2**63, 2**63 - 1)
SECONDS = st.sampled_from([0, 1, -1, 30, 43_200, 43_201, 315_576_000_000, 2**63 - 1, -2**63]) \
    | st.integers(-2**63, 2**63 - 1)
NANOS = st.sampled_from([0, 1, -1, 999_999_999, 1_000_000_000, 2**31 - 1, -2**31])
SCALARS = {FD.TYPE_INT32: INT32, FD.TYPE_SINT32: INT32, FD.TYPE_SFIXED32: INT32,
           FD.TYPE_INT64: INT64, FD.TYPE_SINT64: INT64, FD.TYPE_SFIXED64: INT64,
           FD.TYPE_UINT32: st.integers(0, 2**32 - 1), FD.TYPE_FIXED32: st.integers(0, 2**32 - 1),
           FD.TYPE_UINT64: st.integers(0, 2**64 - 1), FD.TYPE_FIXED64: st.integers(0, 2**64 - 1),
           FD.TYPE_BOOL: st.booleans(), FD.TYPE_DOUBLE: st.floats(), FD.TYPE_FLOAT: st.floats(
               width=32)}


def _strings(env: Env, field: str):
    if field == "name":
        return NAMES
    if field == "receipt_handle":
        return st.sampled_from(env.handles + [_tampered(h) for h in env.handles]) | TEXT
    if field == "recall_handle":
        return st.sampled_from(env.recall_handles + [_tampered(env.recall_handles[0])]) | TEXT
    if field == "expression":
        return FILTERS
    return TEXT


def _real_oneofs(descriptor) -> list:
    """The oneofs of ``descriptor`` but the ones that stand for a proto3 ``optional``."""
    return [o for o in descriptor.oneofs
            if not (len(o.fields) == 1 and o.name == "_" + o.fields[0].name)]


@st.composite
def _fields(draw, env: Env, descriptor, depth: int = 0, percent: int = 50):
    """A message of ``descriptor`` whose fields are each set (``percent`` % of them), or
    not, to adversarial values; of a oneof's fields one or none."""
    msg = _cls(descriptor)()
    chosen = {o.name: draw(st.sampled_from([None, *o.fields])) for o in _real_oneofs(descriptor)}
    for f in descriptor.fields:
        oneof = f.containing_oneof
        if oneof is not None and oneof.name in chosen:
            if chosen[oneof.name] is not f:
                continue
        elif draw(st.integers(0, 99)) >= percent and descriptor.name != "FilterExpression":
            continue
        n = draw(st.integers(0, 3)) if f.is_repeated else 1
        if f.type == FD.TYPE_MESSAGE:
            if f.message_type.GetOptions().map_entry:
                getattr(msg, f.name).update(draw(st.dictionaries(TEXT, TEXT, max_size=3)))
                continue
            if f.message_type.full_name in ("google.protobuf.Duration",
                                            "google.protobuf.Timestamp"):
                values = [_cls(f.message_type)(seconds=draw(SECONDS), nanos=draw(NANOS))
                          for _ in range(n)]
            elif depth < 4:
                values = [draw(_fields(env, f.message_type, depth + 1)) for _ in range(n)]
            else:
                continue
            if f.is_repeated:
                getattr(msg, f.name).extend(values)
            else:
                getattr(msg, f.name).CopyFrom(values[0])
            continue
        if f.type == FD.TYPE_STRING:
            s = _strings(env, f.name)
        elif f.type == FD.TYPE_BYTES:
            s = st.binary(max_size=16) | st.just(b"x" * (MAX_BODY + 1))
        elif f.type == FD.TYPE_ENUM:
            s = st.sampled_from([v.number for v in f.enum_type.values]) | INT32
        else:
            s = SCALARS[f.type]
        values = [draw(s) for _ in range(n)]
        if f.is_repeated:
            getattr(msg, f.name).extend(values)
        else:
            setattr(msg, f.name, values[0])
    return msg


def _templates(env: Env) -> dict:
    """A valid request of each RPC (what a right client sends), to fuzz field by field."""
    g, t = pb.Resource(name="G"), pb.Resource(name="T")
    mq = pb.MessageQueue(topic=t, id=0)
    handle = env.handles[0]
    sub = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=g, subscriptions=[pb.SubscriptionEntry(topic=t, expression=pb.FilterExpression(
            type=pb.TAG, expression="*"))]))
    return {
        "QueryRoute": spb.QueryRouteRequest(topic=t),
        "Heartbeat": spb.HeartbeatRequest(group=g, client_type=pb.SIMPLE_CONSUMER),
        "SendMessage": spb.SendMessageRequest(messages=[_raw_message("T", b"fuzz")]),
        "QueryAssignment": spb.QueryAssignmentRequest(topic=t, group=g),
        "ReceiveMessage": _receive_request("G", "T", batch=1, invisible_s=1),
        "AckMessage": spb.AckMessageRequest(group=g, topic=t, entries=[
            spb.AckMessageEntry(receipt_handle=handle)]),
        "ForwardMessageToDeadLetterQueue": spb.ForwardMessageToDeadLetterQueueRequest(
            group=g, topic=t, receipt_handle=handle, max_delivery_attempts=16),
        "PullMessage": spb.PullMessageRequest(group=g, message_queue=mq, batch_size=4),
        "UpdateOffset": spb.UpdateOffsetRequest(group=g, message_queue=mq, offset=0),
        "GetOffset": spb.GetOffsetRequest(group=g, message_queue=mq),
        "QueryOffset": spb.QueryOffsetRequest(message_queue=mq, query_offset_policy=pb.END),
        "EndTransaction": spb.EndTransactionRequest(topic=t, transaction_id="tx",
                                                    resolution=pb.COMMIT),
        "Telemetry": spb.TelemetryCommand(settings=sub),
        "NotifyClientTermination": spb.NotifyClientTerminationRequest(group=g),
        "ChangeInvisibleDuration": spb.ChangeInvisibleDurationRequest(
            group=g, topic=t, receipt_handle=handle, invisible_duration={"seconds": 1}),
        "RecallMessage": spb.RecallMessageRequest(topic=t, recall_handle=env.recall_handles[0]),
        "SyncLiteSubscription": spb.SyncLiteSubscriptionRequest(topic=t, group=g),
    }


@st.composite
def _request(draw, env: Env, method: str):
    """A well-formed request of ``method``: its template with fields changed, or fields
    alone; Telemetry: one to three commands."""
    def one():
        m = METHODS[method]
        base = _cls(m.input_type)()
        templated = draw(st.booleans())
        if templated:
            base.CopyFrom(_templates(env)[method])
        base.MergeFrom(draw(_fields(env, m.input_type, percent=20 if templated else 50)))
        return base
    if METHODS[method].client_streaming:
        return [one() for _ in range(draw(st.integers(1, 3)))]
    return one()


@st.composite
def _raw(draw, env: Env, method: str) -> bytes:
    """Bytes where ``method``'s request goes: random, a request cut or with a byte changed,
    or another RPC's request."""
    kind = draw(st.sampled_from(["random", "cut", "flip", "other"]))
    if kind == "random":
        return draw(st.binary(max_size=64))
    if kind == "other":
        other = draw(st.sampled_from(sorted(METHODS)))
        req = draw(_request(env, other))
        return (req[0] if isinstance(req, list) else req).SerializeToString()
    good = draw(_request(env, method))
    data = (good[0] if isinstance(good, list) else good).SerializeToString() or b"\x0a\x00"
    i = draw(st.integers(0, len(data) - 1))
    if kind == "cut":
        return data[:i]
    return data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1:]


# ---------------------------------------------------------------- the good client
class GoodClient:
    """Sends ``good-<n>`` messages to topic ``Good`` and receives and acks them as group
    ``GoodGroup`` on a thread of its own, as the official Producer and SimpleConsumer do;
    ``finish()`` drains what is left and returns what went wrong."""

    def __init__(self, endpoint: str):
        self.channel = grpc.insecure_channel(endpoint)
        self.sent: list[bytes] = []
        self.received: list[bytes] = []
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="good-client", daemon=True)

    def md(self):
        return _metadata(cid="good-client")

    def start(self) -> "GoodClient":
        route = _call(self.channel, "QueryRoute", spb.QueryRouteRequest(
            topic=pb.Resource(name="Good")), self.md())[0]
        assert route.status.code == Code.OK, route.status
        self._thread.start()
        return self

    def _send(self) -> None:
        body = b"good-%d" % len(self.sent)
        r = _call(self.channel, "SendMessage", spb.SendMessageRequest(
            messages=[_raw_message("Good", body, tag="g")]), self.md())[0]
        if r.status.code != Code.OK or len(r.entries) != 1:
            self.problems.append(f"send of {body!r}: {r.status}")
        else:
            self.sent.append(body)

    def _receive(self, poll_ms: int) -> int:
        got = _call(self.channel, "ReceiveMessage", _receive_request(
            "GoodGroup", "Good", poll_ms=poll_ms), self.md())
        codes = [r.status.code for r in got if r.HasField("status")]
        if codes not in ([Code.OK], [Code.MESSAGE_NOT_FOUND]):
            self.problems.append(f"receive answered {codes}")
        msgs = [r.message for r in got if r.HasField("message")]
        for m in msgs:
            self.received.append(m.body)
            ack = _call(self.channel, "AckMessage", spb.AckMessageRequest(
                group=pb.Resource(name="GoodGroup"), topic=m.topic, entries=[spb.AckMessageEntry(
                    message_id=m.system_properties.message_id,
                    receipt_handle=m.system_properties.receipt_handle)]), self.md())[0]
            if ack.status.code != Code.OK:
                self.problems.append(f"ack of {m.body!r}: {ack.status}")
        return len(msgs)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._send()
                self._receive(poll_ms=100)
        except Exception as e:  # noqa: BLE001 (recorded: finish() reports it as a failure)
            self.problems.append(f"{type(e).__name__}: {e}")

    def finish(self) -> list[str]:
        self._stop.set()
        self._thread.join(30)
        for _ in range(20):
            if len(self.received) >= len(self.sent) and self._receive(poll_ms=0) == 0:
                break
            self._receive(poll_ms=500)
        if sorted(self.received) != sorted(self.sent):
            self.problems.append(f"sent {len(self.sent)} messages, received "
                                 f"{len(self.received)} ({len(set(self.received))} distinct)")
        self.channel.close()
        return self.problems


# ---------------------------------------------------------------- the properties
def _names(request, field: str, depth: int = 0) -> list[str]:
    """The names of every Resource called ``field`` (topic, group) anywhere in ``request``
    (an absent one: "", as the broker reads it)."""
    out = []
    for f in request.DESCRIPTOR.fields:
        if f.type != FD.TYPE_MESSAGE or f.message_type.GetOptions().map_entry or depth > 5:
            continue
        value = getattr(request, f.name)
        for v in (value if f.is_repeated else [value]):
            if f.name == field and f.message_type.name == "Resource":
                out.append(v.name)
            out += _names(v, field, depth + 1)
    return out


def _illegal(names: list[str], check) -> bool:
    try:
        [check(n) for n in names]
    except InvalidNameError:
        return True
    return False


def _judge(env: Env, method: str, request, raw: bool, errors: ErrorRecords) -> list[pb.Status]:
    """Call ``method`` signed; fail unless it answered in time with clear statuses."""
    errors.records.clear()
    try:
        responses = _call(env.channel, method, request, _metadata(), raw=raw)
    except grpc.RpcError as e:
        pytest.fail(f"{method} answered gRPC {e.code()} ({e.details()}) instead of a status")
    statuses = _statuses(responses)
    if not METHODS[method].client_streaming:
        assert statuses, f"{method} answered no status: {responses}"
    for s in statuses:
        assert s.code not in INTERNAL, f"{method}: {Code.Name(s.code)} {s.message!r}"
        assert s.code != Code.UNAUTHORIZED, f"{method} refused the credential: {s.message}"
        if s.code != Code.OK:
            assert s.message and s.message != "OK", f"{method}: {Code.Name(s.code)} says nothing"
            assert "Traceback" not in s.message and 'File "' not in s.message, s.message
    assert not errors.records, [logging.Formatter().format(r) for r in errors.records[:2]]
    codes = {s.code for s in statuses}
    # the code names what was wrong, in some message of a stream (its statuses are the
    # stream's: one message's group may be refused after another's was taken)
    reqs = request if isinstance(request, list) else [request]
    if not raw and Code.ILLEGAL_TOPIC in codes:
        assert _illegal([n for r in reqs for n in _names(r, "topic")], validate_topic), statuses
    if not raw and Code.ILLEGAL_CONSUMER_GROUP in codes:
        assert _illegal([n for r in reqs for n in _names(r, "group")], validate_group), statuses
    return statuses


FUZZ = settings(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_fuzzed_rpcs_answer_clearly_and_harm_no_one(env):
    """Properties 1-4 of the module docstring, with a good client running throughout."""
    errors = ErrorRecords()
    logging.getLogger("sparkmq").addHandler(errors)
    good = GoodClient(env.broker.endpoint).start()
    seen: dict[str, set] = {}

    @settings(FUZZ, max_examples=30)
    @given(data=st.data())
    def structured(method, data):
        request = data.draw(_request(env, method))
        for s in _judge(env, method, request, False, errors):
            seen.setdefault(method, set()).add(Code.Name(s.code))

    @settings(FUZZ, max_examples=15)
    @given(data=st.data())
    def raw(method, data):
        payload = data.draw(_raw(env, method))
        _judge(env, method, [payload] if METHODS[method].client_streaming else payload,
               True, errors)

    try:
        for method in sorted(METHODS):      # every RPC gets its share of examples
            structured(method)
            raw(method)
    finally:
        logging.getLogger("sparkmq").removeHandler(errors)
        problems = good.finish()
    assert problems == []
    assert len(good.sent) > 0
    assert env.stored("Stored")[:len(env.stored_before)] == env.stored_before
    assert env.broker.is_running
    after = env.send(_raw_message("T", b"still serving"))
    assert after.entries[0].status.code == Code.OK


BAD_CREDENTIALS = st.sampled_from([
    (None, SK), ("", ""), (AK, "wrong-secret"), ("mallory", SK), (AK.upper(), SK)])


@pytest.mark.parametrize("method", sorted(METHODS))
@settings(deadline=None, max_examples=8, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), cred=BAD_CREDENTIALS, raw=st.booleans())
def test_without_a_valid_credential_every_rpc_is_refused(env, method, data, cred, raw):
    request = data.draw(_raw(env, method) if raw else _request(env, method))
    if raw and METHODS[method].client_streaming:
        request = [request]
    written = env.broker.store.commitlog.written_offset
    md = _metadata(*cred, cid="intruder")
    if METHODS[method].client_streaming:
        with pytest.raises(grpc.RpcError) as err:
            _call(env.channel, method, request, md, raw=raw)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    else:
        codes = [s.code for s in _statuses(_call(env.channel, method, request, md,
                                                         raw=raw))]
        assert codes[:1] == [Code.UNAUTHORIZED], (method, [Code.Name(c) for c in codes])
    assert env.broker.store.commitlog.written_offset == written


# where each RPC names a topic and a group it checks (set on its template)
NAME_FIELDS = {
    "QueryRoute": ("topic", None), "QueryOffset": ("message_queue.topic", None),
    "SendMessage": ("messages.0.topic", None), "QueryAssignment": ("topic", "group"),
    "ReceiveMessage": ("message_queue.topic", "group"),
    "PullMessage": ("message_queue.topic", "group"),
    "GetOffset": ("message_queue.topic", "group"), "UpdateOffset": ("message_queue.topic", "group"),
    "AckMessage": (None, "group"), "ChangeInvisibleDuration": (None, "group"),
    "ForwardMessageToDeadLetterQueue": (None, "group"), "Heartbeat": (None, "group")}
ILLEGAL_NAMES = st.sampled_from(["bad group!", "my-group\n", "group\x00", "consumer group",
                                 "", "a" * 256, "RMQ_SYS_X", "TBW102", "T\n", "../T"]) \
    | st.text(max_size=12)


def _resource(request, path: str):
    for part in path.split("."):
        request = request[int(part)] if part.isdigit() else getattr(request, part)
    return request


@settings(deadline=None, max_examples=150, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(sorted(NAME_FIELDS)), which=st.sampled_from(["topic", "group"]),
       name=ILLEGAL_NAMES)
def test_an_illegal_name_gets_the_code_that_names_it(env, method, which, name):
    """A topic name the rule refuses gets ILLEGAL_TOPIC, a group name ILLEGAL_CONSUMER_GROUP
    (whatever words the name holds), the other name of the request being right."""
    path = NAME_FIELDS[method][0 if which == "topic" else 1]
    check = validate_topic if which == "topic" else validate_group
    if path is None or not _illegal([name], check) or (method == "Heartbeat" and not name):
        return                          # (a Heartbeat without a group is a producer's)
    request = _templates(env)[method]
    _resource(request, path).name = name
    [answer] = _call(env.channel, method, request, _metadata())
    codes = [s.code for s in _statuses([answer])]
    want = Code.ILLEGAL_TOPIC if which == "topic" else Code.ILLEGAL_CONSUMER_GROUP
    assert codes[:1] == [want], (Code.Name(codes[0]), answer.status.message)
    assert repr(name) in answer.status.message or name == "" or len(name) > 127, \
        answer.status.message


@pytest.mark.parametrize("method", ["ReceiveMessage", "PullMessage"])
def test_a_long_poll_answers_before_the_client_deadline(env, method):
    """However long a poll a request asks for, the answer (MESSAGE_NOT_FOUND) comes before
    the client's deadline, as the proxy bounds a poll by the call's remaining time."""
    mq = pb.MessageQueue(topic=pb.Resource(name="Empty"), id=0)
    if method == "ReceiveMessage":
        request = spb.ReceiveMessageRequest(group=pb.Resource(name="G"), message_queue=mq,
                                            batch_size=1)
    else:
        request = spb.PullMessageRequest(group=pb.Resource(name="G"), message_queue=mq,
                                         batch_size=1)
    request.long_polling_timeout.seconds = 10**9
    call = env.channel.unary_stream(f"/{SERVICE.full_name}/{method}",
                                    request_serializer=lambda r: r.SerializeToString(),
                                    response_deserializer=_cls(METHODS[method].output_type)
                                    .FromString)
    try:
        answers = list(call(request, timeout=1.0, metadata=_metadata()))
    except grpc.RpcError as e:
        pytest.fail(f"{method} with a long poll answered gRPC {e.code()}, not a status")
    assert [a.status.code for a in answers if a.HasField("status")] == [Code.MESSAGE_NOT_FOUND]


@pytest.mark.parametrize("group, topic", [("bad group!", "T"), ("G", "bad topic!")])
def test_telemetry_settings_with_an_illegal_name_are_refused(env, group, topic):
    cmd = spb.TelemetryCommand(settings=pb.Settings(
        client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
            group=pb.Resource(name=group), subscriptions=[pb.SubscriptionEntry(
                topic=pb.Resource(name=topic),
                expression=pb.FilterExpression(type=pb.TAG, expression="*"))])))
    answers = _call(env.channel, "Telemetry", [cmd], _metadata(cid="settings-" + group))
    assert [Code.Name(a.status.code) for a in answers] == \
        ["ILLEGAL_CONSUMER_GROUP" if group != "G" else "ILLEGAL_TOPIC"]


def test_a_stream_whose_later_settings_name_no_group_is_judged_by_that_message(env):
    # found by the fuzz above: a Telemetry stream of good settings, then settings whose
    # subscription names no group; the second is refused ILLEGAL_CONSUMER_GROUP, which
    # the judge must find named by some message of the stream, not by each
    good = spb.TelemetryCommand(settings=pb.Settings(
        client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
            group=pb.Resource(name="G"), subscriptions=[pb.SubscriptionEntry(
                topic=pb.Resource(name="T"),
                expression=pb.FilterExpression(type=pb.TAG, expression="*"))])))
    nameless = spb.TelemetryCommand(settings=pb.Settings(subscription=pb.Subscription()))
    codes = [Code.Name(s.code) for s in
             _judge(env, "Telemetry", [good, nameless], False, ErrorRecords())]
    assert codes == ["OK", "ILLEGAL_CONSUMER_GROUP"], codes


# ---------------------------------------------------------------- the NameServer
@pytest.fixture(scope="module")
def namesrv():
    from helpers.net import free_port
    from sparkmq.namesrv import NameServer
    from sparkmq.namesrv.signing import resolve_secret

    with NameServer(port=free_port()) as ns:
        secret = resolve_secret()
        code, _ = _http(ns, "POST", "/brokers/register", json.dumps(
            {"cluster": "C", "brokerName": "kept", "brokerId": 0, "endpoint": "127.0.0.1:1",
             "topics": {"KeptTopic": {"readQueueNums": 2, "writeQueueNums": 2}}}).encode(),
            secret)
        assert code == 200
        yield ns, secret


def _http(ns, method: str, path: str, body: bytes | None, secret: str | None,
          bad_signature: bool = False) -> tuple[int, bytes]:
    from sparkmq.namesrv.signing import sign

    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers.update(sign(secret, method, path.split("?")[0], body or b""))
        if bad_signature:
            headers["X-Sparkmq-Signature"] = "0" * 64
    conn = http.client.HTTPConnection(ns.host, ns.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(TEXT, kids, max_size=3), max_leaves=8)
NUMBERS = st.sampled_from(["0", "-1", "NaN", "1.5", "2e19", "99999999999999999999999", '"7"',
                           '"x"', "null", "[]", "{}", '{"a": 1}', "true"])
INFINITE = ["1e999", "-1e999", "Infinity"]       # JSON numbers int() cannot take


@st.composite
def _registration(draw) -> bytes:
    """A register or unregister body: right keys, each value anything (also numbers JSON
    holds and Python's int() does not: 1e999, NaN)."""
    keys = {"cluster": '"C"', "brokerName": '"fuzzed"', "brokerId": "1",
            "endpoint": '"127.0.0.1:2"', "role": '"ASYNC_MASTER"',
            "topics": '{"FuzzTopic": {"readQueueNums": 1, "writeQueueNums": 1}}',
            "epochs": '[{"epoch": 1, "storeId": "s"}]'}
    parts = []
    for key, value in keys.items():
        if draw(st.integers(0, 3)) == 0:
            continue
        if draw(st.booleans()):
            value = draw(NUMBERS | JSON.map(json.dumps))
        if key == "topics" and draw(st.booleans()):
            value = '{"FuzzTopic": {"readQueueNums": %s}}' % draw(NUMBERS)
        if key == "epochs" and draw(st.booleans()):
            value = '[{"epoch": %s, "storeId": "s"}]' % draw(NUMBERS)
        parts.append(f'"{key}": {value}')
    return ("{" + ", ".join(parts) + "}").encode()


def _clear(code: int, answer: bytes) -> None:
    """An answer, and a refusal of a request with what was wrong (JSON ``error``)."""
    assert code < 500, (code, answer)
    if code >= 400:
        assert json.loads(answer)["error"], answer


@settings(deadline=None, max_examples=100, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
       path=st.sampled_from(["/health", "/brokers", "/route?topic=KeptTopic", "/route",
                             "/route?topic=", "/route?topic=%00%ff", "/brokers/register",
                             "/brokers/unregister", "/", "/../x", "/route?topic=a&topic=b"]),
       body=st.none() | st.binary(max_size=32) | JSON.map(lambda j: json.dumps(j).encode())
       | _registration(), signing=st.sampled_from(["none", "bad signature"]))
def test_the_nameserver_answers_every_request_clearly(namesrv, method, path, body, signing):
    """Every request without the cluster secret gets an answer (no dropped connection, no
    5xx but 501 for a method the API has not), a refusal as JSON with its reason; its
    writes are refused 401 and change nothing; the NameServer keeps serving."""
    ns, secret = namesrv
    before = ns.registry.route("KeptTopic")
    try:
        code, answer = _http(ns, method, path, body, None if signing == "none" else secret,
                             bad_signature=True)
    except (OSError, http.client.HTTPException) as e:
        pytest.fail(f"{method} {path} {body!r}: no answer ({type(e).__name__}: {e})")
    if method not in ("GET", "POST"):
        assert code == 501, code
        return
    _clear(code, answer)
    if method == "POST" and path.startswith("/brokers/"):
        assert code == 401, (code, answer)
    assert ns.registry.route("KeptTopic") == before
    assert _http(ns, "GET", "/health", None, None) == (200, b"ok")


@settings(deadline=None, max_examples=100, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/brokers/register", "/brokers/unregister"]), body=_registration())
def test_the_nameserver_answers_signed_writes_clearly(namesrv, path, body):
    """A cluster member's register or unregister with any values gets 200, 409 or a 400 that
    says what was wrong; the broker registered before keeps its route."""
    ns, secret = namesrv
    before = ns.registry.route("KeptTopic")
    try:
        code, answer = _http(ns, "POST", path, body, secret)
    except (OSError, http.client.HTTPException) as e:
        pytest.fail(f"POST {path} {body!r}: no answer ({type(e).__name__}: {e})")
    _clear(code, answer)
    assert ns.registry.route("KeptTopic") == before
    assert _http(ns, "GET", "/health", None, None) == (200, b"ok")


@pytest.mark.parametrize("path", ["/brokers/register", "/brokers/unregister"])
@pytest.mark.parametrize("number", INFINITE)
def test_a_signed_write_with_an_infinite_number_is_refused_clearly(namesrv, path, number):
    ns, secret = namesrv
    body = ('{"cluster": "C", "brokerName": "fuzzed", "brokerId": %s, '
            '"endpoint": "127.0.0.1:2"}' % number).encode()
    try:
        code, answer = _http(ns, "POST", path, body, secret)
    except (OSError, http.client.HTTPException) as e:
        raise AssertionError(f"no answer: {type(e).__name__}: {e}") from None
    assert code == 400 and json.loads(answer)["error"], (code, answer)
