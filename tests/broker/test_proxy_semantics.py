"""What the Apache RocketMQ proxy does, done the same way (issue 14 items 1, 2): the body
digest of a delivered message is MD5 in uppercase hex (GrpcConverter), and
ChangeInvisibleDuration accepts 0 (validateInvisibleTime with a minimum of 0): the
message is visible again at once."""
from __future__ import annotations

import hashlib

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.grpc_protocol.definition_pb2 import Code

from helpers.brokers import client_conf, msg

pytestmark = pytest.mark.integration

META = [("x-mq-client-id", "proxy-semantics")]


def _receive(stub, topic, group, invisible_s=30):
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), id=-1), batch_size=1,
        invisible_duration=Duration(seconds=invisible_s),
        long_polling_timeout=Duration(seconds=2))
    return [r.message for r in stub.ReceiveMessage(req, timeout=20, metadata=META)
            if r.HasField("message")]


def test_delivered_messages_carry_the_proxys_md5_digest(make_broker, clients):
    b = make_broker()
    bodies = [b"hello", b"", bytes(range(256)) * 40]
    producer = clients(Producer(client_conf(b), ("D",)))
    for body in bodies:
        producer.send(msg("D", body or b"x"))
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        got = []
        while len(got) < len(bodies):
            got += _receive(stub, "D", "G")
    for m in got:
        d = m.system_properties.body_digest
        assert d.type == pb.MD5
        assert d.checksum == hashlib.md5(m.body).hexdigest().upper()
    # the official client verifies it and does not mark the messages corrupted
    consumer = clients(SimpleConsumer(client_conf(b), "G2", {"D": FilterExpression()},
                                      await_duration=2))
    seen = []
    for _ in range(10):
        seen += consumer.receive(16, 30)
        if len(seen) >= len(bodies):
            break
    assert len(seen) == len(bodies) and not any(m.corrupted for m in seen)


def test_change_invisible_duration_zero_makes_the_message_visible_at_once(make_broker):
    b = make_broker()
    b.store.create_topic("Z", read_queue_nums=1, write_queue_nums=1)
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        stub.SendMessage(spb.SendMessageRequest(messages=[pb.Message(
            topic=pb.Resource(name="Z"), body=b"retry-me", system_properties=pb.SystemProperties(
                message_id="0A0000000000000000000000ZZ", body_encoding=pb.IDENTITY,
                message_type=pb.NORMAL))]), timeout=10, metadata=META)
        [first] = _receive(stub, "Z", "G", invisible_s=600)
        out = stub.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
            group=pb.Resource(name="G"), topic=pb.Resource(name="Z"),
            receipt_handle=first.system_properties.receipt_handle,
            message_id=first.system_properties.message_id,
            invisible_duration=Duration(seconds=0)), timeout=10, metadata=META)
        assert out.status.code == Code.OK
        [again] = _receive(stub, "Z", "G")       # not 600 s later: now
        assert again.body == b"retry-me"
        assert again.system_properties.delivery_attempt == 2


def test_the_official_push_consumer_logs_no_metrics_error_and_its_exports_arrive(
        make_broker, clients, caplog):
    """The broker names itself as the clients' metrics collector (otlp.py); before, the
    official PushConsumer logged "'NoneType' object has no attribute 'get_meter'"."""
    import logging
    import threading
    from rocketmq import ConsumeResult, MessageListener, PushConsumer
    from helpers.waiting import wait_until
    caplog.set_level(logging.INFO)
    b = make_broker()
    producer = clients(Producer(client_conf(b), ("PM",)))
    for i in range(5):
        producer.send(msg("PM", f"m{i}".encode()))
    seen, lock = set(), threading.Lock()

    class Listener(MessageListener):
        def consume(self, message):
            with lock:
                seen.add(message.body)
            return ConsumeResult.SUCCESS
    clients(PushConsumer(client_conf(b), "PMG", Listener(), {"PM": FilterExpression()}))
    wait_until(lambda: len(seen) == 5, "the push consumer to consume all five")
    assert "get_meter" not in caplog.text
    assert "start metric provider success" in caplog.text


