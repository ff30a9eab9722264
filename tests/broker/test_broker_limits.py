"""Input limits at the broker, over real gRPC: a bad message refuses its request with the
RocketMQ 5 proxy's status and nothing of the request is stored, as the proxy; names are
matched whole; an out-of-range QueryOffset time is refused; and a bad message merged
with concurrent good sends (official client) never fails them, whether the broker
refuses it before the merge or the store fails on it after."""
from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from helpers.brokers import GrpcContext
from helpers.waiting import wait_until
from sparkmq.broker.grpc_service import MessagingServicer
from sparkmq.broker.sendlimits import first_body_refusal

Code = pb.Code
KIB, MIB = 1 << 10, 1 << 20
FAR_S = 2**62                  # seconds: a time no int64 of milliseconds holds


@pytest.fixture
def stub(make_broker):
    b = make_broker(autoCreateTopicEnable="false", maxMessageSize=64 * KIB)
    b.store.create_topic("Known")
    channel = grpc.insecure_channel(b.endpoint,
                                    options=[("grpc.max_send_message_length", 64 * MIB)])
    yield b, MessagingServiceStub(channel)
    channel.close()


def raw(body=b"x", topic="Known", mtype=pb.NORMAL, props=None, keys=(), **sys_props):
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_type = mtype
    m.system_properties.born_timestamp.FromMilliseconds(1_700_000_000_000)
    m.user_properties.update(props or {})
    m.system_properties.keys.extend(keys)
    for k, v in sys_props.items():
        if k in ("born_timestamp", "delivery_timestamp"):
            getattr(m.system_properties, k).seconds = v
        else:
            setattr(m.system_properties, k, v)
    return m


