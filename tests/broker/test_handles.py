"""Receipt and recall handles cannot be forged, and system topics are not served to
clients (issue 13 item 3): a guessed or altered handle gets INVALID_RECEIPT_HANDLE and
changes nothing; RMQ_SYS_* and SCHEDULE_TOPIC_XXXX answer ILLEGAL_TOPIC."""
from __future__ import annotations

import base64
import dataclasses
import os
import stat
import time

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.definition_pb2 import Code

from sparkmq.broker import Broker
from sparkmq.broker.handles import HandleSigner
from sparkmq.client import ClientError, Message, Producer, SimpleConsumer

from helpers.brokers import broker_config
from helpers.clock import Clock

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(tmp_path):
    b = Broker(broker_config(tmp_path), clock_ms=Clock(int(time.time() * 1000))).start()
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    yield b
    b.stop()


def _forgeries(handle: str) -> list[str]:
    text = handle.rpartition("~")[0]
    seq, qid, off, topic, broker = text.split(".", 4)
    return [text,                                                  # unsigned, old style
            f"{seq}.{qid}.{int(off) + 1}.{topic}.{broker}~" + handle.rpartition("~")[2],
            f"{int(seq, 16) + 1:x}.{qid}.{off}.{topic}.{broker}~" + "0" * 32,
            handle[:-1] + ("0" if handle[-1] != "0" else "1")]


def test_a_forged_receipt_handle_acks_nothing(broker):
    with Producer(broker.endpoint) as p:
        p.send(Message("T", b"one"))
        p.send(Message("T", b"two"))
    c = SimpleConsumer(broker.endpoint, "G", {"T": "*"})
    try:
        got = c.receive(max_messages=2, invisible_duration_s=60, wait_s=2)
        assert [m.body for m in got] == [b"one", b"two"]
        for fake in _forgeries(got[0].receipt_handle):
            with pytest.raises(ClientError, match="INVALID_RECEIPT_HANDLE"):
                c.ack(dataclasses.replace(got[0], receipt_handle=fake))
        c.ack(got[0])                  # the genuine handles still work: nothing was acked
        c.ack(got[1])
    finally:
        c.close()


def test_a_forged_recall_handle_cancels_nothing(broker):
    clock = broker.clock_ms
    with Producer(broker.endpoint) as p:
        r = p.send(Message("T", b"later", delivery_timestamp_ms=clock.now_ms + 60_000))
        text = r.recall_handle.rpartition("~")[0]
        parts = base64.urlsafe_b64decode(text).decode().split(" ")
        guesses = [text] + [base64.urlsafe_b64encode(" ".join(
            parts[:4] + [str(int(parts[4]) + d)] + parts[5:]).encode()).decode() + "~" + "a" * 32
            for d in (0, 1)]
        for fake in guesses:
            with pytest.raises(ClientError, match="INVALID_RECEIPT_HANDLE"):
                p.recall_message("T", fake)
        assert broker.schedule.pending_count() == 1
        assert p.recall_message(r) == r.message_id


