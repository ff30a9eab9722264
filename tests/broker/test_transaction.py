"""Transactional messages end to end with the official client's transaction producer:
commit, rollback, check-back deciding both ways, give-up after transactionCheckMax (the half
message kept in TRANS_CHECK_MAX_TIME_TOPIC), restart mid-transaction, a first check-back
asked for later (gRPC ``orphaned_transaction_recovery_duration``), and a restart reading the
op topic only from its floor. Check-backs are driven by an injected clock and
``run_checks()``."""

from __future__ import annotations

import json
import threading

import pytest
from rocketmq import (FilterExpression, Producer, SimpleConsumer, TransactionChecker,
                      TransactionResolution)

from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from helpers.waiting import wait_until
from sparkmq.admin import main as admin_main
from sparkmq.broker.grpc_service import MessagingServicer
from sparkmq.broker.pop import PopService, TagFilter
from sparkmq.broker.protocol import Code, message_to_pb
from sparkmq.broker.transaction import (CHECK_GROUP, CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC,
                                        PROP_CHECK_IMMUNITY_S)
from sparkmq.log.message import decode_message_id

from helpers.brokers import GrpcContext, client_conf, msg

pytestmark = pytest.mark.integration


class Checker(TransactionChecker):
    """Decides by body; records what it was asked about."""

    def __init__(self, decisions: dict[bytes, TransactionResolution]):
        self.decisions = decisions
        self.asked: list[bytes] = []
        self.event = threading.Event()

    def check(self, message):
        self.asked.append(message.body)
        self.event.set()
        return self.decisions.get(message.body, TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)  # unknown


def visible(b) -> list[bytes]:
    return [m.body for m in b.store.read("T", 0, 0, 100)]


def half_send(producer, body: bytes):
    tx = producer.begin_transaction()
    receipt = producer.send(msg("T", body, tag="Tx"), tx)
    return tx, receipt


def wait_asked(checker, n):
    wait_until(lambda: len(checker.asked) >= n, f"the broker to ask the checker {n} times")


def test_commit_and_rollback(tx_broker, clients):
    make, _ = tx_broker
    b = make()
    producer = clients(Producer(client_conf(b), ("T",), Checker({})))
    tx1, r1 = half_send(producer, b"commit-me")
    tx2, _ = half_send(producer, b"roll-me-back")
    assert r1.transaction_id
    assert visible(b) == []                                     # half: invisible
    assert b.store.max_offset(HALF_TOPIC, 0) == 2               # but stored
    tx1.commit()
    tx2.rollback()
    assert visible(b) == [b"commit-me"]
    assert [m.tags for m in b.store.read(OP_TOPIC, 0, 0, 10)] == ["c", "r"]
    assert b.transactions.pending() == []
    got = b.store.read("T", 0, 0, 1)[0]
    assert got.unique_key == r1.message_id and got.message_type == 3
    consumer = clients(SimpleConsumer(client_conf(b), "G", {"T": FilterExpression("*")},
                                      await_duration=2))
    got = []
    for _ in range(3):
        got += consumer.receive(16, 30)
        if got:
            break
    assert [m.body for m in got] == [b"commit-me"] and got[0].message_id == r1.message_id


def test_check_back_decides_both_ways_then_gives_up(tx_broker, clients):
    make, clock = tx_broker
    b = make(transactionCheckMax=2)
    checker = Checker({b"yes": TransactionResolution.COMMIT,
                       b"no": TransactionResolution.ROLLBACK})
    producer = clients(Producer(client_conf(b), ("T",), checker))
    for body in (b"yes", b"no", b"dunno"):
        half_send(producer, body)                                # never ended by the producer
    b.transactions.run_checks()
    assert checker.asked == []                                   # not before transactionTimeOut
    clock.now_ms += 6000
    b.transactions.run_checks()
    wait_asked(checker, 3)
    assert sorted(checker.asked) == [b"dunno", b"no", b"yes"]
    assert wait_until(lambda: len(b.transactions.pending()) == 1)
    assert visible(b) == [b"yes"]
    for _ in range(2):                                           # second check, then give up
        clock.now_ms += 6000
        b.transactions.run_checks()
    wait_asked(checker, 4)
    assert checker.asked.count(b"dunno") == 2
    assert b.transactions.pending() == [] and b.transactions.rolled_back_unresolved == 1
    assert visible(b) == [b"yes"]
    assert sorted(m.tags for m in b.store.read(OP_TOPIC, 0, 0, 20) if m.tags != "k") == [
        "c", "r", "x"]


