"""Consumer groups on the broker: pop (receive), invisible time, ack, redelivery, DLQ.

RocketMQ 5's pop consumption, kept in memory over the store:

* per (group, topic, queue) a :class:`QueueProgress`: ``floor`` (every offset
  below it is done: acked, filtered out or sent to the DLQ — this is the
  group's committed consumer offset), ``next_offset`` (the next offset never
  delivered), the in-flight leases and the done offsets above the floor;
* ``pop`` hands out expired leases first (delivery attempt + 1) and then fresh
  messages across all queues of the topic on this broker, round robin, skipping
  messages the tag filter refuses (they count as done);
* a message whose lease expires after ``max_delivery_attempts`` deliveries
  (``maxReconsumeTimes`` + 1) is appended to ``%DLQ%<group>`` (an ordinary
  topic, one queue) and counts as done;
* receipt handles name (lease serial, queue, offset, topic, broker); a handle
  whose lease was superseded (redelivered, acked) is refused, also after a restart
  (each PopService numbers its leases from a random start);
* FIFO, for a consumer group whose subscription group config says
  ``consumeMessageOrderly`` (as the proxy pops with ``fifo`` only for such groups;
  other groups consume a FIFO topic's messages concurrently): a message with a
  message group is delivered only when no earlier message of its group (in its
  queue) is in flight; a message read while its group is busy is *held* and
  delivered, in offset order, once the earlier one is acked, sent to the DLQ or
  forwarded. One message per group is in flight.

Invariant: every offset in ``[floor, next_offset)`` is in flight, held or done.
Offsets persist as floors (``Store.commit_consumer_offsets``), so after a
restart un-acked messages come back (at least once).

Clustering and broadcasting: a consumer is a :class:`GroupKey` — the group
alone (clustering: the group's consumers share the messages), or the group and
one consumer instance's client id (broadcasting: every instance gets every
message, with offsets of its own, persisted with ``client_id``). Methods take a
group name or a GroupKey.

Thread-safety: one lock per group; store reads and DLQ appends run under it.
The clock is injected (``clock_ms``).
"""
from __future__ import annotations

import heapq
import logging
import secrets
import threading
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from ..errors import DataLossError, InvalidReceiptHandleError, TopicNotFoundError
from ..log.message import Message, StoredMessage
from ..log.names import DLQ_PREFIX
from ..tagexpr import tag_set
from .handles import HandleSigner

log = logging.getLogger("sparkmq.broker.pop")

CONSUME_FROM_FIRST = "CONSUME_FROM_FIRST_OFFSET"
ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
ORIGIN_QUEUE = "DLQ_ORIGIN_QUEUE"
ORIGIN_OFFSET = "DLQ_ORIGIN_QUEUE_OFFSET"
MAX_SCAN_PER_POP = 4096   # filtered-out messages skipped per pop call, at most
MAX_HELD_PER_QUEUE = 10_000   # FIFO messages waiting for their group, per queue
MAX_ATTEMPTS_KEPT = 1_024     # receive attempt ids an orderly group remembers


class GroupKey(NamedTuple):
    """A consumer: the group (clustering), or the group and a client id (broadcasting)."""

    group: str
    client_id: str | None = None


def _key(group: "str | GroupKey") -> GroupKey:
    return group if isinstance(group, GroupKey) else GroupKey(group)


InvalidHandle = InvalidReceiptHandleError   # the broker's old name for it


def dlq_topic(group: str) -> str:
    return f"{DLQ_PREFIX}{group}"


@dataclass
class Lease:
    offset: int
    attempt: int            # 1-based delivery attempt of this lease
    visible_at_ms: int
    seq: int
    message_group: str | None = None


