"""Transactional messages: half messages, EndTransaction, check-back over Telemetry.

Contract:
- ``TransactionService.prepare_row`` turns a sent TRANSACTION message into a *half* message:
  topic ``RMQ_SYS_TRANS_HALF_TOPIC`` (queue 0), the real topic in property ``REAL_TOPIC``, the
  sending client in ``TRANS_CLIENT_ID`` and a fresh transaction id. Consumers and Spark
  readers of the real topic do not see it.
- ``end(transaction_id, commit, topic)``: COMMIT appends the real message (same body, tags,
  keys, properties, unique key; type TRANSACTION) to its topic and an op record to
  ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` in ONE store append (one record batch: both or neither);
  ROLLBACK appends only the op. An unknown or already resolved transaction, or one of
  another topic than ``topic`` (the request's, which the caller was authorized for: as the
  proxy finds a transaction by topic and id), raises ``UnknownTransaction``.
- A half message unresolved ``transaction_timeout_ms`` (transactionTimeOut, 6 s) after it was
  stored is checked back; a producer may ask for a later first check with property
  ``CHECK_IMMUNITY_TIME_IN_SECONDS`` (the gRPC SystemProperties'
  ``orphaned_transaction_recovery_duration``, ``protocol.transaction_properties``): the first
  check is then that many seconds after the store time, never earlier than
  transactionTimeOut; a value that is not a whole number counts as absent
  (``first_check_delay_ms``, RocketMQ's ``TransactionalMessageUtil.getImmunityTime``). A
  ``RecoverOrphanedTransactionCommand`` goes to the sending producer's Telemetry stream (or
  another producer of the topic) every ``check_interval_ms`` (transactionCheckInterval), up
  to ``check_max`` (transactionCheckMax, 15) times.
- Check-max: at its next due check after that, the half message is given up: ONE store append
  holds its copy in system topic ``TRANS_CHECK_MAX_TIME_TOPIC`` (1 queue, read/write, created
  when first needed) and the op (tag ``x``), both or neither. The copy is the half message as
  stored (body, tags, keys, every property: ``REAL_TOPIC``, ``TRANS_CLIENT_ID``, the user's;
  transaction id, unique key, born time and host) plus ``TRANSACTION_CHECK_TIMES``, as
  RocketMQ's ``DefaultTransactionalMessageCheckListener.resolveDiscardMsg`` keeps it, so an
  operator can find it and send it again; nothing delivers it to its real topic.
- State is the store: on ``start()`` the pending set is rebuilt from the half topic (from the
  half floor, the committed offset of group ``TRANS_CHECK_GROUP`` on (half topic, 0)) minus
  the op topic, read from the op floor (that group's offset on (op topic, 0)). ``persist()``
  commits both floors in one commit: the half floor is the lowest pending half message (or
  the end of those loaded); the op floor the first op record naming a half message at or
  above it (or the op queue's end), so every op below it names a half message below the half
  floor and a restart reads only the ops it needs (retention: ``on_removed="skip"``). Every
  check-back is recorded as an op too (tag ``k``, property ``checks``; one append per pass),
  so check counts and the time of the next check survive a restart: a restarted broker does
  not grant a half message another ``transactionCheckMax`` checks.
- ``ProducerStreams``: the open Telemetry streams (client id -> outbound queue, topics);
  thread-safe.
- Thread ``sparkmq-transaction-check`` (``start()``/``stop()``), woken by a condition at the
  earliest due check (no polling loop); ``run_checks()`` runs one pass synchronously (tests).
"""

from __future__ import annotations

import heapq
import logging
import queue
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from ..errors import DataLossError, SparkMQError, UnknownTransaction, UserError  # noqa: F401
from ..log import format as fmt
from ..lifecycle import ServiceThread
from ..log.actions import PERM_RW
from ..log.message import Message

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"   # TopicValidator.RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC
CHECK_GROUP = "TRANS_CHECK_GROUP"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_CLIENT_ID = "TRANS_CLIENT_ID"
PROP_CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"    # MessageConst names
PROP_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
OP_COMMIT, OP_ROLLBACK, OP_EXPIRED = "c", "r", "x"
OP_CHECKED = "k"              # a check-back was sent (not a resolution)
PROP_CHECKS = "checks"
_OP_SCAN_STEP = 1024          # op records read at a time while the op floor moves
_JAVA_LONG = re.compile(r"[+-]?\d+")     # what Java's Long.parseLong takes (no blanks, no "_")


