"""PopService against a model of RocketMQ's pop consumption, driven by hypothesis: any
sequence of sends, receives, acks (with current and stale handles), invisible-time
changes, DLQ forwards, clock moves and broker restarts, on a real store.

What must hold after every step:

- a message is handed out only when nobody holds it: never while an earlier delivery's
  invisible time runs, never once acked, forwarded or sent to the DLQ;
- its delivery attempt is 1 when fresh and one more than the last when redelivered;
- a handle works only while it is its message's newest (a change of invisible time or a
  redelivery supersedes it; a restart supersedes every handle);
- an orderly group gets a message group's messages of a queue one at a time and in order,
  and its receive retried with the same attempt id gets again what that receive leased;
- a message the tag filter refuses is never handed out;
- a message whose last allowed delivery expires goes to ``%DLQ%<group>`` exactly once;
- the committed offset never passes a message that is not done (a restart loses none).

The consumer is the group (clustering) or one client of it (broadcasting: progress and
persisted offsets of its own). And at the end, with the clock moved past every invisible
time, receiving and acking until nothing comes delivers every message the filter takes (at
least once) and commits the end.
"""
from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from helpers.clock import Clock
from sparkmq import Message, Store
from sparkmq.broker.handles import HandleSigner
from sparkmq.broker.pop import (ORIGIN_OFFSET, ORIGIN_QUEUE, GroupKey, InvalidHandle,
                                PopService, TagFilter, dlq_topic)

QUEUES = 2
NEW, LEASED, DONE = "new", "leased", "done"
_names = itertools.count()


class Msg:
    """The model's view of one stored message."""

    def __init__(self, qid: int, offset: int, group: str | None, tag: str):
        self.qid, self.offset, self.group, self.tag = qid, offset, group, tag
        self.state = NEW
        self.attempt = 0             # deliveries so far (since the last restart)
        self.visible_at = 0          # the newest lease's end
        self.handle: str | None = None   # the newest handle
        self.old_handles: list[str] = []


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    clock = Clock()
    store = Store.open(str(tmp_path_factory.mktemp("popmodel")), mode="w", clock_ms=clock)
    yield store, clock
    store.close()