def test_a_fifo_consumer_group_is_told_fifo_and_consumes_each_group_in_order(
        make_broker, clients):
    """Issue 14 item 3: ``sparkmq admin group create --orderly`` (consumeMessageOrderly)
    makes the settings say fifo=true, as the proxy does; the official PushConsumer then
    consumes each message group in order."""
    import threading
    from rocketmq import ConsumeResult, MessageListener, PushConsumer
    from helpers.waiting import wait_until
    from sparkmq.admin import main as admin_main
    b = make_broker()
    b.store.create_topic("O", read_queue_nums=2, write_queue_nums=2)
    assert admin_main(["--broker", b.admin_url, f"--token={b.admin_token}", "group", "create",
                       "Ordered", "--orderly"]) == 0
    producer = clients(Producer(client_conf(b), ("O",)))
    for i in range(6):
        for g in ("g1", "g2"):
            m = msg("O", f"{g}:{i}".encode())
            m.message_group = g
            producer.send(m)
    seen: dict[str, list[str]] = {"Ordered": [], "Plain": []}
    lock = threading.Lock()

    class Listener(MessageListener):
        def __init__(self, group):
            self.group = group

        def consume(self, message):
            with lock:
                seen[self.group].append(message.body.decode())
            return ConsumeResult.SUCCESS
    ordered = clients(PushConsumer(client_conf(b), "Ordered", Listener("Ordered"),
                                   {"O": FilterExpression()}))
    plain = clients(PushConsumer(client_conf(b), "Plain", Listener("Plain"),
                                 {"O": FilterExpression()}))
    wait_until(lambda: all(len(v) == 12 for v in seen.values()),
               "both groups to consume all 12 messages")
    assert ordered.fifo is True and plain.fifo is False
    with lock:
        for g in ("g1", "g2"):               # the FIFO group saw each message group in order
            order = [int(x.split(":")[1]) for x in seen["Ordered"] if x.startswith(g)]
            assert order == list(range(6))


def test_internal_properties_are_not_sent_as_user_properties():
    """As the proxy's GrpcConverter: RocketMQ's own keys and the broker's bookkeeping stay
    out of user_properties; a dead letter's origin goes in dead_letter_queue."""
    from sparkmq.broker.protocol import message_to_pb
    from sparkmq.log.message import StoredMessage
    props = {"app": "1", "DLQ_ORIGIN_TOPIC": "Orders", "DLQ_ORIGIN_MESSAGE_ID": "ID1",
             "DLQ_ORIGIN_QUEUE": "2", "DLQ_ORIGIN_QUEUE_OFFSET": "7",
             "SCHEDULE_SOURCE": "18:0", "DELAY": "3", "UNIQ_KEY": "u"}
    sm = StoredMessage(topic="%DLQ%G", queue_id=0, queue_offset=0, physical_offset=0,
                       message_id="M", body=b"x", tags=None, keys=[], properties=props,
                       born_timestamp=1, store_timestamp=2, born_host=None, store_host=None,
                       reconsume_times=0, delivery_timestamp=None, message_group=None,
                       transaction_id=None, message_type=0, unique_key="ID2")
    m = message_to_pb(sm)
    assert dict(m.user_properties) == {"app": "1"}
    dlq = m.system_properties.dead_letter_queue
    assert (dlq.topic, dlq.message_id) == ("Orders", "ID1")
    plain = message_to_pb(StoredMessage(**{**sm.__dict__, "properties": {"app": "1"}}))
    assert not plain.system_properties.HasField("dead_letter_queue")



@pytest.mark.parametrize("born, delivery_ms, invisible_ms", [
    (1_700_000_000_123, 4_102_444_800_999, 30_000), (0, None, 1), (5, 1, 999)])