@dataclass
class QueueProgress:
    floor: int
    next_offset: int
    inflight: dict[int, Lease] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    held: dict[int, str] = field(default_factory=dict)   # offset -> message group (FIFO)
    dirty: bool = False
    # (visible_at_ms, offset, seq) of leases, earliest first: a pop finds the expired
    # leases and the next expiry without a look at every lease in flight. An entry
    # whose lease was acked or replaced is stale (its seq is no longer in ``inflight``)
    # and dropped when it comes up, or when stale entries outnumber the live ones.
    expiry: list[tuple[int, int, int]] = field(default_factory=list)

    def add_lease(self, lease: Lease) -> None:
        self.inflight[lease.offset] = lease
        heapq.heappush(self.expiry, (lease.visible_at_ms, lease.offset, lease.seq))
        self._compact()

    def _compact(self) -> None:
        """Rebuild the heap from the live leases once stale entries outnumber them
        (amortized O(1) per lease; the heap holds at most 2 x in flight + 64)."""
        if len(self.expiry) > 2 * len(self.inflight) + 64:
            self.expiry = [(x.visible_at_ms, x.offset, x.seq) for x in self.inflight.values()]
            heapq.heapify(self.expiry)

    def _current(self, entry: tuple[int, int, int]) -> Lease | None:
        lease = self.inflight.get(entry[1])
        return lease if lease is not None and lease.seq == entry[2] else None

    def take_expired(self, now_ms: int) -> list[Lease]:
        """The leases visible again at ``now_ms``, earliest first, out of the expiry
        heap: the caller renews or finishes each, or hands it back (``put_back``)."""
        out = []
        while self.expiry and self.expiry[0][0] <= now_ms:
            lease = self._current(heapq.heappop(self.expiry))
            if lease is not None:
                out.append(lease)
        return out

    def put_back(self, lease: Lease) -> None:
        heapq.heappush(self.expiry, (lease.visible_at_ms, lease.offset, lease.seq))

    def next_expiry_ms(self) -> int | None:
        while self.expiry and self._current(self.expiry[0]) is None:
            heapq.heappop(self.expiry)
        return self.expiry[0][0] if self.expiry else None

    def busy_groups(self) -> set[str]:
        """Message groups with a message in flight or held in this queue."""
        return ({x.message_group for x in self.inflight.values() if x.message_group}
                | set(self.held.values()))

    def finish(self, offset: int) -> None:
        if self.inflight.pop(offset, None) is not None:
            self._compact()
        self.held.pop(offset, None)
        if offset >= self.floor:
            self.done.add(offset)
        while self.floor in self.done:
            self.done.discard(self.floor)
            self.floor += 1
            self.dirty = True


@dataclass
class Delivery:
    """One message handed to a consumer."""

    message: StoredMessage
    attempt: int
    receipt_handle: str
    invisible_ms: int


def encode_handle(seq: int, qid: int, offset: int, topic: str, broker: str) -> str:
    return f"{seq:x}.{qid}.{offset}.{topic}.{broker}"


def decode_handle(handle: str) -> tuple[int, int, int, str, str]:
    """(seq, queue id, offset, topic, broker) of a receipt handle; InvalidHandle if malformed."""
    parts = handle.split(".", 4) if isinstance(handle, str) else []
    if len(parts) != 5:
        raise InvalidHandle(f"receipt handle {handle!r} is malformed")
    try:
        return int(parts[0], 16), int(parts[1]), int(parts[2]), parts[3], parts[4]
    except ValueError:
        raise InvalidHandle(f"receipt handle {handle!r} is malformed") from None


class TagFilter:
    """RocketMQ tag expressions: ``*`` (or empty) matches all; ``A || B`` matches either."""

    def __init__(self, expression: str | None):
        self.tags = tag_set(expression)         # the one reading (sparkmq/tagexpr.py)

    def matches(self, tag: str | None) -> bool:
        return self.tags is None or (tag is not None and tag in self.tags)

    @property
    def accepts_all(self) -> bool:
        """True for ``*``: no message is filtered out (a pop reads no more than it takes)."""
        return self.tags is None

    def accepts(self, message) -> bool:
        """Decide a StoredMessage (the interface SqlFilter shares)."""
        return self.matches(message.tags)


class GroupState:
    def __init__(self, key: GroupKey):
        self.key = key
        self.name = key.group
        self.lock = threading.Lock()
        self.queues: dict[tuple[str, int], QueueProgress] = {}
        self.rr: dict[str, int] = {}
        # an orderly group's receive attempt id -> what that receive leased, as (topic,
        # queue, offset, delivery attempt): a retry with the same id gets them again
        # (while so leased: renewals keep the attempt, a redelivery does not)
        self.attempts: dict[str, list[tuple[str, int, int, int]]] = {}


