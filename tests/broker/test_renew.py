"""ReceiptRenewer over a real PopService and store, with an injected clock: whatever the
timing of its passes (each within renewAheadTimeMillis of the last), a held message is
never handed to anyone else, and the client's first handle acks it."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.clock import Clock
from sparkmq import Message, Store
from sparkmq.broker.pop import PopService, TagFilter
from sparkmq.broker.renew import RENEW_STEPS_MS, ReceiptRenewer
from sparkmq.log.retrypolicy import default_policy

ALL = TagFilter("*")
AHEAD_MS = 10_000


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    clock = Clock()
    store = Store.open(str(tmp_path_factory.mktemp("renew")), mode="w", clock_ms=clock,
                       defaultTopicQueueNums=1)
    pop = PopService(store, broker_name="b1", clock_ms=clock)
    online = {"c1": True}
    renewer = ReceiptRenewer(pop, lambda cid: online.get(cid, False),
                             lambda group: default_policy(), clock_ms=clock,
                             ahead_ms=AHEAD_MS, max_ms=3 * 3600_000, clear_ms=1_000)
    yield store, pop, clock, renewer, online
    store.close()


@settings(deadline=None, max_examples=60)
@given(steps=st.lists(st.tuples(st.integers(0, AHEAD_MS), st.booleans(), st.booleans()),
                      max_size=40),
       ack_second_at=st.integers(0, 40))
def test_a_held_message_stays_hidden_through_any_pass_timing_and_acks_by_its_first_handle(
        env, steps, ack_second_at):
    store, pop, clock, renewer, _ = env
    topic = f"T{clock.now_ms}"
    store.create_topic(topic)
    store.append([Message(topic=topic, body=b"a"), Message(topic=topic, body=b"b")])
    got = pop.pop("G", topic, batch_size=2, invisible_ms=60_000, tag_filter=ALL)
    assert len(got) == 2
    renewer.hold("c1", "G", topic, got)
    first, second = got
    for i, (advance_ms, look_before, look_after) in enumerate(steps):
        if i == ack_second_at:          # one acked while the other is still renewed
            pop.ack("G", renewer.release("c1", "G", second.receipt_handle), topic)
        clock.now_ms += advance_ms      # another consumer looks before the pass, or after
        for look in (look_before, "pass", look_after):
            if look == "pass":
                renewer.renew_due()
            elif look:
                assert pop.pop("G", topic, batch_size=2, invisible_ms=1_000,
                               tag_filter=ALL) == []
    pop.ack("G", renewer.release("c1", "G", first.receipt_handle), topic)
    if ack_second_at >= len(steps):
        pop.ack("G", renewer.release("c1", "G", second.receipt_handle), topic)
    assert pop.committed_offset("G", topic, 0) == 2
    assert renewer.held_count() == 0
    clock.now_ms += 2 * 3600_000                    # nothing left to come back
    assert pop.pop("G", topic, batch_size=2, invisible_ms=1_000, tag_filter=ALL) == []


def test_a_pass_lets_go_of_an_offline_clients_messages_and_renews_the_others(env):
    store, pop, clock, renewer, online = env
    topic = f"O{clock.now_ms}"
    store.create_topic(topic)
    store.append([Message(topic=topic, body=b"x"), Message(topic=topic, body=b"y")])
    [x] = pop.pop("G", topic, batch_size=1, invisible_ms=60_000, tag_filter=ALL)
    [y] = pop.pop("G", topic, batch_size=1, invisible_ms=60_000, tag_filter=ALL)
    online["gone"] = False
    renewer.hold("c1", "G", topic, [x])
    renewer.hold("gone", "G", topic, [y])
    clock.now_ms += 60_000 - AHEAD_MS
    renewer.renew_due()
    assert renewer.held_count() == 1               # the offline client's is let go
    clock.now_ms += 1_000                          # invisibleTimeMillisWhenClear
    [again] = pop.pop("G", topic, batch_size=2, invisible_ms=60_000, tag_filter=ALL)
    assert again.message.body == b"y" and again.attempt == 2
    lease_left = [lease.visible_at_ms for (t, _), qp in pop.group("G").queues.items()
                  if t == topic for lease in qp.inflight.values()
                  if lease.offset == x.message.queue_offset][0] - clock.now_ms
    assert RENEW_STEPS_MS[0] - 2_000 <= lease_left <= RENEW_STEPS_MS[0]
