"""The OFFICIAL Node.js RocketMQ 5 client (npm ``rocketmq-client-nodejs`` 1.0.8, pinned in
``node/package.json``) against a real sparkmq broker on 127.0.0.1 (issue 14 item 4).

Each test runs one scenario of ``node/scenario.js`` in a ``node`` subprocess (fixture
``run_node``, conftest.py) and asserts on its JSON result, field by field, and on the
broker's store. One broker serves the module (unique topics and groups per test); the
cluster test starts its own two. Skipped only when ``node`` is not on PATH.

Known client quirks (1.0.8) these scenarios meet or work around:
- a PushConsumer does not implement the server's CustomizedBackoff retry policy (the one
  sparkmq and, by default, the Apache proxy send), so a FAILURE is nacked with invisible
  duration 0 (immediate redelivery) and a FIFO group's failed message goes straight to
  the DLQ instead of being retried in place (so no FIFO failure case here);
- PushConsumer ignores its ``longPollingTimeout`` option and ``shutdown()`` waits for the
  in-flight long poll: the module broker caps long polling at 3 s (maxLongPollingTimeMs);
- ``SimpleConsumer.receive(n, 0)`` sends invisible duration 0 as is (refused);
- ``Transaction.commit`` calls ``logger.debug`` unguarded (the script's logger has one);
- the consume services log to ``~/logs/rocketmq`` whatever logger is given (HOME is a
  temporary directory);
- a CRC32 body digest is checked against the decimal CRC, not the Java client's hex
  (sparkmq sends MD5, as the proxy does, which the client checks correctly).
"""
from __future__ import annotations

import shutil

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb

from helpers.brokers import broker_config, client_conf, msg
from helpers.waiting import wait_until
from sparkmq.broker import Broker
from sparkmq.broker.pop import dlq_topic
from sparkmq.broker.transaction import OP_TOPIC
from sparkmq.log.topics import message_type_attributes

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("node") is None,
                       reason="node (Node.js) is not on PATH: the Node.js client suite needs it"),
]
Code = pb.Code


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One broker for the module: SQL92 filters on, 2 s transaction check-back, long
    polls capped at 3 s (so a Node PushConsumer's shutdown is quick)."""
    b = Broker(broker_config(tmp_path_factory.mktemp("node-broker"),
                             enablePropertyFilter="true", transactionTimeOut=2000,
                             transactionCheckInterval=2000, maxLongPollingTimeMs=3000)).start()
    yield b
    b.stop()


def stored(b, topic):
    """Every message of ``topic`` in the store, queue by queue."""
    return [m for q in range(b.store.topics()[topic]["readQueueNums"])
            for m in b.store.read(topic, q, 0, 1000)]


def acked(b, group) -> int:
    """The committed consumer offsets of ``group``, summed (= messages acked in order)."""
    b.persist_offsets()
    return sum(b.store.consumer_offsets(group).values())


def spec(i, **extra):
    return {"body": f"n{i}", "tag": "TagN", "keys": [f"k{i}", "shared"],
            "properties": {"i": str(i), "lang": "node"}, **extra}


# ---------------------------------------------------------------- send / receive
def test_sync_and_async_sends_arrive_field_by_field(broker, run_node):
    sync = run_node("produce", broker.endpoint, topic="NSend", mode="sync",
                    messages=[spec(i) for i in range(3)])["receipts"]
    asyn = run_node("produce", broker.endpoint, topic="NSend", mode="async",
                    messages=[spec(i) for i in range(3, 6)])["receipts"]
    ids = {f"n{i}": r["messageId"] for i, r in enumerate(sync + asyn)}
    assert len(set(ids.values())) == 6
    got = run_node("consume", broker.endpoint, topic="NSend", group="NSendG", count=6,
                   extraPoll=True)
    assert got["extra"] == []
    assert sorted(m["body"] for m in got["messages"]) == sorted(ids)
    for m in got["messages"]:
        i = int(m["body"][1:])
        assert m["messageId"] == ids[m["body"]]
        assert m["topic"] == "NSend" and m["tag"] == "TagN"
        assert sorted(m["keys"]) == sorted([f"k{i}", "shared"])
        assert m["properties"] == {"i": str(i), "lang": "node"}
        assert m["deliveryAttempt"] == 1 and m["corrupted"] is False   # MD5 digest checks
        assert m["messageGroup"] == "" and m["deliveryTimestamp"] is None
        assert m["bornHost"] and m["bornTimestamp"] > 0
    rows = {m.body.decode(): m for m in stored(broker, "NSend")}
    assert sorted(rows) == sorted(ids)
    assert all(rows[b].unique_key == ids[b] and rows[b].tags == "TagN" for b in ids)
    assert acked(broker, "NSendG") == 6


# ---------------------------------------------------------------- FIFO
def test_fifo_message_groups_keep_their_order(broker, run_node):
    """The broker never hands out a message while an earlier one of its message group is
    in flight (SimpleConsumer), and tells an orderly group's PushConsumer fifo=true so
    the client's FIFO consume service runs each group one message at a time, in order."""
    broker.store.create_topic("NFifo", read_queue_nums=2, write_queue_nums=2,
                              attributes=message_type_attributes("FIFO"))
    for group in ("NFifoSimple", "NFifoPush"):
        broker.store.create_group(group, consume_message_orderly=True)
    messages = [{"body": f"{g}:{i}", "messageGroup": g} for i in range(3) for g in ("g1", "g2")]
    run_node("produce", broker.endpoint, topic="NFifo", mode="sync", messages=messages)
    by_group = {}
    for m in stored(broker, "NFifo"):                  # a group's messages: one queue, in order
        by_group.setdefault(m.message_group, []).append((m.queue_id, m.body.decode()))
    for g, rows in by_group.items():
        assert len({q for q, _ in rows}) == 1 and [b for _, b in rows] == [
            f"{g}:{i}" for i in range(3)]

    rounds = run_node("fifo_simple", broker.endpoint, topic="NFifo", group="NFifoSimple",
                      count=6, awaitMs=1000)["rounds"]
    received = [m["body"] for r in rounds for m in r["batch"] + r["whileInFlight"]]
    for g in ("g1", "g2"):
        assert [b for b in received if b.startswith(g)] == [f"{g}:{i}" for i in range(3)]
    for r in rounds:
        busy = {m["messageGroup"] for m in r["batch"]}
        assert not busy & {m["messageGroup"] for m in r["whileInFlight"]}, r
        assert all(m["deliveryAttempt"] == 1 for m in r["batch"])

    push = run_node("push", broker.endpoint, topic="NFifo", group="NFifoPush", expect=6,
                    holdMs=100, waitMs=30000)
    assert push["outcome"] == "all consumed" and push["fifo"] is True
    for g in ("g1", "g2"):
        order = [m["body"] for m in push["consumed"] if m["messageGroup"] == g]
        assert order == [f"{g}:{i}" for i in range(3)]
    assert push["maxInFlight"] == {"g1": 1, "g2": 1}
    assert acked(broker, "NFifoSimple") == acked(broker, "NFifoPush") == 6


# ---------------------------------------------------------------- delay
def test_delay_message_arrives_not_before_its_delivery_time(broker, run_node):
    r = run_node("delay", broker.endpoint, topic="NDelay", group="NDelayG", delayMs=3000)
    [m] = r["messages"]
    assert m["body"] == "later" and m["tag"] == "TagD"
    assert m["messageId"] == r["receipt"]["messageId"]
    assert m["deliveryTimestamp"] == r["due"]
    assert m["receivedAt"] >= r["due"] > r["sentAt"]
    [row] = stored(broker, "NDelay")
    assert row.store_timestamp >= r["due"]            # put in its topic when due, not before


def test_a_delayed_message_is_recalled_with_its_receipts_handle(broker, run_node):
    r = run_node("recall", broker.endpoint, topic="NRecall", group="NRecallG", delayMs=3000)
    assert r["handle"] and r["recalledId"] == r["dropId"]
    assert r["again"] and ("NOT_FOUND" in r["again"] or "not waiting" in r["again"])
    assert [m["body"] for m in r["messages"]] == ["keep"] and r["extra"] == []
    assert r["messages"][0]["messageId"] == r["keepId"]
    assert [m.body for m in stored(broker, "NRecall")] == [b"keep"]   # never delivered


# ---------------------------------------------------------------- transactions
def test_transaction_commit_rollback_and_check_back(broker, run_node):
    r = run_node("transaction", broker.endpoint, topic="NTx", group="NTxG", checkWaitMs=30000)
    commit, rollback, check = r["receipts"]
    assert all(x["transactionId"] for x in r["receipts"])
    # the half message left open was checked back, and the checker's COMMIT applied
    assert {"body": "check-me", "messageId": check["messageId"]} in r["asked"]
    got = {m["body"]: m for m in r["messages"]}
    assert sorted(got) == ["check-me", "commit-me"] and r["extra"] == []
    assert got["commit-me"]["messageId"] == commit["messageId"]
    assert got["check-me"]["messageId"] == check["messageId"]
    assert all(m["tag"] == "Tx" for m in r["messages"])
    wait_until(lambda: broker.transactions.pending() == [], "no half message left")
    assert sorted(m.tags for m in stored(broker, OP_TOPIC) if m.tags != "k") == ["c", "c", "r"]
    assert sorted(m.body for m in stored(broker, "NTx")) == [b"check-me", b"commit-me"]
    assert rollback["messageId"] not in {m.unique_key for m in stored(broker, "NTx")}


# ---------------------------------------------------------------- redelivery, DLQ
def test_redelivery_after_the_invisible_time_and_change_invisible_duration(broker, run_node):
    r = run_node("redelivery", broker.endpoint, topic="NRetry", group="NRetryG")
    sent = r["sent"]["messageId"]
    [first], [second] = r["first"], r["second"]
    assert first["messageId"] == second["messageId"] == sent
    assert (first["deliveryAttempt"], second["deliveryAttempt"]) == (1, 2)
    assert r["handleChanged"] is True
    assert r["whileHeld"] == []                       # the 60 s set by changeInvisibleDuration
    assert r["acked"] is True
    assert r["staleAck"]["code"] == Code.INVALID_RECEIPT_HANDLE
    # receive(n, 0): the client sends invisible duration 0 as is; refused, as the proxy does
    assert r["zeroInvisible"]["code"] == Code.ILLEGAL_INVISIBLE_TIME
    assert acked(broker, "NRetryG") == 1


def test_dead_letter_queue_after_max_attempts(broker, run_node):
    broker.store.create_group("NDlqG", retry_max_times=1)          # 2 deliveries, then DLQ
    r = run_node("dlq", broker.endpoint, topic="NDlq", group="NDlqG",
                 dlqTopic=dlq_topic("NDlqG"), dlqGroup="NDlqReader")
    sent = r["sent"]["messageId"]
    assert [(m["messageId"], m["deliveryAttempt"]) for m in r["attempts"]] == [
        (sent, 1), (sent, 2)]
    assert r["after"] == []
    [d] = r["dlq"]
    assert (d["topic"], d["body"], d["keys"], d["messageId"]) == (
        dlq_topic("NDlqG"), "poison", ["p1"], sent)
    assert [m.body for m in stored(broker, dlq_topic("NDlqG"))] == [b"poison"]


# ---------------------------------------------------------------- filters
FILTER_TAGS = ["TagA", "TagB", "TagC", "TagA", "TagB", "TagC", "TagA", "TagB"]


def test_tag_and_sql92_filters(broker, run_node):
    run_node("produce", broker.endpoint, topic="NFilter", mode="sync", messages=[
        {"body": f"m{i}", "tag": tag,
         "properties": {"a": str(i), "region": "eu" if i < 4 else "us"}}
        for i, tag in enumerate(FILTER_TAGS)])
    sql = "a > 2 AND region = 'us' AND TAGS IN ('TagA', 'TagB')"
    cases = [("NTagG", {"type": "TAG", "expression": "TagA || TagC"},
              ["m0", "m2", "m3", "m5", "m6"]),
             ("NSqlG", {"type": "SQL", "expression": sql}, ["m4", "m6", "m7"])]
    for group, flt, want in cases:
        r = run_node("consume", broker.endpoint, topic="NFilter", group=group, filter=flt,
                     count=len(want), extraPoll=True)
        assert sorted(m["body"] for m in r["messages"]) == want, group
        assert r["extra"] == [], group


# ---------------------------------------------------------------- push consumer
def test_push_consumer_success_consumes_each_message_once(broker, run_node):
    r = run_node("push", broker.endpoint, topic="NPush", group="NPushG", expect=10,
                 waitMs=30000, settleMs=1500, messages=[spec(i) for i in range(10)])
    assert r["outcome"] == "all consumed" and r["fifo"] is False
    ids = [x["messageId"] for x in r["receipts"]]
    assert sorted(m["messageId"] for m in r["consumed"]) == sorted(ids)     # each once
    assert {m["result"] for m in r["consumed"]} == {"SUCCESS"}
    assert all(m["deliveryAttempt"] == 1 for m in r["consumed"])
    assert all(m["properties"] == {"i": m["body"][1:], "lang": "node"} for m in r["consumed"])
    assert acked(broker, "NPushG") == 10


def test_push_consumer_failure_is_redelivered(broker, run_node):
    r = run_node("push", broker.endpoint, topic="NPushFail", group="NPushFailG", expect=4,
                 waitMs=30000, failFirst=True, messages=[spec(i) for i in range(4)])
    assert r["outcome"] == "all consumed"
    for x in r["receipts"]:
        seen = [(m["deliveryAttempt"], m["result"]) for m in r["consumed"]
                if m["messageId"] == x["messageId"]]
        assert seen == [(1, "FAILURE"), (2, "SUCCESS")]
    assert acked(broker, "NPushFailG") == 4


def test_push_consumer_listener_longer_than_the_invisible_time_is_not_redelivered(
        make_broker, run_node):
    """The Node PushConsumer receives with auto_renew; its listener takes 2.5 s against
    the broker's 1.5 s default invisible time. The broker renews the lease (renew.py: a
    pass every 50 ms renews what ends within 1.4 s, so at once), so each message is
    consumed once, at its first attempt, and the acks land."""
    b = make_broker(maxLongPollingTimeMs=3000, defaultInvisibleTimeMs=1500,
                    renewAheadTimeMillis=1400, renewSchedulePeriodMillis=50)
    r = run_node("push", b.endpoint, topic="NSlow", group="NSlowG", expect=2, holdMs=2500,
                 waitMs=30000, settleMs=1000, messages=[spec(i) for i in range(2)])
    assert r["outcome"] == "all consumed"
    assert sorted((m["body"], m["deliveryAttempt"]) for m in r["consumed"]) == [
        ("n0", 1), ("n1", 1)]
    assert b.metrics.get("sparkmq_receipt_renewals_total") >= 2
    assert acked(b, "NSlowG") == 2


# ---------------------------------------------------------------- cross-client
def test_node_producer_to_python_consumer(broker, run_node, clients):
    [r] = run_node("produce", broker.endpoint, topic="NToPy", mode="sync",
                   messages=[spec(7)])["receipts"]
    consumer = clients(SimpleConsumer(client_conf(broker), "NToPyG",
                                      {"NToPy": FilterExpression("TagN")}, await_duration=2))
    got = []
    for _ in range(5):
        got += consumer.receive(16, 30)
        if got:
            break
    [m] = got
    assert (m.topic, m.body, m.tag, m.message_id) == ("NToPy", b"n7", "TagN", r["messageId"])
    assert set(m.keys) == {"k7", "shared"} and m.properties == {"i": "7", "lang": "node"}
    assert m.corrupted is False
    consumer.ack(m)


def test_python_producer_to_node_consumer(broker, run_node, clients):
    producer = clients(Producer(client_conf(broker), ("PyToN",)))
    m = msg("PyToN", "from python ✓".encode(), tag="TagP", keys="pk1")
    m.keys = "pk2"
    m.add_property("origin", "python")
    receipt = producer.send(m)
    r = run_node("consume", broker.endpoint, topic="PyToN", group="PyToNG",
                 filter={"type": "TAG", "expression": "TagP"}, count=1)
    [got] = r["messages"]
    assert (got["topic"], got["body"], got["tag"], got["messageId"]) == (
        "PyToN", "from python ✓", "TagP", receipt.message_id)
    assert sorted(got["keys"]) == ["pk1", "pk2"] and got["properties"] == {"origin": "python"}
    assert got["corrupted"] is False and got["deliveryAttempt"] == 1


# ---------------------------------------------------------------- cluster
def test_two_brokers_behind_one_nameserver(make_broker, run_node):
    from helpers.net import free_port
    from sparkmq.namesrv import NameServer, NameServerClient
    with NameServer(port=free_port()) as ns:
        a = make_broker("broker-a", namesrvAddr=ns.address, autoCreateTopicEnable="false")
        b = make_broker("broker-b", namesrvAddr=ns.address, autoCreateTopicEnable="false")
        for x in (a, b):
            x.store.create_topic("NShared")
            x.register_once()
        assert len(NameServerClient(ns.address).route("NShared")) == 4
        sent = run_node("produce", a.endpoint, topic="NShared", mode="sync",     # asks a only
                        messages=[{"body": f"s{i}"} for i in range(8)])["receipts"]
        on_a, on_b = len(stored(a, "NShared")), len(stored(b, "NShared"))
        assert on_a + on_b == 8 and on_a > 0 and on_b > 0
        got = run_node("consume", b.endpoint, topic="NShared", group="G", count=8,  # b only
                       maxCalls=30)
        assert sorted(m["body"] for m in got["messages"]) == sorted(f"s{i}" for i in range(8))
        assert {m["messageId"] for m in got["messages"]} == {r["messageId"] for r in sent}
