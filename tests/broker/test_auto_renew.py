"""A message received with ``auto_renew`` stays hidden while its consumer works on it, as
the Apache RocketMQ 5 proxy's ReceiptHandleManager keeps it (broker/renew.py): renewed
ahead of its end, the client's handle good for ack / change / DLQ after renewals, let go
when the client ends, and let go with the group's retry delay past renewMaxTimeMillis."""
from __future__ import annotations

import threading

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq import ConsumeResult, FilterExpression, MessageListener, Producer, PushConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.definition_pb2 import Code
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from helpers.brokers import client_conf, msg
from helpers.waiting import wait_until
from sparkmq.broker.receive import CLIENT_EXPIRY_MS, ClientRegistry
from sparkmq.broker.renew import RENEW_STEPS_MS

pytestmark = pytest.mark.integration

# a pass every 50 ms that renews any lease ending within the next 10 min (so at once)
PASSES = {"renewSchedulePeriodMillis": 50, "renewAheadTimeMillis": 600_000}


def _meta(cid: str) -> list:
    return [("x-mq-client-id", cid)]


def _send(stub, topic: str, body: bytes, cid: str = "producer") -> None:
    out = stub.SendMessage(spb.SendMessageRequest(messages=[pb.Message(
        topic=pb.Resource(name=topic), body=body, system_properties=pb.SystemProperties(
            message_id="0A00000000000000000000%04X" % (hash(body) & 0xFFFF),
            body_encoding=pb.IDENTITY, message_type=pb.NORMAL))]),
        timeout=10, metadata=_meta(cid))
    assert out.status.code == Code.OK, out.status


def _receive(stub, topic: str, group: str, cid: str, *, auto_renew: bool,
             invisible_s: int | None = None, poll_s: int = 2) -> list:
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), id=-1), batch_size=4, auto_renew=auto_renew,
        long_polling_timeout=Duration(seconds=poll_s))
    if invisible_s is not None:
        req.invisible_duration.CopyFrom(Duration(seconds=invisible_s))
    return [r.message for r in stub.ReceiveMessage(req, timeout=20, metadata=_meta(cid))
            if r.HasField("message")]


def _lease(b, group: str, topic: str):
    """The one lease in flight of ``group`` on ``topic``."""
    [lease] = [x for (t, _), qp in b.pop.group(group).queues.items() if t == topic
               for x in qp.inflight.values()]
    return lease


def _renewals(b) -> int:
    return int(b.metrics.get("sparkmq_receipt_renewals_total"))


def test_the_official_push_consumer_is_not_handed_a_message_it_is_still_working_on(
        make_broker, clients):
    """The official PushConsumer receives with auto_renew and no invisible time. Its
    listener holds the message past the broker's default invisible time (2 s); the
    broker renews the lease (a pass every 50 ms renews what ends within 1.9 s: at once),
    so the message is delivered once and its ack (with the client's first handle)
    lands. Without renewal it is delivered again meanwhile."""
    b = make_broker(defaultInvisibleTimeMs=2000, renewAheadTimeMillis=1900,
                    renewSchedulePeriodMillis=50)
    b.store.create_topic("R", read_queue_nums=1, write_queue_nums=1)
    producer = clients(Producer(client_conf(b), ("R",)))
    producer.send(msg("R", b"slow"))
    deliveries, lock = [], threading.Lock()
    go_on = threading.Event()

    class Slow(MessageListener):
        def consume(self, message):
            with lock:
                deliveries.append(message.message_id)
            go_on.wait(60)
            return ConsumeResult.SUCCESS
    clients(PushConsumer(client_conf(b), "RG", Slow(), {"R": FilterExpression()}))
    try:
        wait_until(lambda: deliveries, "the first delivery")
        # held until the broker renewed it, or (no renewal) until it came round again
        wait_until(lambda: _renewals(b) >= 1 or len(deliveries) > 1,
                   "a renewal or a second delivery")
        assert len(deliveries) == 1, "delivered again while its listener still held it"
        lease = _lease(b, "RG", "R")
        assert lease.visible_at_ms - b.clock_ms() > 30_000    # hidden a minute now
    finally:
        go_on.set()
    wait_until(lambda: b.receiver.committed_offset("RG", "R", 0) == 1,
               "the ack with the client's first handle to land")
    assert len(deliveries) == 1
    assert b.renewer.held_count() == 0


