"""RecallMessage (5.x): cancel a delayed message before delivery. The schedule service on a
real store (injected clock, restart, crash), and the broker end to end with sparkmq's
Producer (recall handle on the send receipt, NOT_FOUND once delivered, bad handles)."""

from __future__ import annotations

import time

import pytest

from helpers.clock import Clock
from sparkmq import Store
from sparkmq.broker.schedule import (DEFAULT_DELAY_LEVELS, RECALL_TOPIC, SCHEDULE_TOPIC,
                                     DelayPolicy, RecallStatus, ScheduleService,
                                     make_recall_handle, parse_recall_handle,
                                     parse_delay_levels)
from sparkmq.errors import UserError

from test_delay import bodies, park

POLICY = DelayPolicy(parse_delay_levels(DEFAULT_DELAY_LEVELS))


def test_recall_handle_round_trip_and_malformed():
    h = make_recall_handle("T", "broker-a", 18, 7, "ABC")
    assert parse_recall_handle(h) == ("T", "broker-a", 18, 7, "ABC")
    for bad in ("", "not base64 !!", make_recall_handle("T", "b", 1, 2, "x")[:-4] + "AAAA"):
        with pytest.raises(UserError, match="recall handle"):
            parse_recall_handle(bad)


def test_recalled_message_is_never_delivered_even_after_restart_and_crash(local_store_url):
    clock = Clock()
    store = Store.open(local_store_url, clock_ms=clock)
    store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    svc = ScheduleService(store, POLICY, clock_ms=clock).start()
    t0 = clock.now_ms
    keep = park(store, clock, POLICY, "T", b"keep", at_ms=t0 + 1000)
    drop = park(store, clock, POLICY, "T", b"drop", at_ms=t0 + 1000)
    late = park(store, clock, POLICY, "T", b"late-drop", at_ms=t0 + 60_000)
    q = POLICY.timer_queue
    assert svc.recall(q, drop.queue_offset) == RecallStatus.RECALLED
    assert svc.recall(q, drop.queue_offset) == RecallStatus.NOT_FOUND       # once
    assert svc.recall(q, 999) == RecallStatus.NOT_FOUND
    assert svc.recall(77, 0) == RecallStatus.NOT_FOUND
    assert svc.pending_count() == 2
    clock.now_ms = t0 + 1000
    svc.run_due()          # (the service thread may have delivered first: it holds the same lock)
    assert bodies(store, "T") == [b"keep"]
    assert svc.recall(q, keep.queue_offset) == RecallStatus.NOT_FOUND       # delivered
    assert svc.recall(q, late.queue_offset) == RecallStatus.RECALLED
    svc.stop()
    store._crash()                                          # recall stored before it acted

    store = Store.open(local_store_url, clock_ms=clock)
    assert [m.body for m in store.read(RECALL_TOPIC, 0, 0, 10)] == [
        b"%d:%d" % (q, drop.queue_offset), b"%d:%d" % (q, late.queue_offset)]
    svc = ScheduleService(store, POLICY, clock_ms=clock).start()
    assert svc.pending_count() == 0
    clock.now_ms = t0 + 120_000
    svc.run_due()
    assert bodies(store, "T") == [b"keep"]
    assert store.max_offset(SCHEDULE_TOPIC, q) == 3                          # still auditable
    svc.stop()
    store.close()


@pytest.mark.integration
def test_recall_through_the_broker_with_sparkmq_producer(tmp_path):
    from sparkmq.broker import Broker
    from sparkmq.client import ClientError, Message, Producer
    from helpers.brokers import broker_config

    clock = Clock(int(time.time() * 1000))
    b = Broker(broker_config(tmp_path), clock_ms=clock).start()
    try:
        b.store.create_topic("D", read_queue_nums=1, write_queue_nums=1)
        with Producer(b.endpoint) as p:
            r1 = p.send(Message("D", b"recall-me", delivery_timestamp_ms=clock.now_ms + 30_000))
            r2 = p.send(Message("D", b"deliver-me", delivery_timestamp_ms=clock.now_ms + 30_000))
            now = p.send(Message("D", b"now"))
            assert r1.recall_handle and r2.recall_handle and not now.recall_handle
            assert p.recall_message(r1) == r1.message_id
            with pytest.raises(ClientError, match="NOT_FOUND"):
                p.recall_message(r1)                                   # already recalled
            with pytest.raises(UserError, match="no recall handle"):
                p.recall_message(now)
            with pytest.raises(ClientError, match="INVALID_RECEIPT_HANDLE"):
                p.recall_message("D", "garbage")
            from rocketmq.grpc_protocol.definition_pb2 import Code
            wrong = p.conns.call(b.endpoint, "RecallMessage",
                                 _recall_request("Other", r2.recall_handle))
            assert wrong.status.code == Code.BAD_REQUEST and "not 'Other'" in wrong.status.message
            clock.now_ms += 30_000
            b.schedule.run_due()
            assert [m.body for m in b.store.read("D", 0, 0, 10)] == [b"now", b"deliver-me"]
            with pytest.raises(ClientError, match="NOT_FOUND"):
                p.recall_message("D", r2.recall_handle)                # delivered already
    finally:
        b.stop()


def _recall_request(topic, handle):
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    return spb.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle)


@pytest.mark.integration
def test_recall_with_the_official_client(tmp_path, clients):
    from rocketmq import Producer as OfficialProducer
    from sparkmq.broker import Broker
    from helpers.brokers import broker_config
    from helpers.brokers import client_conf, msg

    clock = Clock(int(time.time() * 1000))
    b = Broker(broker_config(tmp_path), clock_ms=clock).start()
    try:
        b.store.create_topic("D", read_queue_nums=1, write_queue_nums=1)
        producer = clients(OfficialProducer(client_conf(b), ("D",)))
        keep, drop = msg("D", b"keep"), msg("D", b"drop")
        for m in (keep, drop):
            m.delivery_timestamp = (clock.now_ms + 60_000) // 1000   # the client sends seconds
        r_keep, r_drop = producer.send(keep), producer.send(drop)
        assert r_drop.recall_handle and r_keep.recall_handle
        assert producer.recall_message("D", r_drop.recall_handle) == r_drop.message_id
        with pytest.raises(Exception, match="NOT_FOUND|not waiting"):
            producer.recall_message("D", r_drop.recall_handle)
        clock.now_ms += 61_000
        b.schedule.run_due()
        assert [m.body for m in b.store.read("D", 0, 0, 10)] == [b"keep"]
    finally:
        b.stop()
