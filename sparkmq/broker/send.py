"""The send domain: from the messages of a SendMessage request to stored rows.

- The per-message refusal checks (``SendService.refusal``): topic name valid and
  the topic present here (``topic_refusal``; created when autoCreateTopicEnable),
  body 1..maxMessageSize bytes (``body_refusal``), message type consistent with
  its group, tag and delivery time; the input limits of ``log/limits.py`` with the
  proxy's codes (``limits_refusal`` for one message, ``SendRows.limit_refusals`` from a
  request's columns), all before any merge; the parking decisions: a transactional
  message becomes a half message (``TransactionService.prepare_row``), a delayed
  one is parked in the schedule topic (``park``). As the Apache proxy, a request with
  a refused message is refused whole with that message's status (``protocol.status``),
  and so is one whose messages name more than one topic; nothing of it is stored.
- The send model ``SendRows``: the accepted messages of one request as columns.
- Storing: ``SendService.send_rows`` merges concurrent requests into one store
  append (``sendmerge.SendMerger``); ``_append_rows`` builds the SEGMENT_SCHEMA
  batch and appends it (after the broker's role allows writes); in SYNC_MASTER each
  request then waits for its replica (``replicated``; ``replicawait``). Queues: a
  message group's rows go to crc32(group) % writeQueueNums (the store's chooser); the
  other rows of ONE request go to one queue of their topic, round robin request by
  request (``place``), as the Apache proxy's SendMessageQueueSelector sends a whole
  request to one queue. The Flight path's DoPut batches take the same rule
  (``request_queue``).

Thread-safety: ``SendService`` is called from many gRPC threads at once; the
round-robin counters are under a lock, the store is thread-safe.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

from rocketmq.grpc_protocol import definition_pb2 as pb

from ..errors import InvalidNameError, PermissionDeniedError, ReplicaNotAvailableError, SparkMQError
from ..log import format as fmt
from ..log.batch import QueueChooser
from ..log.built import build_rows
from ..log.topics import topic_message_type, type_conflict
from ..log.limits import RESERVED_PROPERTY_KEYS, MessageLimits, message_violation
from ..log.message import encode_message_id
from ..log.names import validate_topic
from ..log.status import PutMessageStatus
from .protocol import Code, ms_of_timestamp, recovery_refusal, status, transaction_properties
from .replicawait import HELD, Replicating, count_failure, merges, resolve
from .delaypolicy import DelayRefused, parked_row
from .parked import PROP_DELAY_LEVEL
from .sendlimits import plain_within_limits, type_refusal, body_refusal, limits_refusal
from .sendmerge import SendMerger

log = logging.getLogger(__name__)
_SEGMENT_COLUMNS = ("topic", "queue_id", "body", "tags", "keys", "properties", "born_timestamp",
                    "born_host", "delivery_timestamp", "message_group", "transaction_id",
                    "message_type", "unique_key")
NORMAL_TYPE, FIFO_TYPE = fmt.MESSAGE_TYPE_NORMAL, fmt.MESSAGE_TYPE_FIFO
DELAY_TYPE, TRANSACTION_TYPE = fmt.MESSAGE_TYPE_DELAY, fmt.MESSAGE_TYPE_TRANSACTION


def _logged(e: Exception) -> Exception:
    """``e``, logged with its traceback when it is not one of sparkmq's own errors."""
    if not isinstance(e, SparkMQError):
        log.error("a send failed unexpectedly", exc_info=e)
    return e


