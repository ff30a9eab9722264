"""PopService (receive / invisible time / ack / redelivery / DLQ) over a real store,
with an injected clock; and the long-polling notifier."""
from __future__ import annotations

import threading

import pytest

from helpers.waiting import wait_until

from helpers.clock import Clock
from sparkmq import Message, Store
from sparkmq.broker.longpoll import ArrivalNotifier
from sparkmq.broker.pop import (ORIGIN_MESSAGE_ID, ORIGIN_TOPIC, GroupKey, InvalidHandle,
                                PopService,
                                TagFilter, decode_handle, dlq_topic)

ALL = TagFilter("*")


@pytest.fixture
def env(local_store_url):
    clock = Clock()
    store = Store.open(local_store_url, mode="w", clock_ms=clock, defaultTopicQueueNums=2)
    store.create_topic("T")
    pop = PopService(store, broker_name="b1", max_delivery_attempts=3, clock_ms=clock)
    yield store, pop, clock
    store.close()


def send(store, n, topic="T", tags=None):
    return store.append([Message(topic=topic, body=f"m{i}".encode(), tags=tags,
                                 unique_key=f"id{i}") for i in range(n)])


def test_pop_hands_each_message_once_and_ack_moves_the_floor(env):
    store, pop, clock = env
    send(store, 6)
    first = pop.pop("G", "T", batch_size=4, invisible_ms=10_000, tag_filter=ALL)
    rest = pop.pop("G", "T", batch_size=4, invisible_ms=10_000, tag_filter=ALL)
    assert len(first) == 4 and len(rest) == 2
    bodies = sorted(d.message.body for d in first + rest)
    assert bodies == [f"m{i}".encode() for i in range(6)]
    assert all(d.attempt == 1 for d in first + rest)
    assert pop.pop("G", "T", batch_size=4, invisible_ms=10_000, tag_filter=ALL) == []
    for d in first + rest:
        pop.ack("G", d.receipt_handle, "T")
    assert sum(pop.floors("G").values()) == 6
    assert pop.take_dirty() == {GroupKey("G"): {("T", 0): 3, ("T", 1): 3}}
    # another group sees everything again
    assert len(pop.pop("H", "T", batch_size=10, invisible_ms=1000, tag_filter=ALL)) == 6


def test_unacked_message_comes_back_with_attempt_plus_one_and_old_handle_is_stale(env):
    store, pop, clock = env
    send(store, 1)
    [d1] = pop.pop("G", "T", batch_size=1, invisible_ms=5_000, tag_filter=ALL)
    clock.now_ms += 4_999
    assert pop.pop("G", "T", batch_size=1, invisible_ms=5_000, tag_filter=ALL) == []
    clock.now_ms += 1
    [d2] = pop.pop("G", "T", batch_size=1, invisible_ms=5_000, tag_filter=ALL)
    assert d2.message.message_id == d1.message.message_id and d2.attempt == 2
    with pytest.raises(InvalidHandle):
        pop.ack("G", d1.receipt_handle, "T")
    pop.ack("G", d2.receipt_handle, "T")
    assert pop.floors("G")[("T", d2.message.queue_id)] == 1


def test_after_max_attempts_the_message_goes_to_the_dlq_topic(env):
    store, pop, clock = env
    send(store, 1)
    attempts = []
    for _ in range(3):
        [d] = pop.pop("G", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL)
        attempts.append(d.attempt)
        clock.now_ms += 1_000
    assert attempts == [1, 2, 3]
    assert pop.pop("G", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL) == []
    dlq = store.read(dlq_topic("G"), 0, 0, 10)
    assert [m.body for m in dlq] == [b"m0"]
    assert dlq[0].properties[ORIGIN_TOPIC] == "T"
    assert dlq[0].properties[ORIGIN_MESSAGE_ID] == "id0"
    assert pop.dlq_count == 1 and sum(pop.floors("G").values()) == 1


def test_change_invisible_duration_extends_and_reissues_the_handle(env):
    store, pop, clock = env
    send(store, 1)
    [d] = pop.pop("G", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL)
    h2 = pop.change_invisible("G", d.receipt_handle, 60_000, "T")
    assert h2 != d.receipt_handle
    clock.now_ms += 30_000
    assert pop.pop("G", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL) == []
    with pytest.raises(InvalidHandle):
        pop.change_invisible("G", d.receipt_handle, 1000, "T")
    pop.ack("G", h2, "T")


