"""Real processes on 127.0.0.1: a NameServer and two broker groups started with
``python -m sparkmq.namesrv`` / ``python -m sparkmq.broker``; the official client
produces through one broker and consumes from the other; offsets survive a restart."""
from __future__ import annotations

import urllib.request

import pytest
from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message, Producer,
                      SimpleConsumer)

from helpers.net import free_port
from helpers.waiting import wait_until
from helpers.daemons import get_json, post_json, spawn, stop_process
from sparkmq.broker import Broker, BrokerConfig
from sparkmq.namesrv import NameServerClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_nameserver_and_two_broker_processes(tmp_path, procs):
    ns_port = free_port()
    spawn(["sparkmq.namesrv", "-p", str(ns_port)], f"http://127.0.0.1:{ns_port}/health", procs)
    brokers = {}
    for name in ("broker-a", "broker-b"):
        grpc_port, admin_port = free_port(), free_port()
        conf = tmp_path / f"{name}.properties"
        conf.write_text(f"brokerClusterName=C\nbrokerName={name}\nflushDiskType=SYNC_FLUSH\n"
                        f"storePathRootDir={tmp_path / name}\nautoCreateTopicEnable=false\n")
        spawn(["sparkmq.broker", "-c", str(conf), "-n", f"127.0.0.1:{ns_port}",
               "-p", str(grpc_port), "--admin-port", str(admin_port)],
              f"http://127.0.0.1:{admin_port}/health", procs)
        brokers[name] = (grpc_port, admin_port)
        post_json(f"http://127.0.0.1:{admin_port}/admin/topics",
                  {"name": "Shared", "queueNums": 2})
    ns = NameServerClient(f"127.0.0.1:{ns_port}")
    wait_until(lambda: len(ns.route("Shared") or []) == 4, "both brokers to re-register Shared")
    assert {q["brokerName"] for q in ns.route("Shared")} == {"broker-a", "broker-b"}

    conf_a = ClientConfiguration(f"127.0.0.1:{brokers['broker-a'][0]}", Credentials())
    conf_b = ClientConfiguration(f"127.0.0.1:{brokers['broker-b'][0]}", Credentials())
    producer = Producer(conf_a, ("Shared",))
    consumer = SimpleConsumer(conf_b, "G", {"Shared": FilterExpression()}, await_duration=1)
    producer.startup()
    consumer.startup()
    try:
        for i in range(12):
            m = Message()
            m.topic, m.body = "Shared", f"x{i}".encode()
            producer.send(m)
        got = []
        for _ in range(40):
            for m in consumer.receive(16, 30):
                got.append(m.body)
                consumer.ack(m)
            if len(got) >= 12:
                break
    finally:
        consumer.shutdown()
        producer.shutdown()
    assert sorted(got) == sorted(f"x{i}".encode() for i in range(12))
    per_broker = [get_json(f"http://127.0.0.1:{admin}/status")["topics"]["Shared"]["messages"]
                  for _, admin in brokers.values()]
    assert sum(per_broker) == 12 and all(n > 0 for n in per_broker)
    assert [stop_process(p) for p in procs] == [0, 0, 0]      # clean stops


def test_consumer_offsets_are_persisted_at_stop_and_restored(tmp_path):
    props = {"brokerName": "broker-o", "storePathRootDir": str(tmp_path / "o"),
             "listenPort": str(free_port()), "adminPort": str(free_port()),
             "autoCreateTopicEnable": "true", "flushConsumerOffsetInterval": "600000"}
    broker = Broker(BrokerConfig.from_properties(props)).start()
    conf = ClientConfiguration(broker.endpoint, Credentials())
    try:
        producer = Producer(conf, ("O",))
        producer.startup()
        for i in range(8):
            m = Message()
            m.topic, m.body = "O", f"o{i}".encode()
            producer.send(m)
        producer.shutdown()
        consumer = SimpleConsumer(conf, "G", {"O": FilterExpression()}, await_duration=1)
        consumer.startup()
        acked = []
        for _ in range(10):
            for m in consumer.receive(1, 30):
                if len(acked) < 5:
                    consumer.ack(m)
                    acked.append(m.body)
            if len(acked) >= 5:
                break
        consumer.shutdown()
    finally:
        broker.stop()                                # persists offsets (interval is 10 min)
    broker = Broker(BrokerConfig.from_properties(props)).start()
    try:
        lag = urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/metrics",
                                     timeout=5).read().decode()
        assert 'sparkmq_consumer_lag{group="G",topic="O"} 3' in lag   # from the stored offsets
        consumer = SimpleConsumer(ClientConfiguration(broker.endpoint, Credentials()), "G",
                                  {"O": FilterExpression()}, await_duration=1)
        consumer.startup()
        rest = []
        for _ in range(10):
            rest += [m.body for m in consumer.receive(16, 30)]
            if len(rest) >= 3:
                break
        consumer.shutdown()
        text = urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/metrics",
                                      timeout=5).read().decode()
    finally:
        broker.stop()
    assert len(acked) == 5
    assert sorted(rest + acked) == sorted(f"o{i}".encode() for i in range(8))
    assert 'sparkmq_consumer_lag{group="G",topic="O"} 3' in text   # received, not acked yet