def first_check_delay_ms(properties, timeout_ms: int) -> int:
    """How long after it was stored a half message is first checked back: ``timeout_ms``
    (transactionTimeOut), or its ``CHECK_IMMUNITY_TIME_IN_SECONDS`` when that is longer.
    A value Java's ``Long.parseLong`` refuses ("", "1.5", " 3", "x", beyond a long) counts
    as absent. This is RocketMQ's ``TransactionalMessageUtil.getImmunityTime`` (the rule
    EndTransactionProcessor applies; its check loop's private copy lets a shorter value
    through, which the Util version's "minimum check time" rule does not)."""
    value = (properties or {}).get(PROP_CHECK_IMMUNITY_S)
    if value is None or not _JAVA_LONG.fullmatch(value):
        return timeout_ms
    seconds = int(value)
    if not -2 ** 63 <= seconds < 2 ** 63:
        return timeout_ms
    return max(seconds * 1000, timeout_ms)


class ProducerStreams:
    """Open Telemetry streams of producers: ``client id -> (outbound queue, topics)``."""

    def __init__(self):
        self._lock = threading.Lock()
        self._streams: dict[str, tuple[queue.Queue, set[str]]] = {}

    def open(self, client_id: str, q=None):
        """Register ``client_id``'s stream; ``q`` (anything with ``put``, e.g. the stream's
        ``telemetry.Outbox``; default a new ``queue.Queue``) receives its commands."""
        q = queue.Queue() if q is None else q
        with self._lock:
            self._streams[client_id] = (q, set())
        return q

    def set_topics(self, client_id: str, topics) -> None:
        with self._lock:
            if client_id in self._streams:
                self._streams[client_id][1].update(topics)

    def close(self, client_id: str, q: queue.Queue) -> None:
        with self._lock:
            if self._streams.get(client_id, (None,))[0] is q:
                del self._streams[client_id]

    def producers(self, topic: str) -> list[str]:
        """Client ids of the open streams whose producers publish to ``topic``."""
        with self._lock:
            return sorted(c for c, (_, topics) in self._streams.items() if topic in topics)

    def send(self, client_id: str | None, topic: str, command) -> str | None:
        """Queue ``command`` to ``client_id``'s stream, else to a producer of ``topic``;
        returns the client id used, or None if no producer is connected."""
        with self._lock:
            target = self._streams.get(client_id) if client_id else None
            cid = client_id
            if target is None:
                for c, (q, topics) in self._streams.items():
                    if topic in topics:
                        target, cid = (q, topics), c
                        break
        if target is None:
            return None
        target[0].put(command)
        return cid


@dataclass
class Half:
    offset: int
    transaction_id: str
    real_topic: str
    client_id: str | None
    next_check_ms: int
    checks: int = 0