def test_expired_leases_come_back_earliest_first_across_pops_and_acked_ones_never(env):
    store, pop, clock = env
    send(store, 6)
    leased = []
    for invisible in (3_000, 1_000, 2_000):          # three pops, leases of three lengths
        leased += [(invisible, d) for d in pop.pop("G", "T", batch_size=2,
                                                   invisible_ms=invisible, tag_filter=ALL)]
    assert pop.next_expiry_ms("G", "T") == clock.now_ms + 1_000
    acked = leased[2][1]                              # one of the 1 s leases is acked
    pop.ack("G", acked.receipt_handle, "T")
    clock.now_ms += 5_000                             # every other lease has expired
    again = []
    while got := pop.pop("G", "T", batch_size=2, invisible_ms=60_000, tag_filter=ALL):
        assert len(got) <= 2
        again += got
    expected = [d for _, d in sorted((x for x in leased if x[1] is not acked),
                                     key=lambda x: x[0])]
    assert [d.message.queue_offset for d in again] == \
        [d.message.queue_offset for d in expected]
    assert [(d.message.queue_id, d.message.queue_offset) for d in again] == \
        [(d.message.queue_id, d.message.queue_offset) for d in expected]
    assert all(d.attempt == 2 for d in again)
    assert pop.next_expiry_ms("G", "T") == clock.now_ms + 60_000


def test_many_acked_leases_leave_the_expiry_heap_bounded(env):
    store, pop, clock = env
    send(store, 400)
    for d in pop.pop("G", "T", batch_size=400, invisible_ms=10_000, tag_filter=ALL)[:-1]:
        pop.ack("G", d.receipt_handle, "T")
    heaps = [qp.expiry for qp in pop.group("G").queues.values()]
    assert sum(len(h) for h in heaps) <= 2 * 1 + 64 * len(heaps)
    assert pop.next_expiry_ms("G", "T") == clock.now_ms + 10_000


def test_forward_to_dlq_marks_done(env):
    store, pop, clock = env
    send(store, 1)
    [d] = pop.pop("G", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL)
    pop.forward_to_dlq("G", d.receipt_handle, "T")
    assert [m.body for m in store.read(dlq_topic("G"), 0, 0, 10)] == [b"m0"]
    clock.now_ms += 10_000
    assert pop.pop("G", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL) == []


def test_tag_filter_skips_unmatched_messages_as_done(env):
    store, pop, clock = env
    send(store, 2, tags="TagA")
    send(store, 2, tags="TagB")
    send(store, 2, tags="TagC")
    got = pop.pop("G", "T", batch_size=10, invisible_ms=1_000, tag_filter=TagFilter("TagA || TagC"))
    assert sorted(d.message.tags for d in got) == ["TagA", "TagA", "TagC", "TagC"]
    for d in got:
        pop.ack("G", d.receipt_handle)
    assert sum(pop.floors("G").values()) == 6


def test_tag_filter_parsing():
    assert TagFilter("*").matches(None) and TagFilter("").matches("x")
    f = TagFilter(" A ||B ")
    assert f.matches("A") and f.matches("B") and not f.matches("C") and not f.matches(None)
    with pytest.raises(ValueError):
        TagFilter("A || ")


@pytest.mark.parametrize("bad", ["", "x", "1.2.3", "zz.0.0.T.b1", "1.x.0.T.b1", None])
def test_malformed_handles_are_refused(env, bad):
    _, pop, _ = env
    with pytest.raises(InvalidHandle):
        pop.ack("G", bad)


def test_handles_of_another_broker_or_topic_are_refused(env):
    store, pop, clock = env
    send(store, 1)
    [d] = pop.pop("G", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL)
    seq, qid, off, topic, broker = decode_handle(d.receipt_handle)
    with pytest.raises(InvalidHandle, match="broker"):
        pop.ack("G", f"{seq:x}.{qid}.{off}.{topic}.other")
    with pytest.raises(InvalidHandle, match="topic"):
        pop.ack("G", d.receipt_handle, "U")
    with pytest.raises(InvalidHandle):
        pop.ack("OtherGroup", d.receipt_handle)


