"""Four answers of the RocketMQ 5 gRPC path made the Apache proxy's (read from its source):

* Heartbeat (ClientActivity.heartbeat): a client type other than PRODUCER, PUSH_CONSUMER,
  SIMPLE_CONSUMER and PULL_CONSUMER gets UNRECOGNIZED_CLIENT_TYPE; a consumer's group is
  checked by the naming rule (empty too), a producer's is not read.
* Telemetry Settings (ClientActivity.processAndWriteClientSettings): subscription settings
  from a type that does not consume, or settings with neither publishing nor subscription,
  are refused (BAD_REQUEST here, on a stream that stays open) before the client is known
  under the group or topics; publishing settings are taken from any type, as the proxy
  takes them.
* EndTransaction (EndTransactionActivity): the topic is checked first (ILLEGAL_TOPIC,
  nothing resolved); a blank transaction id is INVALID_TRANSACTION_ID, saying so, whatever
  the resolution; an unspecified resolution (the proxy's UNKNOWN) is OK for a pending
  transaction, which stays pending, and INVALID_TRANSACTION_ID for any other.
* PullMessage (store getMessage + PullMessageProcessor + the proxy's pull stream writer):
  an offset past the queue's end answers ILLEGAL_OFFSET with next_offset the end, at once;
  at the end, MESSAGE_NOT_FOUND with next_offset the offset.

One real broker on 127.0.0.1, driven with the protocol's stubs as a client sends."""
from __future__ import annotations

import threading
import time
import uuid

import grpc
import pytest
from rocketmq import Producer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from helpers.brokers import broker_config, client_conf
from helpers.net import free_port
from helpers.waiting import wait_until
from sparkmq.broker import Broker

pytestmark = pytest.mark.integration
Code = pb.Code
TIMEOUT_S = 10
STORED = 3            # messages in queue 0 of "T"
NOT_A_TYPE = 99       # a number outside the ClientType enum


def _type_id(client_type: int) -> str:
    return "not-a-type" if client_type == NOT_A_TYPE else pb.ClientType.Name(client_type)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    b = Broker(broker_config(tmp_path_factory.mktemp("parity"),
                             autoCreateTopicEnable="false")).start()
    try:
        for topic in ("T", "Empty"):
            b.store.create_topic(topic, read_queue_nums=1, write_queue_nums=1)
        channel = grpc.insecure_channel(b.endpoint)
        stub = MessagingServiceStub(channel)
        sent = stub.SendMessage(spb.SendMessageRequest(messages=[
            _message("T", b"m%d" % i) for i in range(STORED)]), timeout=TIMEOUT_S,
            metadata=_md("sender"))
        assert sent.status.code == Code.OK, sent.status
        yield b, stub
        channel.close()
    finally:
        b.stop()


def _md(cid: str) -> list:
    return [("x-mq-client-id", cid)]


def _cid() -> str:
    return f"parity-{uuid.uuid4().hex[:8]}"


def _message(topic: str, body: bytes, message_type=pb.NORMAL) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    sp = m.system_properties
    sp.message_id, sp.born_host, sp.body_encoding = uuid.uuid4().hex.upper(), "h", pb.IDENTITY
    sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
    sp.message_type = message_type
    return m


# ---------------------------------------------------------------- Heartbeat
@pytest.mark.parametrize("client_type", [pb.CLIENT_TYPE_UNSPECIFIED, pb.LITE_PUSH_CONSUMER,
                                         pb.LITE_SIMPLE_CONSUMER, NOT_A_TYPE], ids=_type_id)
def test_a_heartbeat_of_an_unknown_client_type_is_unrecognized(env, client_type):
    b, stub = env
    cid = _cid()
    out = stub.Heartbeat(spb.HeartbeatRequest(group=pb.Resource(name="G"),
                                              client_type=client_type),
                         timeout=TIMEOUT_S, metadata=_md(cid))
    assert out.status.code == Code.UNRECOGNIZED_CLIENT_TYPE, out.status
    name = str(client_type) if client_type == NOT_A_TYPE else pb.ClientType.Name(client_type)
    assert name in out.status.message
    assert not b.clients.online(cid)


@pytest.mark.parametrize("client_type", [pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER,
                                         pb.PULL_CONSUMER], ids=_type_id)
