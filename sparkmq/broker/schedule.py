"""Delayed messages: RocketMQ's ``messageDelayLevel`` levels and 5.x delivery timestamps.

Contract:
- Where a send parks (``delaypolicy``: ``DelayPolicy``, ``parked_row``; re-exported here).
- Parked messages are ordinary rows of the system topic ``SCHEDULE_TOPIC_XXXX`` (queue
  ``level-1`` per level, queue ``N`` for arbitrary timestamps) with ``delivery_timestamp`` =
  due time and the real topic in property ``REAL_TOPIC``: Spark readers of the real topic do
  not see them; admin tools do (the system topic is readable).
- ``ScheduleService`` (thread ``sparkmq-schedule``; ``start()``/``stop()``, injected
  ``clock_ms``) holds no per-message state for what is parked, so its memory and its start
  time do not grow with the number of parked messages:
  - a level queue's due times rise with its offsets (one delay added to a rising send time),
    so a level queue is a cursor: rows are delivered from it, in order, while due (a row
    sent a few ms out of order waits for the one before it: late by those ms, never early);
  - the timestamp queue is indexed by a timer wheel (``timerwheel.TimerWheel``, RocketMQ 5's
    TimerLog + TimerWheel: broker-local files, one slot per second, derived data rebuilt from
    the store if lost); a slot is read into memory ``LOOKAHEAD_MS`` before its second, so
    memory holds only what falls due within about a second (at most ``SOON_MAX`` entries
    are loaded ahead of delivery).
  The thread is woken by the store's arrival listener and by a timer for the earliest due
  time (no polling loop), at most one delivery pass per ``tick_ms`` (50 ms), so messages
  falling due close together go out as one append. Due messages are re-appended to their
  real topic (same body, tags, keys, properties, unique key and ``delivery_timestamp``;
  property ``SCHEDULE_SOURCE`` = ``"queue:offset"`` of the parked copy), never before
  ``clock_ms() >= due``.
- Progress: per schedule queue, the lowest undelivered offset is committed with
  ``Store.commit_consumer_offsets`` under group ``SCHEDULE_GROUP`` (every
  ``persist_interval_ms`` and at ``stop()``), after the wheel's own progress is written.
  ``start()`` resumes each level queue at its committed offset and the wheel where it was
  (indexing only the timestamp queue's tail it has not seen); a parked message due at start
  that a real topic already holds a copy of (by ``SCHEDULE_SOURCE``, searched from shortly
  before the oldest possible such delivery) is not delivered again, so restart and crash
  neither lose nor duplicate a delivery.
- Recall (5.x RecallMessage): ``recall(queue, offset)`` cancels a parked message that is not
  delivered yet. The recall is stored first (a row ``"queue:offset"`` in the system topic
  ``rmq_sys_SCHEDULE_RECALL``), then takes effect; ``start()`` reads the stored recalls, so
  a recall survives restart and crash. ``make_recall_handle`` / ``parse_recall_handle``
  encode where the parked copy lives (returned with the send).
- Thread-safety: ``wake()``, ``run_due()``, ``recall()``, ``pending_count()`` may be called from
  any thread.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from typing import Callable

from ..errors import DelayRefused, SparkMQError  # noqa: F401 (DelayRefused re-exported)
from ..lifecycle import ServiceThread
from ..log.message import Message
from .delaypolicy import (DEFAULT_DELAY_LEVELS, DEFAULT_MAX_DELAY_MS,  # noqa: F401
                          DelayPolicy, parked_row, parse_delay_levels)
from .parked import (PROP_DELAY_LEVEL, PROP_REAL_TOPIC, PROP_SOURCE,  # noqa: F401 (re-exported)
                     RECALL_TOPIC, SCHEDULE_GROUP, SCHEDULE_TOPIC, delivered_sources,
                     RecallStatus, make_recall_handle, parse_recall_handle, read_dues,
                     real_table, store_time_at, stored_recalls)
from .timerwheel import TimerWheel, default_timer_dir

log = logging.getLogger(__name__)

DELIVER_BATCH = 256
PERSIST_SLACK_MS = 200


#: Delivery passes are at least this far apart (ms): due messages are batched per tick.
DEFAULT_TICK_MS = 50
#: a timer slot is read into memory this long before its second begins (ms)
LOOKAHEAD_MS = 1000
#: the wheel spans maxDelay plus this much (s): how far delivery may fall behind the clock
#: (a backlog, a broker down) before indexing new timestamp messages waits for it
WHEEL_MARGIN_S = 3600
#: timer slots are not read ahead while this many loaded entries wait for delivery
SOON_MAX = 65_536
#: a delivered copy is stored no earlier than its delivery decision minus this (clock skew)
DEDUPE_SLACK_MS = 5000


class ScheduleService(ServiceThread):
    """Delivers parked messages when due (see module docstring). Thread-safe; one
    ``sparkmq-schedule`` thread delivers, at most one pass per ``tick_ms``.

    Memory: per level queue a cursor and the due time of the row at it; for the timestamp
    queue the wheel's mapped file (fixed size, 32 bytes a second of ``maxDelay``) and the
    entries of the seconds read ahead; the stored recalls not yet passed; after a crash, the
    copies found delivered since the last persist. None of it grows with what is parked."""

    name = "schedule"

    def __init__(self, store, policy: DelayPolicy, *, clock_ms: Callable[[], int] | None = None,
                 persist_interval_ms: int = 1000, max_wait_s: float = 5.0,
                 on_delivered: Callable[[int], None] | None = None,
                 tick_ms: int = DEFAULT_TICK_MS, timer_dir: str | None = None):
        super().__init__(interval_ms=int(max_wait_s * 1000))
        self.store = store
        self.tick_ms = self.min_pass_interval_ms = tick_ms
        self.policy = policy
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.persist_interval_ms = persist_interval_ms
        self.max_wait_s = max_wait_s
        self.on_delivered = on_delivered
        self.timer_dir = timer_dir
        self.delivered_total = 0
        self.timer_queue = policy.timer_queue
        self.wheel_slots = math.ceil(policy.max_delay_ms / 1000) + WHEEL_MARGIN_S + 2
        self._lock = threading.RLock()
        self._run_lock = threading.Lock()
        self._cursor: dict[int, int] = {}               # level queue -> next undelivered
        self._head: dict[int, tuple[int, int]] = {}     # level queue -> (cursor, its due ms)
        self._committed: dict[int, int] = {}
        self._recalled: dict[int, set[int]] = {}        # queue -> recalled, not passed yet
        self._seen: dict[tuple[int, int], int] = {}     # delivered before a crash -> due
        self.wheel: TimerWheel | None = None
        self._loaded_to = 0                             # timer seconds below it are loaded
        self._soon: list[tuple[int, int]] = []          # (due ms, offset), loaded timer rows
        self._soon_due: dict[int, int] = {}             # offset -> due ms (what _soon holds)
        self._blocked_at = -1
        self._last_persist_ms = 0

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "ScheduleService":
        n = self.policy.queue_count
        conf = self.store.topics().get(SCHEDULE_TOPIC)
        if conf is None:
            self.store.create_topic(SCHEDULE_TOPIC, read_queue_nums=n, write_queue_nums=n,
                                    system=True, exist_ok=True)
        elif conf.read_queue_nums < n:
            self.store.update_topic(SCHEDULE_TOPIC, read_queue_nums=n, write_queue_nums=n)
        if RECALL_TOPIC not in self.store.topics():
            self.store.create_topic(RECALL_TOPIC, read_queue_nums=1, write_queue_nums=1,
                                    system=True, exist_ok=True)
        with self._run_lock, self._lock:
            self._recover()
        self.store.add_listener(self._on_arrival)
        super().start()
        log.info("schedule service: %d parked message(s) pending", self.pending_count())
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop delivering, then persist the delivered-up-to offsets."""
        self.store.remove_listener(self._on_arrival)
        super().stop(timeout_s)
        try:
            self.persist()
        except SparkMQError as e:
            log.error("schedule service: could not persist progress at stop: %s", e)
        finally:
            with self._lock:
                if self.wheel is not None:
                    self.wheel.close()
                    self.wheel = None

    def wake(self) -> None:
        """Re-evaluate now (after an injected clock moved, or new parked messages)."""
        self.wakeup()

    def pending_count(self) -> int:
        """Parked messages neither delivered nor recalled (the wheel's slots counted)."""
        with self._lock:
            n = 0
            for qid, cur in self._cursor.items():
                hi = self.store.max_offset(SCHEDULE_TOPIC, qid)
                gone = self._recalled_in(qid, cur, hi)
                gone += sum(1 for q, o in self._seen if q == qid and cur <= o < hi)
                n += max(0, hi - cur - gone)
            w = self.wheel
            if w is None:
                return n
            hi, lo = self.store.max_offset(SCHEDULE_TOPIC, self.timer_queue), w.indexed_up_to
            tail = hi - lo - self._recalled_in(self.timer_queue, lo, hi)
            seen = sum(1 for (q, _), due in self._seen.items()       # counted in a slot
                       if q == self.timer_queue and due // 1000 >= self._loaded_to)
            return (n + max(0, tail) + len(self._soon_due) - seen
                    + w.count_between(self._loaded_to, w.wheel_second + w.slot_count))

    def _recalled_in(self, qid: int, lo: int, hi: int) -> int:
        """How many stored recalls of queue ``qid`` not passed yet fall in [lo, hi)."""
        return sum(1 for o in self._recalled.get(qid, ()) if lo <= o < hi)

    def next_due_ms(self) -> int | None:
        """When the next pass has something to do (an estimate: never later than due)."""
        with self._lock:
            out = []
            for qid in self._cursor:
                d = self._head_due(qid)
                if d is not None:
                    out.append(d)
            if self._soon:
                out.append(self._soon[0][0])
            w = self.wheel
            if w is not None:
                nxt = w.next_busy(self._loaded_to,
                                  self._loaded_to + int(self.max_wait_s) + 2)
                if nxt is not None:
                    out.append(nxt * 1000 - LOOKAHEAD_MS)
            return min(out) if out else None

    # ------------------------------------------------------------ recovery
    def _recover(self) -> None:
        """Cursors from the committed progress, the wheel from its files (or rebuilt), the
        recalls, and the copies delivered after the last persist (a crash)."""
        now = self.clock_ms()
        offsets = self.store.consumer_offsets(SCHEDULE_GROUP)
        self._recalled = stored_recalls(self.store)
        for qid in range(self.policy.queue_count):
            self._committed[qid] = offsets.get((SCHEDULE_TOPIC, qid), 0)
        for qid in range(len(self.policy.levels_ms)):
            self._cursor[qid] = max(self._committed[qid],
                                    self.store.min_offset(SCHEDULE_TOPIC, qid))
        tq = self.timer_queue
        floor = max(self._committed[tq], self.store.min_offset(SCHEDULE_TOPIC, tq))
        folder = self.timer_dir or default_timer_dir(self.store)
        self.wheel, reason = TimerWheel.open(
            folder, slots=self.wheel_slots, queue_id=tq, store_id=self.store.store_id,
            indexed_up_to=floor, wheel_second=now // 1000,
            max_indexed=self.store.max_offset(SCHEDULE_TOPIC, tq))
        if reason is not None:
            level = logging.WARNING if floor < self.store.max_offset(SCHEDULE_TOPIC, tq) \
                else logging.INFO                           # nothing to read: a new store
            log.log(level, "schedule service: %s; building the timer wheel in %s from offset "
                    "%d of the timestamp queue (reads every message parked there)",
                    reason, folder, floor)
        w = self.wheel
        self._seen = self._delivered_before(now, floor, since_floor=reason is not None)
        self._loaded_to = w.wheel_second
        self._load_slot(w.wheel_second)        # from here on _loaded_to > wheel_second
        self._index_tail()
        self._forget_seen()

    def _forget_seen(self) -> None:
        """Forget copies found delivered that no queue will reach again: behind a level
        cursor; in the timestamp queue, of a second already read (all indexed)."""
        tq = self.timer_queue
        indexed = self.wheel.indexed_up_to >= self.store.max_offset(SCHEDULE_TOPIC, tq)
        for (q, off), due in list(self._seen.items()):
            if (off < self._cursor[q]) if q != tq else (indexed and due // 1000 < self._loaded_to):
                del self._seen[(q, off)]

    def _delivered_before(self, now: int, timer_floor: int, *, since_floor: bool) -> dict:
        """Copies of parked messages a real topic holds that progress does not yet show:
        they were delivered after the last persist (a crash). Due ones only can be."""
        floors, since = {}, None
        for qid, cur in self._cursor.items():
            d = self._head_due(qid)
            if d is not None and d <= now:
                floors[qid] = cur
                since = min(d, since if since is not None else d)
        tq = self.timer_queue
        if since_floor:          # a rebuilt wheel: anything from the committed floor on
            t0 = store_time_at(self.store, tq, timer_floor)
        else:                    # slots before wheel_second were delivered and persisted
            t0 = self.wheel.wheel_second * 1000 - LOOKAHEAD_MS
        if t0 is not None and t0 <= now:
            floors[tq] = timer_floor
            since = min(t0, since if since is not None else t0)
        if since is None:
            return {}
        return delivered_sources(self.store, since - DEDUPE_SLACK_MS, floors)

    def recall(self, qid: int, offset: int) -> str:
        """Cancel parked message ``qid:offset`` if it is not delivered yet (RecallStatus).
        The recall is stored before it takes effect; a delivery never races it."""
        with self._run_lock:
            with self._lock:
                slot = self._recall_target(qid, offset)
                if slot is None:
                    return RecallStatus.NOT_FOUND
            self.store.append([Message(RECALL_TOPIC, f"{qid}:{offset}".encode(), queue_id=0)])
            with self._lock:
                self._recalled.setdefault(qid, set()).add(offset)
                if qid == self.timer_queue:
                    self._soon_due.pop(offset, None)        # its heap entry goes stale
                    if self.wheel is not None and slot > self.wheel.wheel_second:
                        self.wheel.uncount(slot)            # (a slot still on the wheel)
            self.wakeup()
            log.info("schedule service: parked message %d:%d recalled", qid, offset)
            return RecallStatus.RECALLED

    def _recall_target(self, qid: int, offset: int) -> int | None:
        """None if ``qid:offset`` is not waiting; else the timer second whose slot counts
        it if still on the wheel, or -1 (a level queue, or not indexed yet)."""
        if not 0 <= qid < self.policy.queue_count or offset in self._recalled.get(qid, ()) \
                or (qid, offset) in self._seen or self.wheel is None:
            return None                     # (delivered before a crash; stopped)
        if not (self.store.min_offset(SCHEDULE_TOPIC, qid) <= offset
                < self.store.max_offset(SCHEDULE_TOPIC, qid)):
            return None
        if qid != self.timer_queue:
            return -1 if offset >= self._cursor[qid] else None
        self._index_tail()
        if offset >= self.wheel.indexed_up_to:
            return -1
        if offset in self._soon_due:        # read, but its slot on disk counts it (restart)
            return self._soon_due[offset] // 1000
        _, dues = read_dues(self.store, qid, offset, offset + 1)
        if not len(dues):
            return None
        second = int(dues[0]) // 1000
        # a slot below _loaded_to was read: its waiting rows are in _soon_due
        return second if second >= self._loaded_to else None

    # ------------------------------------------------------------ the level queues
    def _head_due(self, qid: int) -> int | None:
        """Due ms of the row at level queue ``qid``'s cursor, None if there is none."""
        cur = self._cursor[qid]
        head = self._head.get(qid)
        if head is not None and head[0] == cur:
            return head[1]
        if cur >= self.store.max_offset(SCHEDULE_TOPIC, qid):
            return None
        offs, dues = read_dues(self.store, qid, cur, cur + 1)
        if not len(offs):
            floor = self.store.min_offset(SCHEDULE_TOPIC, qid)
            if floor <= cur:
                return None
            self._cursor[qid] = cur = floor          # rows removed by retention
            offs, dues = read_dues(self.store, qid, cur, cur + 1)
            if not len(offs):
                return None
        self._head[qid] = (cur, int(dues[0]))
        return int(dues[0])

    def _level_due(self, qid: int, now: int, limit: int, items: list) -> int:
        """Append up to ``limit`` due rows of level queue ``qid`` to ``items``; returns the
        cursor after them (recalled rows and copies delivered before a crash skipped)."""
        d = self._head_due(qid)             # (moves the cursor past rows retention removed)
        cur = self._cursor[qid]
        if d is None or d > now:
            return cur
        hi = self.store.max_offset(SCHEDULE_TOPIC, qid)
        offs, dues = read_dues(self.store, qid, cur, min(hi, cur + limit))
        recalled = self._recalled.get(qid, ())
        for off, due in zip(offs.tolist(), dues.tolist()):
            if due > now:
                break
            cur = off + 1
            if off not in recalled and (qid, off) not in self._seen:   # both kept till
                items.append((due, qid, off))        # persist: the cursor moves after this
        return cur

    # ------------------------------------------------------------ the timer wheel
    def _index_tail(self) -> None:
        """Add the timestamp queue's rows the wheel has not indexed yet."""
        w, tq = self.wheel, self.timer_queue
        hi = self.store.max_offset(SCHEDULE_TOPIC, tq)
        while w.indexed_up_to < hi:
            lo = w.indexed_up_to
            offs, dues = read_dues(self.store, tq, lo, min(hi, lo + 4096))
            if not len(offs):
                floor = self.store.min_offset(SCHEDULE_TOPIC, tq)
                if floor <= lo:
                    return
                w.add([], [], [], floor)                  # rows removed by retention
                continue
            secs = (dues // 1000).clip(min=w.wheel_second)
            over = (secs >= w.wheel_second + w.slot_count).nonzero()[0]
            n = int(over[0]) if len(over) else len(secs)
            if n == 0:
                if self._blocked_at != lo:
                    log.warning("schedule service: parked message %d:%d is due beyond the "
                                "timer wheel's span (delivery is behind); indexing waits",
                                tq, lo)
                    self._blocked_at = lo
                return
            upto = int(offs[n]) if n < len(offs) else int(offs[-1]) + 1
            w.add(secs[:n], dues[:n], offs[:n], upto)
            recalled = self._recalled.get(tq, set())
            for s, due, off in zip(secs[:n].tolist(), dues[:n].tolist(), offs[:n].tolist()):
                if off in recalled:
                    if s >= self._loaded_to:
                        w.uncount(s)
                elif s < self._loaded_to:               # its slot was read already
                    self._enqueue(due, off)

    def _enqueue(self, due: int, off: int) -> None:
        """Hold a timer row in memory until due (unless delivered before a crash)."""
        if self._seen.pop((self.timer_queue, off), None) is not None:
            return
        self._push_soon(due, off)

    def _push_soon(self, due: int, off: int) -> None:
        heapq.heappush(self._soon, (due, off))
        self._soon_due[off] = due

    def _load_slot(self, second: int) -> None:
        """Read timer slot ``second`` into memory (its rows wait for delivery there)."""
        recalled = self._recalled.get(self.timer_queue, set())
        for due, off in self.wheel.walk(second):
            if off in recalled:
                recalled.discard(off)
            elif off not in self._soon_due:
                self._enqueue(due, off)
        self._loaded_to = second + 1

    def _load_due(self, now: int) -> None:
        """Read the slots up to LOOKAHEAD_MS ahead (while fewer than SOON_MAX wait)."""
        w = self.wheel
        target = (now + LOOKAHEAD_MS) // 1000 + 1       # load seconds below it
        target = min(target, w.wheel_second + w.slot_count)
        while self._loaded_to < target and len(self._soon_due) < SOON_MAX:
            nxt = w.next_busy(self._loaded_to, target)
            if nxt is None:
                self._loaded_to = target
                break
            self._load_slot(nxt)

    def _timer_due(self, now: int, limit: int, items: list) -> None:
        while self._soon and self._soon[0][0] <= now and limit > 0:
            due, off = heapq.heappop(self._soon)
            if self._soon_due.get(off) != due:
                continue                                  # recalled
            del self._soon_due[off]
            items.append((due, self.timer_queue, off))
            limit -= 1

    def _on_arrival(self, topic: str, qid: int, max_offset: int) -> None:
        if topic == SCHEDULE_TOPIC:
            self.wake()

    # ------------------------------------------------------------ delivering
    def run_once(self) -> None:
        self.run_due()

    def wait_s(self) -> float:
        """Until the next parked message is due (at most ``max_wait_s``)."""
        nxt = self.next_due_ms()
        if nxt is None:
            return self.max_wait_s
        return min(self.max_wait_s, max(0.0, (nxt - self.clock_ms()) / 1000.0))

    def run_due(self) -> int:
        """Index newly parked messages and deliver every due one now; returns how many."""
        with self._run_lock:
            total = 0
            while True:
                items: list[tuple[int, int, int]] = []
                with self._lock:
                    if self.wheel is None:
                        return total
                    now = self.clock_ms()
                    self._index_tail()
                    self._load_due(now)
                    moves = {}
                    for qid in self._cursor:
                        if len(items) >= DELIVER_BATCH:
                            break
                        moves[qid] = self._level_due(qid, now, DELIVER_BATCH - len(items),
                                                     items)
                    self._timer_due(now, DELIVER_BATCH - len(items), items)
                if not items and all(m == self._cursor[q] for q, m in moves.items()):
                    if not self._move_wheel_for_tail():
                        break
                    continue
                self._deliver(items, moves)
                total += len(items)
            self._maybe_persist()
            return total

    def _move_wheel_for_tail(self) -> bool:
        """Indexing waits for a wheel lagging the clock by over WHEEL_MARGIN_S (a broker down,
        no pass for long): persist now to move it; whether it moved (then index again)."""
        with self._lock:
            w = self.wheel
            if w is None or self._blocked_at != w.indexed_up_to:
                return False
            second = w.wheel_second
        self.persist()
        with self._lock:
            return self.wheel is w and w.wheel_second > second

    def _deliver(self, items: list[tuple[int, int, int]], moves: dict[int, int]) -> None:
        table = real_table(self.store, items, self.clock_ms()) if items else None
        try:
            if table is not None and table.num_rows:
                self.store.append_batch(table, limits_checked=True)   # accepted at send
        except BaseException:
            with self._lock:
                for due, qid, off in items:
                    if qid == self.timer_queue:
                        self._push_soon(due, off)
            raise
        with self._lock:
            self._cursor.update(moves)
        n = 0 if table is None else table.num_rows
        self.delivered_total += n
        if self.on_delivered is not None and n:
            self.on_delivered(n)

    def _maybe_persist(self) -> None:
        """Persist progress every persist_interval_ms, but not while the next message is
        due within PERSIST_SLACK_MS (a log commit then would make it late), unless progress
        is 10 intervals old."""
        now = self.clock_ms()
        age = now - self._last_persist_ms
        if age < self.persist_interval_ms:
            return
        nxt = self.next_due_ms()
        if nxt is not None and nxt - now < PERSIST_SLACK_MS and age < 10 * self.persist_interval_ms:
            return
        self.persist()

    def persist(self) -> None:
        """Move the wheel past the delivered seconds (its files first, made durable), then
        commit each schedule queue's lowest undelivered offset (if it moved)."""
        with self._lock:
            w = self.wheel
            if w is None:
                return
            floors = dict(self._cursor)
            done = min(self._loaded_to - 1, self.clock_ms() // 1000)
            if self._soon:
                done = min(done, max(w.wheel_second, self._soon[0][0] // 1000))
            w.advance(done)
            w.flush()
            floors[self.timer_queue] = min(w.lowest_offset(), w.indexed_up_to,
                                           min(self._soon_due, default=w.indexed_up_to))
            for qid, cur in floors.items():      # recalls below the progress are passed
                rec = self._recalled.get(qid)
                if rec and qid != self.timer_queue:
                    rec.difference_update([o for o in rec if o < cur])
            if self._seen:
                self._forget_seen()
        changed = {(SCHEDULE_TOPIC, q): f for q, f in floors.items() if f != self._committed.get(q)}
        self._last_persist_ms = self.clock_ms()
        if changed:
            self.store.commit_consumer_offsets(SCHEDULE_GROUP, changed)
            for (_, q), f in changed.items():
                self._committed[q] = f
