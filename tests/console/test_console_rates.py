"""The console's samples over time (``sparkmq.console.samples``): in/out rates per topic
on the topics page, lag sparklines on the group pages. Two looks with sends between;
no timing is asserted."""
from __future__ import annotations

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer

from helpers.brokers import client_conf, msg
from helpers.console import call

pytestmark = [pytest.mark.integration]


def look(console, path: str) -> str:
    status, _, body = call(console.base, "GET", path,
                           headers={"Authorization": f"Bearer {console.token}"})
    assert status == 200, body
    return body


def test_after_sends_the_topics_page_shows_a_nonzero_in_rate(console, clients, html_table):
    table = html_table
    console.broker.admin.create_topic({"name": "Rated", "queueNums": 2})
    console.broker.admin.create_topic({"name": "Idle", "queueNums": 1})
    header, rows, _ = table(look(console, "/console/topics"), "topics")   # first sample
    col_in, col_out = header.index("In msg/s"), header.index("Out msg/s")
    producer = clients(Producer(client_conf(console.broker), ("Rated",)))
    for i in range(10):
        producer.send(msg("Rated", f"r{i}".encode()))
    consumer = clients(SimpleConsumer(client_conf(console.broker), "RateGroup",
                                      {"Rated": FilterExpression()}, await_duration=1))
    got = []
    for _ in range(20):
        got += consumer.receive(16, 30)
        if len(got) >= 3:
            break
    assert got
    header, rows, svgs = table(look(console, "/console/topics"), "topics")   # second
    assert float(rows["Rated"][col_in]) > 0 and float(rows["Rated"][col_out]) > 0
    assert float(rows["Idle"][col_in]) == 0


def test_the_group_pages_draw_lag_over_time_as_svg(console, html_table):
    table = html_table
    b = console.broker
    b.admin.create_topic({"name": "Lagging", "queueNums": 1})
    from sparkmq.log.message import Message
    b.store.append([Message(topic="Lagging", body=b"x") for _ in range(4)])
    b.store.commit_consumer_offsets("SparkQuery", {("Lagging", 0): 1})   # as Spark records
    look(console, "/console/groups")
    b.store.append([Message(topic="Lagging", body=b"y") for _ in range(3)])
    header, rows, svgs = table(look(console, "/console/groups"), "groups")
    col = header.index("Lag, last 10 min")
    assert rows["SparkQuery"][header.index("Lag")] == "6"
    assert svgs["SparkQuery"][col]
    body = look(console, "/console/group?name=SparkQuery")
    assert "<svg" in body and "last 6" in body and "<script" not in body
