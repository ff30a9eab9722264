"""Delayed messages: RocketMQ's ``messageDelayLevel`` levels and 5.x delivery timestamps.

Contract:
- ``DelayPolicy`` turns a send's delay (a level 1..N via the ``DELAY`` user property, or a
  delivery timestamp) into ``(schedule queue, due ms)``; a delay beyond ``maxDelayMs``
  (default 3 days) or an unknown level raises ``DelayRefused``; a due time already past means
  "deliver now" (``None``).
- Parked messages are ordinary rows of the system topic ``SCHEDULE_TOPIC_XXXX`` (queue
  ``level-1`` per level, queue ``N`` for arbitrary timestamps) with ``delivery_timestamp`` =
  due time and the real topic in property ``REAL_TOPIC``: Spark readers of the real topic do
  not see them; admin tools do (the system topic is readable).
- ``ScheduleService`` (thread ``sparkmq-schedule``; ``start()``/``stop()``, injected
  ``clock_ms``) keeps every parked, undelivered message in a heap by due time, woken by the
  store's arrival listener and by a timer for the earliest due time (no polling loop), at most
  one delivery pass per ``tick_ms`` (50 ms), so messages falling due close together go out as
  one append. Due messages are re-appended to their real topic (same body, tags, keys, properties, unique key
  and ``delivery_timestamp``; property ``SCHEDULE_SOURCE`` = ``"queue:offset"`` of the parked
  copy), never before ``clock_ms() >= due``.
- Progress: per schedule queue, the lowest undelivered offset is committed with
  ``Store.commit_consumer_offsets`` under group ``SCHEDULE_GROUP`` (every ``persist_interval_ms``
  and at ``stop()``). ``start()`` rebuilds the heap from there; a parked message already due that
  the real topic holds a copy of (by ``SCHEDULE_SOURCE``) is not delivered again, so restart
  and crash neither lose nor duplicate a delivery.
- Recall (5.x RecallMessage): ``recall(queue, offset)`` cancels a parked message that is not
  delivered yet. The recall is stored first (a row ``"queue:offset"`` in the system topic
  ``rmq_sys_SCHEDULE_RECALL``), then the message leaves the heap; ``start()`` skips recalled
  messages, so a recall survives restart and crash. ``make_recall_handle`` /
  ``parse_recall_handle`` encode where the parked copy lives (returned with the send).
- Thread-safety: ``wake()``, ``run_due()``, ``recall()``, ``pending_count()`` may be called from
  any thread.
"""

from __future__ import annotations

import base64
import heapq
import logging
import re
import threading
import time
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import DelayRefused, SparkMQError, UserError
from ..log import format as fmt
from ..log.batch import build_segment_batch
from ..lifecycle import ServiceThread
from ..log.message import Message

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_GROUP = "SCHEDULE_CONSUMER_GROUP"
RECALL_TOPIC = "rmq_sys_SCHEDULE_RECALL"
RECALL_HANDLE_VERSION = "v1"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_DELAY_LEVEL = "DELAY"                  # RocketMQ MessageConst.PROPERTY_DELAY_TIME_LEVEL
PROP_SOURCE = "SCHEDULE_SOURCE"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_MAX_DELAY_MS = 3 * 24 * 3600 * 1000
DELIVER_BATCH = 256
PERSIST_SLACK_MS = 200
_PARKED_COLUMNS = ["queue_offset", "body", "tags", "keys", "properties", "born_timestamp",
                   "born_host", "delivery_timestamp", "unique_key"]
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 1m 2h"`` -> milliseconds per level (level 1 first)."""
    out = []
    for item in text.split():
        m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", item.strip())
        if m is None:
            raise UserError(f"messageDelayLevel item {item!r} is not <number><ms|s|m|h|d>")
        out.append(int(m.group(1)) * _UNIT_MS[m.group(2)])
    if not out:
        raise UserError("messageDelayLevel is empty")
    return out


class DelayPolicy:
    """Where and until when a delayed message is parked. Immutable; thread-safe."""

    def __init__(self, levels_ms: list[int], max_delay_ms: int = DEFAULT_MAX_DELAY_MS):
        self.levels_ms = list(levels_ms)
        self.max_delay_ms = max_delay_ms

    @property
    def timer_queue(self) -> int:
        """The schedule queue of arbitrary delivery timestamps (after the level queues)."""
        return len(self.levels_ms)

    @property
    def queue_count(self) -> int:
        return len(self.levels_ms) + 1

    def park(self, now_ms: int, *, level: int | None = None,
             deliver_at_ms: int | None = None) -> tuple[int, int] | None:
        """(schedule queue, due ms), or None to deliver at once (level 0, a past timestamp)."""
        if level is not None:
            if level <= 0:
                return None
            if level > len(self.levels_ms):
                raise DelayRefused(f"delay level {level} does not exist; levels are 1.."
                                   f"{len(self.levels_ms)} (messageDelayLevel)")
            return level - 1, now_ms + self.levels_ms[level - 1]
        if deliver_at_ms is None or deliver_at_ms <= now_ms:
            return None
        if deliver_at_ms - now_ms > self.max_delay_ms:
            raise DelayRefused(
                f"delivery time is {deliver_at_ms - now_ms} ms ahead; at most {self.max_delay_ms}"
                " ms (maxDelayMs) is allowed")
        return self.timer_queue, deliver_at_ms


