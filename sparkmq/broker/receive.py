"""The receive domain: pop-mode receive with long polling, ack, invisible time,
dead-letter forwarding, pull, consumer offsets, and the registry of clients.

``ReceiveService`` drives the broker's ``PopService`` (``pop.py``: leases, receipt
handles, retries, DLQ) and waits on its ``ArrivalNotifier`` (``longpoll.py``: woken
by the store's arrival listener). Offsets: ``committed_offset`` / ``reset_offset``
(GetOffset / UpdateOffset) act on the pop state; ``persist_offsets`` commits the
moved ones to the store (one commit per group, ``ConsumerOffsetPersistService``);
``commit_offsets`` (Flight's commitOffset) stores a group's offsets at once, then moves
them; ``query_offset`` answers QueryOffset from the store.

Thread-safety: called from many gRPC threads at once; the pop service, the
notifier and the store are thread-safe; a persist pass, a group delete and
``commit_offsets`` exclude each other (``offsets_lock``).
"""
from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from typing import Awaitable, Callable, NamedTuple

from ..errors import PermissionDeniedError, QueueNotFoundError, SparkMQError, TopicNotFoundError
from ..log.message import StoredMessage
from .pop import GroupKey, TagFilter
from .protocol import IllegalOffset

log = logging.getLogger("sparkmq.broker.receive")

MIN_WAIT_S = 0.01
NACK_INVISIBLE_MS = 1_000      # a popped message a cancelled receive did not hand over
CLIENT_EXPIRY_MS = 120_000


class PullStatus(enum.Enum):
    """The outcome of a pull (RocketMQ's PullStatus)."""
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"             # none within the long poll
    NO_MATCHED_MSG = "NO_MATCHED_MSG"     # read, none matched the filter
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"     # past the queue's end: next_offset is the end


class PullResult(NamedTuple):
    """A pull's outcome, matching messages and the offset to pull from next."""
    status: PullStatus
    messages: list[StoredMessage]
    next_offset: int


class ClientRegistry:
    """Clients seen by heartbeat/settings: client id -> (group, type, last seen ms).
    A client silent for ``CLIENT_EXPIRY_MS`` is forgotten."""

    def __init__(self, clock_ms: Callable[[], int]):
        self.clock_ms = clock_ms
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[str | None, int, int]] = {}

    def heartbeat(self, client_id: str, group: str | None, client_type: int) -> None:
        with self._lock:
            self._clients[client_id] = (group, client_type, self.clock_ms())

    def remove(self, client_id: str, group: str | None = None) -> None:
        """Forget ``client_id`` (it ended), unless it is a consumer of a group other than
        ``group``: a termination names the consumer's own group (ACLs check that one)."""
        with self._lock:
            known = self._clients.get(client_id)
            if known is not None and (known[0] is None or known[0] == group):
                del self._clients[client_id]

    def online(self, client_id: str) -> bool:
        """Whether ``client_id`` was heard from within ``CLIENT_EXPIRY_MS`` and has not
        ended (NotifyClientTermination)."""
        with self._lock:
            seen = self._clients.get(client_id)
            return seen is not None and seen[2] >= self.clock_ms() - CLIENT_EXPIRY_MS

    def _expire(self) -> None:
        cutoff = self.clock_ms() - CLIENT_EXPIRY_MS
        for cid in [c for c, (_, _, seen) in self._clients.items() if seen < cutoff]:
            del self._clients[cid]

    def groups(self) -> dict[str, int]:
        with self._lock:
            self._expire()
            out: dict[str, int] = {}
            for group, _, _ in self._clients.values():
                if group:
                    out[group] = out.get(group, 0) + 1
            return out

    def count(self) -> int:
        with self._lock:
            self._expire()
            return len(self._clients)


