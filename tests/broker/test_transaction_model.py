"""TransactionService against a model of RocketMQ's transactional (half) messages, driven by
hypothesis: any sequence of half-message sends (some asking for a later first check-back,
``CHECK_IMMUNITY_TIME_IN_SECONDS``, valid or not), EndTransaction calls (COMMIT, ROLLBACK,
UNKNOWN; for open, resolved, expired and unknown transaction ids), clock moves, check-back
passes answered by the producer (commit, rollback, unknown, no answer), producers
connecting and leaving, and broker restarts (clean or not, store reopened or not), on a
real store with a manual clock.

The producer is the one edge not run for real: a fake that reads the check-back commands
(the broker's ``RecoverOrphanedTransactionCommand``) the service queues on its Telemetry
stream and answers by EndTransaction. The check thread
is not started; the test runs each pass (``run_checks``) as the thread would.

What must hold after every step:

- a half message is never visible in its real topic before it is committed; a committed
  one is visible exactly once (also across restarts), with its body, tags, keys,
  properties, unique key and transaction id; a rolled-back or expired one never;
- an end of a resolved, expired or unknown transaction raises ``UnknownTransaction``
  naming the id and appends nothing; an UNKNOWN end changes nothing (EndTransaction takes
  only COMMIT and ROLLBACK to the service; RocketMQ leaves the rest to the check-back);
- the pending half messages are exactly the open transactions, with their check counts
  and next check times (a restart keeps both: no new transactionCheckMax checks);
- a check pass asks about exactly the open transactions due: first transactionTimeOut
  after the store time (or the immunity asked for, when that is a whole number of seconds
  and longer), then transactionCheckInterval after the previous check; each is asked at
  most transactionCheckMax times; at its next due pass after that it is given up (op tag
  ``x``), counted in ``rolled_back_unresolved``, and its half message is in
  ``TRANS_CHECK_MAX_TIME_TOPIC`` once, as stored (real topic, producer, properties,
  transaction id, unique key) with its check count, in the same record batch as the op;
- the committed floors of the check group are those of the service's last persist: the
  half floor is the lowest open half message then (else every half message sent), the op
  floor the first op record naming a half message at or above it, else where the op topic
  ended then; a restart reads the op topic from that floor only;
- a check-back goes to the sending producer's stream, else another producer of the topic,
  else nowhere (it still counts, as in RocketMQ), and shows the message as it was sent.

And at the end, with every open transaction committed and the clock moved past every
check, no check is due, the topic holds exactly the committed messages once each, and a
consumer group receives each of them once as a normal delivery.
"""
from __future__ import annotations

import itertools
import queue
import sys
import uuid

import fsspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)
from rocketmq.grpc_protocol import definition_pb2 as pb

from helpers.clock import Clock
from sparkmq import Message, Store
from sparkmq.broker.pop import PopService, TagFilter
from sparkmq.broker.protocol import recover_command
from sparkmq.broker.transaction import (CHECK_GROUP, CHECK_MAX_TOPIC, HALF_TOPIC, OP_EXPIRED,
                                        OP_TOPIC, PROP_CHECK_IMMUNITY_S, ProducerStreams,
                                        TransactionService, first_check_delay_ms)
from sparkmq.errors import UnknownTransaction
from sparkmq.lifecycle import ServiceThread
from sparkmq.log import format as fmt
from sparkmq.log.message import decode_message_id

TIMEOUT_MS = 6_000          # transactionTimeOut
INTERVAL_MS = 10_000        # transactionCheckInterval
QUEUES = 2                  # of each real topic
OPEN, COMMITTED, ROLLED_BACK, EXPIRED = "open", "committed", "rolled back", "expired"
COMMIT, ROLLBACK, UNKNOWN, NO_ANSWER = "commit", "rollback", "unknown", "no answer"
_names = itertools.count()
#: CHECK_IMMUNITY_TIME_IN_SECONDS values a producer may send -> the seconds RocketMQ reads
#: (Java's Long.parseLong; None: refused, so the property counts as absent)
IMMUNITY = {None: None, "": None, "x": None, "1.5": None, " 20": None, "2_0": None,
            "99999999999999999999": None, "-5": -5, "0": 0, "2": 2, "6": 6, "7": 7,
            "20": 20, "+20": 20}


