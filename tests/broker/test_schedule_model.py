"""ScheduleService against a model of delayed delivery, driven by hypothesis: any sequence
of delayed sends (delay levels and delivery timestamps, due at once, soon or days ahead),
recalls by recall handle (of waiting, delivered, recalled and unknown messages), clock
moves, delivery passes, broker restarts and crashes before progress is persisted, on a real
store with a manual clock. The service's thread never delivers: the test runs each pass.

What must hold after every step:

- a parked message reaches its real topic only in a delivery pass run at or after its due
  time, and once a pass ran at or after it, it is there (``run_due`` delivers every due one);
- each message reaches its real topic at most once, across restarts and crashes too
  (test_timer_wheel: a crash before progress is persisted "neither loses nor duplicates");
- a recalled message is never delivered; a recall of a delivered, recalled or unknown
  message is refused (NOT_FOUND; a forged handle: InvalidReceiptHandleError) and stores and
  changes nothing;
- a delivered copy keeps body, tags, keys, user properties, message id (unique key) and
  delivery time, and names its parked copy (``SCHEDULE_SOURCE``);
- ``pending_count`` is the number of messages waiting; ``next_due_ms`` after a pass is no
  later than the first due time within ``max_wait_s`` (the thread sleeps until then).

At the end, with the clock moved past the longest delay, one pass delivers every message not
recalled, and the real topic holds each of them exactly once.
"""
from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from helpers.clock import Clock
from sparkmq import Message, Store
from sparkmq.broker.handles import HandleSigner
from sparkmq.broker.schedule import (DEFAULT_DELAY_LEVELS, DEFAULT_MAX_DELAY_MS,
                                     PROP_DELAY_LEVEL, PROP_SOURCE, RECALL_TOPIC,
                                     SCHEDULE_TOPIC, DelayPolicy, RecallStatus,
                                     ScheduleService, make_recall_handle, parked_row,
                                     parse_delay_levels, parse_recall_handle)
from sparkmq.errors import InvalidReceiptHandleError
from sparkmq.lifecycle import ServiceThread

POLICY = DelayPolicy(parse_delay_levels(DEFAULT_DELAY_LEVELS))
MAX_DELAY_MS = DEFAULT_MAX_DELAY_MS
HOUR_MS = 3_600_000
NEVER_MS = 10 ** 15
BROKER = "b1"
QUEUES = 2
MAX_WAIT_S = 5
WAITING, RECALLED, DELIVERED = "waiting", "recalled", "delivered"
ROW_COLUMNS = ["body", "tags", "keys", "properties", "store_timestamp", "delivery_timestamp",
               "unique_key"]
_names = itertools.count()

DELAY = st.one_of(
    st.tuples(st.just("level"), st.sampled_from([1, 2, 3, 17, 18])),     # 1 s .. 2 h
    st.tuples(st.just("at"), st.sampled_from(                            # ms from now
        [-1000, 0, 1, 999, 1000, 1001, 4_500, 60_000, HOUR_MS, MAX_DELAY_MS])))
MESSAGE = st.fixed_dictionaries({
    "delay": DELAY,
    "tags": st.sampled_from([None, "TagA", "TagB"]),
    "keys": st.lists(st.sampled_from(["k1", "k2", "order-7"]), max_size=2, unique=True),
    "props": st.dictionaries(st.sampled_from(["color", "trace", "x-y"]),
                             st.text("abc xyz", max_size=4), max_size=2),
})


class Msg:
    """The model's view of one sent message."""

    def __init__(self, n: int, m: dict, due_ms: int | None):
        self.body, self.tags, self.keys = b"m%d" % n, m["tags"], list(m["keys"])
        self.unique_key = f"01{n:030X}"      # the producer's message id
        self.user_props = dict(m["props"])    # what the delivered copy must keep
        self.due_ms = due_ms                  # delivery timestamp; None: not parked
        self.qid = self.offset = None         # where the parked copy lives
        self.handle: str | None = None        # the recall handle (parked messages only)
        self.state = WAITING

    def copy_row(self) -> dict:
        """The row its delivered copy must be (ROW_COLUMNS but body and store time)."""
        return {"tags": self.tags, "keys": self.keys or None, "unique_key": self.unique_key,
                "delivery_timestamp": self.due_ms,
                "properties": {**self.user_props, PROP_SOURCE: f"{self.qid}:{self.offset}"}}