def test_an_ack_change_and_dlq_forward_by_the_clients_handle_act_on_the_newest_one(
        make_broker):
    b = make_broker(**PASSES)
    b.store.create_topic("H", read_queue_nums=1, write_queue_nums=1)
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        for body in (b"one", b"two", b"three"):
            _send(stub, "H", body)
        got = _receive(stub, "H", "HG", "c1", auto_renew=True)
        assert len(got) == 3
        wait_until(lambda: _renewals(b) >= 6, "each held message renewed twice")
        text = b.admin.metrics_text()
        assert "sparkmq_receipt_handles_held 3" in text
        assert "sparkmq_receipt_renewals_total" in text
        first = {m.body: m.system_properties.receipt_handle for m in got}
        ack = stub.AckMessage(spb.AckMessageRequest(
            group=pb.Resource(name="HG"), topic=pb.Resource(name="H"),
            entries=[spb.AckMessageEntry(message_id="x", receipt_handle=first[b"one"])]),
            timeout=10, metadata=_meta("c1"))
        assert ack.status.code == Code.OK, ack.status
        change = stub.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
            group=pb.Resource(name="HG"), topic=pb.Resource(name="H"),
            receipt_handle=first[b"two"], message_id="x",
            invisible_duration=Duration(seconds=0)), timeout=10, metadata=_meta("c1"))
        assert change.status.code == Code.OK, change.status
        dlq = stub.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name="HG"), topic=pb.Resource(name="H"),
            receipt_handle=first[b"three"], message_id="x"), timeout=10, metadata=_meta("c1"))
        assert dlq.status.code == Code.OK, dlq.status
        assert b.renewer.held_count() == 0      # released: no longer renewed
        [again] = _receive(stub, "H", "HG", "c2", auto_renew=False, invisible_s=30)
        assert again.body == b"two" and again.system_properties.delivery_attempt == 2
    assert [m.body for m in b.store.read("%DLQ%HG", 0, 0, 10)] == [b"three"]


def test_a_receive_with_auto_renew_starts_with_the_default_invisible_time(make_broker):
    """auto_renew: the request's invisible duration is not read (the proxy's
    defaultInvisibleTimeMills); enableProxyAutoRenew=false: it is, and nothing is held."""
    b = make_broker(defaultInvisibleTimeMs=120_000)
    off = make_broker("broker-b", enableProxyAutoRenew="false")
    for broker, held in ((b, 1), (off, 0)):
        broker.store.create_topic("D", read_queue_nums=1, write_queue_nums=1)
        with grpc.insecure_channel(broker.endpoint) as channel:
            stub = MessagingServiceStub(channel)
            _send(stub, "D", b"d")
            before = broker.clock_ms()
            [m] = _receive(stub, "D", "DG", "c1", auto_renew=True, invisible_s=5)
            after = broker.clock_ms()
        lease = _lease(broker, "DG", "D")
        ms = 120_000 if held else 5_000
        assert before + ms <= lease.visible_at_ms <= after + ms
        assert broker.renewer.held_count() == held


def test_a_client_that_ends_has_its_held_messages_taken_over(make_broker):
    """NotifyClientTermination lets go of what the client held: visible again
    invisibleTimeMillisWhenClear later (here 0), at once, not at the next pass (here none
    runs by itself) nor when its renewed minute ends."""
    b = make_broker(invisibleTimeMillisWhenClear=0, renewSchedulePeriodMillis=600_000,
                    renewAheadTimeMillis=600_000)
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        _send(stub, "T", b"orphan")
        [m] = _receive(stub, "T", "TG", "leaver", auto_renew=True)
        b.renewer.renew_due()
        assert _renewals(b) == 1
        assert _receive(stub, "T", "TG", "stayer", auto_renew=True, poll_s=0) == []
        # a termination that names no group (a producer's) or another group lets go of
        # nothing of TG's (and needs no right to TG under ACLs)
        for other in (None, "Other"):
            req = spb.NotifyClientTerminationRequest()
            if other:
                req.group.name = other
            assert stub.NotifyClientTermination(req, timeout=10, metadata=_meta(
                "leaver")).status.code == Code.OK
        b.renewer.renew_due()
        assert b.renewer.held_count() == 1 and b.clients.online("leaver")
        assert _receive(stub, "T", "TG", "stayer", auto_renew=True, poll_s=0) == []
        out = stub.NotifyClientTermination(spb.NotifyClientTerminationRequest(
            group=pb.Resource(name="TG")), timeout=10, metadata=_meta("leaver"))
        assert out.status.code == Code.OK
        [again] = _receive(stub, "T", "TG", "stayer", auto_renew=True)
        assert again.body == b"orphan" and again.system_properties.delivery_attempt == 2
    # the stayer's copy is held (and renewed) under its own client id
    assert b.renewer.held_count() == 1


