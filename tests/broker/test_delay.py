"""Delayed messages: the schedule service against a real store (injected clock), and the
broker end to end with the official client (delay levels, delivery timestamps, restart)."""

from __future__ import annotations

import time

import pytest

from helpers.clock import Clock
from helpers.waiting import wait_until
from sparkmq import Store
from sparkmq.broker.schedule import (PROP_REAL_TOPIC, SCHEDULE_GROUP, SCHEDULE_TOPIC,
                                     DEFAULT_DELAY_LEVELS, DelayPolicy, DelayRefused,
                                     ScheduleService, parked_row, parse_delay_levels)
from sparkmq.log.message import Message


LEVELS = parse_delay_levels(DEFAULT_DELAY_LEVELS)


def test_levels_parse_to_the_18_rocketmq_levels():
    assert len(LEVELS) == 18
    assert LEVELS[:4] == [1000, 5000, 10_000, 30_000] and LEVELS[-1] == 2 * 3600 * 1000
    with pytest.raises(Exception, match="not <number>"):
        parse_delay_levels("1s 5x")


def test_policy_levels_timestamps_and_limits():
    p = DelayPolicy(LEVELS, max_delay_ms=3 * 86_400_000)
    assert p.park(1000, level=3) == (2, 11_000)
    assert p.park(1000, level=0) is None
    assert p.park(1000, deliver_at_ms=500) is None            # past: deliver at once
    assert p.park(1000, deliver_at_ms=9000) == (18, 9000)
    with pytest.raises(DelayRefused, match="maxDelayMs"):
        p.park(0, deliver_at_ms=3 * 86_400_000 + 1)
    with pytest.raises(DelayRefused, match="levels are 1..18"):
        p.park(0, level=19)


def park(store, clock, policy, topic, body, *, level=None, at_ms=None):
    props = {"DELAY": str(level)} if level else {}
    t, qid, due, props = parked_row(policy, clock(), topic, props, at_ms)
    return store.append([Message(topic=t, body=body, queue_id=qid, delivery_timestamp=due,
                                 properties=props)])[0]


def bodies(store, topic):
    out = []
    for q in range(store.topics()[topic]["readQueueNums"]):
        out += [m.body for m in store.read(topic, q, 0, 1000)]
    return sorted(out)


@pytest.fixture
def delay_store(local_store_url):
    clock = Clock()
    store = Store.open(local_store_url, clock_ms=clock, autoCreateTopicEnable=True)
    store.create_topic("T", read_queue_nums=2, write_queue_nums=2)
    yield store, clock
    store.close()


def test_every_level_is_delivered_when_due_and_not_before(delay_store):
    store, clock = delay_store
    policy = DelayPolicy(LEVELS)
    svc = ScheduleService(store, policy, clock_ms=clock).start()
    try:
        start = clock.now_ms
        for level in range(1, 19):
            park(store, clock, policy, "T", f"L{level}".encode(), level=level)
        svc.run_due()
        assert bodies(store, "T") == [] and svc.pending_count() == 18
        assert store.max_offset(SCHEDULE_TOPIC, 0) == 1           # visible to admin tools
        for level, delay in enumerate(LEVELS, 1):
            clock.now_ms = start + delay - 1
            svc.run_due()
            assert f"L{level}".encode() not in bodies(store, "T")   # not before due
            clock.now_ms = start + delay
            svc.run_due()
            assert f"L{level}".encode() in bodies(store, "T")
        assert svc.pending_count() == 0 and len(bodies(store, "T")) == 18
        delivered = [m for q in range(2) for m in store.read("T", q, 0, 100)]
        assert all(m.delivery_timestamp >= m.born_timestamp for m in delivered)
        assert all(PROP_REAL_TOPIC not in m.properties and m.message_type == 2 for m in delivered)
    finally:
        svc.stop()


def test_arbitrary_delivery_times_out_of_order(delay_store):
    store, clock = delay_store
    policy = DelayPolicy(LEVELS)
    svc = ScheduleService(store, policy, clock_ms=clock).start()
    try:
        t0 = clock.now_ms
        for d in (50_000, 10_000, 86_400_000, 30_000):
            park(store, clock, policy, "T", str(d).encode(), at_ms=t0 + d)
        clock.now_ms = t0 + 30_000
        svc.run_due()
        assert bodies(store, "T") == [b"10000", b"30000"]
        clock.now_ms = t0 + 86_400_000
        svc.run_due()
        assert bodies(store, "T") == [b"10000", b"30000", b"50000", b"86400000"]
    finally:
        svc.stop()


def test_restart_delivers_parked_messages_once(local_store_url):
    clock = Clock()
    policy = DelayPolicy(LEVELS)
    store = Store.open(local_store_url, clock_ms=clock)
    store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    svc = ScheduleService(store, policy, clock_ms=clock).start()
    t0 = clock.now_ms
    park(store, clock, policy, "T", b"long", at_ms=t0 + 3_600_000)   # holds the queue floor
    park(store, clock, policy, "T", b"short", at_ms=t0 + 1000)
    park(store, clock, policy, "T", b"level", level=2)
    clock.now_ms = t0 + 5000
    svc.run_due()
    assert bodies(store, "T") == [b"level", b"short"]
    svc.stop()
    store.close()

    store = Store.open(local_store_url, clock_ms=clock)
    progress = store.consumer_offsets(SCHEDULE_GROUP)
    assert progress.get((SCHEDULE_TOPIC, 18), 0) == 0        # floor held back by "long"
    assert progress[(SCHEDULE_TOPIC, 1)] == 1                # level 2 queue: delivered
    svc = ScheduleService(store, policy, clock_ms=clock).start()
    assert svc.pending_count() == 1
    clock.now_ms = t0 + 3_600_000
    svc.run_due()
    assert bodies(store, "T") == [b"level", b"long", b"short"]            # no duplicate
    svc.stop()
    store._crash()

    store = Store.open(local_store_url, clock_ms=clock)                   # after a crash
    svc = ScheduleService(store, policy, clock_ms=clock).start()
    assert svc.pending_count() == 0
    svc.stop()
    store.close()


