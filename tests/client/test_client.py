"""sparkmq's own client (sparkmq.client) against in-process brokers on 127.0.0.1."""
from __future__ import annotations

import threading
import time

import pytest

from helpers.net import free_port
from helpers.waiting import wait_until
from sparkmq.client import (BrokerUnavailableError, ConsumeMode, ConsumeResult, Message,
                            Producer, PullConsumer, PushConsumer, SimpleConsumer)

pytestmark = pytest.mark.integration


@pytest.fixture
def make_broker(make_broker):
    """The shared factory (conftest.py) with this file's defaults: ASYNC_FLUSH, 4 queues."""
    def make(name="broker-a", **props):
        return make_broker(name, **{"flushDiskType": "ASYNC_FLUSH",
                                    "defaultTopicQueueNums": 4, **props})
    return make


def receive_all(consumer: SimpleConsumer, n: int, timeout_s: float = 20.0, ack=True,
                invisible_s: float = 30) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        for m in consumer.receive(max_messages=32, invisible_duration_s=invisible_s,
                                  wait_s=1.0):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def test_round_trip_sync_send_receive_ack(make_broker, closing):
    b = make_broker()
    p = closing(Producer(b.endpoint))
    receipts = [p.send(Message("T1", f"m{i}".encode(), tag="A", keys=[f"k{i}"],
                               properties={"i": str(i)})) for i in range(10)]
    assert len({r.message_id for r in receipts}) == 10
    assert all(r.broker_name == "broker-a" and r.queue_offset >= 0 for r in receipts)
    c = closing(SimpleConsumer(b.endpoint, "G1", {"T1": "A"}))
    got = receive_all(c, 10)
    assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(10))
    by_body = {m.body: m for m in got}
    assert by_body[b"m3"].properties["i"] == "3" and by_body[b"m3"].keys == ("k3",)
    assert {m.message_id for m in got} == {r.message_id for r in receipts}
    assert c.receive(max_messages=8, wait_s=0.3) == []     # all acked: nothing comes back


def test_tag_filter_and_unacked_redelivery(make_broker, closing):
    b = make_broker()
    p = closing(Producer(b.endpoint))
    p.send(Message("T2", b"a", tag="A"))
    p.send(Message("T2", b"b", tag="B"))
    p.send(Message("T2", b"c", tag="C"))
    c = closing(SimpleConsumer(b.endpoint, "G2", {"T2": "A || C"}))
    first = receive_all(c, 2, ack=False)
    assert sorted(m.body for m in first) == [b"a", b"c"]
    # shorten the invisibility of one and do not ack it: it comes back, attempt + 1
    m = c.change_invisible_duration(first[0], 0.2)
    c.ack(first[1])
    again = receive_all(c, 1, ack=False)
    assert [x.body for x in again] == [m.body]
    assert again[0].delivery_attempt == first[0].delivery_attempt + 1
    c.ack(again[0])


def test_a_message_never_acked_goes_to_the_dlq_after_its_attempts(make_broker, closing):
    b = make_broker()
    b.store.create_group("GD", retry_max_times=1)          # two deliveries, then the DLQ
    p = closing(Producer(b.endpoint))
    p.send(Message("TD", b"poison"))
    c = closing(SimpleConsumer(b.endpoint, "GD", {"TD": "*"}))
    attempts = []
    for _ in range(2):
        [m] = receive_all(c, 1, ack=False, invisible_s=0.2)
        attempts.append(m.delivery_attempt)
    assert attempts == [1, 2]
    from helpers.waiting import wait_until
    wait_until(lambda: (c.receive(max_messages=1, invisible_duration_s=0.2, wait_s=0.3) or True)
               and b.store.max_offset("%DLQ%GD", 0) == 1, "the message in %DLQ%GD")
    [dead] = b.store.read("%DLQ%GD", 0, 0, 1)
    assert dead.body == b"poison" and dead.properties["DLQ_ORIGIN_TOPIC"] == "TD"


def test_async_callback_oneway_and_batch(make_broker, closing):
    b = make_broker()
    p = closing(Producer(b.endpoint))
    seen, done = [], threading.Event()

    def cb(receipt, err):
        seen.append((receipt, err))
        if len(seen) == 20:
            done.set()
    futs = [p.send_async(Message("T3", f"a{i}".encode()), callback=cb) for i in range(20)]
    ids = {f.result(timeout=10).message_id for f in futs}
    assert done.wait(10) and all(err is None for _, err in seen) and len(ids) == 20
    batch = p.send_batch([Message("T3", f"b{i}".encode()) for i in range(50)])
    assert len(batch) == 50 and len({r.message_id for r in batch}) == 50
    p.send_oneway(Message("T3", b"oneway"))
    c = closing(SimpleConsumer(b.endpoint, "G3", {"T3": "*"}))
    got = receive_all(c, 71)
    bodies = {m.body for m in got}
    assert len(got) == 71 and b"oneway" in bodies and b"b49" in bodies and b"a0" in bodies