def test_a_client_gone_silent_is_offline_and_a_renewal_pass_lets_go_of_its_messages(
        make_broker):
    now = [1_000_000]
    clients = ClientRegistry(lambda: now[0])
    clients.heartbeat("c", "G", pb.PUSH_CONSUMER)
    assert clients.online("c")
    now[0] += CLIENT_EXPIRY_MS + 1
    assert not clients.online("c") and not clients.online("never-seen")
    # on a broker: a holder the registry does not know is let go by the next pass
    b = make_broker(invisibleTimeMillisWhenClear=0, **PASSES)
    b.store.create_topic("S", read_queue_nums=1, write_queue_nums=1)
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        _send(stub, "S", b"s")
        _receive(stub, "S", "SG", "ghost", auto_renew=True)
        b.clients.remove("ghost", "SG")           # as its expiry would
        wait_until(lambda: b.renewer.held_count() == 0, "the pass to let it go")
        [again] = _receive(stub, "S", "SG", "other", auto_renew=False, invisible_s=30)
        assert again.system_properties.delivery_attempt == 2


def test_past_renew_max_time_a_message_is_let_go_with_the_groups_retry_delay(make_broker):
    from sparkmq.admin import main as admin_main
    b = make_broker(renewMaxTimeMillis=1, **PASSES)
    b.store.create_topic("M", read_queue_nums=1, write_queue_nums=1)
    assert admin_main(["--broker", b.admin_url, f"--token={b.admin_token}", "group", "create",
                       "MG", "--retry-policy", "customized:7s,9s"]) == 0
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        _send(stub, "M", b"m")
        before = b.clock_ms()
        _receive(stub, "M", "MG", "c1", auto_renew=True)
        wait_until(lambda: b.renewer.held_count() == 0, "the pass to let it go")
        after = b.clock_ms()
    lease = _lease(b, "MG", "M")      # delivery 1 failed: the policy's first step, 7 s
    assert before + 7_000 <= lease.visible_at_ms <= after + 7_000
    assert _renewals(b) == 0


def test_renewals_follow_the_proxys_steps_and_stop_once_the_lease_is_far_enough_ahead(
        make_broker):
    """Each renewal hides the message the next of 1, 3, 5, 10, 30 min from now; one is
    renewed only while its lease ends within renewAheadTimeMillis (here 10 min): five
    renewals, then it rests hidden 30 min."""
    b = make_broker(**PASSES)
    b.store.create_topic("P", read_queue_nums=1, write_queue_nums=1)
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        _send(stub, "P", b"p")
        _receive(stub, "P", "PG", "c1", auto_renew=True)
    wait_until(lambda: _renewals(b) >= 5, "five renewals")
    b.renewer.renew_due()
    b.renewer.renew_due()
    assert _renewals(b) == 5
    left = _lease(b, "PG", "P").visible_at_ms - b.clock_ms()
    assert RENEW_STEPS_MS[4] - 60_000 < left <= RENEW_STEPS_MS[4]