def test_the_service_thread_delivers_a_one_second_level_for_real(local_store_url):
    store = Store.open(local_store_url)
    store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    policy = DelayPolicy(LEVELS)
    svc = ScheduleService(store, policy).start()
    try:
        sent_ms = int(time.time() * 1000)
        park(store, store_clock := (lambda: sent_ms), policy, "T", b"x", level=1)
        wait_until(lambda: store.max_offset("T", 0) > 0, "the delayed message's delivery")
        got = store.read("T", 0, 0, 1)
        assert [m.body for m in got] == [b"x"]
        assert got[0].store_timestamp >= sent_ms + 1000       # waited the level's second
        assert got[0].delivery_timestamp == sent_ms + 1000
        del store_clock
    finally:
        svc.stop()
        store.close()


# ---------------------------------------------------------------- broker, official client
from helpers.brokers import client_conf, msg  # noqa: E402
from test_broker import raw_message, send_code  # noqa: E402


@pytest.mark.integration
def test_official_client_delay_message_is_delivered_when_due_and_spark_view_follows(
        make_broker, clients):
    from rocketmq import FilterExpression, Producer, SimpleConsumer
    b = make_broker()
    b.store.create_topic("D")
    producer = clients(Producer(client_conf(b), ("D",)))
    due_ms = (int(time.time()) + 2) * 1000
    m = msg("D", b"later", tag="TagD")
    # the official Python client copies this value into Timestamp.seconds (its docstring
    # says ms): give it seconds so that the wire carries the intended instant
    m.delivery_timestamp = due_ms // 1000
    receipt = producer.send(m)
    # parked: the real topic holds nothing yet; the schedule topic (admin view) holds it
    assert sum(b.store.max_offset("D", q) for q in range(2)) == 0
    assert b.store.max_offset(SCHEDULE_TOPIC, b.delay_policy.timer_queue) == 1
    consumer = clients(SimpleConsumer(client_conf(b), "G", {"D": FilterExpression("*")},
                                      await_duration=5))
    got = []
    for _ in range(4):                                   # bounded: 4 long polls of 5 s
        got += consumer.receive(16, 30)
        if got:
            break
    assert [x.body for x in got] == [b"later"]
    assert got[0].message_id == receipt.message_id and got[0].delivery_timestamp == due_ms
    stored = [x for q in range(2) for x in b.store.read("D", q, 0, 10)]
    assert stored[0].store_timestamp >= due_ms           # delivered no earlier than due


@pytest.mark.integration
def test_broker_delay_levels_limits_and_restart_with_parked_messages(tmp_path, make_broker):
    from sparkmq.broker import Broker
    from helpers.brokers import broker_config
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    clock = Clock(int(time.time() * 1000))
    cfg = broker_config(tmp_path, timerMaxDelaySec=3600)
    b = Broker(cfg, clock_ms=clock).start()
    try:
        b.store.create_topic("D", read_queue_nums=1, write_queue_nums=1)
        with grpc.insecure_channel(b.endpoint) as ch:
            s = MessagingServiceStub(ch)
            lv = raw_message("D", b"level3")
            lv.user_properties["DELAY"] = "3"                            # 10 s
            far = raw_message("D", b"too-far", message_type=pb.DELAY)
            far.system_properties.delivery_timestamp.FromMilliseconds(clock.now_ms + 3_600_001)
            ts = raw_message("D", b"in-30s", message_type=pb.DELAY)
            ts.system_properties.delivery_timestamp.FromMilliseconds(clock.now_ms + 30_000)
            bad = raw_message("D", b"bad-level")
            bad.user_properties["DELAY"] = "99"
            assert send_code(s, far) == [Code.ILLEGAL_DELIVERY_TIME]
            assert send_code(s, bad) == [Code.ILLEGAL_DELIVERY_TIME]
            assert send_code(s, lv, bad) == [Code.ILLEGAL_DELIVERY_TIME]  # whole: lv not kept
            assert send_code(s, lv, ts) == [Code.OK, Code.OK]
        # the schedule service loads parked messages on its own thread, woken by the store
        wait_until(lambda: b.schedule.pending_count() == 2, "two parked messages loaded")
        clock.now_ms += 10_000
        b.schedule.run_due()
        assert [m.body for m in b.store.read("D", 0, 0, 10)] == [b"level3"]
    finally:
        b.stop()
    b = Broker(cfg, clock_ms=clock).start()                 # restart: one still parked
    try:
        assert b.schedule.pending_count() == 1
        clock.now_ms += 20_000
        b.schedule.run_due()
        assert [m.body for m in b.store.read("D", 0, 0, 10)] == [b"level3", b"in-30s"]
    finally:
        b.stop()


Code = __import__("rocketmq.grpc_protocol.definition_pb2", fromlist=["Code"]).Code