class ManualSchedule(ScheduleService):
    """The schedule service whose thread never delivers: every pass is the test's
    ``run_due`` (its thread idles until stopped)."""

    def run_once(self) -> None:
        pass

    def wait_s(self) -> float:
        return self.max_wait_s


class Node:
    """One broker's store (reopened after a crash) and its manual clock."""

    def __init__(self, url: str):
        self.url, self.clock = url, Clock()
        self.store = Store.open(url, mode="w", clock_ms=self.clock)

    def crash(self) -> None:
        """The broker process dies: the store stops as killed and is opened again."""
        self.store._crash()
        self.store = Store.open(self.url, mode="w", clock_ms=self.clock)


@pytest.fixture(scope="module")
def store_root(tmp_path_factory):
    """A folder for the stores: one store per example, since an example's schedule
    topic, recall topic and timer wheel are its store's (shared, an example that failed
    would change the next one, and hypothesis could not replay it)."""
    return tmp_path_factory.mktemp("schedmodel")


def recall_by_handle(svc: ScheduleService, signer: HandleSigner, handle: str) -> str:
    """What the broker's RecallMessage does with a handle: open it, then recall."""
    _, _, qid, offset, _ = parse_recall_handle(signer.open(handle, "recall handle"))
    return svc.recall(qid, offset)