@pytest.mark.parametrize("auto_renew", [False, True])
def test_messages_a_cancelled_receive_did_not_hand_over_are_visible_again_in_a_second(
        make_broker, auto_renew):
    """A receive popped 20 messages of 1 MiB; its client cancels after the first answer,
    so gRPC's flow control holds back most of them. Those not handed over are visible
    again 1 s later (the proxy's NACK_INVISIBLE_TIME), not after 10 min, and not renewed
    for the client that never got them."""
    b = make_broker(defaultInvisibleTimeMs=600_000, **PASSES)
    b.store.create_topic("C", read_queue_nums=1, write_queue_nums=1)
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        for i in range(20):
            _send(stub, "C", bytes([i]) * (1 << 20))
        call = stub.ReceiveMessage(spb.ReceiveMessageRequest(
            group=pb.Resource(name="CG"), message_queue=pb.MessageQueue(
                topic=pb.Resource(name="C"), id=-1), batch_size=20, auto_renew=auto_renew,
            invisible_duration=Duration(seconds=600), long_polling_timeout=Duration(seconds=2)),
            timeout=20, metadata=_meta("quitter"))
        assert next(call).HasField("delivery_timestamp")
        call.cancel()
        back = []
        wait_until(lambda: back.extend(_receive(stub, "C", "CG", "next", auto_renew=False,
                                                invisible_s=600)) or len(back) >= 1,
                   "messages the cancelled receive did not hand over")
        if auto_renew:   # held (renewed) for the quitter: only what it was handed
            wait_until(lambda: back.extend(_receive(
                stub, "C", "CG", "next", auto_renew=False, invisible_s=600, poll_s=0))
                or len(back) + b.renewer.held_count() == 20, "the rest given back")
        else:
            assert b.renewer.held_count() == 0
    assert {m.system_properties.delivery_attempt for m in back} == {2}


def _fifo_receive(stub, attempt_id: str, poll_s: int = 2) -> list:
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name="OG"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name="F"), id=-1), batch_size=1, auto_renew=True,
        long_polling_timeout=Duration(seconds=poll_s), attempt_id=attempt_id)
    return [r.message for r in stub.ReceiveMessage(req, timeout=20, metadata=_meta("c1"))
            if r.HasField("message")]


def test_an_orderly_groups_receive_retried_with_its_attempt_id_gets_its_messages_again(
        make_broker):
    """A PushConsumer that lost a receive's answer retries it with the same attempt id
    (the official clients do). In an orderly group the message it leased blocks its
    message group, so without this the group would wait while the broker renews a lease
    nobody holds; with it, the retry gets the message again (same attempt, a new
    handle), as RocketMQ's ConsumerOrderInfoManager lets the same attempt id through,
    also after the broker renewed the lease."""
    b = make_broker(renewSchedulePeriodMillis=600_000, renewAheadTimeMillis=600_000)
    b.store.create_topic("F", read_queue_nums=1, write_queue_nums=1)
    b.store.create_group("OG", consume_message_orderly=True)
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        for i in range(2):
            out = stub.SendMessage(spb.SendMessageRequest(messages=[pb.Message(
                topic=pb.Resource(name="F"), body=b"f%d" % i,
                system_properties=pb.SystemProperties(
                    message_id="0A0000000000000000000000F%d" % i, body_encoding=pb.IDENTITY,
                    message_type=pb.FIFO, message_group="g"))]), timeout=10,
                metadata=_meta("p"))
            assert out.status.code == Code.OK
        [lost] = _fifo_receive(stub, "A1")               # its answer "lost"
        assert _fifo_receive(stub, "A2", poll_s=0) == []  # another attempt: g is busy
        b.renewer.renew_due()       # (renewAheadTimeMillis > the invisible time: renewed)
        assert b.metrics.get("sparkmq_receipt_renewals_total") == 1
        [again] = _fifo_receive(stub, "A1")
        assert (again.body, again.system_properties.delivery_attempt) == (b"f0", 1)
        old, new = lost.system_properties.receipt_handle, again.system_properties.receipt_handle
        assert old != new

        def ack(handle):
            return stub.AckMessage(spb.AckMessageRequest(
                group=pb.Resource(name="OG"), topic=pb.Resource(name="F"),
                entries=[spb.AckMessageEntry(message_id="x", receipt_handle=handle)]),
                timeout=10, metadata=_meta("c1")).status.code
        assert ack(old) == Code.INVALID_RECEIPT_HANDLE
        assert ack(new) == Code.OK
        [nxt] = _fifo_receive(stub, "A3")
        assert nxt.body == b"f1"
        assert _fifo_receive(stub, "A1", poll_s=0) == []   # A1's message is done