def test_a_consumers_heartbeat_needs_a_legal_group(env, client_type):
    b, stub = env
    cid = _cid()
    for group in ("", "bad group!"):
        out = stub.Heartbeat(spb.HeartbeatRequest(group=pb.Resource(name=group),
                                                  client_type=client_type),
                             timeout=TIMEOUT_S, metadata=_md(cid))
        assert out.status.code == Code.ILLEGAL_CONSUMER_GROUP, (group, out.status)
        assert not b.clients.online(cid)
    group = f"G-{cid}"
    out = stub.Heartbeat(spb.HeartbeatRequest(group=pb.Resource(name=group),
                                              client_type=client_type),
                         timeout=TIMEOUT_S, metadata=_md(cid))
    assert out.status.code == Code.OK, out.status
    assert b.clients.online(cid) and b.clients.groups().get(group) == 1


def test_the_official_producer_heartbeats_and_is_known(env, clients):
    """The official Python Producer's own heartbeat (1 s after it starts) is answered OK:
    only a heartbeat makes a producer known to the client registry."""
    b, _ = env
    producer = clients(Producer(client_conf(b), ("T",)))
    wait_until(lambda: b.clients.online(str(producer.client_id)),
               "the official producer's heartbeat to be taken", timeout_s=20)


@pytest.mark.parametrize("group", [None, "P", "bad group!"])
def test_a_producers_heartbeat_does_not_read_a_group(env, group):
    b, stub = env
    cid = _cid()
    request = spb.HeartbeatRequest(client_type=pb.PRODUCER)
    if group is not None:
        request.group.name = group
    out = stub.Heartbeat(request, timeout=TIMEOUT_S, metadata=_md(cid))
    assert out.status.code == Code.OK, out.status
    assert b.clients.online(cid) and group not in b.clients.groups()


# ---------------------------------------------------------------- Telemetry settings
def _subscription(client_type: int, group: str) -> spb.TelemetryCommand:
    return spb.TelemetryCommand(settings=pb.Settings(
        client_type=client_type, subscription=pb.Subscription(
            group=pb.Resource(name=group), subscriptions=[pb.SubscriptionEntry(
                topic=pb.Resource(name="T"),
                expression=pb.FilterExpression(type=pb.TAG, expression="*"))])))


def _publishing(client_type: int, *topics: str) -> spb.TelemetryCommand:
    return spb.TelemetryCommand(settings=pb.Settings(
        client_type=client_type,
        publishing=pb.Publishing(topics=[pb.Resource(name=t) for t in topics])))


def _telemetry(stub, commands: list, cid: str) -> list:
    return list(stub.Telemetry(iter(commands), timeout=TIMEOUT_S, metadata=_md(cid)))


@pytest.mark.parametrize("client_type", [pb.PRODUCER, pb.CLIENT_TYPE_UNSPECIFIED,
                                         pb.LITE_SIMPLE_CONSUMER, NOT_A_TYPE], ids=_type_id)
def test_subscription_settings_from_a_type_that_does_not_consume_are_refused(env, client_type):
    """BAD_REQUEST, the group never registered; the stream stays open: the client's next
    settings (a consumer's, another group) are answered."""
    b, stub = env
    cid = _cid()
    refused, good = f"R-{cid}", f"G-{cid}"
    answers = _telemetry(stub, [_subscription(client_type, refused),
                                _subscription(pb.SIMPLE_CONSUMER, good)], cid)
    assert [a.status.code for a in answers] == [Code.BAD_REQUEST, Code.OK], answers
    assert "subscription" in answers[0].status.message
    groups = b.clients.groups()
    assert refused not in groups and groups.get(good) == 1


def test_subscription_settings_from_a_pull_consumer_are_taken(env):
    b, stub = env
    cid = _cid()
    [answer] = _telemetry(stub, [_subscription(pb.PULL_CONSUMER, f"G-{cid}")], cid)
    assert answer.status.code == Code.OK, answer.status
    assert b.clients.groups().get(f"G-{cid}") == 1


def test_settings_with_neither_publishing_nor_subscription_are_refused(env):
    _, stub = env
    cid = _cid()
    [answer] = _telemetry(stub, [spb.TelemetryCommand(settings=pb.Settings(
        client_type=pb.PRODUCER))], cid)
    assert answer.status.code == Code.BAD_REQUEST, answer.status
    assert "neither publishing" in answer.status.message