def test_batch_refuses_mixed_topics(make_broker, closing):
    b = make_broker()
    p = closing(Producer(b.endpoint))
    with pytest.raises(Exception, match="one topic"):
        p.send_batch([Message("X1", b"a"), Message("X2", b"b")])


def test_sharding_key_keeps_order_per_key(make_broker, closing):
    b = make_broker()
    p = closing(Producer(b.endpoint))
    keys = ["k0", "k1", "k2"]
    for i in range(30):
        k = keys[i % 3]
        p.send(Message("T4", f"{k}:{i}".encode(), message_group=k))
    c = closing(SimpleConsumer(b.endpoint, "G4", {"T4": "*"}))
    got = receive_all(c, 30)
    assert len(got) == 30
    for k in keys:
        seq = [int(m.body.split(b":")[1]) for m in got if m.message_group == k]
        assert seq == sorted(seq) and len(seq) == 10
        assert len({m.queue_id for m in got if m.message_group == k}) == 1


def test_push_consumers_of_one_group_consume_everything_exactly_once(make_broker, closing):
    b = make_broker()
    p = closing(Producer(b.endpoint))
    n = 300
    lock = threading.Lock()
    seen: dict[bytes, int] = {}
    by_consumer = {0: 0, 1: 0}
    all_done = threading.Event()

    def listener_for(idx):
        def listener(m):
            with lock:
                seen[m.body] = seen.get(m.body, 0) + 1
                by_consumer[idx] += 1
                if len(seen) == n:
                    all_done.set()
            return ConsumeResult.SUCCESS
        return listener
    consumers = [closing(PushConsumer(b.endpoint, "G5", {"T5": "*"}, listener_for(i),
                                      consume_threads=2, wait_s=1.0)) for i in range(2)]
    for start in range(0, n, 50):
        p.send_batch([Message("T5", f"m{i}".encode()) for i in range(start, start + 50)])
    assert all_done.wait(30), f"consumed {len(seen)} of {n}"
    for c in consumers:
        c.shutdown()
    assert sorted(seen) == sorted(f"m{i}".encode() for i in range(n))
    assert set(seen.values()) == {1}, "a message was consumed twice"
    assert sum(c.consumed for c in consumers) == n


def _failing_once():
    """A listener that fails its first message and takes the next; the delivery
    attempts it saw, and an Event set at its first success."""
    attempts, ok = [], threading.Event()

    def listener(m):
        attempts.append(m.delivery_attempt)
        if len(attempts) == 1:
            return ConsumeResult.FAILURE
        ok.set()
        return ConsumeResult.SUCCESS
    return listener, attempts, ok


def test_push_consumer_listener_longer_than_the_invisible_time_gets_its_message_once(
        make_broker, closing):
    """By default the PushConsumer receives with auto_renew, as the official ones do:
    a listener that runs past the broker's invisible time (2 s here; renewed at once) is
    not handed its message again meanwhile."""
    b = make_broker(defaultInvisibleTimeMs=2000, renewAheadTimeMillis=1900,
                    renewSchedulePeriodMillis=50, invisibleTimeMillisWhenClear=0)
    b.store.create_topic("TL", read_queue_nums=1, write_queue_nums=1)
    p = closing(Producer(b.endpoint))
    seen, lock, go_on = [], threading.Lock(), threading.Event()

    def slow(m):
        with lock:
            seen.append(m.body)
        if m.body == b"slow":
            go_on.wait(60)
        return ConsumeResult.SUCCESS
    c = closing(PushConsumer(b.endpoint, "GL", {"TL": "*"}, slow, wait_s=0.5))
    p.send(Message("TL", b"slow"))
    wait_until(lambda: seen, "the first delivery")
    wait_until(lambda: b.metrics.get("sparkmq_receipt_renewals_total") >= 1 or len(seen) > 1,
               "a renewal or a second delivery")
    go_on.set()
    wait_until(lambda: c.consumed == 1, "the ack")
    assert seen == [b"slow"]
    c.shutdown()
    assert b.renewer.held_count() == 0


def test_push_consumer_failure_is_redelivered(make_broker, closing):
    b = make_broker()
    p = closing(Producer(b.endpoint))
    listener, attempts, ok = _failing_once()
    closing(PushConsumer(b.endpoint, "G6", {"T6": "*"}, listener, wait_s=1.0,
                         invisible_duration_s=0.5))
    p.send(Message("T6", b"x"))
    assert ok.wait(20)
    assert attempts[:2] == [1, 2]