def first_check_ms(stored_ms: int, immunity: str | None) -> int:
    """When the model expects the first check-back: transactionTimeOut after the store
    time, or the immunity asked for when it is longer."""
    seconds = IMMUNITY[immunity]
    return stored_ms + max(TIMEOUT_MS, (seconds or 0) * 1000)


class _NoThread(ServiceThread):
    def start(self) -> None:
        """No check thread: the test runs each pass itself."""


class ManualTransactionService(TransactionService, _NoThread):
    """The broker's TransactionService without its ``sparkmq-transaction-check`` thread,
    so no pass races a step (the ``super().start()`` of ``TransactionService.start`` is
    ``_NoThread.start`` here)."""


class Tx:
    """The model's view of one transaction."""

    def __init__(self, txid: str, body: bytes, tags, keys: list[str], props: dict,
                 client: str | None, unique_key: str, stored_ms: int, half_offset: int):
        self.txid, self.body, self.tags, self.keys = txid, body, tags, keys
        self.props, self.client, self.unique_key = props, client, unique_key
        self.half_offset = half_offset
        self.state = OPEN
        self.checks = 0
        self.due_ms = first_check_ms(stored_ms, props.get(PROP_CHECK_IMMUNITY_S))  # next check
        self.kept = False                        # seen in TRANS_CHECK_MAX_TIME_TOPIC
        self.visible = False                     # seen in the real topic

    def __repr__(self) -> str:                   # (how a failing example names it)
        return f"Tx({self.body.decode()!r})"