@pytest.mark.parametrize("client_type", [pb.PRODUCER, pb.SIMPLE_CONSUMER,
                                         pb.CLIENT_TYPE_UNSPECIFIED], ids=_type_id)
def test_publishing_settings_are_taken_from_any_client_type(env, client_type):
    """As the proxy takes them (it registers a producer of each topic whatever the type)."""
    _, stub = env
    cid = _cid()
    [answer] = _telemetry(stub, [_publishing(client_type, "T")], cid)
    assert answer.status.code == Code.OK, answer.status


@pytest.mark.parametrize("topics, code", [(("T",), Code.OK),
                                          (("T", "bad topic!"), Code.ILLEGAL_TOPIC)])
def test_a_producer_is_known_by_its_topics_only_once_its_settings_are_taken(env, topics, code):
    """Observed while the stream is open: refused settings leave no producer of "T"
    (the transaction check-backs of "T" would go to it)."""
    b, stub = env
    cid = _cid()
    gate = threading.Event()

    def commands():
        yield _publishing(pb.PRODUCER, *topics)
        gate.wait(TIMEOUT_S)          # the stream stays open until the answer is looked at

    answers = stub.Telemetry(commands(), timeout=TIMEOUT_S, metadata=_md(cid))
    try:
        first = next(answers)
        assert first.status.code == code, first.status
        assert (cid in b.streams.producers("T")) == (code == Code.OK)
    finally:
        gate.set()
    assert list(answers) == []


# ---------------------------------------------------------------- EndTransaction
def _half(stub) -> str:
    """A transactional (half) message sent to "T"; its transaction id."""
    out = stub.SendMessage(spb.SendMessageRequest(messages=[
        _message("T", b"half", pb.TRANSACTION)]), timeout=TIMEOUT_S, metadata=_md("tx"))
    assert out.status.code == Code.OK, out.status
    return out.entries[0].transaction_id


def _end(stub, topic: str, txid: str, resolution=pb.ROLLBACK) -> pb.Status:
    return stub.EndTransaction(spb.EndTransactionRequest(
        topic=pb.Resource(name=topic), transaction_id=txid, resolution=resolution),
        timeout=TIMEOUT_S, metadata=_md("tx")).status


@pytest.mark.parametrize("topic", ["", "bad topic!", "RMQ_SYS_TRANS_HALF_TOPIC", "TBW102"])
def test_end_transaction_checks_its_topic_before_it_resolves(env, topic):
    """ILLEGAL_TOPIC, the transaction left pending: the same end with the right topic
    then resolves it (INVALID_TRANSACTION_ID had the first resolved it)."""
    _, stub = env
    txid = _half(stub)
    st = _end(stub, topic, txid)
    assert st.code == Code.ILLEGAL_TOPIC, st
    assert _end(stub, "T", txid).code == Code.OK
    assert _end(stub, "T", txid).code == Code.INVALID_TRANSACTION_ID     # (resolved now)


def test_end_transaction_of_another_topics_transaction_finds_nothing(env):
    """A transaction is found by its topic and id, as the proxy finds it: an end naming
    another (legal, existing) topic is INVALID_TRANSACTION_ID and resolves nothing. (The
    caller is authorized for the request's topic: else Pub on one topic would end
    another's transactions.) The end with its own topic then resolves it."""
    _, stub = env
    txid = _half(stub)
    st = _end(stub, "Empty", txid, pb.COMMIT)
    assert st.code == Code.INVALID_TRANSACTION_ID and "for topic 'Empty'" in st.message, st
    assert _end(stub, "T", txid).code == Code.OK


@pytest.mark.parametrize("resolution", [pb.COMMIT, pb.TRANSACTION_RESOLUTION_UNSPECIFIED])
@pytest.mark.parametrize("txid", ["", "   "])
def test_end_transaction_with_a_blank_id_is_an_invalid_transaction_id(env, txid, resolution):
    """Said so (not "not pending"), before the resolution is read: the id was left out."""
    _, stub = env
    st = _end(stub, "T", txid, resolution)
    assert st.code == Code.INVALID_TRANSACTION_ID, st
    assert st.message.startswith("transaction_id is empty"), st