class SendRows:
    """The accepted messages of one SendMessage request, turned into columns (segment
    schema names) ready for ``Store.append_batch``; ``index`` maps rows to request
    entries. Rows are collected first and the columns built in one pass per column
    (list comprehensions over the protobuf messages), the cheapest way in Python."""

    COLUMNS = ("topic", "body", "tags", "keys", "properties", "born_timestamp", "born_host",
               "message_group", "message_type", "unique_key", "queue_id",
               "delivery_timestamp", "transaction_id")

    def __init__(self):
        self.index: list[int] = []
        self.messages: list[pb.Message] = []
        self.parked: dict[int, tuple] = {}       # row -> parked tuple (see add)
        self.placed: dict[int, int] = {}         # row -> queue id (SendService.place)
        self._columns: dict[str, list] | None = None

    def add(self, i: int, m: pb.Message, parked: tuple | None = None) -> None:
        """Append one message that passed ``SendService.refusal`` (so a present tag is not blank);
        ``parked`` = (topic, queue, due ms, properties[, transaction id]) of a delayed or
        half (transactional) message."""
        if parked is not None:
            self.parked[len(self.index)] = parked
        self.index.append(i)
        self.messages.append(m)
        self._columns = None

    @classmethod
    def plain(cls, messages, sps: list, props: list, bodies: list, topic: str) -> "SendRows":
        """The rows of a whole request of plain messages (see
        ``SendService.plain_rows``: NORMAL, one ``topic``, no tag, group, delivery
        time or delay level), with ``sps``/``props``/``bodies`` the messages' system
        properties, user properties and bodies already read: the columns ``columns``
        would build, without its general cases. A born time shared by the whole batch
        (one client request) is converted once."""
        out = cls()
        n = len(messages)
        out.messages = list(messages)
        out.index = list(range(n))
        borns = [sp.born_timestamp for sp in sps]
        b = borns[0]
        if borns.count(b) == n:
            born_ms = [b.seconds * 1000 + b.nanos // 1_000_000 or None] * n
        else:
            born_ms = [b.seconds * 1000 + b.nanos // 1_000_000 or None for b in borns]
        keys = [sp.keys for sp in sps]
        out._columns = {
            "topic": [topic] * n,
            "body": bodies,
            "tags": [None] * n,
            "keys": [list(k) if k else None for k in keys] if any(keys) else [None] * n,
            "properties": [list(p.items()) if p else None for p in props] if any(props)
            else [None] * n,
            "born_timestamp": born_ms,
            "born_host": [sp.born_host or None for sp in sps],
            "message_group": [None] * n,
            "message_type": [NORMAL_TYPE] * n,
            "unique_key": [sp.message_id or None for sp in sps],
            "queue_id": [None] * n,
            "delivery_timestamp": [None] * n,
            "transaction_id": [None] * n,
        }
        return out

    def __len__(self) -> int:
        return len(self.index)

    def columns(self) -> dict[str, list]:
        """Column name -> one Python value per row (None = null). Built once."""
        if self._columns is not None:
            return self._columns
        ms = self.messages
        n = len(ms)
        sps = [m.system_properties for m in ms]
        borns = [sp.born_timestamp for sp in sps]
        mtypes = [sp.message_type for sp in sps]
        c = {
            "topic": [m.topic.name for m in ms],
            "body": [m.body for m in ms],
            "tags": [sp.tag or None for sp in sps],
            "keys": [list(k) if k else None for k in (sp.keys for sp in sps)],
            "properties": [list(p.items()) if p else None for p in (m.user_properties
                                                                     for m in ms)],
            "born_timestamp": [b.seconds * 1000 + b.nanos // 1_000_000 or None for b in borns],
            "born_host": [sp.born_host or None for sp in sps],
            "message_group": [sp.message_group or None for sp in sps],
            "message_type": [FIFO_TYPE if t == pb.FIFO else TRANSACTION_TYPE
                             if t == pb.TRANSACTION else NORMAL_TYPE for t in mtypes],
            "unique_key": [sp.message_id or None for sp in sps],
            "queue_id": [None] * n,
            "delivery_timestamp": [None] * n,
            "transaction_id": [None] * n,
        }
        for r, parked in self.parked.items():
            c["topic"][r], c["queue_id"][r], c["delivery_timestamp"][r] = parked[:3]
            c["properties"][r] = list(parked[3].items()) if parked[3] else None
            c["transaction_id"][r] = parked[4] if len(parked) > 4 else None
            if mtypes[r] not in (pb.FIFO, pb.TRANSACTION):
                c["message_type"][r] = DELAY_TYPE
        for r, q in self.placed.items():
            c["queue_id"][r] = q
        self._columns = c
        return c

    @staticmethod
    def concat(parts: list["SendRows"]) -> "SendRows":
        """The rows of several requests as one (in order; ``index`` is not kept)."""
        out = SendRows()
        for part in parts:
            base = len(out.messages)
            out.messages.extend(part.messages)
            out.parked.update({base + r: p for r, p in part.parked.items()})
            out.placed.update({base + r: q for r, q in part.placed.items()})
        out.index = list(range(len(out.messages)))
        return out

    def limit_refusals(self, limits: MessageLimits, skip: set[int]) -> dict[int, pb.Status]:
        """Row position -> the status refusing it for an input limit (``log/limits.py``),
        decided from the columns (built here once, as the append needs them anyway)
        for every row not in ``skip``."""
        c = self.columns()
        out: dict[int, pb.Status] = {}
        rows = zip(c["topic"], c["body"], c["tags"], c["keys"], c["properties"],
                   c["message_group"], c["unique_key"], c["born_host"], c["born_timestamp"])
        for r, (topic, body, tag, keys, props, group, mid, host, born) in enumerate(rows):
            if r in skip:
                continue
            bad = message_violation(limits, topic=topic, body_bytes=len(body), tag=tag,
                                    keys=keys or (), properties=dict(props) if props else None,
                                    message_group=group, message_id=mid, born_host=host,
                                    born_timestamp_ms=born,
                                    reserved_keys=RESERVED_PROPERTY_KEYS)
            if bad is not None:
                out[r] = status(Code.Value(bad.status), bad.message)
        return out

    def subset(self, positions: list[int]) -> "SendRows":
        out = SendRows()
        for p in positions:
            if p in self.placed:
                out.placed[len(out.index)] = self.placed[p]
            out.add(self.index[p], self.messages[p], self.parked.get(p))
        return out


class SendService:
    """The broker's send domain (see the module docstring). ``broker`` is the
    :class:`sparkmq.broker.Broker` whose store, role, metrics, topics, delay policy
    and transaction service it uses."""

    def __init__(self, broker):
        self.broker = broker
        self.merger = SendMerger(self._send_rows_alone, self._append_rows, SendRows.concat)
        self._queues = QueueChooser()
        self._queues_lock = threading.Lock()

    # What the send domain reads of the broker
    @property
    def store(self):
        return self.broker.store

    @property
    def metrics(self):
        return self.broker.metrics

    @property
    def role(self) -> str:
        return self.broker.role

    @property
    def ha_service(self):
        return self.broker.ha_service

    @property
    def transactions(self):
        return self.broker.transactions

    def clock_ms(self) -> int:
        return self.broker.clock_ms()

    # ------------------------------------------------------------ refusals
    def accept(self, messages, client_id: Callable[[], str]) -> "SendRows | pb.Status":
        """The rows of ``messages`` to store (delayed and transactional ones parked), or
        the status refusing the whole request. As the proxy's SendMessageActivity: every
        message has the first one's topic (else MESSAGE_CORRUPTED), and a request with a
        refused message stores nothing and answers that message's status, the first in
        request order (its text names the message), so a client that resends the
        request after fixing it stores each message once. The refusal is counted in
        ``sparkmq_send_errors_total``. ``client_id()`` names the producer of a
        transactional message (asked only when there is one)."""
        n = len(messages)
        first = messages[0].topic.name      # (a namespace is no part of a topic here)
        for i in range(1, n):
            if messages[i].topic.name != first:
                return self._refused(i, n, status(
                    Code.MESSAGE_CORRUPTED, f"its topic {messages[i].topic.name!r} is not "
                    f"the first message's {first!r}: one SendMessage request is for one "
                    "topic; send each topic's messages in a request of their own"))
        limits = MessageLimits.of(self.store.config)
        rows = SendRows()
        topics: dict[str, pb.Status | None] = {}
        refusal, transactional = self.refusal, pb.TRANSACTION
        alone: set[int] = set()      # rows whose limits were checked message by message
        for i, m in enumerate(messages):
            st = refusal(m, topics, limits)
            parked = None
            if st is None:
                mtype = m.system_properties.message_type
                if mtype == transactional:
                    topic, props, txid = self.broker.transactions.prepare_row(
                        m.topic.name, transaction_properties(m), client_id())
                    parked = (topic, 0, None, props, txid)
                elif mtype == pb.DELAY or (m.user_properties
                                           and PROP_DELAY_LEVEL in m.user_properties):
                    try:
                        parked = self.park(m)
                    except DelayRefused as e:
                        st = status(Code.ILLEGAL_DELIVERY_TIME, e.message)
                if st is None and (parked is not None
                                   or m.system_properties.HasField("delivery_timestamp")):
                    st = limits_refusal(m, limits)   # as sent, before the broker's properties
                    if st is None:
                        alone.add(len(rows))         # the position rows.add gives it
            if st is not None:
                earlier = rows.limit_refusals(limits, skip=alone)   # the rows before i
                if earlier:
                    p = min(earlier)
                    return self._refused(rows.index[p], n, earlier[p])
                return self._refused(i, n, st)
            rows.add(i, m, parked)
        bad = rows.limit_refusals(limits, skip=alone)
        if bad:
            p = min(bad)
            return self._refused(rows.index[p], n, bad[p])
        return rows

    def _refused(self, i: int, n: int, st: pb.Status) -> pb.Status:
        self.metrics.inc("sparkmq_send_errors_total", code=Code.Name(st.code))
        if n == 1:
            return st
        return status(st.code, f"message {i} of {n}: {st.message}; nothing of this request "
                               "was stored")

    def plain_rows(self, messages) -> "SendRows | None":
        """The rows of a request whose messages are all plain (NORMAL, no message group,
        tag, delivery time, delay level or gzip) bodies ``body_refusal`` lets through, for
        ONE topic that may be written: what ``refusal`` lets through with no status,
        checked a column at a time (the usual batch: ~2x cheaper than message by
        message). None if any message is not such (the request then takes ``accept``)."""
        n = len(messages)
        topics = [m.topic.name for m in messages]
        first = topics[0]
        if topics.count(first) != n:
            return None
        # One list per field and C-level counts/membership tests: cheaper than one
        # any() over a generator testing five fields per message.
        sps = [m.system_properties for m in messages]
        if [sp.message_type for sp in sps].count(pb.NORMAL) != n \
                or any([sp.message_group for sp in sps]) \
                or pb.GZIP in [sp.body_encoding for sp in sps] \
                or True in [sp.HasField("tag") or sp.HasField("delivery_timestamp") for sp in sps]:
            return None
        props = [m.user_properties for m in messages]
        if any(props) and any(p and PROP_DELAY_LEVEL in p for p in props):
            return None
        bodies = [m.body for m in messages]
        sizes = list(map(len, bodies))
        limits = MessageLimits.of(self.store.config)
        limit = limits.max_message_size_bytes
        if body_refusal(min(sizes), limit) is not None \
                or body_refusal(max(sizes), limit) is not None \
                or self.topic_refusal(first) is not None \
                or (self.broker.config.enable_topic_message_type_check and type_conflict(
                    topic_message_type(self.broker.topic_conf(first)), "NORMAL")):
            return None
        rows = SendRows.plain(messages, sps, props, bodies, first)
        if not plain_within_limits(rows.columns(), first, max(sizes), limits) \
                and rows.limit_refusals(limits, skip=set()):
            return None          # some row is refused: ``accept`` answers it alone
        return rows

    def refusal(self, m: pb.Message, topics: dict, limits: MessageLimits) -> pb.Status | None:
        """The status refusing ``m`` before it reaches the store for its topic, body and
        type, or None; ``topics`` caches the verdict per topic. The input limits are
        ``accept``'s (per message for a parked or timed one, else from the request's
        columns: ``SendRows.limit_refusals``). Each message is decided alone, before
        any merge with other requests: a bad one never fails the others."""
        topic = m.topic.name
        refused = topics.get(topic, False)
        if refused is False:
            refused = topics[topic] = self.topic_refusal(topic)
        if refused is not None:
            return refused
        refused = body_refusal(len(m.body), limits.max_message_size_bytes) or type_refusal(m)
        if refused is not None:
            return refused
        sp = m.system_properties
        if self.broker.config.enable_topic_message_type_check:
            why = type_conflict(self._expected_type(topic, topics), _actual_type(m))
            if why is not None:
                return status(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, why)
        mtype = sp.message_type
        if mtype == pb.NORMAL and not sp.message_group and not sp.HasField("tag") \
                and not sp.HasField("delivery_timestamp") and sp.body_encoding != pb.GZIP:
            return None              # the common case, decided with the fewest lookups
        if mtype == pb.NORMAL and not sp.message_group:
            pass
        elif mtype == pb.TRANSACTION and self.transactions is None:
            return status(Code.UNSUPPORTED, "transactional messages are served by the master "
                          "only")
        elif mtype == pb.TRANSACTION and sp.HasField("delivery_timestamp"):
            return status(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          "a transactional message cannot carry a delivery timestamp")
        elif mtype == pb.DELAY and not sp.HasField("delivery_timestamp") \
                and PROP_DELAY_LEVEL not in m.user_properties:
            return status(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          "a DELAY message needs a delivery timestamp (or a DELAY level property)")
        elif (mtype == pb.FIFO) != bool(sp.message_group):
            return status(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          "a FIFO message needs a message group, and only FIFO messages may have one")
        if sp.HasField("delivery_timestamp") and mtype != pb.DELAY:
            return status(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          "only DELAY messages may carry a delivery timestamp")
        if sp.body_encoding == pb.GZIP:
            return status(Code.UNSUPPORTED, "gzip-encoded bodies are not supported")
        return recovery_refusal(sp) if mtype == pb.TRANSACTION else None

    def _expected_type(self, topic: str, cache: dict) -> str:
        """The message type ``topic`` accepts (cached per request in ``cache``)."""
        key = ("type", topic)
        if key not in cache:
            cache[key] = topic_message_type(self.broker.topic_conf(topic))
        return cache[key]

    def topic_refusal(self, topic: str) -> pb.Status | None:
        """The status refusing a send to ``topic``: an illegal name (ILLEGAL_TOPIC), or a
        topic that is not here and may not be created (TOPIC_NOT_FOUND); else None."""
        try:
            validate_topic(topic)
        except InvalidNameError as e:
            return status(Code.ILLEGAL_TOPIC, e.message)
        if not self.broker.ensure_topic(topic):
            return status(Code.TOPIC_NOT_FOUND,
                          f"topic {topic!r} does not exist on broker {self.broker.config.broker_name}; "
                          "create it first (autoCreateTopicEnable is off)")
        return None

    def park(self, m: pb.Message) -> tuple | None:
        """Where a delayed message waits: (schedule topic, queue, due ms, properties), or
        None for a message to store at once. Raises DelayRefused (ILLEGAL_DELIVERY_TIME)."""
        sp = m.system_properties
        if not sp.HasField("delivery_timestamp") and PROP_DELAY_LEVEL not in m.user_properties:
            return None
        at_ms = ms_of_timestamp(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") \
            else None
        return parked_row(self.broker.delay_policy, self.clock_ms(), m.topic.name,
                          dict(m.user_properties), at_ms)

    # ------------------------------------------------------------ store
    def send_rows(self, rows) -> list:
        """Append the accepted messages of one request (a ``SendRows``); returns
        per row ``(PutMessageStatus, message id, queue offset, transaction id)`` or the
        exception that refused it. SYNC_FLUSH returns after the fsync. Requests waiting
        at the same moment are appended as ONE record batch (``SendMerger``); on the
        gRPC loop a request is appended alone (``replicawait.merges``), and inside
        ``replicawait.held`` its caller awaits the fsync and the replica."""
        self.place(rows)
        # (on the gRPC loop, one at a time: replicawait; each request's replica wait after)
        return resolve(self, self.merger.submit(rows, merge=merges()))

    def request_queue(self, topic: str) -> int:
        """The queue of one request's rows of ``topic`` that have neither a queue nor a
        message group: the next one round robin (the proxy sends a request to one queue)."""
        n = self.broker.topic_conf(topic).write_queue_nums
        with self._queues_lock:
            return self._queues.next_queue(topic, n)

    def request_queues(self, topics: Sequence[str], free: Sequence[bool]) -> list[int | None]:
        """Where the rows of ONE request go, on both wire paths (this method, and
        ``request_queue`` for a request of one topic): a free row (no queue of its own, no
        message group, not parked) to ONE queue per topic of the request, round robin
        request by request, as the proxy sends a request to one queue; any other row:
        None (it keeps its own queue, the store hashes its group, or it is parked)."""
        chosen: dict[str, int] = {}
        out: list[int | None] = []
        for topic, is_free in zip(topics, free):
            if not is_free:
                out.append(None)
                continue
            q = chosen.get(topic)
            if q is None:
                q = chosen[topic] = self.request_queue(topic)
            out.append(q)
        return out

    def place(self, rows: SendRows) -> None:
        """Give the rows of one request that are not parked and have no message group
        their queue (``request_queues``); a plain request without a loop."""
        c, n = rows.columns(), len(rows)
        topics, groups = c["topic"], c["message_group"]
        if not rows.parked and groups.count(None) == n and topics.count(topics[0]) == n:
            q = self.request_queue(topics[0])
            rows.placed, c["queue_id"] = dict.fromkeys(range(n), q), [q] * n
            return
        free = [g is None and r not in rows.parked for r, g in enumerate(groups)]
        for r, q in enumerate(self.request_queues(topics, free)):
            if q is not None:
                rows.placed[r] = c["queue_id"][r] = q

    def _send_rows_alone(self, rows) -> list:
        """``send_rows`` for one SendRows as one record batch. If the batch is refused or
        fails as a whole, rows are appended one by one to isolate the bad one."""
        try:
            return self._append_rows(rows)
        # refused as a whole (a SparkMQError, or an unexpected error of one row's
        # values): row by row below, so only the bad row fails
        except Exception as e:
            if len(rows) == 1:
                return [_logged(e)]
        out: list = []
        for p in range(len(rows)):
            try:
                out += self._append_rows(rows.subset([p]))
            # this row's own error, answered in its entry only (INTERNAL_ERROR if unexpected)
            except Exception as e:
                out.append(_logged(e))
        return out

    def check_append(self) -> None:
        """Refuse an append before anything is stored: a replica or fenced master, a
        master out of lease (PermissionDeniedError), a SYNC_MASTER no replica can
        acknowledge (ReplicaNotAvailableError; RocketMQ 5 checks its in-sync replicas
        before putting). Every wire path calls this before it appends."""
        ha_role = self.broker.ha    # (read once: every send asks, on the loop)
        refusal = ha_role.write_refusal()
        if refusal is not None:
            raise PermissionDeniedError(refusal)
        ha = ha_role.ha_service
        if ha_role.role == "SYNC_MASTER" and ha is not None and self.broker.controlled is None \
                and not ha.has_replica():
            raise ReplicaNotAvailableError(
                "no replica is attached to acknowledge the send (SYNC_MASTER); nothing was "
                "stored: retry, or send to another broker group")

    def never_waits(self) -> bool:
        """Whether a send returns once appended (ASYNC_FLUSH, not SYNC_MASTER): served one
        at a time (the gRPC loop; the Flight put lock). Sends that wait are awaited on
        the loop (``replicawait``) or, on threads, merged (one fsync for all)."""
        return self.store is not None and \
            self.store.config.flush_disk_type == "ASYNC_FLUSH" and self.role != "SYNC_MASTER"

    def replicated(self, r) -> PutMessageStatus:
        """The status of append ``r`` once the broker's role is satisfied: SYNC_MASTER
        waits for its replica (controller mode: every other SyncStateSet member, and
        the lease must still hold). Every wire path calls this after it appends."""
        ha_role = self.broker.ha    # (read once, as in ``check_append``)
        put_status, ha = r.status, ha_role.ha_service
        controlled = self.broker.controlled
        waits = ha_role.role == "SYNC_MASTER" and ha is not None    # for a replica's ack
        if HELD.offsets is not None and put_status is PutMessageStatus.PUT_OK:
            if waits:
                HELD.offsets.append(r.batch_offset + 1)
            return put_status    # the caller awaits the replica, then checks the lease
        if controlled is not None and put_status is PutMessageStatus.PUT_OK:
            if waits:
                put_status = ha.wait_replicated_by(r.batch_offset + 1,
                                                   controlled.sync_replica_ids(),
                                                   self.store.config.sync_flush_timeout_ms)
            if not controlled.lease_valid():
                put_status = PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        elif waits and put_status is PutMessageStatus.PUT_OK:
            put_status = ha.wait_replicated(r.batch_offset + 1,
                                            self.store.config.sync_flush_timeout_ms)
        if put_status is not r.status:
            count_failure(self.metrics, put_status)
        return put_status

    def _append_rows(self, rows) -> list:
        self.check_append()
        c = rows.columns()
        n = len(rows)
        topics, unique_keys, txids = c["topic"], c["unique_key"], c["transaction_id"]
        now = self.clock_ms()
        # One batch in SEGMENT_SCHEMA (the store's no-cast path), built by the log's one
        # builder; rows without a queue id are placed by the store's one queue chooser
        # (message group -> crc32 % queues, else round robin); the store stamps
        # store_timestamp under its append lock. Every row was held to every rule (body,
        # log/limits, the topic) by ``refusal``/``plain_rows`` before merging, and was
        # built from Python values: BuiltRows, which the store does not check again.
        one = topics[0] if topics.count(topics[0]) == n else None
        qs = c["queue_id"]
        rows = build_rows({name: c[name] for name in _SEGMENT_COLUMNS}, n,
                          store_host=self.store.config.store_host, now_ms=now, topic=one,
                          queue=qs[0] if qs[0] is not None and qs.count(qs[0]) == n else None)
        r = self.store.append_batch(rows, later=HELD.flushes)
        put_status = Replicating(r)         # (send_rows waits, after the merger)
        per_topic: dict[str, list[int]] = {}
        if one is not None:                       # one topic: no per-row loop
            per_topic[one] = [n, rows.nbytes]
        else:
            for t, body in zip(topics, c["body"]):
                acc = per_topic.get(t)
                if acc is None:
                    acc = per_topic[t] = [0, 0]
                acc[0] += 1
                acc[1] += len(body)
        for t, (count, nbytes) in per_topic.items():
            self.metrics.count_sent(t, count, nbytes)
        qos = r.queue_offsets.tolist()
        has_tx = any(txids)
        if self.transactions is not None and has_tx:
            self.transactions.on_stored()
        if all(unique_keys):
            if not has_tx:
                return [(put_status, k, qo, None) for k, qo in zip(unique_keys, qos)]
            return [(put_status, k, qo, tx) for k, qo, tx in zip(unique_keys, qos, txids)]
        tag = self.store.state.id_tags.at(r.batch_offset)
        return [(put_status, unique_keys[j] or encode_message_id(tag, r.batch_offset, j), qos[j],
                 txids[j]) for j in range(n)]


def _actual_type(m: pb.Message) -> str:
    """A message's type as the proxy reads it from its properties (TopicMessageType.
    parseFromMessageProperty): transaction, else delay, else FIFO (a message group),
    else normal."""
    sp = m.system_properties
    if sp.message_type == pb.TRANSACTION:
        return "TRANSACTION"
    if sp.message_type == pb.DELAY or sp.HasField("delivery_timestamp") \
            or (m.user_properties and PROP_DELAY_LEVEL in m.user_properties):
        return "DELAY"
    return "FIFO" if sp.message_group else "NORMAL"