def test_a_failed_message_comes_back_after_the_groups_retry_delay(make_broker, closing):
    """As the official push consumers nack: the listener's failure changes the message's
    invisible duration to the group's retry delay for its attempt (0.2 s here), so it is
    back long before the 60 s it was received with."""
    b = make_broker()
    b.store.create_group("GR", retry_policy={"type": "CUSTOMIZED",
                                             "customizedRetryPolicy": {"next": [200]}})
    p = closing(Producer(b.endpoint))
    p.send(Message("TR", b"x"))
    listener, attempts, ok = _failing_once()
    c = closing(PushConsumer(b.endpoint, "GR", {"TR": "*"}, listener, wait_s=1.0,
                             invisible_duration_s=60))
    assert c.retry_policy is not None and c.retry_policy.steps == (0.2,)
    assert ok.wait(30), f"not redelivered within 30 s: attempts {attempts}"
    assert attempts[:2] == [1, 2]
    b.store.create_group("GR", retry_policy={"type": "EXPONENTIAL", "exponentialRetryPolicy": {
        "initial": 3000, "max": 60000, "multiplier": 3}})
    c._fetch_retry_policy()
    assert (c.retry_policy.initial, c.retry_policy.maximum, c.retry_policy.multiplier) == \
        (3.0, 60.0, 3.0)


def test_broadcasting_push_consumers_each_get_everything(make_broker, closing):
    b = make_broker()
    p = closing(Producer(b.endpoint))
    got = {0: set(), 1: set()}
    done = [threading.Event(), threading.Event()]

    def listener_for(i):
        def listener(m):
            got[i].add(m.body)
            if len(got[i]) == 20:
                done[i].set()
            return ConsumeResult.SUCCESS
        return listener
    for i in range(2):
        closing(PushConsumer(b.endpoint, "G7", {"T7": "*"}, listener_for(i), wait_s=1.0,
                             mode=ConsumeMode.BROADCASTING))
    p.send_batch([Message("T7", f"m{i}".encode()) for i in range(20)])
    assert done[0].wait(20) and done[1].wait(20)
    assert got[0] == got[1] == {f"m{i}".encode() for i in range(20)}


def test_pull_consumer_by_offset(make_broker, closing):
    b = make_broker()
    p = closing(Producer(b.endpoint))
    p.send_batch([Message("T8", f"m{i}".encode()) for i in range(12)])
    pc = closing(PullConsumer(b.endpoint, "G8"))
    bodies = []
    for q in pc.queues("T8"):
        off = pc.query_offset(q, "BEGINNING")
        end = pc.query_offset(q, "END")
        while off < end:
            msgs, off = pc.pull(q, off, max_messages=5)
            bodies += [m.body for m in msgs]
        pc.commit_offset(q, off)
        assert pc.committed_offset(q) == end
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(12))


def test_failover_send_retried_on_the_other_broker(make_broker, closing):
    a, b = make_broker("broker-a"), make_broker("broker-b")
    p = closing(Producer([a.endpoint, b.endpoint], request_timeout_s=2.0, isolation_s=60))
    first = [p.send(Message("T9", f"w{i}".encode())) for i in range(8)]
    assert {r.broker_name for r in first} == {"broker-a", "broker-b"}  # round robin
    a.stop()
    after = [p.send(Message("T9", f"x{i}".encode())) for i in range(8)]
    assert {r.broker_name for r in after} == {"broker-b"}
    assert p.isolated_endpoints() == [a.endpoint]
    c = closing(SimpleConsumer(b.endpoint, "G9", {"T9": "*"}))
    bodies = {m.body for m in receive_all(c, 12)}
    assert {f"x{i}".encode() for i in range(8)} <= bodies


def test_no_broker_reachable_raises_after_retries(closing):
    p = closing(Producer(f"127.0.0.1:{free_port()}", request_timeout_s=0.5))
    with pytest.raises(BrokerUnavailableError):
        p.send(Message("T10", b"x"))


def test_nameserver_route_reaches_both_groups_and_push_consumer_follows_a_joining_broker(
        make_broker, closing):
    from sparkmq.namesrv import NameServer
    with NameServer(port=free_port()) as ns:
        a = make_broker("broker-a", namesrvAddr=ns.address, autoCreateTopicEnable="false")
        b = make_broker("broker-b", namesrvAddr=ns.address, autoCreateTopicEnable="false")
        a.store.create_topic("Shared")
        a.register_once()
        got, lock = set(), threading.Lock()

        def listener(m):
            with lock:
                got.add(m.body)
            return ConsumeResult.SUCCESS
        closing(PushConsumer(a.endpoint, "GS", {"Shared": "*"}, listener, wait_s=0.5,
                             refresh_s=0.3))
        b.store.create_topic("Shared")          # broker-b joins the topic's route
        b.register_once()
        p = closing(Producer(a.endpoint))       # one endpoint: the route names both
        receipts = [p.send(Message("Shared", f"m{i}".encode())) for i in range(8)]
        assert {r.broker_name for r in receipts} == {"broker-a", "broker-b"}
        wait_until(lambda: len(got) >= 8, "the push consumer to get all 8 messages")
        assert got == {f"m{i}".encode() for i in range(8)}