BAD = [
    ("129 properties", dict(props={f"k{i}": "v" for i in range(129)}),
     Code.MESSAGE_PROPERTIES_TOO_LARGE),
    ("a 1 MiB property", dict(props={"big": "v" * MIB}), Code.MESSAGE_PROPERTIES_TOO_LARGE),
    ("a system property key", dict(props={"UNIQ_KEY": "mine"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ("a property with a control character", dict(props={"a": "b\x01"}),
     Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ("a 17 KiB tag", dict(tag="t" * (17 * KIB)), Code.MESSAGE_PROPERTIES_TOO_LARGE),
    ("a tag with '|'", dict(tag="a|b"), Code.ILLEGAL_MESSAGE_TAG),
    ("a tag with a newline", dict(tag="TagA\n"), Code.ILLEGAL_MESSAGE_TAG),
    ("5000 keys", dict(keys=[f"k{i:04d}" for i in range(5000)]),
     Code.MESSAGE_PROPERTIES_TOO_LARGE),
    ("a blank key", dict(keys=[" "]), Code.ILLEGAL_MESSAGE_KEY),
    ("a 64-byte message group", dict(mtype=pb.FIFO, message_group="g" * 64),
     Code.ILLEGAL_MESSAGE_GROUP),
    ("a 4 MiB message group", dict(mtype=pb.FIFO, message_group="g" * (4 * MIB)),
     Code.ILLEGAL_MESSAGE_GROUP),
    ("a 1 MiB message id", dict(message_id="i" * MIB), Code.ILLEGAL_MESSAGE_ID),
    ("a message id with a newline", dict(message_id="ID\n"), Code.ILLEGAL_MESSAGE_ID),
    ("born 2^62 s", dict(born_timestamp=FAR_S), Code.BAD_REQUEST),
    ("delivered at 2^62 s", dict(mtype=pb.DELAY, delivery_timestamp=FAR_S),
     Code.ILLEGAL_DELIVERY_TIME),
    ("message type 99", dict(mtype=99), Code.BAD_REQUEST),
    ("message type -5", dict(mtype=-5), Code.BAD_REQUEST),
    ("whole message over maxMessageSize", dict(body=b"x" * (64 * KIB - 8),
                                               props={"p": "v" * 100}),
     Code.MESSAGE_BODY_TOO_LARGE),
]


def _stored_bodies(b, topic="Known") -> list[bytes]:
    conf = b.store.topics()[topic]
    return sorted(m.body for q in range(conf["writeQueueNums"])
                  for m in b.store.read(topic, q, 0, 100))


@pytest.mark.integration
@pytest.mark.parametrize("fields,code", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_message_refuses_its_request_with_the_proxys_code_and_nothing_is_stored(
        stub, fields, code):
    b, s = stub
    resp = s.SendMessage(spb.SendMessageRequest(messages=[
        raw(b"good-1", message_id="G1"), raw(**fields), raw(b"good-2", message_id="G2")]),
        timeout=30)
    assert (resp.status.code, len(resp.entries)) == (code, 0), resp.status.message
    assert resp.status.message.startswith("message 1 of 3: ")
    assert _stored_bodies(b) == []
    alone = s.SendMessage(spb.SendMessageRequest(messages=[raw(**fields)]), timeout=30)
    assert alone.status.code == code and " of 1: " not in alone.status.message


def _codes_alone(s, messages) -> list[int]:
    """Each message's code, sent in a request of its own."""
    out = []
    for m in messages:
        r = s.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=10)
        out.append(r.status.code)
    return out


@pytest.mark.integration
def test_names_are_matched_whole_and_bad_times_refused_on_every_rpc(stub):
    b, s = stub
    resp = s.SendMessage(spb.SendMessageRequest(messages=[raw(topic="Known\n")]), timeout=10)
    assert resp.status.code == Code.ILLEGAL_TOPIC and not resp.entries
    route = s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="Known\n")), timeout=10)
    assert route.status.code == Code.ILLEGAL_TOPIC
    mq = pb.MessageQueue(topic=pb.Resource(name="Known"), id=0)
    got = s.GetOffset(spb.GetOffsetRequest(group=pb.Resource(name="GNL\n"), message_queue=mq),
                      timeout=10, metadata=[("x-mq-client-id", "c1")])
    assert got.status.code == Code.ILLEGAL_CONSUMER_GROUP
    far = pb.MessageQueue(topic=pb.Resource(name="Known"), id=0)
    req = spb.QueryOffsetRequest(message_queue=far, query_offset_policy=pb.TIMESTAMP)
    req.timestamp.seconds = FAR_S
    assert s.QueryOffset(req, timeout=10).status.code == Code.BAD_REQUEST
    req.timestamp.seconds = 0
    assert s.QueryOffset(req, timeout=10).status.code == Code.OK


def _hold_first_append(b, ready):
    """Hold the store's first append until ``ready()``, so that the requests queued
    behind it are merged into one append; returns the list of appended batch sizes."""
    appended: list[int] = []
    append_batch = b.store.append_batch

    def held(batch, **kw):
        appended.append(len(batch))    # (BuiltRows or a batch: its rows)
        if len(appended) == 1:
            wait_until(ready, "every other request queued or answered", timeout_s=30)
        return append_batch(batch, **kw)
    b.store.append_batch = held
    return appended


def _send_concurrently(b, bad: list[pb.Message], good_count: int):
    """``good_count`` good requests and one per ``bad`` message, each on a thread of its
    own, all at once behind a held first append (released once every other request is
    queued behind it or already answered: a bad one may be refused before the merge);
    returns (good responses, bad responses). In process (``send_message``): requests on
    threads meet in ``SendMerger`` (controller mode's gRPC sends, in-process callers); the
    gRPC server's own sends run one at a time on its loop (``replicawait``)."""
    servicer = MessagingServicer(b)
    goods, answers, errors = [], [], []
    others = good_count + len(bad) - 1
    appended = _hold_first_append(
        b, lambda: b.sender.merger.pending + len(answers) >= others)

    def send(m, into):
        try:
            into.append(servicer.send_message(spb.SendMessageRequest(messages=[m]),
                                              GrpcContext()))
        # collected, and asserted below
        except Exception as e:
            errors.append(e)
    # (the good ones with a user property: not plain, so they meet the bad ones in
    # SendService's merger, not in the plain path's: test_plain_send, test_flight)
    threads = [threading.Thread(target=send, args=(raw(b"good-%03d" % i, props={"p": "v"}),
                                                   goods)) for i in range(good_count)]
    threads += [threading.Thread(target=send, args=(m, answers)) for m in bad]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    merger = b.sender.merger
    assert len(appended) >= 2 and merger.batches < merger.requests   # some were merged
    return goods, answers


@pytest.mark.integration
def test_concurrent_good_sends_are_all_acked_beside_bad_ones(stub):
    b, s = stub
    bad = [raw(b"bad", born_timestamp=FAR_S), raw(b"bad", mtype=99),
           raw(b"bad", props={"p": "v" * MIB}), raw(b"bad", message_id="i" * 200)]
    goods, answers = _send_concurrently(b, bad, good_count=24)
    assert len(goods) == 24 and {g.status.code for g in goods} == {Code.OK}
    assert sorted(a.status.code for a in answers) == sorted(
        [Code.BAD_REQUEST, Code.BAD_REQUEST, Code.MESSAGE_PROPERTIES_TOO_LARGE,
         Code.ILLEGAL_MESSAGE_ID])
    assert _stored_bodies(b) == [b"good-%03d" % i for i in range(24)]


@pytest.mark.integration
def test_a_store_failure_of_one_merged_request_fails_that_request_only(stub, monkeypatch):
    """With the broker's own check switched off, a born time of 2^62 s reaches the batch
    builder and fails there (an unexpected OverflowError): the merged append is retried
    request by request, so only the bad request fails."""
    from sparkmq.broker import send
    monkeypatch.setattr(send, "message_violation", lambda *a, **kw: None)
    b, s = stub
    goods, answers = _send_concurrently(b, [raw(b"bad", born_timestamp=FAR_S)], good_count=12)
    assert len(goods) == 12 and {g.status.code for g in goods} == {Code.OK}
    (answer,) = answers
    assert answer.entries[0].status.code != Code.OK
    assert _stored_bodies(b) == [b"good-%03d" % i for i in range(12)]


@pytest.mark.integration
def test_out_of_range_durations_get_the_proxys_codes(stub):
    from google.protobuf.duration_pb2 import Duration
    b, s = stub
    meta = [("x-mq-client-id", "c1")]
    mq = pb.MessageQueue(topic=pb.Resource(name="Known"), id=0)

    def receive(**kw):
        req = spb.ReceiveMessageRequest(group=pb.Resource(name="G"), message_queue=mq,
                                        batch_size=kw.pop("batch_size", 1), **kw)
        return [r.status.code for r in s.ReceiveMessage(req, timeout=10, metadata=meta)
                if r.HasField("status")]
    assert receive(invisible_duration=Duration(seconds=FAR_S)) == [Code.ILLEGAL_INVISIBLE_TIME]
    assert receive(invisible_duration=Duration(seconds=-5)) == [Code.ILLEGAL_INVISIBLE_TIME]
    assert receive(batch_size=-1, invisible_duration=Duration(seconds=30)) == [Code.BAD_REQUEST]
    change = s.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name="G"), topic=pb.Resource(name="Known"), receipt_handle="x",
        invisible_duration=Duration(seconds=-5)), timeout=10, metadata=meta)
    assert change.status.code == Code.ILLEGAL_INVISIBLE_TIME