def test_transaction_service_keeps_the_model_of_half_messages():

    class TransactionModel(RuleBasedStateMachine):
        @initialize(check_max=st.integers(1, 3),
                    connected=st.sets(st.sampled_from(["p1", "p2"])))
        def setup(self, check_max, connected):
            # A store per example: the service's state (half and op topics, its check
            # group's offset) is store-wide, and a restart reads all of it.
            self.url = f"memory://sparkmq-txmodel-{next(_names)}-{uuid.uuid4().hex}"
            self.clock = Clock()
            self.store = Store.open(self.url, mode="w", clock_ms=self.clock)
            self.topic = "T"
            self.store.create_topic(self.topic, read_queue_nums=QUEUES,
                                    write_queue_nums=QUEUES)
            self.check_max = check_max
            self.producers = {p: f"producer-{p}" for p in ("p1", "p2")}
            self.connected = {self.producers[p] for p in connected}
            self.txs: dict[str, Tx] = {}
            self.by_body: dict[bytes, Tx] = {}
            self.seen = [0] * QUEUES        # real topic offsets checked by the invariant
            self.kept_seen = 0              # CHECK_MAX_TOPIC offsets checked
            self.persisted = (0, 0)         # (half floor, op topic end) at the last persist
            self.restarts = 0
            self._start_service()

        def _start_service(self) -> None:
            """A broker starting: a new service over the store, producers reconnecting."""
            self.streams = ProducerStreams()
            self.queues: dict[str, queue.Queue] = {}
            for cid in sorted(self.connected):
                self._connect(cid)
            self.tx = ManualTransactionService(
                self.store, self.streams, make_command=recover_command, clock_ms=self.clock,
                timeout_ms=TIMEOUT_MS, check_interval_ms=INTERVAL_MS,
                check_max=self.check_max).start()

        def _connect(self, cid: str) -> None:
            self.queues[cid] = self.streams.open(cid)
            self.streams.set_topics(cid, {self.topic})

        def _open(self) -> list[Tx]:
            return [t for t in self.txs.values() if t.state == OPEN]

        def _appended(self) -> tuple[int, ...]:
            """Where the op topic and the real topic's queues end (what an end appends to)."""
            store = self.store
            return (store.max_offset(OP_TOPIC, 0),
                    *(store.max_offset(self.topic, q) for q in range(QUEUES)))

        # ------------------------------------------------------------ rules
        @rule(n=st.integers(1, 3), client=st.sampled_from(["p1", "p2", None]),
              tags=st.sampled_from([None, "A", "B"]),
              keys=st.lists(st.sampled_from(["k1", "k2"]), max_size=2, unique=True),
              props=st.sampled_from([{}, {"a": "1"}, {"a": "1", "b": "x y"}]),
              immunity=st.sampled_from(sorted(IMMUNITY, key=str)))
        def send(self, n, client, tags, keys, props, immunity):
            """A producer sends TRANSACTION messages: stored as half messages, as
            SendService does (``prepare_row``, append, ``on_stored``); with ``immunity``
            the property a gRPC send's recovery duration becomes (or a producer's own)."""
            cid = self.producers.get(client)
            if immunity is not None:
                props = {**props, PROP_CHECK_IMMUNITY_S: immunity}
            rows, sent = [], []
            for _ in range(n):
                body = f"{self.topic}-m{len(self.txs) + len(sent)}".encode()
                unique_key = uuid.uuid4().hex.upper()
                half_topic, half_props, txid = self.tx.prepare_row(self.topic, props, cid)
                rows.append(Message(topic=half_topic, body=body, tags=tags, keys=keys,
                                    properties=half_props, queue_id=0, transaction_id=txid,
                                    message_type=fmt.MESSAGE_TYPE_TRANSACTION,
                                    unique_key=unique_key))
                sent.append(Tx(txid, body, tags, keys, dict(props), cid, unique_key,
                               self.clock.now_ms, len(self.txs) + len(sent)))
            self.store.append(rows)
            self.tx.on_stored()
            for t in sent:
                assert t.txid not in self.txs, "a transaction id was given twice"
                self.txs[t.txid] = t
                self.by_body[t.body] = t

        @rule(data=st.data(), resolution=st.sampled_from([COMMIT, ROLLBACK, UNKNOWN]))
        def end(self, data, resolution):
            """EndTransaction for a transaction in any state (open, resolved, expired), or
            for an id the broker never gave (None)."""
            t = data.draw(st.sampled_from([None, *sorted(self.txs.values(),
                                                         key=lambda t: t.body)]),
                          label="transaction")
            if resolution == UNKNOWN:      # never reaches the service
                return
            if t is None:
                self._refused(uuid.uuid4().hex.upper(), resolution == COMMIT)
            else:
                self._end(t, resolution == COMMIT)

        def _end(self, t: Tx, commit: bool) -> None:
            if t.state == OPEN:
                self.tx.end(t.txid, commit)
                t.state = COMMITTED if commit else ROLLED_BACK
                return
            self._refused(t.txid, commit)

        def _refused(self, txid: str, commit: bool) -> None:
            before = self._appended()
            with pytest.raises(UnknownTransaction) as e:
                self.tx.end(txid, commit)
            assert txid in e.value.message, e.value.message
            assert str(e.value).startswith("[SPARKMQ_INVALID_TRANSACTION_ID] ")
            assert self._appended() == before, "a refused end appended something"

        @rule(ms=st.sampled_from([1, 999, 4_000, 5_999, 6_000, 10_000, 30_000]))
        def advance(self, ms):
            self.clock.advance(ms)

        @rule(producer=st.sampled_from(["p1", "p2"]))
        def toggle_producer(self, producer):
            """A producer opens its Telemetry stream, or closes it."""
            cid = self.producers[producer]
            if cid in self.connected:
                self.connected.discard(cid)
                self.streams.close(cid, self.queues.pop(cid))
            else:
                self.connected.add(cid)
                self._connect(cid)

        @rule(data=st.data(), ms=st.sampled_from([0, 1, 5_999, 6_000, 10_000, 30_000]))
        def check_back(self, data, ms):
            """``ms`` later, one pass of the check thread; then the producers answer what
            they were asked: commit, rollback, unknown (no EndTransaction), or nothing."""
            now = self.clock.advance(ms)
            due = [t for t in self._open() if t.due_ms <= now]
            expire = [t for t in due if t.checks >= self.check_max]
            ask = [t for t in due if t.checks < self.check_max]
            expired_before = self.tx.rolled_back_unresolved
            ops_from = self.store.max_offset(OP_TOPIC, 0)
            assert self.tx.run_checks() == len(due)
            ops = self.store.read(OP_TOPIC, 0, ops_from, 1_000)
            assert sum(m.tags == OP_EXPIRED for m in ops) == len(expire)
            assert self.tx.rolled_back_unresolved - expired_before == len(expire)
            for t in expire:
                t.state = EXPIRED
            for t in ask:
                t.checks += 1
                t.due_ms = now + INTERVAL_MS
            self._persisted()               # (a pass ends with a persist)
            asked = []                      # (stream, message, transaction id)
            for cid in sorted(self.queues):
                while not self.queues[cid].empty():
                    cmd = self.queues[cid].get_nowait().recover_orphaned_transaction_command
                    asked.append((cid, cmd.message, cmd.transaction_id))
            assert sorted(txid for _, _, txid in asked) == sorted(
                t.txid for t in ask if self._recipients(t)), "asked the wrong transactions"
            for cid, msg, txid in asked:
                t = self.txs[txid]
                assert cid in self._recipients(t), f"{txid} asked on {cid}'s stream"
                sp = msg.system_properties
                assert (msg.topic.name, msg.body, sp.tag or None, list(sp.keys),
                        dict(msg.user_properties), sp.message_id, sp.message_type) == (
                    self.topic, t.body, t.tags, t.keys, t.props, t.unique_key,
                    pb.TRANSACTION), "the check-back does not show the message as it was sent"
                answer = data.draw(st.sampled_from([COMMIT, ROLLBACK, UNKNOWN, NO_ANSWER]),
                                   label=f"answer of {t.body.decode()}")
                if answer in (COMMIT, ROLLBACK):
                    self._end(t, answer == COMMIT)

        def _recipients(self, t: Tx) -> set[str]:
            """The streams a check-back of ``t`` may go to: its producer's, else those of
            the topic's other producers (none connected: it goes nowhere)."""
            if t.client in self.connected:
                return {t.client}
            return set(self.connected)

        @precondition(lambda self: self.restarts < 3)
        @rule(clean=st.booleans(), reopen_store=st.booleans())
        def restart(self, clean, reopen_store):
            """The broker restarts: a clean stop persists the service's progress, a crash
            does not; the store is reopened, or kept (the master services restarting in a
            running broker, as after it was fenced and made master again)."""
            self.restarts += 1
            if clean:
                self.tx.stop()
                self._persisted()
            if reopen_store:
                self.store.close()
                self.store = Store.open(self.url, mode="w", clock_ms=self.clock)
            self._start_service()
            _, op_floor = self._floors()
            assert self.tx.rebuild_ops_read == self.store.max_offset(OP_TOPIC, 0) - op_floor, \
                "the restart did not read the op topic from its floor"

        def _persisted(self) -> None:
            """The service has just persisted: what the floors must be from now on."""
            open_halves = [t.half_offset for t in self._open()]
            self.persisted = (min(open_halves) if open_halves else len(self.txs),
                              self.store.max_offset(OP_TOPIC, 0))

        def _floors(self) -> tuple[int, int]:
            offsets = self.store.consumer_offsets(CHECK_GROUP)
            return offsets.get((HALF_TOPIC, 0), 0), offsets.get((OP_TOPIC, 0), 0)

        # ------------------------------------------------------------ invariants
        @invariant()
        def pending_are_the_open_transactions(self):
            if not hasattr(self, "tx"):
                return
            got = {h.transaction_id: (h.real_topic, h.client_id, h.checks, h.next_check_ms)
                   for h in self.tx.pending()}
            want = {t.txid: (self.topic, t.client, t.checks, t.due_ms) for t in self._open()}
            assert got == want

        @invariant()
        def the_floors_are_exact(self):
            """Every op below the op floor names a half message below the half floor, and
            the op floor is the first op that does not (or the op topic's end then)."""
            if not hasattr(self, "tx"):
                return
            half_floor, op_end = self.persisted
            ops = self.store.read_table(OP_TOPIC, 0, 0, columns=["queue_offset", "body"])
            named = [off for off, body in zip(ops.column("queue_offset").to_pylist(),
                                              ops.column("body").to_pylist())
                     if int(body) >= half_floor]
            assert self._floors() == (half_floor, min(named[:1] + [op_end]))

        @invariant()
        def the_given_up_are_kept_once(self):
            """TRANS_CHECK_MAX_TIME_TOPIC holds each given-up half message once, as it was
            stored, with its check count, in the record batch of its ``x`` op."""
            if not hasattr(self, "tx") or CHECK_MAX_TOPIC not in self.store.topics():
                assert not any(t.state == EXPIRED for t in self.txs.values())
                return
            ops = {int(m.body): m for m in self.store.read(OP_TOPIC, 0, 0, 10_000)
                   if m.tags == OP_EXPIRED}
            for m in self.store.read(CHECK_MAX_TOPIC, 0, self.kept_seen, 1_000):
                self.kept_seen = m.queue_offset + 1
                t = self.by_body.get(m.body)
                assert t is not None and t.state == EXPIRED and not t.kept, m.body
                t.kept = True
                props = {**t.props, "REAL_TOPIC": self.topic, "TRANSACTION_CHECK_TIMES":
                         str(self.check_max), **({"TRANS_CLIENT_ID": t.client} if t.client
                                                 else {})}
                assert (m.tags, m.keys, m.properties, m.unique_key, m.transaction_id,
                        m.message_type) == (t.tags, t.keys, props, t.unique_key, t.txid,
                                            fmt.MESSAGE_TYPE_TRANSACTION)
                assert decode_message_id(m.message_id)[1] == decode_message_id(
                    ops[t.half_offset].message_id)[1], "the copy and its x op: two appends"
            assert self.kept_seen == sum(t.state == EXPIRED for t in self.txs.values())

        @invariant()
        def the_topic_shows_the_committed_once(self):
            """New messages of the real topic are committed ones not seen before, as
            sent; every committed one has come."""
            if not hasattr(self, "tx"):
                return
            for q in range(QUEUES):
                for m in self.store.read(self.topic, q, self.seen[q], 1_000):
                    self.seen[q] = m.queue_offset + 1
                    t = self.by_body.get(m.body)
                    assert t is not None and t.state == COMMITTED, \
                        f"{m.body!r} visible while {t.state if t else 'never sent'}"
                    assert not t.visible, f"{m.body!r} visible twice"
                    t.visible = True
                    assert (m.tags, m.keys, m.properties, m.unique_key, m.transaction_id,
                            m.message_type) == (t.tags, t.keys, t.props, t.unique_key,
                                                t.txid, fmt.MESSAGE_TYPE_TRANSACTION)
            assert sum(self.seen) == sum(t.state == COMMITTED for t in self.txs.values())

        def teardown(self):
            if not hasattr(self, "store"):
                return
            try:
                # after a failed step only clean up: that failure is the one to report
                if hasattr(self, "tx") and sys.exc_info()[1] is None:
                    self._commit_the_rest_and_receive()
            finally:
                self.store.close()
                fsspec.filesystem("memory").rm(self.url.removeprefix("memory://"),
                                               recursive=True)

        def _commit_the_rest_and_receive(self) -> None:
            for t in self._open():
                self._end(t, True)
            self.clock.advance(TIMEOUT_MS + INTERVAL_MS * (self.check_max + 1))
            assert self.tx.run_checks() == 0
            assert self.tx.pending() == []
            committed = sorted(t.body for t in self.txs.values() if t.state == COMMITTED)
            stored = [m.body for q in range(QUEUES)
                      for m in self.store.read(self.topic, q, 0, 1_000)]
            assert sorted(stored) == committed
            self._consumers_receive(committed)
            self.tx.stop()

        def _consumers_receive(self, committed: list[bytes]) -> None:
            pop = PopService(self.store, broker_name="b1", clock_ms=self.clock)
            got = []
            for _ in range(len(committed) + 1):
                batch = pop.pop(f"G{self.topic}", self.topic, batch_size=32,
                                invisible_ms=60_000, tag_filter=TagFilter("*"))
                if not batch:
                    break
                for d in batch:
                    assert d.attempt == 1
                    got.append(d.message.body)
                    pop.ack(f"G{self.topic}", d.receipt_handle, self.topic)
            assert sorted(got) == committed, "a consumer did not get the committed ones once"

    run_state_machine_as_test(TransactionModel, settings=settings(
        max_examples=200, stateful_step_count=50, deadline=None))


def test_first_check_delay_reads_the_immunity_as_rocketmq():
    """CHECK_IMMUNITY_TIME_IN_SECONDS as TransactionalMessageUtil.getImmunityTime reads it:
    whole seconds (Long.parseLong), never below transactionTimeOut, refused values absent."""
    for value, seconds in IMMUNITY.items():
        props = {} if value is None else {PROP_CHECK_IMMUNITY_S: value}
        assert first_check_delay_ms(props, TIMEOUT_MS) == max(TIMEOUT_MS, (seconds or 0) * 1000)