def test_a_delivered_message_s_times_are_exact_and_present(born, delivery_ms, invisible_ms):
    """born/store timestamps are always present (a zero one too, as the proxy's converter
    sets them), to the millisecond; a delay's delivery time only when it has one; the
    invisible duration of a delivery exact; empty keys and properties send none."""
    from sparkmq.broker.protocol import message_to_pb, ms_of_duration, ms_of_timestamp
    from sparkmq.log.message import StoredMessage

    class Delivery:
        receipt_handle, attempt = "R1", 2
    d = Delivery()
    d.invisible_ms = invisible_ms
    sm = StoredMessage(topic="T", queue_id=1, queue_offset=4, physical_offset=0,
                       message_id="M", body=b"x", tags=None, keys=[], properties={},
                       born_timestamp=born, store_timestamp=1_700_000_000_001,
                       born_host=None, store_host="s:1", reconsume_times=0,
                       delivery_timestamp=delivery_ms, message_group=None,
                       transaction_id=None, message_type=0, unique_key=None)
    sp = message_to_pb(sm, d).system_properties
    assert sp.HasField("born_timestamp") and sp.HasField("store_timestamp")
    assert ms_of_timestamp(sp.born_timestamp) == born
    assert ms_of_timestamp(sp.store_timestamp) == 1_700_000_000_001
    assert sp.born_timestamp.nanos % 1_000_000 == 0 and 0 <= sp.born_timestamp.nanos < 10**9
    assert sp.HasField("delivery_timestamp") == bool(delivery_ms)
    if delivery_ms:
        assert ms_of_timestamp(sp.delivery_timestamp) == delivery_ms
        assert sp.message_type == pb_type("DELAY")
    assert ms_of_duration(sp.invisible_duration) == invisible_ms
    assert (sp.receipt_handle, sp.delivery_attempt) == ("R1", 2)
    assert list(sp.keys) == [] and not sp.HasField("tag")
    assert not message_to_pb(sm).system_properties.HasField("invisible_duration")
    assert dict(message_to_pb(sm).user_properties) == {}


def pb_type(name: str) -> int:
    from rocketmq.grpc_protocol import definition_pb2 as pb
    return pb.MessageType.Value(name)


def _settings_reply(b, group: str):
    """The Settings the broker answers a SIMPLE_CONSUMER of ``group`` on Telemetry."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
    settings = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(name=group)))
    with grpc.insecure_channel(b.endpoint) as ch:
        call = MessagingServiceStub(ch).Telemetry(iter([spb.TelemetryCommand(
            settings=settings)]), timeout=10, metadata=[("x-mq-client-id", "settings-probe")])
        reply = next(iter(call))
        call.cancel()
    return reply.settings


def test_a_groups_retry_policy_is_sent_to_its_consumers(make_broker):
    """Issue 14 item 3: ``groupRetryPolicy`` of the subscription group config, set with
    ``sparkmq admin group create --retry-policy``, goes to consumers as the settings'
    backoff_policy (as the proxy's GrpcClientSettingsManager); unset, RocketMQ's
    customized 1s 5s 10s 30s 1m ... 2h."""
    from sparkmq.admin import main as admin_main
    from sparkmq.log.retrypolicy import DEFAULT_NEXT_MS
    b = make_broker()
    default = _settings_reply(b, "Plain").backoff_policy
    assert [d.seconds * 1000 + d.nanos // 10**6 for d in default.customized_backoff.next] \
        == list(DEFAULT_NEXT_MS)
    assert admin_main(["--broker", b.admin_url, f"--token={b.admin_token}", "group", "create",
                       "Exp", "--retry-policy", "exponential:2s,1m,3",
                       "--retry-max-times", "4"]) == 0
    exp = _settings_reply(b, "Exp").backoff_policy
    assert exp.max_attempts == 5 and exp.WhichOneof("strategy") == "exponential_backoff"
    assert (exp.exponential_backoff.initial.seconds, exp.exponential_backoff.max.seconds,
            exp.exponential_backoff.multiplier) == (2, 60, 3.0)
    assert admin_main(["--broker", b.admin_url, f"--token={b.admin_token}", "group", "create",
                       "Cus", "--retry-policy", "customized:1s,500ms"]) == 0
    cus = _settings_reply(b, "Cus").backoff_policy
    assert [d.seconds * 1000 + d.nanos // 10**6 for d in cus.customized_backoff.next] \
        == [1000, 500]
    assert b.store.subscription_groups()["Cus"].group_retry_policy["type"] == "CUSTOMIZED"
    for bad in ("linear:1s", "exponential:2s,1s,2", "customized:"):
        try:                                        # argparse refuses it: exit code 2
            code = admin_main(["--broker", b.admin_url, f"--token={b.admin_token}", "group",
                               "create", "Bad", "--retry-policy", bad])
        except SystemExit as e:
            code = e.code
        assert code == 2, bad
    assert "Bad" not in b.store.subscription_groups()
