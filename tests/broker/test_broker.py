"""Broker integration tests on 127.0.0.1: the official RocketMQ 5.x Python client
and raw gRPC calls against in-process brokers; a broker subprocess killed with
SIGKILL; a two-group cluster behind a NameServer."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from helpers.net import free_port
from helpers.brokers import broker_config, client_conf, msg
from helpers.daemons import admin_headers, get_json, kill9, spawn, stop_process
from helpers.waiting import wait_until
from sparkmq import Store
from sparkmq.broker import Broker, BrokerConfig
from sparkmq.broker.pop import dlq_topic
from sparkmq.errors import BindError
from sparkmq.namesrv import NameServer, NameServerClient

pytestmark = pytest.mark.integration
Code = pb.Code


def receive_until(consumer, n, *, invisible_s=30, max_calls=20):
    got = []
    for _ in range(max_calls):
        got += consumer.receive(32, invisible_s)
        if len(got) >= n:
            break
    return got


# ---------------------------------------------------------------- official client
def test_official_producer_and_simple_consumer_send_receive_ack(make_broker, clients):
    b = make_broker()
    producer = clients(Producer(client_conf(b), ("Orders",)))
    receipts = [producer.send(msg("Orders", f"order-{i}".encode(), tag="TagA", keys=f"k{i}"))
                for i in range(10)]
    assert len({r.message_id for r in receipts}) == 10
    consumer = clients(SimpleConsumer(client_conf(b), "GroupA",
                                      {"Orders": FilterExpression("*")}, await_duration=3))
    got = receive_until(consumer, 10)
    assert sorted(m.body for m in got) == sorted(f"order-{i}".encode() for i in range(10))
    assert {m.message_id for m in got} == {r.message_id for r in receipts}
    assert all(m.delivery_attempt == 1 and m.tag == "TagA" for m in got)
    for m in got:
        consumer.ack(m)
    b.persist_offsets()
    assert sum(b.store.consumer_offsets("GroupA").values()) == 10
    assert consumer.receive(32, 30) == []          # nothing left, after a long poll


def test_tag_filter_expression(make_broker, clients):
    b = make_broker()
    producer = clients(Producer(client_conf(b), ("T",)))
    for tag in ["TagA", "TagB", "TagC", "TagA"]:
        producer.send(msg("T", tag.encode(), tag=tag))
    consumer = clients(SimpleConsumer(client_conf(b), "G",
                                      {"T": FilterExpression("TagA || TagC")}, await_duration=2))
    got = receive_until(consumer, 3, max_calls=5)
    assert sorted(m.body for m in got) == [b"TagA", b"TagA", b"TagC"]


def test_long_polling_returns_when_a_message_arrives(make_broker, clients):
    b = make_broker()
    producer = clients(Producer(client_conf(b), ("Live",)))
    poll_s = 25
    consumer = clients(SimpleConsumer(client_conf(b), "G", {"Live": FilterExpression()},
                                      await_duration=poll_s))
    result = []
    t = threading.Thread(target=lambda: result.append(consumer.receive(16, 30)))
    t.start()
    wait_until(lambda: b.notifier.waiting, "the receive to be parked")
    assert b.notifier.waiting == 1
    producer.send(msg("Live", b"wake up"))
    t.join(poll_s * 0.6)                      # well before the poll timeout
    assert not t.is_alive(), "the held receive was not woken by the arrival"
    assert [m.body for m in result[0]] == [b"wake up"]


def test_unacked_message_is_redelivered_with_attempt_plus_one(make_broker, clients):
    b = make_broker()
    producer = clients(Producer(client_conf(b), ("R",)))
    sent = producer.send(msg("R", b"retry me"))
    consumer = clients(SimpleConsumer(client_conf(b), "G", {"R": FilterExpression()},
                                      await_duration=5))
    [first] = receive_until(consumer, 1, invisible_s=1)
    assert first.delivery_attempt == 1 and first.message_id == sent.message_id
    [second] = receive_until(consumer, 1, invisible_s=30)   # held until the lease expires
    assert second.message_id == sent.message_id and second.delivery_attempt == 2
    consumer.ack(second)
    with pytest.raises(Exception):                           # the first handle is stale
        consumer.ack(first)


def test_message_goes_to_dlq_after_max_attempts(make_broker, clients):
    b = make_broker(maxReconsumeTimes=1)                     # 2 deliveries, then the DLQ
    producer = clients(Producer(client_conf(b), ("D",)))
    producer.send(msg("D", b"poison", keys="p1"))
    consumer = clients(SimpleConsumer(client_conf(b), "G", {"D": FilterExpression()},
                                      await_duration=4))
    attempts = [m.delivery_attempt for m in receive_until(consumer, 1, invisible_s=1)]
    attempts += [m.delivery_attempt for m in receive_until(consumer, 1, invisible_s=1)]
    assert attempts == [1, 2]
    assert consumer.receive(16, 1) == []                     # expired again: moved to the DLQ
    dlq = b.store.read(dlq_topic("G"), 0, 0, 10)
    assert [m.body for m in dlq] == [b"poison"] and dlq[0].keys == ["p1"]
    # the DLQ is an ordinary topic: the official client consumes it
    dlq_consumer = clients(SimpleConsumer(client_conf(b), "DlqReader",
                                          {dlq_topic("G"): FilterExpression()}, await_duration=2))
    assert [m.body for m in receive_until(dlq_consumer, 1, max_calls=3)] == [b"poison"]


def test_change_invisible_duration_via_official_client(make_broker, clients):
    b = make_broker()
    producer = clients(Producer(client_conf(b), ("C",)))
    producer.send(msg("C", b"slow"))
    consumer = clients(SimpleConsumer(client_conf(b), "G", {"C": FilterExpression()},
                                      await_duration=2))
    [m] = receive_until(consumer, 1, invisible_s=1)
    old = m.receipt_handle
    consumer.change_invisible_duration(m, 60)
    assert m.receipt_handle != old
    assert consumer.receive(16, 1) == []                     # still invisible after 2 s
    consumer.ack(m)


# ---------------------------------------------------------------- raw gRPC: bad input
@pytest.fixture
def stub(make_broker):
    b = make_broker(autoCreateTopicEnable="false", maxMessageSize=1024)
    b.store.create_topic("Known")
    channel = grpc.insecure_channel(b.endpoint)
    yield b, MessagingServiceStub(channel), channel
    channel.close()


def raw_message(topic, body, **sys_props) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_type = sys_props.pop("message_type", pb.NORMAL)
    for k, v in sys_props.items():
        setattr(m.system_properties, k, v)
    return m


def send_code(stub_, *messages) -> list[int]:
    """Each entry's code, or the one code of a request refused whole (the proxy's way:
    no entries, a status that says which message and why)."""
    resp = stub_.SendMessage(spb.SendMessageRequest(messages=list(messages)), timeout=10)
    if not resp.entries:
        assert resp.status.code != Code.OK and resp.status.message
        return [resp.status.code]
    return [e.status.code for e in resp.entries]


def _bodies(b, topic: str) -> list[bytes]:
    return sorted(m.body for q in range(b.store.topics()[topic]["writeQueueNums"])
                  for m in b.store.read(topic, q, 0, 1000))


def test_bad_input_gets_the_protocol_status_and_the_broker_keeps_serving(stub):
    b, s, channel = stub
    assert send_code(s, raw_message("Unknown", b"x")) == [Code.TOPIC_NOT_FOUND]
    assert send_code(s, raw_message("Known", b"x" * 1025)) == [Code.MESSAGE_BODY_TOO_LARGE]
    assert send_code(s, raw_message("bad topic!", b"x")) == [Code.ILLEGAL_TOPIC]
    assert send_code(s, raw_message("Known", b"")) == [Code.MESSAGE_BODY_EMPTY]
    assert send_code(s, raw_message("Known", b"x", message_type=pb.DELAY)) == \
        [Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE]          # a DELAY message needs a due time
    tx_with_time = raw_message("Known", b"x", message_type=pb.TRANSACTION)
    tx_with_time.system_properties.delivery_timestamp.FromMilliseconds(1)
    assert send_code(s, tx_with_time) == [Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE]
    assert send_code(s, raw_message("Known", b"x", message_type=pb.FIFO)) == \
        [Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE]
    assert send_code(s, raw_message("Known", b"x", tag="a||b")) == [Code.ILLEGAL_MESSAGE_TAG]
    # as the proxy: one bad message refuses its request whole, and a request is for one
    # topic; nothing of a refused request is stored
    mixed = s.SendMessage(spb.SendMessageRequest(messages=[
        raw_message("Known", b"good-but-with-bad"), raw_message("Known", b"")]), timeout=10)
    assert mixed.status.code == Code.MESSAGE_BODY_EMPTY and not mixed.entries
    assert mixed.status.message.startswith("message 1 of 2: ")
    two = s.SendMessage(spb.SendMessageRequest(messages=[
        raw_message("Known", b"good-but-two-topics"), raw_message("Other", b"x")]), timeout=10)
    assert two.status.code == Code.MESSAGE_CORRUPTED and "'Other'" in two.status.message
    assert not [x for x in _bodies(b, "Known") if x.startswith(b"good-but")]
    assert s.SendMessage(spb.SendMessageRequest(), timeout=5).status.code == Code.BAD_REQUEST

    route = s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="Unknown")), timeout=5)
    assert route.status.code == Code.TOPIC_NOT_FOUND
    route = s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="a/../b")), timeout=5)
    assert route.status.code == Code.ILLEGAL_TOPIC
    ack = s.AckMessage(spb.AckMessageRequest(group=pb.Resource(name="G"),
                                             topic=pb.Resource(name="Known"),
                                             entries=[spb.AckMessageEntry(receipt_handle="junk")]),
                       timeout=5)
    assert ack.status.code == Code.INVALID_RECEIPT_HANDLE
    recv = list(s.ReceiveMessage(spb.ReceiveMessageRequest(
        group=pb.Resource(name="bad group!"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name="Known")), batch_size=1), timeout=5))
    assert [r.status.code for r in recv] == [Code.ILLEGAL_CONSUMER_GROUP]
    recv = list(s.ReceiveMessage(spb.ReceiveMessageRequest(
        group=pb.Resource(name="G"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name="Known")), batch_size=1,
        filter_expression=pb.FilterExpression(type=pb.SQL, expression="a > 1")), timeout=5))
    assert [r.status.code for r in recv] == [Code.UNSUPPORTED]
    end = s.EndTransaction(spb.EndTransactionRequest(topic=pb.Resource(name="Known")), timeout=5)
    # no id, no resolution: the id is checked first, as the proxy does
    assert end.status.code == Code.INVALID_TRANSACTION_ID, end.status
    assert end.status.message.startswith("transaction_id is empty"), end.status
    end = s.EndTransaction(spb.EndTransactionRequest(
        topic=pb.Resource(name="Known"), transaction_id="nope", resolution=pb.COMMIT), timeout=5)
    assert end.status.code == Code.INVALID_TRANSACTION_ID

    # malformed or truncated bytes where a request should be: BAD_REQUEST, not a dead broker
    garbage = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
                                  request_serializer=lambda x: x,
                                  response_deserializer=spb.SendMessageResponse.FromString)
    assert garbage(b"\xff\xff\xff\x0f\x01", timeout=5).status.code == Code.BAD_REQUEST
    whole = spb.SendMessageRequest(messages=[raw_message("Known", b"y" * 100)]).SerializeToString()
    assert garbage(whole[: len(whole) // 2], timeout=5).status.code == Code.BAD_REQUEST
    raw_receive = channel.unary_stream("/apache.rocketmq.v2.MessagingService/ReceiveMessage",
                                       request_serializer=lambda x: x,
                                       response_deserializer=spb.ReceiveMessageResponse.FromString)
    assert [r.status.code for r in raw_receive(b"\x0a\xff", timeout=5)] == [Code.BAD_REQUEST]
    # a client that vanishes in the middle of a long poll: its held receive ends
    b.store.create_topic("Empty")
    stream = s.ReceiveMessage(spb.ReceiveMessageRequest(
        group=pb.Resource(name="G2"), message_queue=pb.MessageQueue(topic=pb.Resource(name="Empty")),
        batch_size=1, long_polling_timeout=Duration(seconds=20)), timeout=25)
    wait_until(lambda: b.notifier.waiting, "the receive to be parked")
    assert b.notifier.waiting == 1
    stream.cancel()
    wait_until(lambda: not b.notifier.waiting, "the broker to let the receive go")
    assert b.notifier.waiting == 0

    assert send_code(s, raw_message("Known", b"still serving")) == [Code.OK]
    stored = [m.body for q in range(2) for m in b.store.read("Known", q, 0, 10)]
    assert sorted(stored) == [b"still serving"]        # nothing of a refused request


def test_offsets_pull_and_query_offset(stub):
    b, s, _ = stub
    assert send_code(s, *[raw_message("Known", f"p{i}".encode()) for i in range(4)]) == [Code.OK] * 4
    mq = pb.MessageQueue(topic=pb.Resource(name="Known"), id=0)
    end = s.QueryOffset(spb.QueryOffsetRequest(message_queue=mq, query_offset_policy=pb.END),
                        timeout=5)
    assert end.status.code == Code.OK and end.offset == b.store.max_offset("Known", 0) > 0
    pulled = list(s.PullMessage(spb.PullMessageRequest(
        group=pb.Resource(name="P"), message_queue=mq, offset=0, batch_size=10), timeout=5))
    bodies = [r.message.body for r in pulled if r.HasField("message")]
    assert len(bodies) == end.offset and pulled[-1].next_offset == end.offset
    up = s.UpdateOffset(spb.UpdateOffsetRequest(group=pb.Resource(name="P"), message_queue=mq,
                                                offset=1), timeout=5)
    assert up.status.code == Code.OK
    got = s.GetOffset(spb.GetOffsetRequest(group=pb.Resource(name="P"), message_queue=mq), timeout=5)
    assert got.offset == 1
    bad = s.UpdateOffset(spb.UpdateOffsetRequest(group=pb.Resource(name="P"), message_queue=mq,
                                                 offset=999), timeout=5)
    assert bad.status.code == Code.ILLEGAL_OFFSET


def test_admin_endpoint_health_status_metrics(make_broker, clients):
    b = make_broker()
    producer = clients(Producer(client_conf(b), ("M",)))
    for i in range(3):
        producer.send(msg("M", b"abc"))
    base = f"http://127.0.0.1:{b.admin_port}"
    assert urllib.request.urlopen(base + "/health", timeout=5).read() == b"running\n"
    status = get_json(base + "/status")
    assert status["state"] == "running" and status["topics"]["M"]["messages"] == 3
    consumer = clients(SimpleConsumer(client_conf(b), "G", {"M": FilterExpression()},
                                      await_duration=2))
    [consumer.ack(m) for m in receive_until(consumer, 1, max_calls=1)[:1]]
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    assert 'sparkmq_messages_sent_total{topic="M"} 3' in text
    assert 'sparkmq_bytes_sent_total{topic="M"} 9' in text
    assert 'sparkmq_consumer_lag{group="G",topic="M"}' in text
    assert "sparkmq_queue_depth{" in text and "sparkmq_acks_total" in text


# ---------------------------------------------------------------- cluster
def test_two_broker_groups_behind_a_nameserver(tmp_path, make_broker, clients):
    with NameServer(port=free_port()) as ns:
        a = make_broker("broker-a", namesrvAddr=ns.address, autoCreateTopicEnable="false")
        b = make_broker("broker-b", namesrvAddr=ns.address, autoCreateTopicEnable="false")
        a.store.create_topic("Shared")
        b.store.create_topic("Shared")
        a.register_once()
        b.register_once()
        route = NameServerClient(ns.address).route("Shared")
        assert {q["brokerName"] for q in route} == {"broker-a", "broker-b"} and len(route) == 4
        producer = clients(Producer(client_conf(a), ("Shared",)))   # asks broker-a only
        for i in range(8):
            producer.send(msg("Shared", f"s{i}".encode()))
        on_a = sum(a.store.max_offset("Shared", q) for q in range(2))
        on_b = sum(b.store.max_offset("Shared", q) for q in range(2))
        assert on_a + on_b == 8 and on_a > 0 and on_b > 0
        consumer = clients(SimpleConsumer(client_conf(b), "G", {"Shared": FilterExpression()},
                                          await_duration=1))
        got = receive_until(consumer, 8, max_calls=30)
        assert sorted(m.body for m in got) == sorted(f"s{i}".encode() for i in range(8))


# ---------------------------------------------------------------- crash
def start_broker_process(conf_path: str, admin_port: int):
    return spawn(["sparkmq.broker", "-c", conf_path], f"http://127.0.0.1:{admin_port}/health")


@pytest.mark.slow
def test_sigkill_under_sync_flush_loses_no_acked_message(tmp_path):
    store = tmp_path / "store"
    grpc_port, admin_port = free_port(), free_port()
    conf = tmp_path / "broker.properties"
    conf.write_text(f"brokerName=broker-k\nstorePathRootDir={store}\nlistenPort={grpc_port}\n"
                    f"adminPort={admin_port}\nflushDiskType=SYNC_FLUSH\n"
                    "autoCreateTopicEnable=true\ndefaultTopicQueueNums=2\n")
    proc = start_broker_process(str(conf), admin_port)
    acked: list[bytes] = []
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        s = MessagingServiceStub(channel)
        stop = threading.Event()

        def produce():
            i = 0
            while not stop.is_set() and i < 100_000:
                body = f"msg-{i}".encode()
                try:
                    r = s.SendMessage(spb.SendMessageRequest(messages=[raw_message("K", body)]),
                                      timeout=5)
                except grpc.RpcError:
                    return
                if r.status.code == Code.OK:
                    acked.append(body)
                i += 1
        t = threading.Thread(target=produce)
        t.start()
        wait_until(lambda: len(acked) >= 50, "50 acked sends")
        kill9(proc)
        stop.set()
        t.join(30)
        channel.close()
    finally:
        kill9(proc)
    assert len(acked) >= 50
    proc = start_broker_process(str(conf), admin_port)   # restart: recovery
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        s = MessagingServiceStub(channel)
        mqs = [pb.MessageQueue(topic=pb.Resource(name="K"), id=q) for q in range(2)]
        stored = []
        for mq in mqs:
            offset = 0
            for _ in range(10_000):
                resp = list(s.PullMessage(spb.PullMessageRequest(
                    group=pb.Resource(name="Checker"), message_queue=mq, offset=offset,
                    batch_size=1000), timeout=10))
                msgs = [r.message.body for r in resp if r.HasField("message")]
                if not msgs:
                    break
                stored += msgs
                offset = resp[-1].next_offset
        channel.close()
        missing = set(acked) - set(stored)
        assert not missing, f"{len(missing)} acked messages lost, e.g. {sorted(missing)[:3]}"
    finally:
        stop_process(proc)
    with Store.open(str(store), mode="r") as s2:      # clean stop: published, lease released
        assert s2.state.lease.released


# ---------------------------------------------------------------- push consumer, FIFO
def test_official_push_consumer_consumes_and_a_failed_message_comes_back(make_broker, clients):
    from rocketmq import ConsumeResult, MessageListener, PushConsumer
    b = make_broker()
    producer = clients(Producer(client_conf(b), ("P",)))
    for i in range(6):
        producer.send(msg("P", f"p{i}".encode()))
    seen: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    class Listener(MessageListener):
        def consume(self, message):
            with lock:
                seen.append((message.body, message.delivery_attempt))
            if message.body == b"p3" and message.delivery_attempt == 1:
                return ConsumeResult.FAILURE            # -> invisible for the back-off, then again
            return ConsumeResult.SUCCESS
    clients(PushConsumer(client_conf(b), "PushG", Listener(), {"P": FilterExpression()}))
    def redelivered() -> bool:
        with lock:
            return (b"p3", 2) in seen and len({x for x, _ in seen}) == 6
    wait_until(redelivered, "p3's redelivery after the 1 s back-off")
    with lock:
        assert {x for x, _ in seen} == {f"p{i}".encode() for i in range(6)}
        assert (b"p3", 1) in seen and (b"p3", 2) in seen


def test_fifo_message_groups_keep_their_order_under_concurrent_consumers(make_broker, clients):
    b = make_broker()
    b.store.create_group("FifoG", consume_message_orderly=True)   # an orderly group
    producer = clients(Producer(client_conf(b), ("Fifo",)))
    groups, per_group = ["g1", "g2", "g3"], 8
    for i in range(per_group):
        for g in groups:
            m = msg("Fifo", f"{g}:{i}".encode())
            m.message_group = g
            producer.send(m)
    consumed: list[tuple[str, int]] = []
    acked: set[tuple[str, int]] = set()
    early: list[tuple[str, int]] = []     # delivered before its predecessor was acked
    lock = threading.Lock()

    def consume(consumer):
        for _ in range(200):
            with lock:
                if len(consumed) >= len(groups) * per_group:
                    return
            for m in consumer.receive(8, 30):
                g, i = m.body.decode().split(":")
                with lock:
                    consumed.append((g, int(i)))
                    if int(i) > 0 and (g, int(i) - 1) not in acked:
                        early.append((g, int(i)))
                with lock:                      # noted before the ack is sent: the broker
                    acked.add((g, int(i)))      # may hand out the next one once it has it
                consumer.ack(m)
    consumers = [clients(SimpleConsumer(client_conf(b), "FifoG", {"Fifo": FilterExpression()},
                                        await_duration=1)) for _ in range(2)]
    threads = [threading.Thread(target=consume, args=(c,)) for c in consumers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(consumed) == sorted((g, i) for g in groups for i in range(per_group))
    assert early == []
    for g in groups:
        assert [i for gg, i in consumed if gg == g] == list(range(per_group))


def test_a_group_that_is_not_orderly_consumes_a_message_group_concurrently(make_broker, clients):
    """As the proxy pops with fifo only for consumeMessageOrderly groups: another group
    gets several messages of one message group at once."""
    b = make_broker()
    producer = clients(Producer(client_conf(b), ("Fifo2",)))
    for i in range(4):
        m = msg("Fifo2", f"g1:{i}".encode())
        m.message_group = "g1"
        producer.send(m)
    consumer = clients(SimpleConsumer(client_conf(b), "PlainG", {"Fifo2": FilterExpression()},
                                      await_duration=1))
    got = []
    for _ in range(10):
        got += [m.body for m in consumer.receive(8, 30)]     # nothing acked
        if len(got) == 4:
            break
    assert sorted(got) == [f"g1:{i}".encode() for i in range(4)]


# ---------------------------------------------------------------- Spark committer hand-off
def test_spark_commit_goes_through_the_broker_and_online_consumers_see_it(make_broker, clients):
    from sparkmq.log import format as fmt
    from sparkmq.log.committer import BrokerCommitter
    from sparkmq.log.fs import StoreFS
    from sparkmq.log.message import messages_to_batch
    from sparkmq.log.segment import write_segment
    from sparkmq import Message as StoreMessage
    b = make_broker()
    b.store.create_topic("Job", read_queue_nums=1, write_queue_nums=1)
    lease = b.store.txlog.snapshot().lease
    assert lease.endpoint == f"http://127.0.0.1:{b.admin_port}"
    consumer = clients(SimpleConsumer(client_conf(b), "Online", {"Job": FilterExpression()},
                                      await_duration=20))
    result = []
    t = threading.Thread(target=lambda: result.append(consumer.receive(16, 30)))
    t.start()
    wait_until(lambda: b.notifier.waiting, "the poll to be parked")
    url = b.config.store_path
    batch = messages_to_batch([StoreMessage("Job", f"row{i}".encode()) for i in range(3)],
                              queue_ids=[0, 0, 0], store_timestamp_ms=1_700_000_000_000,
                              store_host="spark", max_message_size_bytes=1 << 20)
    rel = fmt.staged_segment_file("job1", "t0")
    write_segment(StoreFS(url), rel, [batch])
    committer = BrokerCommitter(url, lease, timeout_s=30)
    first = committer.commit([rel], app_id="q1", app_version=0)
    assert first.num_messages == 3 and not first.skipped
    assert committer.commit([rel], app_id="q1", app_version=0).skipped     # replay: once only
    t.join(12)
    assert not t.is_alive()
    assert sorted(m.body for m in result[0]) == [b"row0", b"row1", b"row2"]
    bad = BrokerCommitter(url, lease, timeout_s=30)
    with pytest.raises(Exception, match="staged"):
        bad.commit(["commitlog/not-staged.arrow"])


def test_broadcasting_each_instance_gets_every_message_with_its_own_offsets(stub):
    b, s, _ = stub
    b.store.create_topic("Bc", read_queue_nums=1, write_queue_nums=1)
    assert send_code(s, *[raw_message("Bc", f"b{i}".encode()) for i in range(3)]) == [Code.OK] * 3
    mq = pb.MessageQueue(topic=pb.Resource(name="Bc"), id=0)

    def receive(cid):
        meta = [("x-mq-client-id", cid), ("x-sparkmq-consume-mode", "BROADCASTING")]
        out = list(s.ReceiveMessage(spb.ReceiveMessageRequest(
            group=pb.Resource(name="BG"), message_queue=mq, batch_size=10,
            invisible_duration=Duration(seconds=30)), timeout=10, metadata=meta))
        msgs = [r.message for r in out if r.HasField("message")]
        if msgs:
            ack = s.AckMessage(spb.AckMessageRequest(
                group=pb.Resource(name="BG"), topic=pb.Resource(name="Bc"),
                entries=[spb.AckMessageEntry(receipt_handle=m.system_properties.receipt_handle)
                         for m in msgs]), timeout=5, metadata=meta)
            assert ack.status.code == Code.OK
        offset = s.GetOffset(spb.GetOffsetRequest(group=pb.Resource(name="BG"), message_queue=mq),
                             timeout=5, metadata=meta).offset
        return sorted(m.body for m in msgs), offset
    assert receive("instance-1") == ([b"b0", b"b1", b"b2"], 3)
    assert receive("instance-2") == ([b"b0", b"b1", b"b2"], 3)
    clustering = s.GetOffset(spb.GetOffsetRequest(group=pb.Resource(name="BG"), message_queue=mq),
                             timeout=5)
    assert clustering.offset == 0                   # the group's own offset did not move
    no_id = list(s.ReceiveMessage(spb.ReceiveMessageRequest(
        group=pb.Resource(name="BG"), message_queue=mq, batch_size=1), timeout=5,
        metadata=[("x-sparkmq-consume-mode", "BROADCASTING")]))
    assert [r.status.code for r in no_id] == [Code.CLIENT_ID_REQUIRED]
    b.persist_offsets()
    assert b.store.consumer_offsets("BG", client_id="instance-1") == {("Bc", 0): 3}


def test_a_second_broker_on_the_same_store_is_refused(tmp_path, make_broker):
    from sparkmq.errors import StoreLockedError
    b = make_broker()
    twin = Broker(BrokerConfig.from_properties({
        "brokerName": "broker-a", "storePathRootDir": b.config.store_path,
        "listenPort": str(free_port()), "adminPort": str(free_port())}))
    with pytest.raises(StoreLockedError):
        twin.start()
    assert twin.state.value == "stopped" and b.state.value == "running"


def test_main_reports_a_bad_config_and_exits_nonzero(tmp_path, capsys):
    from sparkmq.broker import main
    conf = tmp_path / "bad.properties"
    conf.write_text("brokerRole=BOSS\n")
    assert main(["-c", str(conf)]) == 1
    assert "brokerRole" in capsys.readouterr().err
    assert main(["-c", str(tmp_path / "missing.properties")]) == 2


def test_a_taken_port_fails_the_start_cleanly(tmp_path, make_broker):
    b = make_broker()
    clash = Broker(broker_config(tmp_path, "broker-z", listenPort=b.listen_port))
    with pytest.raises(BindError, match="cannot bind"):
        clash.start()
    assert clash.state.value == "stopped"
    again = make_broker("broker-z")                 # the store's lease was released
    assert again.state.value == "running"


def test_admin_topic_api_and_bad_admin_requests(make_broker):
    b = make_broker()
    base = f"http://127.0.0.1:{b.admin_port}"

    def post(path, body: bytes):
        req = urllib.request.Request(base + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **admin_headers()})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
    assert post("/admin/topics", b'{"name": "New", "queueNums": 3}') == (
        200, {"topic": "New", "messageType": "MIXED", "readQueueNums": 3, "writeQueueNums": 3,
              "perm": 6})
    assert post("/admin/topics", b'{"name": "bad name!"}')[0] == 400
    assert post("/admin/topics", b'{"name": "X", "queueNums": "many"}')[0] == 400
    assert post("/admin/topics", b"{not json")[0] == 400
    assert post("/admin/adopt", b'{"paths": "not-a-list"}')[0] == 400
    assert post("/nope", b"{}")[0] == 404
    assert b.store.topics()["New"]["readQueueNums"] == 3