def test_committed_offsets_survive_a_reopen(local_store_url):
    clock = Clock()
    store = Store.open(local_store_url, mode="w", clock_ms=clock, defaultTopicQueueNums=1)
    store.create_topic("T")
    send(store, 5)
    pop = PopService(store, broker_name="b1", clock_ms=clock)
    got = pop.pop("G", "T", batch_size=3, invisible_ms=1_000, tag_filter=ALL)
    for d in got:
        pop.ack("G", d.receipt_handle)
    for key, floors in pop.take_dirty().items():
        store.commit_consumer_offsets(key.group, floors, client_id=key.client_id)
    store.close()
    store = Store.open(local_store_url, mode="w", clock_ms=clock)
    try:
        pop = PopService(store, broker_name="b1", clock_ms=clock)
        again = pop.pop("G", "T", batch_size=10, invisible_ms=1_000, tag_filter=ALL)
        assert [d.message.body for d in again] == [b"m3", b"m4"]
    finally:
        store.close()


def test_arrival_notifier_wakes_a_waiter_and_never_loses_an_arrival():
    n = ArrivalNotifier()
    seen = n.version("T")
    n.on_arrival("T", 0, 1)                        # arrives before the wait starts
    assert n.wait("T", seen, timeout_s=30) is True
    seen = n.version("T")
    assert n.wait("T", seen, timeout_s=0.01) is False
    result = []
    t = threading.Thread(target=lambda: result.append(n.wait("T", seen, timeout_s=30)))
    t.start()
    for _ in range(1000):                           # bounded: until the waiter is parked
        if n.waiting:
            break
        threading.Event().wait(0.005)
    n.on_arrival("U", 0, 1)                         # another topic does not count...
    n.on_arrival("T", 0, 2)
    t.join(30)
    assert result == [True] and not t.is_alive()


def test_fifo_a_message_group_is_delivered_in_order_one_at_a_time(local_store_url):
    clock = Clock()
    store = Store.open(local_store_url, mode="w", clock_ms=clock)
    try:
        store.create_topic("F", read_queue_nums=1, write_queue_nums=1)
        store.create_group("G", consume_message_orderly=True)
        order = [("g1", 0), ("g2", 0), ("g1", 1), ("g1", 2), ("g2", 1), ("g3", 0)]
        store.append([Message(topic="F", body=f"{g}-{i}".encode(), message_group=g)
                      for g, i in order])
        pop = PopService(store, broker_name="b1", max_delivery_attempts=2, clock_ms=clock)

        def take(n=10, invisible_ms=1_000):
            return pop.pop("G", "F", batch_size=n, invisible_ms=invisible_ms, tag_filter=ALL)
        first = take()
        assert [d.message.body for d in first] == [b"g1-0", b"g2-0", b"g3-0"]
        assert take() == []                                  # g1/g2 busy: the rest is held
        by_body = {d.message.body: d for d in first}
        assert pop.ack("G", by_body[b"g1-0"].receipt_handle) is True
        pop.ack("G", by_body[b"g3-0"].receipt_handle)
        [g1_1] = take()
        assert g1_1.message.body == b"g1-1"
        clock.now_ms += 1_000                                    # g2-0 and g1-1 expire unacked
        again = take()
        assert sorted((d.message.body, d.attempt) for d in again) == [(b"g1-1", 2), (b"g2-0", 2)]
        for d in again:
            if d.message.body == b"g1-1":
                pop.ack("G", d.receipt_handle)
        clock.now_ms += 1_000                                    # g2-0: max attempts -> DLQ
        rest = take()
        assert sorted(d.message.body for d in rest) == [b"g1-2", b"g2-1"]
        assert [m.body for m in store.read(dlq_topic("G"), 0, 0, 5)] == [b"g2-0"]
    finally:
        store.close()


