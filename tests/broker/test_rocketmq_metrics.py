"""Metrics under Apache RocketMQ 5's names (issue 17 item 4): /metrics, parsed with
prometheus_client's own parser, has the names and labels RocketMQ's dashboards query,
and the counters move by what was sent and received."""
from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rocketmq import FilterExpression, Producer, SimpleConsumer

from helpers.brokers import client_conf, msg

pytestmark = pytest.mark.integration


def _scrape(broker) -> dict[str, list]:
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _sum(samples, **labels) -> float:
    return sum(v for lab, v in samples if all(lab.get(k) == x for k, x in labels.items()))


def test_rocketmq_names_labels_and_counts(make_broker, clients):
    b = make_broker()
    b.store.create_topic("Orders", read_queue_nums=1, write_queue_nums=1)
    before = _scrape(b)
    assert _sum(before.get("rocketmq_messages_in_total", []), topic="Orders") == 0
    producer = clients(Producer(client_conf(b), ("Orders",)))
    bodies = [b"x" * 10, b"y" * 20, b"z" * 30, b"w" * 40, b"v" * 50]
    for body in bodies:
        producer.send(msg("Orders", body))
    consumer = clients(SimpleConsumer(client_conf(b), "Billing", {"Orders": FilterExpression()},
                                      await_duration=2))
    got = []
    while len(got) < 3:
        got += consumer.receive(3 - len(got), 30)
    after = _scrape(b)
    common = {"cluster": b.config.cluster_name, "node_type": "broker",
              "node_id": b.config.broker_name}
    assert _sum(after["rocketmq_messages_in_total"], topic="Orders", **common) == 5
    assert _sum(after["rocketmq_throughput_in_total"], topic="Orders") == sum(map(len, bodies))
    assert _sum(after["rocketmq_messages_out_total"], topic="Orders",
                consumer_group="Billing") == 3
    assert _sum(after["rocketmq_consumer_lag_messages"], topic="Orders",
                consumer_group="Billing") == 5      # received, not acked yet
    for m in got:
        consumer.ack(m)
    lag = _sum(_scrape(b)["rocketmq_consumer_lag_messages"], consumer_group="Billing")
    assert lag == 2
    assert _sum(after["rocketmq_topic_number"]) == len(b.store.topics())
    assert _sum(after["rocketmq_consumer_connections"], consumer_group="Billing") == 1
    assert _sum(after["rocketmq_storage_size"]) > sum(map(len, bodies))
    assert _sum(after["rocketmq_broker_permission"]) == 6
    labels = after["rocketmq_messages_in_total"][0][0]
    assert {"cluster", "node_type", "node_id", "topic", "message_type", "is_system"} <= set(labels)
