"""sparkmq's own Producer, local-transaction API, against a real in-process broker:
commit / rollback / unknown from the local transaction, check-backs over the Telemetry
stream deciding both ways, a new producer instance answering for half messages of an
earlier one, and the broker restarting under an open stream. Check-backs are driven by
an injected broker clock and ``run_checks()``; waits are bounded polls."""

from __future__ import annotations

import threading

import pytest

from helpers.waiting import wait_until
from sparkmq.broker.transaction import HALF_TOPIC, OP_TOPIC
from sparkmq.client import (Message, Producer, SimpleConsumer, TransactionResolution)
from sparkmq.errors import UserError


pytestmark = pytest.mark.integration

COMMIT, ROLLBACK, UNKNOWN = (TransactionResolution.COMMIT, TransactionResolution.ROLLBACK,
                             TransactionResolution.UNKNOWN)


class Checker:
    """Decides by body; records what the broker asked about."""

    def __init__(self, decisions: dict[bytes, object]):
        self.decisions = decisions
        self.asked: list[bytes] = []
        self.lock = threading.Lock()

    def __call__(self, message):
        with self.lock:
            self.asked.append(message.body)
        d = self.decisions.get(message.body, UNKNOWN)
        if isinstance(d, Exception):
            raise d
        return d


@pytest.fixture
def producers():
    made = []

    def make(*args, **kw):
        p = Producer(*args, **kw)
        made.append(p)
        return p
    yield make
    for p in made:
        p.shutdown()


def visible(b) -> list[bytes]:
    return [m.body for m in b.store.read("T", 0, 0, 100)]


def test_local_transaction_commit_rollback_unknown_and_raise(tx_broker, producers):
    make, _ = tx_broker
    b = make()
    p = producers(b.endpoint)
    seen = []

    def local(decision):
        def execute(message, receipt):
            seen.append((message.body, receipt.message_id))
            assert visible(b) == [] or message.body != b"yes"     # half: not visible yet
            if isinstance(decision, Exception):
                raise decision
            return decision
        return execute
    r1 = p.send_in_transaction(Message("T", b"yes", tag="Tx"), local(COMMIT))
    r2 = p.send_in_transaction(Message("T", b"no"), local(ROLLBACK))
    r3 = p.send_in_transaction(Message("T", b"later"), local(UNKNOWN))
    r4 = p.send_in_transaction(Message("T", b"boom"), local(RuntimeError("db down")))
    r5 = p.send_in_transaction(Message("T", b"str"), local("commit"))
    assert [r.resolution for r in (r1, r2, r3, r4, r5)] == [COMMIT, ROLLBACK, UNKNOWN, UNKNOWN,
                                                            COMMIT]
    assert len({r.transaction_id for r in (r1, r2, r3, r4, r5)}) == 5
    assert [s[0] for s in seen] == [b"yes", b"no", b"later", b"boom", b"str"]
    assert visible(b) == [b"yes", b"str"]
    assert b.store.max_offset(HALF_TOPIC, 0) == 5
    assert sorted(h.transaction_id for h in b.transactions.pending()) == sorted(
        [r3.transaction_id, r4.transaction_id])
    got = b.store.read("T", 0, 0, 1)[0]
    assert got.tags == "Tx" and got.unique_key == r1.receipt.message_id
    with pytest.raises(UserError, match="message_group"):
        p.send_in_transaction(Message("T", b"x", message_group="g"), local(COMMIT))
    c = SimpleConsumer(b.endpoint, "G", {"T": "*"})
    try:
        bodies = []
        for _ in range(5):
            bodies += [m.body for m in c.receive(16, 30, wait_s=1)]
            if len(bodies) >= 2:
                break
    finally:
        c.close()
    assert sorted(bodies) == [b"str", b"yes"]


