"""Parked delayed messages on disk (issue 18 item 6): the schedule service holds no
per-message state for what is parked, and a restart reads only the timer wheel's tail.
Counted, not timed: entries held in memory, rows read from the schedule topic at start.
Recovery: a crash after deliveries that were not persisted, a lost wheel, a damaged log."""

from __future__ import annotations

import logging
import os

import pytest

from helpers.clock import Clock
from sparkmq import Store
from sparkmq.broker.schedule import (DEFAULT_DELAY_LEVELS, PROP_SOURCE, SCHEDULE_TOPIC,
                                     DelayPolicy, RecallStatus, ScheduleService, parked_row,
                                     parse_delay_levels)
from sparkmq.broker.timerwheel import LOG_DIR, default_timer_dir
from sparkmq.lifecycle import ServiceThread
from sparkmq.log.message import Message

POLICY = DelayPolicy(parse_delay_levels(DEFAULT_DELAY_LEVELS))
HOUR_MS = 3_600_000


def park_many(store, clock, *, at_ms=(), level=None, count=0, topic="T"):
    """Park one message per delivery time in ``at_ms``, and ``count`` at ``level``."""
    msgs = []
    for i, at in enumerate(at_ms):
        t, q, due, props = parked_row(POLICY, clock(), topic, {}, at)
        msgs.append(Message(topic=t, body=b"ts%d" % i, queue_id=q, delivery_timestamp=due,
                            properties=props))
    for i in range(count):
        t, q, due, props = parked_row(POLICY, clock(), topic, {"DELAY": str(level)}, None)
        msgs.append(Message(topic=t, body=b"lv%d" % i, queue_id=q, delivery_timestamp=due,
                            properties=props))
    for i in range(0, len(msgs), 5000):
        store.append(msgs[i:i + 5000])


def delivered(store, topic="T"):
    """(SCHEDULE_SOURCE, store ms, delivery ms) of every copy in ``topic``."""
    out = []
    for q in range(store.topics()[topic].read_queue_nums):
        t = store.read_table(topic, q, 0, columns=["properties", "store_timestamp",
                                                   "delivery_timestamp"])
        for props, st, dt in zip(*(t.column(c).to_pylist() for c in t.column_names)):
            out.append((dict(props)[PROP_SOURCE], st, dt))
    return out


def held(svc) -> int:
    """Entries the service holds in memory for parked messages (all of them, any kind)."""
    return (len(svc._soon_due) + len(svc._soon) + len(svc._seen)
            + sum(len(s) for s in svc._recalled.values()) + len(svc._cursor) + len(svc._head))


class RowCounter:
    """Counts the rows ``store.read_table`` returns, per topic."""

    def __init__(self, store):
        self.rows: dict[str, int] = {}
        self._read = store.read_table

        def counted(topic, *a, **kw):
            t = self._read(topic, *a, **kw)
            self.rows[topic] = self.rows.get(topic, 0) + t.num_rows
            return t
        store.read_table = counted


@pytest.fixture
def store_clock(local_store_url):
    clock = Clock()
    store = Store.open(local_store_url, clock_ms=clock)
    store.create_topic("T", read_queue_nums=2, write_queue_nums=2)
    yield store, clock
    if not store.closed:
        store.close()


def test_memory_and_restart_do_not_grow_with_the_number_parked(store_clock, local_store_url):
    store, clock = store_clock
    t0 = clock.now_ms
    svc = ScheduleService(store, POLICY, clock_ms=clock).start()
    ts = [t0 + 5000 + (i * 7919) % HOUR_MS for i in range(20_000)]   # spread over an hour
    park_many(store, clock, at_ms=ts, level=17, count=5000)            # level 17 = 1 h
    svc.run_due()
    assert svc.pending_count() == 25_000
    assert held(svc) < 100                   # what falls due within ~2 s, cursors, heads
    clock.now_ms = t0 + HOUR_MS // 2
    svc.run_due()
    first = delivered(store)
    assert len(first) == sum(1 for d in ts if d <= clock.now_ms)
    assert all(st >= dt for _, st, dt in first)                        # never early
    assert held(svc) < 100
    clock.now_ms += 120_000
    last_pass = svc.run_due()                   # delivers what fell due; persists
    svc.stop()
    done = len(delivered(store))

    park_many(store, clock, at_ms=[clock.now_ms + 60_000] * 100)        # parked while down
    counter = RowCounter(store)
    svc = ScheduleService(store, POLICY, clock_ms=clock).start()
    # parked rows read: the tail (100) and the row at each level queue's cursor; real-topic
    # rows read (the search for copies delivered after the last persist, i.e. lost by a
    # crash): those of the pass that ran just before it
    assert counter.rows.get(SCHEDULE_TOPIC, 0) <= 100 + len(POLICY.levels_ms)
    assert counter.rows.get("T", 0) <= last_pass
    assert sum(counter.rows.values()) <= counter.rows[SCHEDULE_TOPIC] + counter.rows["T"]
    assert svc.pending_count() == 25_100 - done
    clock.now_ms = t0 + 2 * HOUR_MS
    svc.run_due()
    got = delivered(store)
    assert len(got) == 25_100 and len({src for src, _, _ in got}) == 25_100
    assert all(st >= dt for _, st, dt in got)
    assert svc.pending_count() == 0 and held(svc) < 100
    svc.stop()