@pytest.mark.parametrize("topic", ["RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX"])
def test_system_topics_are_not_served_to_clients(broker, topic):
    assert topic in broker.store.topics()            # they exist on every broker
    with Producer(broker.endpoint) as p:
        route = p.conns.call(broker.endpoint, "QueryRoute",
                             spb.QueryRouteRequest(topic=pb.Resource(name=topic)))
        assert route.status.code == Code.ILLEGAL_TOPIC
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name="G"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=1)
    with grpc.insecure_channel(broker.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        answers = list(stub.ReceiveMessage(req, timeout=30,
                                           metadata=[("x-mq-client-id", "forger")]))
    codes = [a.status.code for a in answers if a.HasField("status")]
    assert codes and codes[0] == Code.ILLEGAL_TOPIC
    assert not any(a.HasField("message") for a in answers)


def test_the_handle_secret_is_private_and_kept_across_restarts(tmp_path):
    conf = broker_config(tmp_path)
    clock = Clock(int(time.time() * 1000))
    b = Broker(conf, clock_ms=clock).start()
    try:
        b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        with Producer(b.endpoint) as p:
            r = p.send(Message("T", b"later", delivery_timestamp_ms=clock.now_ms + 60_000))
    finally:
        b.stop()
    path = os.path.join(conf.store_path, "handle.secret")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    b = Broker(conf, clock_ms=clock).start()
    try:
        with Producer(b.endpoint) as p:
            assert p.recall_message(r) == r.message_id
    finally:
        b.stop()


def test_a_receipt_handle_from_before_a_restart_does_not_ack_the_new_delivery(tmp_path):
    """The secret outlives a restart (recall handles need it), so the lease a receipt
    handle names must too be one this start made: a consumer that received a message
    before the restart may not ack, nor hide, the delivery made to another after it."""
    conf = broker_config(tmp_path)
    b = Broker(conf).start()
    try:
        b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        with Producer(b.endpoint) as p:
            p.send(Message("T", b"one"))
        before = SimpleConsumer(b.endpoint, "G", {"T": "*"})
        try:
            [old] = before.receive(max_messages=1, invisible_duration_s=600, wait_s=2)
        finally:
            before.close()
    finally:
        b.stop()
    b = Broker(conf).start()
    try:
        after = SimpleConsumer(b.endpoint, "G", {"T": "*"})
        try:
            [new] = after.receive(max_messages=1, invisible_duration_s=600, wait_s=2)
            assert new.body == b"one" and new.delivery_attempt == 1   # not acked: again
            for act in (after.ack, lambda m: after.change_invisible_duration(m, 0)):
                with pytest.raises(ClientError, match="INVALID_RECEIPT_HANDLE"):
                    act(old)
            assert after.receive(max_messages=1, invisible_duration_s=600, wait_s=0) == []
            after.ack(new)
        finally:
            after.close()
    finally:
        b.stop()


def test_a_signer_opens_only_its_own_handles():
    a, b = HandleSigner(), HandleSigner()
    h = a.sign("1.0.5.T.broker-a")
    assert a.open(h) == "1.0.5.T.broker-a"
    with pytest.raises(Exception, match="not issued by this broker"):
        b.open(h)


def test_a_handle_that_is_not_ascii_is_refused_not_an_internal_error(broker):
    # found by test_grpc_fuzz: compare_digest raised TypeError on a non-ASCII MAC, and the
    # RPC answered INTERNAL_ERROR instead of INVALID_RECEIPT_HANDLE
    signer = HandleSigner()
    for fake in ("1.0.5.T.broker-a~\u00e9", "~\u00e9" * 3, "\u00e9~" + "0" * 32,
                 "1.0.5.T~\ud800", "\ud800~" + "0" * 32):
        with pytest.raises(Exception, match="not issued by this broker"):
            signer.open(fake)
    with grpc.insecure_channel(broker.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        r = stub.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
            group=pb.Resource(name="G"), topic=pb.Resource(name="T"),
            receipt_handle="1.0.5.T.broker-a~\u00e9", invisible_duration={"seconds": 1}),
            timeout=10, metadata=[("x-mq-client-id", "handles-test")])
        assert r.status.code == Code.INVALID_RECEIPT_HANDLE, r.status
        r = stub.AckMessage(spb.AckMessageRequest(
            group=pb.Resource(name="G"), topic=pb.Resource(name="T"),
            entries=[spb.AckMessageEntry(message_id="01", receipt_handle="x~\u00e9")]),
            timeout=10, metadata=[("x-mq-client-id", "handles-test")])
        assert r.entries[0].status.code == Code.INVALID_RECEIPT_HANDLE, r


def test_a_handle_is_its_text_and_the_hmac_sha256_of_it_under_the_secret():
    """The handle format handles.py documents (a recall handle made before a restart, or
    by an earlier version, must still open): text, ``~``, the first 128 bits of
    HMAC-SHA256(secret, text) in hex; the same MAC however many handles were made."""
    import hashlib
    import hmac
    signer = HandleSigner(b"s" * 32)
    for text in ("1.0.5.T.broker-a", "2.3.9.Orders.broker-b", ""):
        want = hmac.new(b"s" * 32, text.encode(), hashlib.sha256).hexdigest()[:32]
        assert signer.sign(text) == f"{text}~{want}"
        assert signer.open(f"{text}~{want}") == text