class PopService:
    """Receive/ack state of every consumer group of one broker (see module doc)."""

    def __init__(self, store, *, broker_name: str, max_delivery_attempts: int = 17,
                 consume_from_where: str = CONSUME_FROM_FIRST,
                 clock_ms: Callable[[], int] | None = None,
                 on_topic_created: Callable[[str], None] | None = None,
                 handles: HandleSigner | None = None):
        self.store = store
        self.broker_name = broker_name
        self.handles = handles or HandleSigner()     # receipt handles are signed
        self.max_delivery_attempts = max_delivery_attempts
        self.consume_from_where = consume_from_where
        self.clock_ms = clock_ms or store.clock_ms
        self.on_topic_created = on_topic_created
        self._groups: dict[GroupKey, GroupState] = {}
        self._groups_lock = threading.Lock()
        # lease serials start at random: a broker started again keeps its handle secret
        # (handles.py), so serials counted from 0 again would make a handle issued before
        # the restart name a new lease of its message (another consumer's delivery)
        self._seq = secrets.randbits(62)
        self._seq_lock = threading.Lock()
        self.dlq_count = 0

    def max_attempts(self, group: str) -> int:
        """Deliveries of one message before the DLQ: the group's ``retryMaxTimes``
        + 1 if its subscription group config sets one, else the broker's."""
        conf = self.store.state.subscription_groups.get(group)
        if conf is not None and conf.retry_max_times is not None:
            return int(conf.retry_max_times) + 1
        return self.max_delivery_attempts

    def orderly(self, group: str) -> bool:
        """Whether ``group`` consumes message groups in order (``consumeMessageOrderly``)."""
        conf = self.store.state.subscription_groups.get(group)
        return bool(conf is not None and conf.orderly)

    # ---------------------------------------------------------------- state
    def group(self, group: "str | GroupKey") -> GroupState:
        key = _key(group)
        with self._groups_lock:
            g = self._groups.get(key)
            if g is None:
                g = self._groups[key] = GroupState(key)
            return g

    def drop_group(self, group: str) -> None:
        """Forget a group's in-memory progress and leases (all its consumers), so a
        deleted group starts again from the store's offsets (or its start policy)."""
        with self._groups_lock:
            for key in [k for k in self._groups if k.group == group]:
                del self._groups[key]

    def groups(self) -> list[GroupKey]:
        with self._groups_lock:
            return sorted(self._groups, key=lambda k: (k.group, k.client_id or ""))

    def _next_seq(self) -> int:
        with self._seq_lock:
            self._seq += 1
            return self._seq

    def _progress(self, g: GroupState, topic: str, qid: int) -> QueueProgress:
        qp = g.queues.get((topic, qid))
        if qp is None:
            lo = self.store.min_offset(topic, qid)
            committed = self.store.consumer_offsets(
                g.name, client_id=g.key.client_id).get((topic, qid))
            if committed is None:
                committed = lo if self.consume_from_where == CONSUME_FROM_FIRST \
                    else self.store.max_offset(topic, qid)
            start = max(committed, lo)
            qp = g.queues[(topic, qid)] = QueueProgress(floor=start, next_offset=start)
        return qp

    def _queue_ids(self, topic: str) -> list[int]:
        conf = self.store.state.topics.get(topic)       # (no copy of the table: a pop's)
        if conf is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist on {self.broker_name}")
        return list(range(conf.read_queue_nums))

    # ---------------------------------------------------------------- pop
    def pop(self, group: "str | GroupKey", topic: str, *, batch_size: int, invisible_ms: int,
            tag_filter: TagFilter, attempt_id: str | None = None) -> list[Delivery]:
        """Up to ``batch_size`` messages of ``topic`` for ``group``: expired leases
        first, then fresh messages. Returns [] if nothing is ready now.
        ``attempt_id`` (an orderly group's; the client's id of this receive, the same when
        it retries one whose answer it lost): what the receive with that id leased and is
        still leased is delivered again first, new handles, same attempt (RocketMQ's
        ConsumerOrderInfoManager: the same attempt id is not blocked by its own messages)."""
        g = self.group(group)
        qids = self._queue_ids(topic)
        with g.lock:
            orderly = self.orderly(g.name)
            again = orderly and attempt_id is not None
            out = self._pop_again(g, topic, attempt_id, batch_size, invisible_ms) if again \
                else []
            if len(out) < batch_size:
                out += self._pop_expired(g, topic, qids, batch_size - len(out), invisible_ms)
            if len(out) < batch_size:
                out += self._pop_fresh(g, topic, qids, batch_size - len(out), invisible_ms,
                                       tag_filter, orderly)
            if again and out:
                self._remember(g, attempt_id, topic, out)
            return out

    def _pop_again(self, g: GroupState, topic: str, attempt_id: str, limit: int,
                   invisible_ms: int) -> list[Delivery]:
        out: list[Delivery] = []
        for t, qid, offset, attempt in g.attempts.pop(attempt_id, ())[:limit]:
            qp = g.queues.get((t, qid)) if t == topic else None
            lease = qp.inflight.get(offset) if qp is not None else None
            if lease is None or lease.attempt != attempt:   # acked or redelivered since
                continue
            msg = self._read_one(t, qid, offset)
            if msg is None:
                qp.finish(offset)
                continue
            new = self._lease(qp, offset, lease.attempt, invisible_ms, lease.message_group)
            out.append(Delivery(msg, new.attempt, self._handle(new, t, qid), invisible_ms))
        return out

    @staticmethod
    def _remember(g: GroupState, attempt_id: str, topic: str, out: list[Delivery]) -> None:
        g.attempts[attempt_id] = [(topic, d.message.queue_id, d.message.queue_offset,
                                   d.attempt) for d in out]
        while len(g.attempts) > MAX_ATTEMPTS_KEPT:       # the oldest go first
            del g.attempts[next(iter(g.attempts))]

    def _lease(self, qp: QueueProgress, offset: int, attempt: int, invisible_ms: int,
               message_group: str | None = None) -> Lease:
        lease = Lease(offset, attempt, self.clock_ms() + invisible_ms, self._next_seq(),
                      message_group)
        qp.add_lease(lease)
        return lease

    def _handle(self, lease: Lease, topic: str, qid: int) -> str:
        return self.handles.sign(encode_handle(lease.seq, qid, lease.offset, topic,
                                               self.broker_name))

    def _read_one(self, topic: str, qid: int, offset: int) -> StoredMessage | None:
        try:
            msgs = self.store.read(topic, qid, offset, 1)
        except DataLossError:
            return None
        return msgs[0] if msgs and msgs[0].queue_offset == offset else None

    def _pop_expired(self, g: GroupState, topic: str, qids: list[int], limit: int,
                     invisible_ms: int) -> list[Delivery]:
        now = self.clock_ms()
        expired = sorted(((lease.visible_at_ms, qid, lease)
                          for qid in qids if (topic, qid) in g.queues
                          for lease in g.queues[(topic, qid)].take_expired(now)),
                         key=lambda t: (t[0], t[1], t[2].offset))
        out: list[Delivery] = []
        for _, qid, lease in expired:
            qp = g.queues[(topic, qid)]
            if len(out) >= limit:
                qp.put_back(lease)              # still expired: the next pop takes it
                continue
            msg = self._read_one(topic, qid, lease.offset)
            if msg is None:
                qp.finish(lease.offset)
                continue
            if lease.attempt >= self.max_attempts(g.name):
                self._to_dlq(g.name, msg, lease.attempt)
                qp.finish(lease.offset)
                continue
            new = self._lease(qp, lease.offset, lease.attempt + 1, invisible_ms,
                              lease.message_group)
            out.append(Delivery(msg, new.attempt, self._handle(new, topic, qid), invisible_ms))
        return out

    def _pop_held(self, qp: QueueProgress, topic: str, qid: int, limit: int,
                  invisible_ms: int) -> list[Delivery]:
        """FIFO: deliver held messages whose group is free, oldest first."""
        out: list[Delivery] = []
        busy = {x.message_group for x in qp.inflight.values() if x.message_group}
        for offset, group in sorted(qp.held.items()):
            if len(out) >= limit:
                break
            if group in busy:
                continue
            busy.add(group)          # later held messages of this group wait for this one
            del qp.held[offset]
            msg = self._read_one(topic, qid, offset)
            if msg is None:
                qp.finish(offset)
                continue
            lease = self._lease(qp, offset, 1, invisible_ms, group)
            out.append(Delivery(msg, 1, self._handle(lease, topic, qid), invisible_ms))
        return out

    def _pop_fresh(self, g: GroupState, topic: str, qids: list[int], limit: int,
                   invisible_ms: int, tag_filter: TagFilter, orderly: bool) -> list[Delivery]:
        out: list[Delivery] = []
        if not qids:
            return out
        start = g.rr.get(topic, 0)
        g.rr[topic] = (start + 1) % len(qids)
        budget = [MAX_SCAN_PER_POP]
        for i in range(len(qids)):
            qid = qids[(start + i) % len(qids)]
            qp = self._progress(g, topic, qid)
            if qp.held:
                out += self._pop_held(qp, topic, qid, limit - len(out), invisible_ms)
            out += self._scan_queue(qp, topic, qid, limit - len(out), invisible_ms, tag_filter,
                                    budget, orderly)
            if len(out) >= limit:
                break
        return out

    def _scan_queue(self, qp: QueueProgress, topic: str, qid: int, limit: int,
                    invisible_ms: int, tag_filter: TagFilter, budget: list[int],
                    orderly: bool) -> list[Delivery]:
        """Fresh messages of one queue from ``next_offset`` on (filtered; message groups
        in order if ``orderly``)."""
        out: list[Delivery] = []
        hi = self.store.max_offset(topic, qid)
        busy = qp.busy_groups() if orderly else set()
        # a filter or held FIFO groups may pass over some: read 16 more to fill up
        extra = 0 if tag_filter.accepts_all and not orderly else 16
        while (len(out) < limit and qp.next_offset < hi and budget[0] > 0
               and len(qp.held) < MAX_HELD_PER_QUEUE):
            try:
                msgs = self.store.read(topic, qid, qp.next_offset,
                                       min(limit - len(out) + extra, 256))
            except DataLossError as e:
                self._skip_removed(qp, e.earliest_offset or qp.next_offset)
                continue
            if not msgs:
                break
            for m in msgs:
                budget[0] -= 1
                qp.next_offset = m.queue_offset + 1
                if not tag_filter.accepts(m):
                    qp.finish(m.queue_offset)
                elif orderly and m.message_group and m.message_group in busy:
                    qp.held[m.queue_offset] = m.message_group
                else:
                    group = m.message_group if orderly else None
                    if group:
                        busy.add(group)
                    lease = self._lease(qp, m.queue_offset, 1, invisible_ms, group)
                    out.append(Delivery(m, 1, self._handle(lease, topic, qid), invisible_ms))
                if len(out) >= limit or budget[0] <= 0:
                    break
        return out

    def _skip_removed(self, qp: QueueProgress, earliest: int) -> None:
        for off in [o for o in qp.held if o < earliest]:
            qp.finish(off)
        for off in range(qp.next_offset, earliest):
            qp.finish(off)
        qp.next_offset = max(qp.next_offset, earliest)
        if qp.floor < earliest and not qp.inflight:
            qp.floor, qp.done, qp.dirty = earliest, set(), True

    def next_expiry_ms(self, group: "str | GroupKey", topic: str) -> int | None:
        """When the earliest in-flight lease of ``group`` on ``topic`` expires (None if none)."""
        g = self.group(group)
        with g.lock:
            times = [qp.next_expiry_ms() for (t, _), qp in g.queues.items() if t == topic]
        return min((x for x in times if x is not None), default=None)

    # ---------------------------------------------------------------- ack & co
    def _lease_of(self, g: GroupState, handle: str, topic: str | None
                  ) -> tuple[QueueProgress, Lease, str, int]:
        seq, qid, offset, h_topic, broker = decode_handle(self.handles.open(handle))
        if broker != self.broker_name:
            raise InvalidHandle(f"receipt handle belongs to broker {broker!r}, "
                                f"not {self.broker_name!r}")
        if topic is not None and topic != h_topic:
            raise InvalidHandle(f"receipt handle is for topic {h_topic!r}, not {topic!r}")
        qp = g.queues.get((h_topic, qid))
        lease = qp.inflight.get(offset) if qp else None
        if lease is None or lease.seq != seq:
            raise InvalidHandle("receipt handle expired: the message was acked, redelivered "
                                "or its invisible time changed since; use the newest handle")
        return qp, lease, h_topic, qid

    def ack(self, group: "str | GroupKey", handle: str, topic: str | None = None) -> bool:
        """Mark the message of ``handle`` consumed. InvalidHandle if the lease is gone.
        Returns True if held FIFO messages may now be deliverable (wake receivers)."""
        g = self.group(group)
        with g.lock:
            qp, lease, _, _ = self._lease_of(g, handle, topic)
            qp.finish(lease.offset)
            return bool(qp.held)

    def change_invisible(self, group: "str | GroupKey", handle: str, invisible_ms: int,
                         topic: str | None = None) -> str:
        """Make the message invisible for ``invisible_ms`` from now; returns the new handle."""
        g = self.group(group)
        with g.lock:
            qp, lease, t, qid = self._lease_of(g, handle, topic)
            new = self._lease(qp, lease.offset, lease.attempt, invisible_ms, lease.message_group)
            return self._handle(new, t, qid)

    def forward_to_dlq(self, group: "str | GroupKey", handle: str, topic: str | None = None) -> None:
        """Send the message of ``handle`` to ``%DLQ%<group>`` now and mark it done
        (a FIFO consumer that gives up on a message)."""
        g = self.group(group)
        with g.lock:
            qp, lease, t, qid = self._lease_of(g, handle, topic)
            msg = self._read_one(t, qid, lease.offset)
            if msg is not None:
                self._to_dlq(g.name, msg, lease.attempt)
            qp.finish(lease.offset)

    def _to_dlq(self, group: str, msg: StoredMessage, attempts: int) -> None:
        topic = dlq_topic(group)
        if topic not in self.store.state.topics:        # (no copy: a message's)
            self.store.create_topic(topic, read_queue_nums=1, write_queue_nums=1,
                                    system=True, exist_ok=True)
            if self.on_topic_created:
                self.on_topic_created(topic)
        props = dict(msg.properties)
        props.update({ORIGIN_TOPIC: msg.topic, ORIGIN_MESSAGE_ID: msg.unique_key or msg.message_id,
                      ORIGIN_QUEUE: str(msg.queue_id), ORIGIN_OFFSET: str(msg.queue_offset)})
        self.store.append([Message(topic=topic, body=msg.body, tags=msg.tags, keys=msg.keys,
                                   properties=props, born_timestamp=msg.born_timestamp,
                                   born_host=msg.born_host, reconsume_times=attempts,
                                   message_group=msg.message_group,
                                   unique_key=msg.unique_key or msg.message_id)],
                          limits_checked=True)    # accepted at send; the DLQ adds properties
        self.dlq_count += 1
        log.info("group %s: message %s of %s/%d after %d deliveries -> %s", group,
                 msg.unique_key or msg.message_id, msg.topic, msg.queue_id, attempts, topic)

    # ---------------------------------------------------------------- offsets
    def floors(self, group: str) -> dict[tuple[str, int], int]:
        g = self.group(group)
        with g.lock:
            return {k: qp.floor for k, qp in g.queues.items()}

    def committed_offset(self, group: "str | GroupKey", topic: str, qid: int) -> int:
        g = self.group(group)
        with g.lock:
            return self._progress(g, topic, qid).floor

    def reset_offset(self, group: "str | GroupKey", topic: str, qid: int, offset: int, *,
                     stored: bool = False) -> None:
        """Move ``group``'s offset of a queue (UpdateOffset); drops its in-flight leases.
        ``stored``: the store has it already (the persist pass does not commit it again)."""
        g = self.group(group)
        with g.lock:
            g.queues[(topic, qid)] = QueueProgress(floor=offset, next_offset=offset,
                                                   dirty=not stored)

    def take_dirty(self) -> dict[GroupKey, dict[tuple[str, int], int]]:
        """Floors changed since the last call, per consumer (for the persist service)."""
        out: dict[GroupKey, dict[tuple[str, int], int]] = {}
        for name in self.groups():
            g = self.group(name)
            with g.lock:
                for k, qp in g.queues.items():
                    if qp.dirty:
                        out.setdefault(name, {})[k] = qp.floor
                        qp.dirty = False
        return out

    def mark_dirty(self, dirty: dict[GroupKey, dict[tuple[str, int], int]]) -> None:
        """Put back floors whose commit failed, so the next pass retries them."""
        for name, floors in dirty.items():
            g = self.group(name)
            with g.lock:
                for k in floors:
                    if k in g.queues:
                        g.queues[k].dirty = True

    def lag(self) -> dict[tuple[GroupKey, str], int]:
        """(consumer, topic) -> messages not yet done (max offset - floor, summed over queues)."""
        out: dict[tuple[GroupKey, str], int] = {}
        for name in self.groups():
            g = self.group(name)
            with g.lock:
                items = list(g.queues.items())
            for (t, q), qp in items:
                try:
                    hi = self.store.max_offset(t, q)
                except TopicNotFoundError:
                    continue
                out[(name, t)] = out.get((name, t), 0) + max(0, hi - qp.floor)
        return out