class TransactionService(ServiceThread):
    """Half messages and their resolution (see module docstring). Its
    ``sparkmq-transaction-check`` thread wakes at the next due check (at most 5 s)."""

    name = "transaction-check"
    retry_after_failure_s = 0.1

    def __init__(self, store, streams: ProducerStreams, *, make_command: Callable,
                 clock_ms: Callable[[], int] | None = None, timeout_ms: int = 6000,
                 check_interval_ms: int = 6000, check_max: int = 15,
                 on_topic_created: Callable[[str], None] | None = None):
        self.store = store
        self.on_topic_created = on_topic_created     # told when CHECK_MAX_TOPIC is created
        self.streams = streams
        self.make_command = make_command      # (StoredMessage, transaction id) -> TelemetryCommand
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.timeout_ms = timeout_ms
        self.check_interval_ms = check_interval_ms
        self.check_max = check_max
        super().__init__(interval_ms=5000)
        self._lock = threading.RLock()
        self._by_txid: dict[str, Half] = {}
        self._by_offset: dict[int, Half] = {}
        self._heap: list[tuple[int, int]] = []     # (next check ms, half offset)
        self._scanned = 0
        self._op_floor = 0          # every op below it names a half below _op_floor_half
        self._op_floor_half = 0
        self._op_floor_exact = False    # _op_floor names a half >= _op_floor_half
        self._committed = (0, 0)    # (half floor, op floor) last committed
        self.rolled_back_unresolved = 0
        self.rebuild_ops_read = 0   # op records the last start read

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "TransactionService":
        for t in (HALF_TOPIC, OP_TOPIC):
            if t not in self.store.topics():
                self.store.create_topic(t, read_queue_nums=1, write_queue_nums=1, system=True,
                                        exist_ok=True)
        self._rebuild()
        super().start()
        log.info("transaction service: %d half message(s) pending", len(self._by_offset))
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the check thread, then persist the half and op floors."""
        super().stop(timeout_s)
        try:
            self.persist()
        except SparkMQError as e:
            log.error("transaction service: could not persist progress: %s", e)

    def pending(self) -> list[Half]:
        with self._lock:
            return sorted(self._by_offset.values(), key=lambda h: h.offset)

    # ------------------------------------------------------------ state
    def _rebuild(self) -> None:
        offsets = self.store.consumer_offsets(CHECK_GROUP)
        half_floor = offsets.get((HALF_TOPIC, 0), 0)
        op_floor = offsets.get((OP_TOPIC, 0), 0)    # absent (an older store): all of it
        self._committed = (half_floor, op_floor)
        self._scanned = max(half_floor, self.store.min_offset(HALF_TOPIC, 0))
        self._op_floor, self._op_floor_half, self._op_floor_exact = op_floor, half_floor, False
        done = set()
        checked: dict[int, tuple[int, int]] = {}       # half offset -> (checks, last check ms)
        t = self.store.read_table(OP_TOPIC, 0, op_floor, columns=[
            "body", "tags", "properties", "store_timestamp"], on_removed="skip")
        self.rebuild_ops_read = t.num_rows
        ts = t.column("store_timestamp").cast("int64").to_pylist()
        for body, tag, props, at in zip(t.column("body").to_pylist(),
                                        t.column("tags").to_pylist(),
                                        t.column("properties").to_pylist(), ts):
            off = int(body)
            if tag != OP_CHECKED:
                done.add(off)
                continue
            n = int(dict(props or ()).get(PROP_CHECKS, 0))
            if n >= checked.get(off, (0, 0))[0]:
                checked[off] = (n, at)
        self._load(skip=done, checked=checked)

    def _load(self, skip=frozenset(), checked=None) -> None:
        hi = self.store.max_offset(HALF_TOPIC, 0)
        while self._scanned < hi:
            msgs = self.store.read(HALF_TOPIC, 0, self._scanned, 1024)
            if not msgs:
                break
            for m in msgs:
                self._scanned = m.queue_offset + 1
                if m.queue_offset in skip or m.queue_offset in self._by_offset:
                    continue
                h = Half(m.queue_offset, m.transaction_id, m.properties.get(PROP_REAL_TOPIC, ""),
                         m.properties.get(PROP_CLIENT_ID),
                         m.store_timestamp + first_check_delay_ms(m.properties, self.timeout_ms))
                if checked and m.queue_offset in checked:
                    h.checks, last_ms = checked[m.queue_offset]
                    h.next_check_ms = last_ms + self.check_interval_ms
                self._by_txid[h.transaction_id] = h
                self._by_offset[h.offset] = h
                heapq.heappush(self._heap, (h.next_check_ms, h.offset))

    def prepare_row(self, topic: str, properties: dict, client_id: str | None
                    ) -> tuple[str, dict, str]:
        """(half topic, properties, transaction id) for a sent TRANSACTION message."""
        props = dict(properties)
        props[PROP_REAL_TOPIC] = topic
        if client_id:
            props[PROP_CLIENT_ID] = client_id
        return HALF_TOPIC, props, uuid.uuid4().hex.upper()

    def on_stored(self) -> None:
        """Call after half messages were appended: load them and re-arm the timer."""
        with self._lock:
            self._load()
        self.wakeup()

    # ------------------------------------------------------------ resolution
    def end(self, transaction_id: str, commit: bool | None, topic: str | None = None) -> None:
        """Commit or roll back the pending transaction (``commit`` None: neither, it is
        left to the check-back; UnknownTransaction all the same if it is not pending)."""
        with self._lock:
            self._load()
            h = self._by_txid.get(transaction_id)
            if h is None:
                raise UnknownTransaction(
                    f"transaction {transaction_id!r} is not pending on this broker (unknown, "
                    "already committed or rolled back)")
            if topic is not None and topic != h.real_topic:
                raise UnknownTransaction(
                    f"transaction {transaction_id!r} is not pending for topic {topic!r}; "
                    "end it with the topic its message was sent to")
            if commit is not None:
                self._resolve(h, OP_COMMIT if commit else OP_ROLLBACK)

    def _resolve(self, h: Half, op: str) -> None:
        """Append the op (and for a commit, the real message; for a check-max give-up, the
        copy in CHECK_MAX_TOPIC) in one batch. Holds _lock."""
        out = [Message(topic=OP_TOPIC, body=str(h.offset).encode(), tags=op,
                       properties={"transactionId": h.transaction_id})]
        if op == OP_COMMIT:
            half = self._half_message(h)
            if half is None:
                raise UnknownTransaction(f"half message of {h.transaction_id} is gone (retention)")
            if h.real_topic not in self.store.state.topics:     # (no copy: a request's)
                raise UnknownTransaction(f"topic {h.real_topic!r} of {h.transaction_id} is gone")
            out.insert(0, _real_message(half))
        elif op == OP_EXPIRED:
            half = self._half_message(h)
            if half is None:
                log.error("transaction %s: half message %d is gone (retention); given up with "
                          "no copy in %s", h.transaction_id, h.offset, CHECK_MAX_TOPIC)
            else:
                self._ensure_check_max_topic()
                out.insert(0, _check_max_message(half, h.checks))
        # (a check-max copy carries the broker's properties on top of what the send accepted)
        self.store.append(out, limits_checked=op == OP_EXPIRED)
        del self._by_txid[h.transaction_id]
        del self._by_offset[h.offset]

    def _half_message(self, h: Half):
        """The stored half message of ``h``, or None if retention removed it."""
        try:
            rows = self.store.read(HALF_TOPIC, 0, h.offset, 1)
        except DataLossError:
            return None
        return rows[0] if rows and rows[0].queue_offset == h.offset else None

    def _ensure_check_max_topic(self) -> None:
        """Create CHECK_MAX_TOPIC when absent, as RocketMQ's
        ``TopicConfigManager.createTopicOfTranCheckMaxTime``: 1 queue, read and write."""
        if CHECK_MAX_TOPIC in self.store.topics():
            return
        self.store.create_topic(CHECK_MAX_TOPIC, read_queue_nums=1, write_queue_nums=1,
                                perm=PERM_RW, system=True, exist_ok=True)
        if self.on_topic_created is not None:
            self.on_topic_created(CHECK_MAX_TOPIC)

    # ------------------------------------------------------------ check-back
    def wait_s(self) -> float:
        with self._lock:
            if not self._heap:
                return self.interval_ms / 1000.0
            return min(self.interval_ms / 1000.0,
                       max(0.0, (self._heap[0][0] - self.clock_ms()) / 1000.0))

    def run_once(self) -> None:
        self.run_checks()

    def run_checks(self) -> int:
        """Check back (or expire) every half message whose check is due; returns how many."""
        n = 0
        with self._lock:
            self._load()
            now = self.clock_ms()
            records: list[Message] = []
            while self._heap and self._heap[0][0] <= now:
                _, off = heapq.heappop(self._heap)
                h = self._by_offset.get(off)
                if h is None:
                    continue
                n += 1
                if h.checks >= self.check_max:
                    log.warning("transaction %s (topic %s) unresolved after %d check(s): given "
                                "up, its half message kept in %s", h.transaction_id,
                                h.real_topic, h.checks, CHECK_MAX_TOPIC)
                    self._resolve(h, OP_EXPIRED)
                    self.rolled_back_unresolved += 1
                    continue
                self._check_back(h)
                h.checks += 1
                h.next_check_ms = now + self.check_interval_ms
                heapq.heappush(self._heap, (h.next_check_ms, h.offset))
                records.append(Message(topic=OP_TOPIC, body=str(h.offset).encode(),
                                       tags=OP_CHECKED,
                                       properties={"transactionId": h.transaction_id,
                                                   PROP_CHECKS: str(h.checks)}))
            if records:         # check counts survive a restart
                self.store.append(records)
        self.persist()
        return n

    def _check_back(self, h: Half) -> None:
        rows = self.store.read(HALF_TOPIC, 0, h.offset, 1)
        if not rows:
            return
        cmd = self.make_command(_real_message_view(rows[0]), h.transaction_id)
        sent_to = self.streams.send(h.client_id, h.real_topic, cmd)
        log.info("transaction %s: check-back #%d %s", h.transaction_id, h.checks + 1,
                 f"sent to {sent_to}" if sent_to else "found no connected producer")

    def persist(self) -> None:
        """Commit the half floor and the op floor (module docstring), in one commit."""
        with self._lock:
            half_floor = min(self._by_offset) if self._by_offset else self._scanned
            floors = (half_floor, self._advance_op_floor(half_floor))
        if floors != self._committed:
            self.store.commit_consumer_offsets(CHECK_GROUP, {(HALF_TOPIC, 0): floors[0],
                                                             (OP_TOPIC, 0): floors[1]})
            self._committed = floors

    def _advance_op_floor(self, half_floor: int) -> int:
        """The first op record naming a half message at or above ``half_floor``, else where
        the op queue ends. Floors only rise, so the scan goes on from the last op floor and
        reads each op record it passes once. Holds _lock (every op is appended under it)."""
        assert half_floor >= self._op_floor_half, "the half floor went down"
        if half_floor == self._op_floor_half and self._op_floor_exact:
            return self._op_floor
        end = self.store.max_offset(OP_TOPIC, 0)
        at = self._op_floor
        self._op_floor_half, self._op_floor_exact = half_floor, False
        while at < end:
            hi = min(at + _OP_SCAN_STEP, end)
            t = self.store.read_table(OP_TOPIC, 0, at, hi, columns=["queue_offset", "body"],
                                      on_removed="skip")
            for off, body in zip(t.column("queue_offset").to_pylist(),
                                 t.column("body").to_pylist()):
                if int(body) >= half_floor:
                    self._op_floor, self._op_floor_exact = off, True
                    return off
            at = hi
        self._op_floor = max(at, self._op_floor)
        return self._op_floor


def _user_properties(m) -> dict:
    """The half message's properties as its producer set them (the broker's removed)."""
    return {k: v for k, v in m.properties.items() if k not in (PROP_REAL_TOPIC, PROP_CLIENT_ID)}


def _half_copy(m, topic: str, properties: dict, **more) -> Message:
    """A stored copy of half message ``m`` in ``topic``: its body, tags, keys, born time
    and host, transaction id and unique key, type TRANSACTION."""
    return Message(topic=topic, body=m.body, tags=m.tags, keys=list(m.keys),
                   properties=properties, born_timestamp=m.born_timestamp,
                   born_host=m.born_host, transaction_id=m.transaction_id,
                   unique_key=m.unique_key, message_type=fmt.MESSAGE_TYPE_TRANSACTION, **more)


def _real_message(m) -> Message:
    return _half_copy(m, m.properties[PROP_REAL_TOPIC], _user_properties(m))


def _check_max_message(m, checks: int) -> Message:
    """The half message ``m`` as RocketMQ's resolveDiscardMsg stores it in CHECK_MAX_TOPIC:
    every property kept (real topic, producer), the check count added."""
    return _half_copy(m, CHECK_MAX_TOPIC, {**m.properties, PROP_CHECK_TIMES: str(checks)},
                      queue_id=0, reconsume_times=m.reconsume_times)


def _real_message_view(m):
    """The half message as its producer sent it (real topic, no internal properties)."""
    import dataclasses
    return dataclasses.replace(m, topic=m.properties.get(PROP_REAL_TOPIC, m.topic),
                               properties=_user_properties(m))
