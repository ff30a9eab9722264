"""Transactional messages end to end with the official client's transaction producer:
commit, rollback, check-back deciding both ways, give-up after transactionCheckMax, restart
mid-transaction. Check-backs are driven by an injected clock and ``run_checks()``."""

from __future__ import annotations

import threading

import pytest
from rocketmq import (FilterExpression, Producer, SimpleConsumer, TransactionChecker,
                      TransactionResolution)

from helpers.waiting import wait_until
from sparkmq.broker.transaction import HALF_TOPIC, OP_TOPIC

from helpers.brokers import client_conf, msg

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