def test_broadcasting_consumers_each_get_every_message_with_their_own_offsets(env):
    store, pop, clock = env
    send(store, 3)
    a, b = GroupKey("B", "client-a"), GroupKey("B", "client-b")
    got_a = pop.pop(a, "T", batch_size=10, invisible_ms=1_000, tag_filter=ALL)
    got_b = pop.pop(b, "T", batch_size=10, invisible_ms=1_000, tag_filter=ALL)
    assert len(got_a) == len(got_b) == 3
    for d in got_a:
        pop.ack(a, d.receipt_handle)
    with pytest.raises(InvalidHandle):
        pop.ack(b, got_a[0].receipt_handle)       # a's handle is not b's lease
    dirty = pop.take_dirty()
    assert set(dirty) == {a} and sum(dirty[a].values()) == 3
    for key, floors in dirty.items():
        store.commit_consumer_offsets(key.group, floors, client_id=key.client_id)
    assert sum(store.consumer_offsets("B", client_id="client-a").values()) == 3
    assert store.consumer_offsets("B", client_id="client-b") == {}


def test_group_retry_max_times_from_its_subscription_group_config(env):
    store, pop, clock = env
    store.create_group("Gone", retry_max_times=0)      # first delivery only, then the DLQ
    store.create_group("Gmany", retry_max_times=4)     # more than the broker's 3 attempts
    send(store, 1)
    [d] = pop.pop("Gone", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL)
    clock.now_ms += 1_000
    assert pop.pop("Gone", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL) == []
    assert [m.body for m in store.read(dlq_topic("Gone"), 0, 0, 10)] == [b"m0"]
    attempts = []
    for _ in range(5):
        [d] = pop.pop("Gmany", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL)
        attempts.append(d.attempt)
        clock.now_ms += 1_000
    assert attempts == [1, 2, 3, 4, 5]
    assert pop.pop("Gmany", "T", batch_size=1, invisible_ms=1_000, tag_filter=ALL) == []
    assert pop.max_attempts("Gmany") == 5 and pop.max_attempts("other") == 3


def test_a_pull_waits_for_its_own_queue_and_a_receive_for_any():
    """Pull waiters (one queue) are woken by their queue only; receive waiters (the
    topic) by any of its queues; a wake naming only the topic reaches both."""
    n = ArrivalNotifier()
    q0, q1, topic = n.version("T", 0), n.version("T", 1), n.version("T")
    n.on_arrival("T", 1, 5)
    assert not n.wait("T", q0, 0, 0)                  # queue 0's pull: nothing for it
    assert n.wait("T", q1, 0, 1) and n.wait("T", topic, 0)
    q0 = n.version("T", 0)
    n.wake(["T"])                                     # the queue unknown: everyone
    assert n.wait("T", q0, 0, 0)
    # a thread parked on queue 0 is not woken by arrivals in queue 1, then is by queue 0
    woke, seen = [], n.version("T", 0)
    t = threading.Thread(target=lambda: woke.append(n.wait("T", seen, 30, 0)))
    t.start()
    wait_until(lambda: n.waiting == 1)                # the waiter is parked
    for off in range(6, 50):
        n.on_arrival("T", 1, off)
    assert t.is_alive() and woke == []
    n.on_arrival("T", 0, 1)
    t.join(30)
    assert woke == [True]


def test_a_pop_that_takes_every_message_reads_no_more_than_it_takes(env):
    """With ``*`` (nothing filtered out) and no FIFO order, a pop of 5 from a backlog of
    60 reads (converts) at most 5 messages a queue; with a tag filter it reads ahead so it
    still fills its batch past the messages it passes over, each handed once."""
    store, pop, _ = env
    send(store, 40)
    send(store, 20, tags="B")
    asked = []
    read = store.read

    def counting_read(topic, qid, offset, max_messages=32):
        asked.append(max_messages)
        return read(topic, qid, offset, max_messages)
    store.read = counting_read
    got = pop.pop("G", "T", batch_size=5, invisible_ms=10_000, tag_filter=ALL)
    assert len(got) == 5 and asked and max(asked) <= 5
    asked.clear()
    tagged = pop.pop("H", "T", batch_size=15, invisible_ms=10_000, tag_filter=TagFilter("B"))
    assert len(tagged) == 15 and {d.message.tags for d in tagged} == {"B"}
    assert len({d.message.unique_key for d in tagged}) == 15
    assert max(asked) > 15                   # read ahead, past the untagged ones