def test_checker_answers_check_backs_both_ways(tx_broker, producers):
    make, clock = tx_broker
    b = make(transactionCheckMax=2)
    checker = Checker({b"c-yes": COMMIT, b"c-no": ROLLBACK, b"c-err": RuntimeError("x")})
    p = producers(b.endpoint, topics=["T"], transaction_checker=checker)
    for body in (b"c-yes", b"c-no", b"c-dunno", b"c-err"):
        p.send_in_transaction(Message("T", body), lambda m, r: UNKNOWN)
    b.transactions.run_checks()
    assert checker.asked == []                                   # not before transactionTimeOut
    clock.now_ms += 6000
    b.transactions.run_checks()
    assert wait_until(lambda: len(checker.asked) == 4)
    assert wait_until(lambda: len(b.transactions.pending()) == 2)
    assert visible(b) == [b"c-yes"]
    for _ in range(2):                                           # asked again, then given up
        clock.now_ms += 6000
        b.transactions.run_checks()
    assert wait_until(lambda: b.transactions.pending() == [])
    assert checker.asked.count(b"c-dunno") == 2 and b.transactions.rolled_back_unresolved == 2
    ops = b.store.read(OP_TOPIC, 0, 0, 50)
    assert sorted(m.tags for m in ops if m.tags != "k") == ["c", "r", "x", "x"]
    assert sorted(m.properties["checks"] for m in ops if m.tags == "k") == ["1"] * 4 + ["2"] * 2
    assert visible(b) == [b"c-yes"]


def test_new_producer_instance_and_broker_restart(tx_broker, producers):
    make, clock = tx_broker
    b = make()
    first = producers(b.endpoint)                                # no checker: dies "mid-way"
    r = first.send_in_transaction(Message("T", b"orphan"), lambda m, rc: UNKNOWN)
    first.shutdown()
    checker = Checker({b"orphan": COMMIT, b"after-restart": ROLLBACK})
    p = producers(b.endpoint, topics=["T"], transaction_checker=checker)
    clock.now_ms += 6000
    b.transactions.run_checks()                                  # routed to a producer of T
    assert wait_until(lambda: visible(b) == [b"orphan"])
    assert checker.asked == [b"orphan"]
    assert b.store.read("T", 0, 0, 1)[0].transaction_id == r.transaction_id

    port = b.config.listen_port
    b.stop()
    b = make(listenPort=port)                                    # same store and port
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1, exist_ok=True)
    # the producer's stream re-opens by itself; then a new half message is checked back
    assert wait_until(lambda: b.streams.producers("T"))
    p.send_in_transaction(Message("T", b"after-restart"), lambda m, rc: UNKNOWN)
    clock.now_ms += 6000
    b.transactions.run_checks()
    assert wait_until(lambda: b.transactions.pending() == [])
    assert checker.asked == [b"orphan", b"after-restart"] and visible(b) == [b"orphan"]


def test_check_counts_survive_a_broker_restart(tx_broker, producers):
    make, clock = tx_broker
    b = make(transactionCheckMax=3)
    checker = Checker({})                                        # always UNKNOWN
    p = producers(b.endpoint, topics=["T"], transaction_checker=checker)
    r = p.send_in_transaction(Message("T", b"undecided"), lambda m, rc: UNKNOWN)
    for _ in range(2):
        clock.now_ms += 6000
        b.transactions.run_checks()
    assert wait_until(lambda: len(checker.asked) == 2)
    [h] = b.transactions.pending()
    assert h.checks == 2
    port = b.config.listen_port
    b.stop()
    b = make(listenPort=port, transactionCheckMax=3)
    [h2] = b.transactions.pending()
    assert (h2.transaction_id, h2.checks) == (r.transaction_id, 2)    # not back to zero
    assert h2.next_check_ms == h.next_check_ms                     # the schedule too
    assert wait_until(lambda: b.streams.producers("T"))
    b.transactions.run_checks()
    assert len(checker.asked) == 2                                 # not due yet
    clock.now_ms += 6000
    b.transactions.run_checks()                                    # third and last check
    assert wait_until(lambda: len(checker.asked) == 3)
    clock.now_ms += 6000
    b.transactions.run_checks()                                    # given up: rolled back
    assert b.transactions.pending() == [] and b.transactions.rolled_back_unresolved == 1
    assert visible(b) == []
    b.stop()
    b = make(listenPort=port, transactionCheckMax=3)
    assert b.transactions.pending() == []                          # resolution survives too