def test_check_max_keeps_the_half_message_in_its_system_topic(tx_broker, clients, capsys):
    """Given up after transactionCheckMax checks, a half message is not lost: its copy is in
    TRANS_CHECK_MAX_TIME_TOPIC (created then; listed by the admin) with its real topic,
    producer, transaction id, unique key and check count, appended in the same record batch
    as its ``x`` op; no consumer of the real topic gets it, and a restart does not bring it
    back as pending."""
    make, clock = tx_broker
    b = make(transactionCheckMax=1)
    producer = clients(Producer(client_conf(b), ("T",), Checker({})))
    tx, receipt = half_send(producer, b"stuck")
    b.transactions.run_checks()
    assert CHECK_MAX_TOPIC not in b.store.topics()          # created when first needed
    for _ in range(2):                                       # one check, then the give-up
        clock.now_ms += 6000
        b.transactions.run_checks()
    assert b.transactions.pending() == []
    [kept] = b.store.read(CHECK_MAX_TOPIC, 0, 0, 10)
    half = b.store.read(HALF_TOPIC, 0, 0, 1)[0]
    assert (kept.body, kept.tags, kept.transaction_id, kept.unique_key) == (
        b"stuck", "Tx", receipt.transaction_id, receipt.message_id)
    assert kept.properties == {**half.properties, "TRANSACTION_CHECK_TIMES": "1"}
    assert kept.properties["REAL_TOPIC"] == "T" and "TRANS_CLIENT_ID" in kept.properties
    [op] = [m for m in b.store.read(OP_TOPIC, 0, 0, 10) if m.tags == "x"]
    assert int(op.body) == half.queue_offset
    assert decode_message_id(kept.message_id)[1] == decode_message_id(op.message_id)[1], \
        "the copy and the x op were not one append"
    conf = b.store.topics()[CHECK_MAX_TOPIC]
    assert (conf.read_queue_nums, conf.write_queue_nums, conf.perm) == (1, 1, 6)
    shown = message_to_pb(kept)                 # what a consumer of that topic is given
    assert shown.topic.name == CHECK_MAX_TOPIC and "REAL_TOPIC" not in shown.user_properties
    pop = PopService(b.store, broker_name="b1", clock_ms=clock)
    assert pop.pop("G", "T", batch_size=32, invisible_ms=60_000, tag_filter=TagFilter("*")) == []
    b.stop()
    b = make()
    assert b.transactions.pending() == [] and visible(b) == []
    assert b.store.max_offset(CHECK_MAX_TOPIC, 0) == 1
    b.stop()
    assert admin_main(["--store", b.config.store_path, "--json", "topic", "list"]) == 0
    listed = {r["topic"]: r["messages"] for r in json.loads(capsys.readouterr().out)}
    assert listed[CHECK_MAX_TOPIC] == 1


def raw_half_send(b, body: bytes, recovery_s: int | None, client: str = "raw-producer"):
    """A TRANSACTION SendMessage as a gRPC client sends it, with SystemProperties'
    ``orphaned_transaction_recovery_duration`` (None: not set); the response."""
    m = pb.Message(topic=pb.Resource(name="T"), body=body)
    sp = m.system_properties
    sp.message_id, sp.message_type, sp.born_host = f"ID-{body.decode()}", pb.TRANSACTION, "h"
    sp.born_timestamp.FromMilliseconds(b.clock_ms())
    if recovery_s is not None:
        sp.orphaned_transaction_recovery_duration.CopyFrom(Duration(seconds=recovery_s))
    return MessagingServicer(b).send_message(spb.SendMessageRequest(messages=[m]),
                                             GrpcContext(client))