class ReceiveService:
    """See the module docstring. ``broker`` is the :class:`sparkmq.broker.Broker` whose
    store, pop service, notifier, metrics and state it uses."""

    def __init__(self, broker):
        self.broker = broker
        # a persist pass (dirty floors taken, then committed) and a group delete
        # exclude each other: otherwise a pass that took a group's floors before the
        # delete commits them after it and the deleted group's offsets come back
        self.offsets_lock = threading.Lock()

    @property
    def store(self):
        return self.broker.store

    @property
    def pop(self):
        return self.broker.pop

    @property
    def notifier(self):
        return self.broker.notifier

    @property
    def metrics(self):
        return self.broker.metrics

    def _running(self) -> bool:
        return self.broker.is_running

    # ------------------------------------------------------------ receive
    def _admit(self, group, topic: str) -> None:
        """Refuse a receive the topic or group does not allow (checked once per poll)."""
        if self.broker.topic_conf(topic) is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist on broker "
                                     f"{self.broker.config.broker_name}")
        conf = self.store.state.subscription_groups.get(
            group.group if isinstance(group, GroupKey) else group)
        if conf is not None and not conf.receives_allowed:
            raise PermissionDeniedError(f"consumer group {conf.group_name!r} is disabled "
                                        "(consumeEnable=false); enable it with "
                                        "'sparkmq admin group create'")
        if conf is not None and isinstance(group, GroupKey) and group.client_id and \
                not conf.broadcast_allowed:
            raise PermissionDeniedError(f"consumer group {conf.group_name!r} does not allow "
                                        "broadcasting consumption (consumeBroadcastEnable=false)")
        self.metrics.inc("sparkmq_receive_requests_total")

    def _try_pop(self, group, topic: str, batch_size: int, invisible_ms: int,
                 tag_filter: TagFilter, attempt_id: str | None = None
                 ) -> tuple[tuple[int, int], list, float | None]:
        """One look: (arrival version seen before it, deliveries, seconds to the next
        lease expiry or None). The version is read first so that an arrival between
        the look and the wait is never lost."""
        seen = self.notifier.version(topic)
        out = self.pop.pop(group, topic, batch_size=batch_size, invisible_ms=invisible_ms,
                           tag_filter=tag_filter, attempt_id=attempt_id)
        if out:
            label = getattr(group, "group", group)
            self.metrics.inc("sparkmq_messages_received_total", len(out), topic=topic,
                             group=label)
            self.metrics.inc("sparkmq_bytes_received_total",
                             sum(len(d.message.body) for d in out), topic=topic, group=label)
            return seen, out, None
        expiry = self.pop.next_expiry_ms(group, topic)
        wait = None if expiry is None else max(MIN_WAIT_S,
                                                (expiry - self.broker.clock_ms()) / 1000.0)
        return seen, out, wait

    def receive(self, group: str, topic: str, *, batch_size: int, invisible_ms: int,
                tag_filter: TagFilter, poll_ms: int) -> list:
        """:meth:`receive_async` for a caller without an event loop (admin tools, tests):
        runs it to the end here, the looks on this thread."""
        return asyncio.run(self.receive_async(
            group, topic, batch_size=batch_size, invisible_ms=invisible_ms,
            tag_filter=tag_filter, poll_ms=poll_ms, offload=run_here))

    async def receive_async(self, group, topic: str, *, batch_size: int, invisible_ms: int,
                            tag_filter: TagFilter, poll_ms: int,
                            offload: Callable[..., Awaitable],
                            attempt_id: str | None = None) -> list:
        """:meth:`receive` as a suspended request (RocketMQ's PullRequestHoldService): the
        looks run on a worker through ``offload(fn, *args)``; between them the poll holds
        a future on the notifier, not a thread. A client gone away cancels the task.
        ``attempt_id``: the receive's (``PopService.pop``)."""
        self._admit(group, topic)
        deadline = time.monotonic() + poll_ms / 1000.0
        while True:
            seen, out, expiry_s = await offload(self._try_pop, group, topic, batch_size,
                                                invisible_ms, tag_filter, attempt_id)
            left = deadline - time.monotonic()
            if out or left <= 0 or not self._running():
                return out
            await self.notifier.wait_async(topic, seen,
                                           left if expiry_s is None else min(left, expiry_s))

    def ack(self, group: str, handle: str, topic: str | None) -> None:
        """Acknowledge the delivery ``handle`` (AckMessage; InvalidHandle if stale);
        wakes long polls when a held FIFO message may now be delivered."""
        if self.pop.ack(group, handle, topic):
            self.notifier.poke()          # a held FIFO message may be deliverable now
        self.metrics.inc("sparkmq_acks_total", group=getattr(group, "group", group))

    def _try_read(self, topic: str, qid: int, offset: int, batch: int):
        """One look of a pull: (arrival version seen before it, messages)."""
        seen = self.notifier.version(topic, qid)
        return seen, self.store.read(topic, qid, offset, batch)

    @staticmethod
    def _pulled(msgs, tag_filter: TagFilter) -> PullResult:
        matched = [m for m in msgs if tag_filter.accepts(m)]
        return PullResult(PullStatus.FOUND if matched else PullStatus.NO_MATCHED_MSG,
                          matched, msgs[-1].queue_offset + 1)

    async def pull_async(self, topic: str, qid: int, offset: int, batch: int,
                         tag_filter: TagFilter, poll_ms: int,
                         offload: Callable[..., Awaitable]) -> PullResult:
        """Messages of one queue from ``offset`` (PullMessage), waiting up to ``poll_ms``
        for the first one as a suspended request (see :meth:`receive_async`).

        As RocketMQ's store and PullMessageProcessor: on a master, an offset past the
        queue's end (max offset) is OFFSET_ILLEGAL at once, its next offset the end
        (OFFSET_OVERFLOW_BADLY); at the end the pull waits (OFFSET_OVERFLOW_ONE). A replica
        may be behind its master: it waits at any offset, as a slave does (no
        offsetCheckInSlave). An offset below the first is read from the first (RocketMQ
        answers OFFSET_TOO_SMALL with the first as next offset; sparkmq's PullConsumer
        relies on this reading on, client/pull.py)."""
        deadline = time.monotonic() + poll_ms / 1000.0
        offset = max(offset, self.store.min_offset(topic, qid))
        end = self.past_end(topic, qid, offset)
        if end is not None:
            return PullResult(PullStatus.OFFSET_ILLEGAL, [], end)
        while True:
            seen, msgs = await offload(self._try_read, topic, qid, offset, batch)
            if msgs:
                return self._pulled(msgs, tag_filter)
            left = deadline - time.monotonic()
            if left <= 0 or not self._running():
                return PullResult(PullStatus.NO_NEW_MSG, [], offset)
            await self.notifier.wait_async(topic, seen, left, qid)

    def past_end(self, topic: str, qid: int, offset: int) -> int | None:
        """The queue's end (max offset) if a read at ``offset`` is past it on a master
        (RocketMQ's OFFSET_OVERFLOW_BADLY: the reader is moved back to the end, not left
        to skip what arrives at the offsets between); else None. A replica may be behind
        its master: None there (no offsetCheckInSlave). PullMessage's and DoGet's rule."""
        end = self.store.max_offset(topic, qid)
        return end if offset > end and self.broker.is_master else None

    def change_invisible(self, group, handle: str, invisible_ms: int, topic: str | None) -> str:
        """A new receipt handle for ``handle``'s message, invisible for ``invisible_ms``
        more (ChangeInvisibleDuration); wakes long polls (a lease may be free now)."""
        handle = self.pop.change_invisible(group, handle, invisible_ms, topic)
        self.notifier.poke()
        return handle

    def give_back(self, group, handles: list[str], topic: str) -> None:
        """Make the messages of ``handles`` (popped, never handed over: the receive was
        cancelled) visible again ``NACK_INVISIBLE_MS`` from now, as the proxy nacks a
        message it could not write."""
        for handle in handles:
            try:
                self.change_invisible(group, handle, NACK_INVISIBLE_MS, topic)
            except SparkMQError as e:    # acked or changed meanwhile: it is not ours to give
                log.debug("a message not handed over stays as it is: %s", e)

    def forward_to_dlq(self, group, handle: str, topic: str | None) -> None:
        """Move ``handle``'s message to the group's dead-letter topic now."""
        self.pop.forward_to_dlq(group, handle, topic)
        self.notifier.poke()

    # ------------------------------------------------------------ offsets
    def local_queue(self, topic: str, qid: int) -> tuple[str, int]:
        """(topic, qid) if this broker has that queue; TopicNotFoundError or
        QueueNotFoundError if not."""
        conf = self.broker.topic_conf(topic)
        if conf is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist on this broker")
        if not 0 <= qid < max(conf.read_queue_nums, conf.write_queue_nums):
            raise QueueNotFoundError(f"queue {qid} of {topic!r} does not exist")
        return topic, qid

    def committed_offset(self, group, topic: str, qid: int) -> int:
        """The consumer's committed offset of one queue (GetOffset)."""
        return self.pop.committed_offset(group, topic, qid)

    def reset_offset(self, group, topic: str, qid: int, offset: int) -> None:
        """Move the consumer's offset of one queue (UpdateOffset); IllegalOffset outside
        the queue's min..max offsets."""
        self.check_offset(topic, qid, offset)
        self.pop.reset_offset(group, topic, qid, offset)

    def check_offset(self, topic: str, qid: int, offset: int) -> None:
        """IllegalOffset where ``offset`` is outside the queue's min..max offsets (what
        ``reset_offset`` refuses)."""
        store = self.store
        if not store.min_offset(topic, qid) <= offset <= store.max_offset(topic, qid):
            raise IllegalOffset(f"offset {offset} is outside "
                                f"{store.min_offset(topic, qid)}..{store.max_offset(topic, qid)}")

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Store the group's offsets of queues of ``topic`` (queue -> offset) in one commit
        and move them as ``reset_offset`` does: all or none (each checked first; moved
        once stored). Under ``offsets_lock``, so the offset pass cannot store an older
        offset of these queues in between."""
        for qid, offset in offsets.items():
            self.check_offset(topic, qid, offset)
        with self.offsets_lock:
            self.store.commit_consumer_offsets(
                group, {(topic, qid): offset for qid, offset in offsets.items()})
            for qid, offset in offsets.items():      # (stored: not the pass's to commit)
                self.pop.reset_offset(group, topic, qid, offset, stored=True)

    def query_offset(self, topic: str, qid: int, *, at_ms: int | None = None,
                     end: bool = False) -> int:
        """QueryOffset: the queue's first offset, its end (``end``), or the first offset
        stored at or after ``at_ms``."""
        store = self.store
        if end:
            return store.max_offset(topic, qid)
        if at_ms is None:
            return store.min_offset(topic, qid)
        return store.offset_for_time(topic, qid, at_ms)

    def persist_offsets(self) -> None:
        """Commit consumer offsets that moved since the last pass (one commit per group)."""
        if self.pop is None:
            return
        with self.offsets_lock:
            dirty = self.pop.take_dirty()
            for key, floors in dirty.items():
                try:
                    self.store.commit_consumer_offsets(key.group, floors,
                                                       client_id=key.client_id)
                except SparkMQError:
                    self.pop.mark_dirty({key: floors})
                    raise

    def drop_group(self, group: str, *, keep_offsets: bool) -> None:
        """Delete a subscription group's config (and its offsets unless ``keep_offsets``)
        and forget its pop state, excluded from a concurrent persist pass."""
        with self.offsets_lock:
            if self.pop is not None:
                self.pop.drop_group(group)
            self.store.delete_group(group, remove_offsets=not keep_offsets)

    def consumer_lag(self) -> dict:
        """Lag per (consumer, topic): live pop state, else the persisted offsets
        (groups not active since this broker started)."""
        lag = dict(self.pop.lag())
        live = {k for k, _ in lag}
        names = {t.id: name for name, t in self.store.topics().items()}
        persisted: dict = {}
        for (group, tid, qid, cid), off in self.store.state.consumer_offsets.items():
            key = GroupKey(group, cid or None)
            topic = names.get(tid)
            if key in live or topic is None:
                continue
            hi = self.store.max_offset(topic, qid)
            persisted[(key, topic)] = persisted.get((key, topic), 0) + max(0, hi - off)
        lag.update(persisted)
        return lag


async def run_here(fn, *args):
    """``offload`` that runs ``fn`` on the calling thread (see ``ReceiveService.receive``)."""
    return fn(*args)