def parked_row(policy: DelayPolicy, now_ms: int, topic: str, properties: dict[str, str],
               deliver_at_ms: int | None) -> tuple[str, int | None, int | None, dict]:
    """(topic, queue id or None, delivery ms or None, properties) for one sent message: the
    schedule topic if it must wait, else the real topic unchanged. Raises DelayRefused."""
    level = None
    raw = properties.get(PROP_DELAY_LEVEL)
    if raw is not None:
        try:
            level = int(raw)
        except ValueError:
            raise DelayRefused(f"{PROP_DELAY_LEVEL} property {raw!r} is not a level number") from None
    parked = policy.park(now_ms, level=level, deliver_at_ms=None if level else deliver_at_ms)
    if parked is None:
        return topic, None, deliver_at_ms, properties
    qid, due = parked
    props = {k: v for k, v in properties.items() if k != PROP_DELAY_LEVEL}
    props[PROP_REAL_TOPIC] = topic
    return SCHEDULE_TOPIC, qid, due, props


def make_recall_handle(topic: str, broker_name: str, qid: int, offset: int,
                       message_id: str) -> str:
    """An opaque handle naming a parked message: ``v1 topic broker queue offset id``,
    base64url (RocketMQ's handles are base64 text of the same kind)."""
    text = f"{RECALL_HANDLE_VERSION} {topic} {broker_name} {qid} {offset} {message_id}"
    return base64.urlsafe_b64encode(text.encode()).decode()


def parse_recall_handle(handle: str) -> tuple[str, str, int, int, str]:
    """(topic, broker name, schedule queue, offset, message id); raises UserError."""
    try:
        parts = base64.urlsafe_b64decode(handle.encode()).decode().split(" ")
        if len(parts) != 6 or parts[0] != RECALL_HANDLE_VERSION:
            raise ValueError(parts[:1])
        return parts[1], parts[2], int(parts[3]), int(parts[4]), parts[5]
    except (ValueError, UnicodeError) as e:
        raise UserError(f"recall handle {handle[:40]!r} is malformed ({e}); use the "
                        "recall_handle returned by the send of a delayed message") from None


class RecallStatus:
    RECALLED = "RECALLED"
    NOT_FOUND = "NOT_FOUND"          # delivered already, recalled already, or never parked


#: Delivery passes are at least this far apart (ms): due messages are batched per tick.
DEFAULT_TICK_MS = 50