def test_a_crash_before_progress_is_persisted_neither_loses_nor_duplicates(store_clock,
                                                                           local_store_url):
    store, clock = store_clock
    t0 = clock.now_ms
    never = 10 ** 15                                         # no persist before the crash
    svc = ScheduleService(store, POLICY, clock_ms=clock, persist_interval_ms=never).start()
    park_many(store, clock, at_ms=[t0 + 1000 * (i + 1) for i in range(40)], level=2, count=10)
    clock.now_ms = t0 + 20_500
    svc.run_due()
    assert len(delivered(store)) == 30                       # 20 timestamps + 10 of level 2
    store.remove_listener(svc._on_arrival)
    ServiceThread.stop(svc)                                  # the thread dies; nothing persisted
    store._crash()

    store = Store.open(local_store_url, clock_ms=clock)
    survived = len(delivered(store))
    svc = ScheduleService(store, POLICY, clock_ms=clock).start()
    assert (survived, svc.pending_count()) == (30, 20)
    clock.now_ms = t0 + 60_000
    svc.run_due()
    got = delivered(store)
    assert len(got) == 50 and len({src for src, _, _ in got}) == 50
    svc.stop()
    store.close()


@pytest.mark.parametrize("damage", ["remove", "truncate-log"])
def test_a_lost_or_damaged_wheel_is_rebuilt_from_the_store(store_clock, local_store_url, damage,
                                                           caplog):
    store, clock = store_clock
    t0 = clock.now_ms
    svc = ScheduleService(store, POLICY, clock_ms=clock).start()
    park_many(store, clock, at_ms=[t0 + 1000 * (i + 1) for i in range(30)])
    late = store.max_offset(SCHEDULE_TOPIC, POLICY.timer_queue) - 1
    assert svc.recall(POLICY.timer_queue, late) == RecallStatus.RECALLED
    clock.now_ms = t0 + 10_000
    svc.run_due()
    assert len(delivered(store)) == 10
    svc.stop()
    folder = default_timer_dir(store)
    if damage == "remove":
        for root, _, files in os.walk(folder):
            for f in files:
                os.remove(os.path.join(root, f))
    else:
        for name in os.listdir(os.path.join(folder, LOG_DIR)):
            with open(os.path.join(folder, LOG_DIR, name), "r+b") as f:
                f.truncate(24)
    with caplog.at_level(logging.WARNING, "sparkmq.broker.schedule"):
        svc = ScheduleService(store, POLICY, clock_ms=clock).start()
    assert "building the timer wheel" in caplog.text
    assert svc.pending_count() == 19                      # 30 - 10 delivered - 1 recalled
    clock.now_ms = t0 + 60_000
    svc.run_due()
    got = delivered(store)
    assert len(got) == 29 and len({src for src, _, _ in got}) == 29
    assert f"{POLICY.timer_queue}:{late}" not in {src for src, _, _ in got}
    svc.stop()


def test_restart_looks_only_into_queues_holding_recent_messages(store_clock, local_store_url):
    """The search for copies delivered after the last persist asks each queue's stats
    first: a restart beside 300 idle topics x 8 queues looks into the delivery topic's
    queues only (it looked into all 2,402: broker start grew with the topic count)."""
    store, clock = store_clock
    t0 = clock.now_ms
    for i in range(300):
        store.create_topic(f"idle{i}", read_queue_nums=8, write_queue_nums=8)
    store.append([Message(topic=f"idle{i}", body=b"old") for i in range(0, 300, 7)])
    clock.now_ms = t0 + HOUR_MS                     # the idle topics' messages are old now
    svc = ScheduleService(store, POLICY, clock_ms=clock).start()
    park_many(store, clock, at_ms=[clock.now_ms + 1000 * (i + 1) for i in range(20)])
    clock.now_ms += 30_000
    svc.run_due()
    svc.stop()
    looked: list[tuple[str, int]] = []
    real = store.offset_for_time
    store.offset_for_time = lambda topic, q, ms: looked.append((topic, q)) or real(topic, q, ms)
    svc = ScheduleService(store, POLICY, clock_ms=clock).start()
    assert looked and {t for t, _ in looked} == {"T"}
    assert svc.pending_count() == 0 and len(delivered(store)) == 20
    svc.stop()