def test_end_transaction_with_no_resolution_leaves_it_to_the_check_back(env):
    """The proxy reads an unspecified resolution as UNKNOWN and ends nothing (its broker
    takes TRANSACTION_NOT_TYPE as a no-op): OK, the transaction still pending (a rollback
    after it finds it); for a transaction that is not pending, INVALID_TRANSACTION_ID."""
    _, stub = env
    txid = _half(stub)
    unspecified = pb.TRANSACTION_RESOLUTION_UNSPECIFIED
    assert _end(stub, "T", txid, unspecified).code == Code.OK
    assert _end(stub, "T", txid, pb.ROLLBACK).code == Code.OK            # still pending
    assert _end(stub, "T", txid, unspecified).code == Code.INVALID_TRANSACTION_ID


# ---------------------------------------------------------------- PullMessage
def _pull(stub, topic: str, offset: int, poll_s: int = 0) -> tuple[list, list, list]:
    """(status codes, message offsets, next offsets) of one PullMessage; a long poll of
    ``poll_s`` (answered before the call's deadline, TIMEOUT_S)."""
    request = spb.PullMessageRequest(
        group=pb.Resource(name="PG"), offset=offset, batch_size=32,
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
    request.long_polling_timeout.seconds = poll_s
    answers = list(stub.PullMessage(request, timeout=TIMEOUT_S, metadata=_md("puller")))
    return ([a.status.code for a in answers if a.HasField("status")],
            [a.message.system_properties.queue_offset for a in answers
             if a.HasField("message")],
            [a.next_offset for a in answers if a.WhichOneof("content") == "next_offset"])


@pytest.mark.parametrize("offset", [STORED + 1, 1000, 2**62])
def test_a_pull_past_the_queue_end_is_an_illegal_offset_with_the_end_next(env, offset):
    """Answered at once, not after the long poll (which would end MESSAGE_NOT_FOUND)."""
    _, stub = env
    assert _pull(stub, "T", offset, poll_s=60) == ([Code.ILLEGAL_OFFSET], [], [STORED])


def test_a_pull_past_an_empty_queues_end_is_an_illegal_offset_with_zero_next(env):
    _, stub = env
    assert _pull(stub, "Empty", 5) == ([Code.ILLEGAL_OFFSET], [], [0])
    assert _pull(stub, "Empty", 0) == ([Code.MESSAGE_NOT_FOUND], [], [0])


def test_a_pull_at_the_queue_end_finds_nothing_and_stays_there(env):
    _, stub = env
    assert _pull(stub, "T", STORED) == ([Code.MESSAGE_NOT_FOUND], [], [STORED])
    assert _pull(stub, "T", 1) == ([Code.OK], [1, 2], [STORED])


def test_a_replica_waits_past_its_end_as_a_slave_does(tmp_path):
    """A replica may be behind its master: past its end it answers MESSAGE_NOT_FOUND with
    next_offset the offset asked (a slave without offsetCheckInSlave), not ILLEGAL_OFFSET."""
    common = {"brokerClusterName": "C", "haSecret": "parity-secret-of-the-pair", "brokerRole":
              "ASYNC_MASTER", "brokerId": "0", "haListenPort": str(free_port())}
    master = Broker(broker_config(tmp_path, "bm", **common)).start()
    replica = None
    try:
        master.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        replica = Broker(broker_config(tmp_path, "br", **{
            **common, "brokerName": "bm", "brokerRole": "SLAVE", "brokerId": "1",
            "haMasterAddress": f"127.0.0.1:{master.ha_service.port}",
            "haListenPort": str(free_port())})).start()
        with grpc.insecure_channel(master.endpoint) as channel:
            sent = MessagingServiceStub(channel).SendMessage(spb.SendMessageRequest(
                messages=[_message("T", b"r%d" % i) for i in range(2)]), timeout=TIMEOUT_S,
                metadata=_md("sender"))
            assert sent.status.code == Code.OK, sent.status
        wait_until(lambda: "T" in replica.store.topics()
                   and replica.store.max_offset("T", 0) == 2, "the replica to catch up")
        with grpc.insecure_channel(replica.endpoint) as channel:
            stub = MessagingServiceStub(channel)
            assert _pull(stub, "T", 5) == ([Code.MESSAGE_NOT_FOUND], [], [5])
            assert _pull(stub, "T", 0) == ([Code.OK], [0, 1], [2])
    finally:
        if replica is not None:
            replica.stop()
        master.stop()