class ScheduleService(ServiceThread):
    """Delivers parked messages when due (see module docstring). Thread-safe; one
    ``sparkmq-schedule`` thread delivers, at most one pass per ``tick_ms``."""

    name = "schedule"

    def __init__(self, store, policy: DelayPolicy, *, clock_ms: Callable[[], int] | None = None,
                 persist_interval_ms: int = 1000, max_wait_s: float = 5.0,
                 on_delivered: Callable[[int], None] | None = None,
                 tick_ms: int = DEFAULT_TICK_MS):
        super().__init__(interval_ms=int(max_wait_s * 1000))
        self.store = store
        self.tick_ms = self.min_pass_interval_ms = tick_ms
        self.policy = policy
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.persist_interval_ms = persist_interval_ms
        self.max_wait_s = max_wait_s
        self.on_delivered = on_delivered
        self.delivered_total = 0
        self._lock = threading.RLock()
        self._run_lock = threading.Lock()
        self._heap: list[tuple[int, int, int]] = []     # (due ms, queue, offset)
        self._pending: dict[int, set[int]] = {}         # queue -> undelivered parked offsets
        self._scanned: dict[int, int] = {}              # queue -> next offset to load
        self._committed: dict[int, int] = {}
        self._recalled: set[tuple[int, int]] = set()   # recalled, still in the heap
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
        self._rebuild()
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

    def wake(self) -> None:
        """Re-evaluate now (after an injected clock moved, or new parked messages)."""
        self.wakeup()

    def pending_count(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._pending.values())

    def next_due_ms(self) -> int | None:
        with self._lock:
            return self._heap[0][0] if self._heap else None

    # ------------------------------------------------------------ loading
    def _rebuild(self) -> None:
        offsets = self.store.consumer_offsets(SCHEDULE_GROUP)
        now = self.clock_ms()
        maybe_done: list[tuple[int, int, int, str, int]] = []
        recalled = self._stored_recalls()
        for qid in range(self.policy.queue_count):
            floor = max(offsets.get((SCHEDULE_TOPIC, qid), 0),
                        self.store.min_offset(SCHEDULE_TOPIC, qid))
            self._scanned[qid] = self._committed[qid] = floor
            self._pending[qid] = set()
            for due, off, real, stored in self._load(qid):
                if (qid, off) in recalled:
                    continue
                if due <= now:
                    maybe_done.append((due, qid, off, real, stored))
                else:
                    self._push(due, qid, off)
        done = self._already_delivered(maybe_done)
        for due, qid, off, _, _ in maybe_done:
            if (qid, off) not in done:
                self._push(due, qid, off)

    def _stored_recalls(self) -> set[tuple[int, int]]:
        t = self.store.read_table(RECALL_TOPIC, 0, 0, columns=["body"], on_removed="skip")
        out = set()
        for body in t.column("body").to_pylist():
            a, b = body.decode().split(":")
            out.add((int(a), int(b)))
        return out

    def recall(self, qid: int, offset: int) -> str:
        """Cancel parked message ``qid:offset`` if it is not delivered yet (RecallStatus).
        The recall is stored before it takes effect; a delivery never races it."""
        with self._run_lock:
            with self._lock:
                if qid not in self._pending:
                    return RecallStatus.NOT_FOUND
                for due, off, _, _ in self._load(qid):
                    self._push(due, qid, off)
                if offset not in self._pending[qid] or (qid, offset) in self._recalled:
                    return RecallStatus.NOT_FOUND
            self.store.append([Message(RECALL_TOPIC, f"{qid}:{offset}".encode(), queue_id=0)])
            with self._lock:
                self._pending[qid].discard(offset)
                self._recalled.add((qid, offset))
            self.wakeup()
            log.info("schedule service: parked message %d:%d recalled", qid, offset)
            return RecallStatus.RECALLED

    def _load(self, qid: int) -> list[tuple[int, int, str, int]]:
        """(due, offset, real topic, store ms) of parked messages from ``_scanned[qid]`` on."""
        out = []
        hi = self.store.max_offset(SCHEDULE_TOPIC, qid)
        while self._scanned[qid] < hi:
            t = self.store.read_table(SCHEDULE_TOPIC, qid, self._scanned[qid],
                                      min(hi, self._scanned[qid] + 4096),
                                      columns=["queue_offset", "delivery_timestamp",
                                               "properties", "store_timestamp"],
                                      on_removed="skip")
            if t.num_rows == 0:
                self._scanned[qid] = hi
                break
            for r in t.to_pylist():
                props = dict(r["properties"] or [])
                out.append((_ms(r["delivery_timestamp"]), r["queue_offset"],
                            props.get(PROP_REAL_TOPIC, ""), _ms(r["store_timestamp"])))
            self._scanned[qid] = t.column("queue_offset")[-1].as_py() + 1
        return out

    def _already_delivered(self, candidates) -> set[tuple[int, int]]:
        """The (queue, offset) of due candidates whose copy the real topic already holds."""
        found: set[tuple[int, int]] = set()
        by_topic: dict[str, int] = {}
        for _, _, _, real, stored in candidates:
            if real in self.store.topics():
                by_topic[real] = min(stored, by_topic.get(real, stored))
        for topic, since in by_topic.items():
            for q in range(self.store.topics()[topic].read_queue_nums):
                start = self.store.offset_for_time(topic, q, since)
                t = self.store.read_table(topic, q, start, columns=["properties"],
                                          on_removed="skip")
                for props in t.column("properties").to_pylist():
                    src = dict(props or []).get(PROP_SOURCE)
                    if src:
                        a, b = src.split(":")
                        found.add((int(a), int(b)))
        return found

    def _push(self, due: int, qid: int, off: int) -> None:
        heapq.heappush(self._heap, (due, qid, off))
        self._pending[qid].add(off)

    def _on_arrival(self, topic: str, qid: int, max_offset: int) -> None:
        if topic == SCHEDULE_TOPIC:
            self.wake()

    # ------------------------------------------------------------ delivering
    def run_once(self) -> None:
        self.run_due()

    def wait_s(self) -> float:
        """Until the next parked message is due (at most ``max_wait_s``)."""
        with self._lock:
            return self._next_wait_s()

    def _next_wait_s(self) -> float:
        if not self._heap:
            return self.max_wait_s
        return min(self.max_wait_s, max(0.0, (self._heap[0][0] - self.clock_ms()) / 1000.0))

    def run_due(self) -> int:
        """Load newly parked messages and deliver every due one now; returns how many."""
        with self._run_lock:
            with self._lock:
                for qid in self._pending:
                    for due, off, _, _ in self._load(qid):
                        self._push(due, qid, off)
            total = 0
            while True:
                with self._lock:
                    now = self.clock_ms()
                    due = []
                    while self._heap and self._heap[0][0] <= now and len(due) < DELIVER_BATCH:
                        item = heapq.heappop(self._heap)
                        if (item[1], item[2]) in self._recalled:
                            self._recalled.discard((item[1], item[2]))
                            continue
                        due.append(item)
                if not due:
                    break
                self._deliver(due)
                total += len(due)
            self._maybe_persist()
            return total

    def _deliver(self, due: list[tuple[int, int, int]]) -> None:
        table = self._real_table(due)
        try:
            if table is not None and table.num_rows:
                self.store.append_batch(table, limits_checked=True)   # accepted at send
        except BaseException:
            with self._lock:
                for item in due:
                    heapq.heappush(self._heap, item)
            raise
        with self._lock:
            for _, qid, off in due:
                self._pending[qid].discard(off)
        n = 0 if table is None else table.num_rows
        self.delivered_total += n
        if self.on_delivered is not None and n:
            self.on_delivered(n)

    def _real_table(self, due: list[tuple[int, int, int]]):
        """The due parked messages as their real-topic rows, one Arrow table (columnar: no
        per-message Python objects but the properties). Parked messages removed by retention
        meanwhile, or whose topic is gone (logged), are left out."""
        wanted: dict[int, list[int]] = {}
        for _, qid, off in due:
            wanted.setdefault(qid, []).append(off)
        live = set(self.store.topics())
        tables = []
        for qid, offs in wanted.items():
            lo, hi = min(offs), max(offs)
            t = self.store.read_table(SCHEDULE_TOPIC, qid, lo, hi + 1, columns=_PARKED_COLUMNS,
                                      on_removed="skip")
            if len(offs) != hi - lo + 1:
                t = t.filter(pc.is_in(t.column("queue_offset"), pa.array(offs, pa.int64())))
            props_out, topics, keep = [], [], []
            for i, (off, props) in enumerate(zip(t.column("queue_offset").to_pylist(),
                                                 t.column("properties").to_pylist())):
                d = dict(props or [])
                real = d.pop(PROP_REAL_TOPIC, None)
                if real not in live:
                    log.error("schedule service: dropping parked message %s:%d, its topic %r "
                              "no longer exists", qid, off, real)
                    continue
                d[PROP_SOURCE] = f"{qid}:{off}"
                keep.append(i)
                topics.append(real)
                props_out.append(list(d.items()))
            if not keep:
                continue
            if len(keep) != t.num_rows:
                t = t.take(pa.array(keep, pa.int64()))
            tables.append(pa.table({
                "topic": pa.array(topics, pa.string()), "body": t.column("body"),
                "tags": t.column("tags"), "keys": t.column("keys"),
                "properties": pa.array(props_out, pa.map_(pa.string(), pa.string())),
                "born_timestamp": t.column("born_timestamp"), "born_host": t.column("born_host"),
                "delivery_timestamp": t.column("delivery_timestamp"),
                "unique_key": t.column("unique_key"),
            }))
        if not tables:
            return None
        t = (tables[0] if len(tables) == 1 else pa.concat_tables(tables)).combine_chunks()
        return _segment_batch(t, self.store.config.store_host, self.clock_ms())

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
        """Commit each schedule queue's lowest undelivered offset (if it moved)."""
        with self._lock:
            floors = {qid: (min(p) if p else self._scanned[qid])
                      for qid, p in self._pending.items()}
        changed = {(SCHEDULE_TOPIC, q): f for q, f in floors.items() if f != self._committed.get(q)}
        self._last_persist_ms = self.clock_ms()
        if changed:
            self.store.commit_consumer_offsets(SCHEDULE_GROUP, changed)
            for (_, q), f in changed.items():
                self._committed[q] = f


def _segment_batch(t: pa.Table, store_host: str, now_ms: int) -> pa.RecordBatch:
    """Delivered rows as one batch in SEGMENT_SCHEMA, built by the log's one builder so
    ``Store.append_batch`` takes its no-cast path (queue ids null: the store's queue
    chooser places them; store time stamped by the store)."""
    cols = {name: t.column(name) for name in (
        "topic", "body", "tags", "keys", "properties", "born_timestamp", "born_host",
        "delivery_timestamp", "unique_key")}
    cols["store_timestamp"] = t.column("born_timestamp")
    cols["message_type"] = pa.repeat(pa.scalar(fmt.MESSAGE_TYPE_DELAY, pa.int8()), t.num_rows)
    return build_segment_batch(cols, t.num_rows, store_host=store_host, now_ms=now_ms)


def _ms(v) -> int:
    if v is None:
        return 0
    return v if isinstance(v, int) else int(v.timestamp() * 1000)