def test_orphaned_transaction_recovery_duration_delays_the_first_check(tx_broker, clients):
    """The gRPC send's recovery duration is stored as CHECK_IMMUNITY_TIME_IN_SECONDS and
    the first check-back comes that long after the store time (not transactionTimeOut's
    6 s), also after a restart; a check-back answered COMMIT by the official client then
    commits. Over the proxy's 3600 s the send is refused and nothing is stored."""
    make, clock = tx_broker
    b = make()
    refused = raw_half_send(b, b"too-late", 3601)
    assert refused.status.code == Code.BAD_REQUEST and "3600" in refused.status.message
    assert b.store.max_offset(HALF_TOPIC, 0) == 0
    sent_ms = clock.now_ms
    ok = raw_half_send(b, b"later", 30)
    assert ok.status.code == Code.OK, ok
    assert raw_half_send(b, b"default", None).status.code == Code.OK
    later, default = b.store.read(HALF_TOPIC, 0, 0, 2)
    assert later.properties[PROP_CHECK_IMMUNITY_S] == "30"
    assert PROP_CHECK_IMMUNITY_S not in default.properties
    assert [h.next_check_ms for h in b.transactions.pending()] == [sent_ms + 30_000,
                                                                   sent_ms + 6_000]
    b.stop()
    b = make()                                   # the first check time survives a restart
    assert [h.next_check_ms for h in b.transactions.pending()] == [sent_ms + 30_000,
                                                                   sent_ms + 6_000]
    checker = Checker({b"later": TransactionResolution.COMMIT})
    clients(Producer(client_conf(b), ("T",), checker))       # a producer of T answers
    # once its telemetry stream has told the broker its topics (the client's start-up
    # returns before that): a check-back with no producer connected is a check spent
    assert wait_until(lambda: b.streams.producers("T"))
    clock.now_ms = sent_ms + 29_999
    b.transactions.run_checks()
    wait_asked(checker, 1)
    assert checker.asked == [b"default"]
    assert {h.transaction_id: h.checks for h in b.transactions.pending()}[
        ok.entries[0].transaction_id] == 0
    clock.now_ms = sent_ms + 30_000
    b.transactions.run_checks()
    assert wait_until(lambda: visible(b) == [b"later"])
    assert b.store.read("T", 0, 0, 1)[0].properties == {PROP_CHECK_IMMUNITY_S: "30"}


def floors(b) -> tuple[int, int]:
    """(half floor, op floor) as committed for the check group (absent: 0)."""
    offsets = b.store.consumer_offsets(CHECK_GROUP)
    return offsets.get((HALF_TOPIC, 0), 0), offsets.get((OP_TOPIC, 0), 0)


def test_restart_reads_the_op_topic_from_its_floor(tx_broker, clients):
    """The check group's offset on the op topic is the first op of a half message at or
    above the half floor: a restart reads from there and still sees every op it needs (the
    resolutions above an older open transaction, its check count), and once nothing is
    open, none at all."""
    make, clock = tx_broker
    b = make()
    producer = clients(Producer(client_conf(b), ("T",), Checker({})))
    old, _ = half_send(producer, b"old")                 # half 0 stays open
    for i in range(5):
        half_send(producer, f"c{i}".encode())[0].commit()   # halves 1..5, ops 0..4
    clock.now_ms += 6000
    b.transactions.run_checks()                          # checks half 0: op 5 (k)
    assert floors(b) == (0, 0)
    b.stop()
    b = make()
    assert b.transactions.rebuild_ops_read == 6
    [h] = b.transactions.pending()
    assert (h.offset, h.checks) == (0, 1)
    producer = clients(Producer(client_conf(b), ("T",),
                                Checker({b"old": TransactionResolution.COMMIT})))
    assert wait_until(lambda: b.streams.producers("T"))  # (its telemetry stream is open)
    clock.now_ms += 6000
    b.transactions.run_checks()
    assert wait_until(lambda: b.transactions.pending() == [])
    half_send(producer, b"new")                          # half 6 open: no op yet
    b.transactions.run_checks()                          # persists the floors
    assert floors(b) == (6, 8)
    half_send(producer, b"after")[0].rollback()          # half 7, op 8
    b.stop()                                             # (op floor: op 8 names half 7)
    b = make()
    assert b.transactions.rebuild_ops_read == 1
    assert [h.offset for h in b.transactions.pending()] == [6]
    assert sorted(visible(b)) == [b"c0", b"c1", b"c2", b"c3", b"c4", b"old"]


def test_restart_mid_transaction_keeps_the_half_message(tx_broker, clients):
    make, clock = tx_broker
    b = make()
    producer = clients(Producer(client_conf(b), ("T",), Checker({})))
    _, receipt = half_send(producer, b"survivor")
    tx2, _ = half_send(producer, b"done")
    tx2.rollback()
    producer.shutdown()
    b.stop()
    b = make()                                                   # same store, new process state
    assert [h.transaction_id for h in b.transactions.pending()] == [receipt.transaction_id]
    checker = Checker({b"survivor": TransactionResolution.COMMIT})
    clients(Producer(client_conf(b), ("T",), checker))
    clock.now_ms += 6000
    assert wait_until(lambda: b.transactions.run_checks() >= 0 and visible(b) == [b"survivor"])
    assert checker.asked[:1] == [b"survivor"]