def test_pop_service_keeps_the_model_of_pop_consumption(shared):
    store, clock = shared

    class PopModel(RuleBasedStateMachine):
        @initialize(orderly=st.booleans(), retries=st.integers(0, 2),
                    only_a=st.booleans(), broadcasting=st.booleans())
        def setup(self, orderly, retries, only_a, broadcasting):
            n = next(_names)
            self.topic, self.group = f"PM{n}", f"PMG{n}"
            # the consumer: the group (clustering) or one instance of it (broadcasting:
            # progress and persisted offsets of its own)
            self.key = GroupKey(self.group, "c1" if broadcasting else None)
            store.create_topic(self.topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
            store.create_group(self.group, retry_max_times=retries,
                               consume_message_orderly=orderly)
            self.orderly, self.max_attempts = orderly, retries + 1
            self.filter = TagFilter("A" if only_a else "*")
            self.signer = HandleSigner()       # the broker's, kept across restarts
            self.pop = self._new_pop()
            self.msgs: dict[tuple[int, int], Msg] = {}
            self.next_offset = [0] * QUEUES
            self.dlq_seen = 0
            self.restarts = 0
            self.attempts: dict[str, list] = {}     # an orderly group's receive attempt ids

        def _new_pop(self) -> PopService:
            return PopService(store, broker_name="b1", clock_ms=clock, handles=self.signer)

        def _passes(self, m: Msg) -> bool:
            return self.filter.matches(m.tag)

        # ------------------------------------------------------------ rules
        @rule(qid=st.integers(0, QUEUES - 1), n=st.integers(1, 4),
              group=st.sampled_from([None, "g1", "g2"]), tag=st.sampled_from(["A", "B"]))
        def send(self, qid, n, group, tag):
            store.append([Message(topic=self.topic, body=b"x", queue_id=qid, tags=tag,
                                  message_group=group) for _ in range(n)])
            for _ in range(n):
                off = self.next_offset[qid]
                self.msgs[(qid, off)] = Msg(qid, off, group, tag)
                self.next_offset[qid] += 1

        @rule(batch=st.integers(1, 5), invisible_ms=st.sampled_from([1_000, 5_000, 30_000]),
              attempt_id=st.sampled_from([None, "r1", "r2"]))
        def receive(self, batch, invisible_ms, attempt_id):
            # an orderly group's receive retried with its attempt id gets again, first, what
            # that receive leased and is still so leased (same attempt, new handle)
            again = []
            if self.orderly and attempt_id is not None:
                again = [key for key, attempt in self.attempts.pop(attempt_id, [])[:batch]
                         if self.msgs[key].state == LEASED and self.msgs[key].attempt == attempt]
            got = self.pop.pop(self.key, self.topic, batch_size=batch,
                               invisible_ms=invisible_ms, tag_filter=self.filter,
                               attempt_id=attempt_id)
            assert len(got) <= batch
            assert [(d.message.queue_id, d.message.queue_offset)
                    for d in got[:len(again)]] == again
            self._take_dlq()
            now = clock.now_ms
            for i, d in enumerate(got):
                m = self.msgs[(d.message.queue_id, d.message.queue_offset)]
                assert self._passes(m), f"{m.tag}-tagged message handed out past the filter"
                assert m.state != DONE, f"done message {m.qid}/{m.offset} handed out again"
                if i < len(again):               # the same delivery, again
                    assert d.attempt == m.attempt
                    m.old_handles.append(m.handle)
                    m.handle, m.visible_at = d.receipt_handle, now + invisible_ms
                    continue
                if m.state == LEASED:
                    assert m.visible_at <= now, \
                        f"{m.qid}/{m.offset} handed out while invisible until {m.visible_at}"
                assert d.attempt == m.attempt + 1
                assert d.attempt <= self.max_attempts, "delivered past the group's retries"
                if self.orderly and m.group is not None:
                    earlier = [o for o in self.msgs.values() if o.qid == m.qid and
                               o.group == m.group and o.offset < m.offset and o.state != DONE
                               and self._passes(o)]
                    assert not earlier, (f"{m.group}'s {m.qid}/{m.offset} handed out before "
                                         f"{[o.offset for o in earlier]} were done")
                if m.handle is not None:
                    m.old_handles.append(m.handle)
                m.state, m.attempt, m.visible_at = LEASED, d.attempt, now + invisible_ms
                m.handle = d.receipt_handle
            if self.orderly and attempt_id is not None and got:
                self.attempts[attempt_id] = [((d.message.queue_id, d.message.queue_offset),
                                              d.attempt) for d in got]
            if self.orderly:     # one message of a group in flight per queue
                flying = [(m.qid, m.group) for m in self.msgs.values()
                          if m.state == LEASED and m.group is not None]
                assert len(flying) == len(set(flying)), flying

        def _take_dlq(self):
            """Messages the pop just sent to the DLQ: each was due (its last delivery
            expired), and none goes twice."""
            dlq = dlq_topic(self.group)
            if dlq not in store.topics():
                return
            for s in store.read(dlq, 0, self.dlq_seen, 1_000):
                self.dlq_seen += 1
                m = self.msgs[(int(s.properties[ORIGIN_QUEUE]), int(s.properties[ORIGIN_OFFSET]))]
                assert m.state == LEASED and m.visible_at <= clock.now_ms, \
                    f"{m.qid}/{m.offset} sent to the DLQ while {m.state}"
                assert m.attempt >= self.max_attempts
                self._done(m)

        def _done(self, m: Msg):
            if m.handle is not None:
                m.old_handles.append(m.handle)
            m.state, m.handle = DONE, None

        def _leased(self):
            return sorted((m for m in self.msgs.values() if m.state == LEASED),
                          key=lambda m: (m.qid, m.offset))

        @precondition(lambda self: self._leased())
        @rule(data=st.data())
        def ack(self, data):
            m = data.draw(st.sampled_from(self._leased()))
            self.pop.ack(self.key, m.handle, self.topic)
            self._done(m)

        @precondition(lambda self: self._leased())
        @rule(data=st.data(), invisible_ms=st.sampled_from([0, 1_000, 10_000]))
        def change_invisible(self, data, invisible_ms):
            m = data.draw(st.sampled_from(self._leased()))
            new = self.pop.change_invisible(self.key, m.handle, invisible_ms, self.topic)
            m.old_handles.append(m.handle)
            m.handle, m.visible_at = new, clock.now_ms + invisible_ms

        @precondition(lambda self: self._leased())
        @rule(data=st.data())
        def forward_to_dlq(self, data):
            m = data.draw(st.sampled_from(self._leased()))
            self.pop.forward_to_dlq(self.key, m.handle, self.topic)
            self._done(m)
            self._take_dlq_forwarded()

        def _take_dlq_forwarded(self):
            """A forward's DLQ message (already done in the model)."""
            for _ in store.read(dlq_topic(self.group), 0, self.dlq_seen, 1_000):
                self.dlq_seen += 1

        @precondition(lambda self: any(m.old_handles for m in self.msgs.values()))
        @rule(data=st.data(), action=st.sampled_from(["ack", "change", "dlq"]))
        def stale_handle_is_refused(self, data, action):
            m = data.draw(st.sampled_from([m for m in self.msgs.values() if m.old_handles]))
            old = data.draw(st.sampled_from(m.old_handles))
            try:
                if action == "ack":
                    self.pop.ack(self.key, old, self.topic)
                elif action == "change":
                    self.pop.change_invisible(self.key, old, 1_000, self.topic)
                else:
                    self.pop.forward_to_dlq(self.key, old, self.topic)
            except InvalidHandle:
                return
            raise AssertionError(f"a superseded handle of {m.qid}/{m.offset} was taken "
                                 f"({action})")

        @rule(ms=st.sampled_from([1, 999, 1_000, 4_000, 30_000]))
        def advance(self, ms):
            clock.advance(ms)

        @precondition(lambda self: self.restarts < 2)   # (else it crowds out the rest)
        @rule()
        def restart(self):
            """The broker stops (its offsets persisted as its persist pass does) and a new
            one starts: what was not done comes back from the committed offset, fresh."""
            self.restarts += 1
            for key, floors in self.pop.take_dirty().items():
                store.commit_consumer_offsets(key.group, floors, client_id=key.client_id)
            self.pop = self._new_pop()
            self.attempts = {}
            committed = store.consumer_offsets(self.group, client_id=self.key.client_id)
            for m in self.msgs.values():
                if m.handle is not None:
                    m.old_handles.append(m.handle)
                    m.handle = None
                if m.offset >= committed.get((self.topic, m.qid), 0):
                    m.state, m.attempt = NEW, 0     # at least once: done ones may come too
                elif m.state != DONE and self._passes(m):
                    raise AssertionError(f"committed offset passed {m.qid}/{m.offset} "
                                         f"({m.state})")

        # ------------------------------------------------------------ invariants
        @invariant()
        def the_committed_offset_passes_only_done_messages(self):
            if not hasattr(self, "pop"):
                return
            floors = self.pop.floors(self.key)
            for (t, qid), floor in floors.items():
                assert floor <= self.next_offset[qid]
                for off in range(floor):
                    m = self.msgs.get((qid, off))
                    assert m is None or m.state == DONE or not self._passes(m), \
                        f"floor {floor} of queue {qid} passed {off} ({m.state})"

        def teardown(self):
            if not hasattr(self, "pop"):
                return
            clock.advance(3_600_000)
            for _ in range(10 * (len(self.msgs) + 1) * self.max_attempts):
                got = self.pop.pop(self.key, self.topic, batch_size=32, invisible_ms=1_000,
                                   tag_filter=self.filter)
                self._take_dlq()
                if not got:
                    break
                for d in got:
                    m = self.msgs[(d.message.queue_id, d.message.queue_offset)]
                    assert m.state != DONE, f"done message {m.qid}/{m.offset} handed out again"
                    self.pop.ack(self.key, d.receipt_handle, self.topic)
                    m.handle = d.receipt_handle
                    self._done(m)
            undone = [(m.qid, m.offset, m.state) for m in self.msgs.values()
                      if self._passes(m) and m.state != DONE]
            assert not undone, f"never delivered to the end: {undone}"
            floors = self.pop.floors(self.key)
            for qid in range(QUEUES):
                assert floors.get((self.topic, qid), 0) == self.next_offset[qid]

    run_state_machine_as_test(PopModel, settings=settings(
        max_examples=200, stateful_step_count=50, deadline=None))