def test_schedule_service_keeps_the_model_of_delayed_delivery(store_root):

    class ScheduleModel(RuleBasedStateMachine):
        @initialize(persist_interval_ms=st.sampled_from([0, 1000, NEVER_MS]))
        def setup(self, persist_interval_ms):
            self.node = Node(str(store_root / f"s{next(_names)}"))
            self.clock, self.topic = self.node.clock, "T"
            self.node.store.create_topic(self.topic, read_queue_nums=QUEUES,
                                         write_queue_nums=QUEUES)
            self.persist_interval_ms = persist_interval_ms
            self.signer = HandleSigner()          # the broker's, kept across restarts
            self.msgs: dict[bytes, Msg] = {}
            self.read_to = [0] * QUEUES           # real-topic rows the model has seen
            self.restarts = 0
            self.svc = self._start()

        def _start(self) -> ScheduleService:
            return ManualSchedule(self.node.store, POLICY, clock_ms=self.clock,
                                  persist_interval_ms=self.persist_interval_ms,
                                  max_wait_s=MAX_WAIT_S).start()

        def _waiting(self) -> list[Msg]:
            return [m for m in self.msgs.values() if m.state == WAITING]

        def _new_rows(self) -> list[dict]:
            """Rows of the real topic the model has not seen yet (times in epoch ms)."""
            out = []
            for q in range(QUEUES):
                hi = self.node.store.max_offset(self.topic, q)
                if hi > self.read_to[q]:
                    t = self.node.store.read_table(self.topic, q, self.read_to[q], hi,
                                                   columns=ROW_COLUMNS)
                    for c in ("store_timestamp", "delivery_timestamp"):
                        t = t.set_column(t.column_names.index(c), c,
                                         t.column(c).cast(pa.int64()))
                    out += t.to_pylist()
                    self.read_to[q] = hi
            return out

        def _recall_rows(self) -> int:
            return self.node.store.max_offset(RECALL_TOPIC, 0)

        # ------------------------------------------------------------ rules
        @rule(msgs=st.lists(MESSAGE, min_size=1, max_size=3))
        def send(self, msgs):
            """Park as the broker's send does (parked_row), one append per request."""
            now = self.clock.now_ms
            rows, models = [], []
            for m in msgs:
                kind, x = m["delay"]
                props = dict(m["props"])
                if kind == "level":
                    props[PROP_DELAY_LEVEL] = str(x)
                at_ms = now + x if kind == "at" else None
                topic, qid, due, stored = parked_row(POLICY, now, self.topic, props, at_ms)
                model = Msg(len(self.msgs), m, due if topic == SCHEDULE_TOPIC else None)
                self.msgs[model.body] = model
                models.append(model)
                rows.append(Message(topic=topic, body=model.body, tags=model.tags,
                                    keys=model.keys, properties=stored, queue_id=qid,
                                    delivery_timestamp=due, unique_key=model.unique_key))
            for model, r in zip(models, self.node.store.append(rows)):
                assert r.ok, r
                if model.due_ms is None:          # due at once: stored in the real topic
                    model.state = DELIVERED
                    continue
                assert r.topic == SCHEDULE_TOPIC
                model.qid, model.offset = r.queue_id, r.queue_offset
                model.handle = self.signer.sign(make_recall_handle(
                    self.topic, BROKER, r.queue_id, r.queue_offset, model.unique_key))
            direct = sorted(m.body for m in models if m.due_ms is None)
            assert sorted(row["body"] for row in self._new_rows()) == direct

        @rule(ms=st.sampled_from([1, 499, 999, 1000, 1001, 4_000, 30_000, HOUR_MS,
                                  MAX_DELAY_MS]))
        def advance(self, ms):
            self.clock.advance(ms)

        @rule(first_ms=st.sampled_from([0, 1, 999, 1000, 5_000, 60_000]))
        def deliver(self, first_ms):
            """A delivery pass (after the clock moved ``first_ms``)."""
            self.clock.advance(first_ms)
            self._pass()

        def _pass(self):
            now = self.clock.now_ms
            n = self.svc.run_due()
            rows = self._new_rows()
            for row in rows:
                m = self.msgs[row.pop("body")]
                where = f"{m.body} ({m.qid}:{m.offset}, due {m.due_ms})"
                assert m.state != DELIVERED, f"{where} delivered twice"
                assert m.state != RECALLED, f"recalled {where} delivered"
                assert m.due_ms <= now, f"{where} delivered at {now}"
                assert row.pop("store_timestamp") >= m.due_ms
                assert {**row, "properties": dict(row["properties"])} == m.copy_row()
                m.state = DELIVERED
            assert n == len(rows), f"the pass says it delivered {n}, the topic got {len(rows)}"
            late = [(m.body, m.qid, m.offset, m.due_ms) for m in self._waiting()
                    if m.due_ms <= now]
            assert not late, f"due by {now} but not delivered by the pass: {late}"
            soon = [m.due_ms for m in self._waiting() if m.due_ms <= now + MAX_WAIT_S * 1000]
            if soon:
                nxt = self.svc.next_due_ms()
                assert nxt is not None and nxt <= min(soon), (nxt, min(soon))

        @precondition(lambda self: any(m.handle for m in self.msgs.values()))
        @rule(data=st.data())
        def recall(self, data):
            m = data.draw(st.sampled_from([m for m in self.msgs.values() if m.handle]))
            rows, pending = self._recall_rows(), self.svc.pending_count()
            status = recall_by_handle(self.svc, self.signer, m.handle)
            if m.state == WAITING:
                assert status == RecallStatus.RECALLED, f"{m.body} waits: {status}"
                assert self._recall_rows() == rows + 1
                m.state = RECALLED
            else:
                assert status == RecallStatus.NOT_FOUND, f"{m.body} {m.state}: {status}"
                assert (self._recall_rows(), self.svc.pending_count()) == (rows, pending)

        @rule(qid=st.sampled_from([0, 1, POLICY.timer_queue, POLICY.queue_count, 99]),
              ahead=st.integers(0, 2), forged=st.booleans())
        def recall_unknown(self, qid, ahead, forged):
            """A handle naming no parked message (past a queue's end, no such queue), or
            one this broker did not sign."""
            if qid < POLICY.queue_count:
                offset = self.node.store.max_offset(SCHEDULE_TOPIC, qid) + ahead
            else:
                offset = ahead
            handle = self.signer.sign(make_recall_handle(self.topic, BROKER, qid, offset, "X"))
            rows, pending = self._recall_rows(), self.svc.pending_count()
            if forged:
                with pytest.raises(InvalidReceiptHandleError, match="not issued by this broker"):
                    recall_by_handle(self.svc, self.signer, handle + "0")
            else:
                assert recall_by_handle(self.svc, self.signer, handle) == RecallStatus.NOT_FOUND
            assert (self._recall_rows(), self.svc.pending_count()) == (rows, pending)

        @precondition(lambda self: self.restarts < 3)
        @rule()
        def restart(self):
            """The broker stops (progress persisted) and a new one starts on the store."""
            self.restarts += 1
            self.svc.stop()
            self.svc = self._start()

        @precondition(lambda self: self.restarts < 3)
        @rule(pass_after_ms=st.sampled_from([None, 999, 5_000, 60_000]))
        def crash(self, pass_after_ms):
            """The broker process dies (right after a delivery pass ``pass_after_ms``
            later): what was delivered since the last persist (every pass with
            persist_interval_ms=0, at most once a second with 1000, only at stop with
            NEVER_MS) is found again at start."""
            if pass_after_ms is not None:
                self.clock.advance(pass_after_ms)
                self._pass()
            self.restarts += 1
            ServiceThread.stop(self.svc)          # its (idle) thread only: no persist
            self.svc.wheel.close()                # (its files stay as written)
            self.node.crash()
            self.svc = self._start()

        # ------------------------------------------------------------ invariants
        @invariant()
        def only_delivery_passes_store_copies(self):
            if hasattr(self, "svc"):
                assert self._new_rows() == []

        @invariant()
        def pending_count_is_what_waits(self):
            if hasattr(self, "svc"):
                assert self.svc.pending_count() == len(self._waiting())

        def teardown(self):
            if not hasattr(self, "svc"):
                return
            try:
                self.clock.advance(MAX_DELAY_MS + 2000)
                self._pass()
                assert self.svc.pending_count() == 0
                want = sorted(m.body for m in self.msgs.values() if m.state != RECALLED)
                got = [b for q in range(QUEUES) for b in self.node.store.read_table(
                    self.topic, q, 0, columns=["body"]).column("body").to_pylist()]
                assert sorted(got) == want
            finally:
                self.svc.stop()
                self.node.store.close()

    run_state_machine_as_test(ScheduleModel, settings=settings(
        max_examples=60, stateful_step_count=30, deadline=None))