@pytest.mark.integration
def test_the_limits_are_set_in_the_broker_config_with_the_proxys_names(make_broker):
    b = make_broker(autoCreateTopicEnable="false", userPropertyMaxNum=2, maxMessageGroupSize=8,
                    maxUserPropertySize=40)
    b.store.create_topic("Known")
    channel = grpc.insecure_channel(b.endpoint)
    try:
        codes = _codes_alone(MessagingServiceStub(channel), [
            raw(props={"a": "1", "b": "2", "c": "3"}), raw(props={"a": "1", "b": "2"}),
            raw(mtype=pb.FIFO, message_group="eightchr"), raw(mtype=pb.FIFO, message_group="g7"),
            raw(tag="t" * 41)])
    finally:
        channel.close()
    assert codes == [Code.MESSAGE_PROPERTIES_TOO_LARGE, Code.OK, Code.ILLEGAL_MESSAGE_GROUP,
                     Code.OK, Code.MESSAGE_PROPERTIES_TOO_LARGE]


@pytest.mark.integration
def test_a_request_mixing_parked_refused_and_plain_messages_names_the_first_bad(stub):
    """Parked (delayed, transactional) messages are checked one by one, the others from
    the request's columns: the refusal names the first bad message in request order
    whichever way each was checked, and nothing is stored."""
    b, s = stub
    far = raw(b"late", mtype=pb.DELAY, props={"UNIQ_KEY": "x"})     # parked, refused
    far.system_properties.delivery_timestamp.FromMilliseconds(1_700_000_000_000 + 3_600_000)
    later = raw(b"later", mtype=pb.DELAY)                             # parked, good
    later.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000)
                                                               + 3_600_000)
    cases = [([raw(b"ok-1"), later, raw(b"bad", keys=[" "]), far],
              (2, Code.ILLEGAL_MESSAGE_KEY)),             # a column-checked one before far
             ([raw(b"ok-1"), far, raw(b"bad", tag="a|b")], (1, Code.ILLEGAL_MESSAGE_PROPERTY_KEY)),
             ([later, raw(b"ok-2", tag="TagA"), raw(b"bad", born_timestamp=FAR_S)],
              (2, Code.BAD_REQUEST))]
    for messages, (i, code) in cases:
        resp = s.SendMessage(spb.SendMessageRequest(messages=messages), timeout=10)
        assert (resp.status.code, len(resp.entries)) == (code, 0), resp.status.message
        assert resp.status.message.startswith(f"message {i} of {len(messages)}: ")
    assert _stored_bodies(b) == []
    assert b.schedule.pending_count() == 0


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 7, 8, 9]), min_size=1, max_size=40))
def test_first_body_refusal_names_the_first_empty_or_oversized_body(sizes):
    # a few rows are decided in Python, more with numpy: the same row and status either way
    got = first_body_refusal(np.array(sizes, np.int32), 8)
    # the bodies' bounds, where measured with them, decide the same
    extent = (min(sizes), max(sizes), sum(sizes))
    assert first_body_refusal(np.array(sizes, np.int32), 8, extent) == got
    bad = [r for r, s in enumerate(sizes) if s == 0 or s > 8]
    if not bad:
        assert got is None
    else:
        r, st_ = got
        assert r == bad[0]
        assert st_.code == (Code.MESSAGE_BODY_EMPTY if sizes[r] == 0
                            else Code.MESSAGE_BODY_TOO_LARGE)