def test_sql92_subscription(make_broker, closing):
    b = make_broker(enablePropertyFilter="true")
    p = closing(Producer(b.endpoint))
    for i in range(6):
        p.send(Message("TS", f"m{i}".encode(), properties={"n": str(i)}))
    c = closing(SimpleConsumer(b.endpoint, "GSQL", {"TS": ("SQL92", "n > 3")}))
    assert sorted(m.body for m in receive_all(c, 2)) == [b"m4", b"m5"]
    assert c.receive(max_messages=8, wait_s=0.3) == []


def test_orderly_push_consumer_keeps_group_order(make_broker, closing):
    b = make_broker()
    b.store.create_group("GO", consume_message_orderly=True)   # FIFO needs an orderly group
    p = closing(Producer(b.endpoint))
    groups = [f"g{i}" for i in range(4)]
    n_per = 15
    for i in range(n_per):
        for g in groups:
            p.send(Message("TO", f"{g}:{i}".encode(), message_group=g))
    seen: dict[str, list[int]] = {g: [] for g in groups}
    lock, done = threading.Lock(), threading.Event()

    def listener(m):
        g, i = m.body.decode().split(":")
        with lock:
            seen[g].append(int(i))
            if sum(map(len, seen.values())) == n_per * len(groups):
                done.set()
        return ConsumeResult.SUCCESS
    closing(PushConsumer(b.endpoint, "GO", {"TO": "*"}, listener, consume_threads=4,
                         orderly=True, wait_s=0.5))
    assert done.wait(30), {g: len(v) for g, v in seen.items()}
    assert seen == {g: list(range(n_per)) for g in groups}


def test_push_consumer_acks_in_batches_and_every_ack_lands(make_broker, closing):
    """Concurrent consumption acks through one AckMessage per batch of waiting acks
    (client/acks.py): fewer requests than messages, each message acked exactly once
    (none comes back after its 1 s invisible time), shutdown sends what is pending."""
    b = make_broker()
    p = closing(Producer(b.endpoint))
    n = 300
    done = threading.Event()
    got: list[bytes] = []

    def listener(m):
        got.append(m.body)
        if len(got) == n:
            done.set()
        return ConsumeResult.SUCCESS
    c = closing(PushConsumer(b.endpoint, "GA", {"TA": "*"}, listener, consume_threads=4,
                             batch_size=32, invisible_duration_s=1.0, wait_s=1.0))
    p.send_batch([Message("TA", f"m{i}".encode()) for i in range(n)])
    assert done.wait(30), f"consumed {len(got)} of {n}"
    c.shutdown()
    assert c.consumed == n and sorted(got) == sorted(f"m{i}".encode() for i in range(n))
    assert c._acks.requests < n, "every message was acked in a request of its own"
    # an unacked message would be visible again after 1 s: a 2.5 s long poll sees none
    s = closing(SimpleConsumer(b.endpoint, "GA", {"TA": "*"}))
    assert s.receive(max_messages=32, invisible_duration_s=10, wait_s=2.5) == []


def test_the_ack_batcher_sends_what_waited_during_a_request_as_one():
    """While one AckMessage is in flight the acks added meanwhile wait and go as one
    request (the RPC is the edge replaced here: the broker's answer per entry)."""
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    from sparkmq.client.acks import AckBatcher
    from sparkmq.client.core import ReceivedMessage
    release, calls, acked = threading.Event(), [], []

    def call(endpoint, method, req):
        calls.append([e.message_id for e in req.entries])
        release.wait(10)
        return spb.AckMessageResponse(status=pb.Status(code=pb.Code.OK), entries=[
            spb.AckMessageResultEntry(message_id=e.message_id, status=pb.Status(
                code=pb.Code.OK if e.message_id != "m5" else pb.Code.INVALID_RECEIPT_HANDLE))
            for e in req.entries])
    acks = AckBatcher("G", call, acked.append)

    def msg(i):
        return ReceivedMessage(topic="T", body=b"", message_id=f"m{i}", tag=None, keys=(),
                               properties={}, message_group=None, queue_id=0, queue_offset=i,
                               born_timestamp_ms=0, delivery_attempt=1, receipt_handle=f"h{i}", endpoint="e")
    acks.add(msg(0))
    wait_until(lambda: len(calls) == 1)
    for i in range(1, 10):
        acks.add(msg(i))
    release.set()
    acks.close()
    assert calls == [["m0"], [f"m{i}" for i in range(1, 10)]]
    assert acked == [1, 8]                          # m5 refused: not counted