# ---------------------------------------------------------------- regressions the model found
def park(node: Node, *delays_ms: int) -> list[tuple[int, int]]:
    """Park one message per delivery time ``now + delay``; their (queue, offset)."""
    rows = []
    for d in delays_ms:
        topic, qid, due, props = parked_row(POLICY, node.clock(), "T", {}, node.clock() + d)
        rows.append(Message(topic=topic, body=b"%d" % d, queue_id=qid, delivery_timestamp=due,
                            properties=props))
    return [(r.queue_id, r.queue_offset) for r in node.store.append(rows)]


@pytest.fixture
def node(local_store_url):
    n = Node(local_store_url)
    n.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    yield n
    n.store.close()


def lagging_wheel(node: Node) -> ScheduleService:
    """A service started after the broker was down longer than WHEEL_MARGIN_S: its wheel
    lags the clock, and a row due near maxDelay cannot be indexed until the wheel moves."""
    ManualSchedule(node.store, POLICY, clock_ms=node.clock).start().stop()
    node.clock.advance(2 * HOUR_MS)
    return ManualSchedule(node.store, POLICY, clock_ms=node.clock).start()


def test_one_pass_delivers_what_is_due_behind_a_row_the_lagging_wheel_cannot_index(node):
    """The rows parked behind the one the wheel could not index waited for it: a pass
    delivered none of them though due (and next_due_ms did not see them coming, so the
    thread slept its max_wait_s before the next pass)."""
    svc = lagging_wheel(node)
    park(node, MAX_DELAY_MS, 1000)
    node.clock.advance(1000)
    assert svc.run_due() == 1
    got = node.store.read_table("T", 0, 0, columns=["body"]).column("body").to_pylist()
    assert got == [b"1000"] and svc.pending_count() == 1
    svc.stop()


def test_a_recall_while_indexing_waits_for_the_wheel_is_not_counted_pending(node):
    svc = lagging_wheel(node)
    _, (_, dropped) = park(node, MAX_DELAY_MS, 1000)
    assert svc.recall(POLICY.timer_queue, dropped) == RecallStatus.RECALLED
    assert svc.pending_count() == 1
    svc.stop()


def test_a_recall_of_a_row_read_ahead_is_not_counted_pending_after_a_restart(node):
    """A timestamp row recalled after its second was read into memory stayed counted in
    its slot on disk: after a restart pending_count counted it (until the slot was read)."""
    svc = ManualSchedule(node.store, POLICY, clock_ms=node.clock).start()
    node.clock.advance(1)
    [(q, off)] = park(node, 1500)
    svc.run_due()                                       # reads the slot ahead of its second
    assert svc.recall(q, off) == RecallStatus.RECALLED
    assert svc.pending_count() == 0
    svc.stop()
    svc = ManualSchedule(node.store, POLICY, clock_ms=node.clock).start()
    assert svc.pending_count() == 0
    node.clock.advance(MAX_DELAY_MS)
    assert svc.run_due() == 0
    svc.stop()
