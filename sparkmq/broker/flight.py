"""The Arrow Flight service of the broker (``flightPort``; docs/PROTOCOL.md): record batches
go into the store and come out of it without being taken apart message by message.

* **DoPut** (descriptor path ``["send"]``): each record batch the client writes holds
  messages (columns: ``topic`` and ``body`` required; ``tags``, ``keys``,
  ``properties``, ``message_group``, ``unique_key``, ``born_timestamp``, ``born_host``,
  ``queue_id`` optional); a row with a message group is stored as FIFO, as the RocketMQ
  path stores it; the rows with neither a queue id nor a group go to one queue per
  batch, as a RocketMQ request does (``batchsend``). Each is stored as ONE append with
  the same durability as a RocketMQ send
  (SYNC_FLUSH fsynced, SYNC_MASTER replicated) and acknowledged by one metadata message:
  an Arrow IPC stream of ``(queue_id int32, queue_offset int64, message_id string)``
  per row. Delay and transaction messages are refused with a message naming the
  RocketMQ path. Several streams' puts: where a send waits (for its fsync or its
  replica) the batches waiting together are one append (``SendMerger``, as gRPC
  requests: one wait for all); where none waits (``SendService.never_waits``) the puts
  run one at a time under a lock, as the gRPC path's sends run on its one event loop
  (4 streams: ~20% more messages a second than handler threads trading the GIL within
  each put; bench/README.md).
* **DoGet** (ticket: JSON ``{"topic", "queue", "offset", "max", "pollMs"}``): the
  messages of one queue from ``offset`` (at most ``max``), as stored, zero copy; with
  none yet, it waits up to ``pollMs`` for arrivals (long polling, the same capacity as
  the gRPC path). ``"view": "consumer"`` gives the messages as the RocketMQ path delivers
  them: ``message_id`` the producer's id (``unique_key``) where it set one, and no broker
  bookkeeping among the ``properties`` (sparkmq's PullConsumer asks for it).
* **DoAction** ``commitOffset`` (body JSON ``{"group", "topic", "queue", "offset"}``):
  records a consumer group's offset as the RocketMQ path's UpdateOffset does (GetOffset
  answers it at once) and commits it to the store.

Stopping: ``stop`` ends every DoPut stream after its current batch (a client reopens
one, or falls back to gRPC); a stream idle in the client's hands holds the server's
shutdown until the client closes it (sparkmq's Producer closes idle streams within
``flight_idle_s``).

Checks are the RocketMQ path's, one implementation each: credentials and ACLs
(``authn``/``authz``, whose ``send_resources``/``read_resources``/
``offset_update_resources`` both paths ask: Pub on each topic sent to, Sub on a topic
read, Sub or Update on the group and topic of a commit, as UpdateOffset), the topic's
message type, the input limits (``batchsend.BatchSender.check``, the core a plain
RocketMQ request goes through too),
writability and replication (``SendService.check_append`` / ``replicated``).
Errors map to Flight's: UNAUTHENTICATED, UNAUTHORIZED, invalid argument, unavailable.
A topic or group name is checked as the RocketMQ path checks it, so the broker's own
topics (``RMQ_SYS_*``: half messages; ``SCHEDULE_TOPIC_XXXX``: parked delayed ones) are
not read here either.

Transport: the listening address (``brokerIP1``) and TLS (``tlsServerMode=enforcing``:
``grpc+tls`` with ``tlsServerCertPath``/``tlsServerKeyPath``, plaintext refused) are the
gRPC port's, so this port is exactly as reachable and as protected as that one.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

from ..errors import (AuthenticationError, AuthorizationError, MessageLimitError,
                      RetriableError, SparkMQError, UserError)
from ..log.batch import none_if_empty
from ..log.dispatch import distinct_strings
from ..log.limits import check_valid_arrow
from ..log.message import batch_message_ids, delivered_ids, id_prefix
from ..log.names import validate_group, validate_topic
from ..log.segment import EOS
from ..log.status import PutMessageStatus
from ..properties import whole
from ..tagexpr import tag_set
from .authz import offset_update_resources, peer_ip, read_resources, send_resources
from .batchsend import SEND_COLUMNS, send_shape, typed
from .protocol import INTERNAL_PROPERTY_KEYS, Code, stored_status

try:
    from .. import _ipc
except ImportError:     # not built here (no C compiler): pyarrow writes every ack
    _ipc = None

log = logging.getLogger("sparkmq.broker.flight")

FOLLOW_WAIT_S = 1.0    # a followed read checks for a cancelled call or a stop this often
ACK_SCHEMA = pa.schema([("queue_id", pa.int32()), ("queue_offset", pa.int64()),
                        ("message_id", pa.string())])
MAX_GET = 10_000
_TOGETHER = contextlib.nullcontext()    # (puts that wait: the merger takes them together)
_ACK_SCHEMA_MESSAGE = ACK_SCHEMA.serialize()


def _ack_stream(schema_message: pa.Buffer, queue_ids: np.ndarray, queue_offsets: np.ndarray,
                ids: pa.Array) -> pa.Buffer:
    """An ack as an Arrow IPC stream of one batch (ACK_SCHEMA): its schema's message, the
    batch's, the end marker. The batch's message is written in one C call from the
    columns' buffers where ``sparkmq._ipc`` was built (the ids as one array, none null),
    else by pyarrow. (A stream writer per ack costs ~20 us more: options, a sink, a
    writer.)"""
    n = len(queue_ids)
    qids = np.ascontiguousarray(queue_ids, np.int32)
    qos = np.ascontiguousarray(queue_offsets, np.int64)
    if _ipc is not None and isinstance(ids, pa.Array) and not ids.offset \
            and not ids.null_count and ids.type == pa.string():
        _, id_offsets, id_data = ids.buffers()
        batch = _ipc.message_of_buffers(n, ((n, 0),) * 3,
                                        (None, qids, None, qos, None, id_offsets, id_data))
    else:
        batch = pa.RecordBatch.from_arrays([pa.array(qids), pa.array(qos), ids],
                                           schema=ACK_SCHEMA).serialize()
    return pa.py_buffer(b"".join((schema_message, batch, EOS)))


def _broker_ids_ack(schema_message: pa.Buffer, queue_ids: np.ndarray,
                    queue_offsets: np.ndarray, tag: int, batch_offset: int,
                    first: int) -> pa.Buffer:
    """:func:`_ack_stream` of rows whose ids are the broker's (``batch_message_ids``: rows
    ``first..`` of the batch at ``batch_offset``): written whole by one C call
    (``_ipc.id_ack``, the same bytes) where that module was built."""
    qids = np.ascontiguousarray(queue_ids, np.int32)
    qos = np.ascontiguousarray(queue_offsets, np.int64)
    if _ipc is not None:
        data = _ipc.id_ack(schema_message, EOS, qids, qos,
                           id_prefix(tag, batch_offset).encode(), first)
        if data is not None:
            return pa.py_buffer(data)
    return _ack_stream(schema_message, qids, qos,
                       batch_message_ids(tag, batch_offset, len(qids), first))


def _typed_send(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, list]:
    """A send batch that ``send_shape`` did not read (valid Arrow naming each column once:
    ``check_valid_arrow``; a column to cast, nested or not a send column, an empty tag or
    message group, more than one topic, a null topic or body): its columns checked by
    name, cast to their types and empty text made null; and its topics."""
    order = batch.schema.names
    names = set(order)
    unknown = names - SEND_COLUMNS
    if unknown & {"delivery_timestamp", "transaction_id"}:
        raise UserError("delay and transaction messages go through the RocketMQ gRPC "
                        "path (delivery time, recall, check-back); send them there")
    if unknown or not {"topic", "body"} <= names:
        raise UserError(f"a Flight send batch has columns topic, body (required) and "
                        f"{', '.join(sorted(SEND_COLUMNS - {'topic', 'body'}))}; got "
                        f"{batch.schema.names}")
    batch = _empty_as_none(typed(batch), order)
    topics = distinct_strings(batch.column(order.index("topic")))
    if None in topics:
        raise UserError("every row needs a topic")
    return batch, topics


def _empty_as_none(batch: pa.RecordBatch, names: list[str]) -> pa.RecordBatch:
    """``batch`` (columns ``names``) with each empty ``tags`` or ``message_group`` value
    null (the log's rule, ``batch.none_if_empty``)."""
    for name in ("tags", "message_group"):
        if name in names:
            i = names.index(name)
            given = batch.column(i)
            col = none_if_empty(given)
            if col is not given:
                batch = batch.set_column(i, batch.schema.field(i), col)
    return batch


class _Auth(fl.ServerMiddleware):
    def __init__(self, user):
        self.user = user


class _AuthFactory(fl.ServerMiddlewareFactory):
    """Checks the RocketMQ 5 signature headers of every call (authn.py)."""

    def __init__(self, broker):
        super().__init__()
        self.broker = broker

    def start_call(self, info, headers):
        authn = self.broker.authenticator
        if not authn.enabled:          # (no user: no middleware, the headers not read)
            return None
        md = [(k, v[0] if isinstance(v, list) else v) for k, v in headers.items()]
        try:
            return _Auth(authn.check(md))
        except AuthenticationError as e:
            raise fl.FlightUnauthenticatedError(e.message)


class _NotAcknowledged(SparkMQError):
    """A batch the store took without the durability its send asked for (``status``: a
    ``stored_status`` other than MASTER_PERSISTENCE_TIMEOUT, which is acked). Its text
    on the wire is the RocketMQ code and message (``_flight_error``)."""

    def __init__(self, status):
        super().__init__(status.message)
        self.status = status

    def __str__(self) -> str:
        return f"{Code.Name(self.status.code)}: {self.status.message}"


def _flight_error(e: Exception) -> Exception:
    if isinstance(e, _NotAcknowledged):   # stored here, not known to be on a replica: as
        #                                   a deadline passed, the outcome is not known
        if e.status.code == Code.SLAVE_PERSISTENCE_TIMEOUT:
            return fl.FlightTimedOutError(str(e))
        return fl.FlightInternalError(str(e))
    if isinstance(e, AuthorizationError):
        return fl.FlightUnauthorizedError(e.message)
    if isinstance(e, AuthenticationError):
        return fl.FlightUnauthenticatedError(e.message)
    if isinstance(e, RetriableError):   # the code tells it from a transport failure
        return fl.FlightUnavailableError(f"{e.code}: {e.message}")
    if isinstance(e, MessageLimitError):    # the proxy's status for it, as gRPC answers
        return pa.ArrowInvalid(f"{e.code}: {e.status}: {e.message}")
    if isinstance(e, SparkMQError):
        return pa.ArrowInvalid(f"{e.code}: {e.message}")
    return fl.FlightInternalError(f"{type(e).__name__}: {e}")


def _committed_offsets(req: dict) -> dict[int, int]:
    """The queue -> offset a ``commitOffset`` body names: its ``queue`` and ``offset``, or
    its ``offsets`` (``[[queue, offset], ...]``, each queue once); ValueError otherwise."""
    if "offsets" not in req:
        return {whole(req["queue"], "queue"): whole(req["offset"], "offset")}
    if "queue" in req or "offset" in req:
        raise ValueError("give 'offsets' or 'queue' and 'offset', not both")
    pairs, out = req["offsets"], {}
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"'offsets' is a non-empty list of [queue, offset], got {pairs!r}")
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"each of 'offsets' is [queue, offset], got {pair!r}")
        queue = whole(pair[0], "queue")
        if queue in out:
            raise ValueError(f"queue {queue} is in 'offsets' twice")
        out[queue] = whole(pair[1], "offset")
    return out


def _next_metadata(queue: int, nxt: int) -> bytes:
    """A followed batch's app_metadata, ``{"queue": queue, "next": nxt}`` as JSON (the
    bytes ``json.dumps`` gives, formatted: a dumps call per message was ~4 us)."""
    return b'{"queue": %d, "next": %d}' % (queue, nxt)


def _followed_batches(table: pa.Table, queue: int, tags: frozenset[str] | None):
    """A followed read's reply for one queue: each stored batch of ``table`` (zero-copy)
    with app_metadata ``{"queue", "next"}`` (the offset after it), its rows cut to
    ``tags`` (a batch left with none still goes: its metadata moves the reader on)."""
    keep = None if tags is None else pa.array(sorted(tags), pa.string())
    for batch in table.to_batches():
        if not batch.num_rows:
            continue
        nxt = batch.column("queue_offset")[-1].as_py() + 1
        if keep is not None:
            batch = batch.filter(pc.is_in(batch.column("tags"), value_set=keep))
        yield batch, _next_metadata(queue, nxt)


class FlightService(fl.FlightServerBase):
    """See the module docstring; ``broker`` is the Broker."""

    def __init__(self, broker, host: str, port: int, *,
                 tls_pair: tuple[bytes, bytes] | None = None):
        self.scheme = "grpc+tls" if tls_pair is not None else "grpc+tcp"
        super().__init__(f"{self.scheme}://{host}:{port}",
                         tls_certificates=[fl.CertKeyPair(*tls_pair)] if tls_pair else [],
                         middleware={"auth": _AuthFactory(broker)})
        self.broker = broker
        self._stopping = threading.Event()
        # puts that never wait run one at a time (SendService.never_waits): several
        # streams' handler threads at once only trade the GIL back and forth
        self._alone = threading.Lock()

    @property
    def endpoint(self) -> str:
        """``grpc+tls://host:port`` (``tlsServerMode=enforcing``) or ``grpc+tcp://host:port``:
        where a Flight client connects, as QueryRoute advertises it (grpc_service.py)."""
        return f"{self.scheme}://{self.broker.config.host}:{self.port}"

    # ------------------------------------------------------------ helpers
    def _user(self, context):
        mw = context.get_middleware("auth")
        return mw.user if mw is not None else None

    def _authorize(self, context, resources, *args) -> None:
        """As ``grpc_service._authorized`` decides an RPC: the broker's one authorizer,
        the user the middleware authenticated, the caller's IP (ACL source IPs), on the
        resources ``resources(*args)`` names (not listed where authorization is off)."""
        authz = self.broker.authorizer
        if authz.enabled:
            authz.check(self._user(context), resources(*args), peer_ip(context.peer()))

    # ------------------------------------------------------------ produce
    def do_put(self, context, descriptor, reader, writer):
        if list(descriptor.path or []) != [b"send"]:
            raise pa.ArrowInvalid("DoPut takes the descriptor path ['send'] (docs/PROTOCOL.md)")
        notifier = self.broker.notifier
        for chunk in reader:
            # Long polls are woken once the ack is written, as the gRPC path wakes them
            # after its reply: a woken DoGet would take the GIL from this ack.
            arrived: set = set()
            try:
                alone = self._alone if self.broker.sender.never_waits() else _TOGETHER
                with notifier.deferred() as arrived, alone:
                    try:
                        ack = self._send(context, chunk.data)
                    except Exception as e:   # one batch's failure ends this stream only
                        if not isinstance(e, SparkMQError):
                            log.exception("Flight send failed")
                        raise _flight_error(e) from None
                writer.write(ack)
            finally:
                if arrived:
                    notifier.wake(arrived)
            if self._stopping.is_set():     # end the stream: the broker is stopping
                return

    def _send(self, context, batch: pa.RecordBatch) -> pa.Buffer:
        shape = send_shape(batch)           # the usual batch: one C call says what it holds
        if shape is None:
            check_valid_arrow(batch, "the Flight send batch")    # before anything reads it
            batch, topics = _typed_send(batch)
            order = batch.schema.names
        else:
            order, topics = shape.names, [shape.topic]
        self._authorize(context, send_resources, topics)
        core = self.broker.batch_sender
        rows = core.check(batch, topics) if shape is None else core.check_shape(shape)
        stored = core.store(rows, topics)
        r, late = stored.r, None
        if stored.status is not PutMessageStatus.PUT_OK:   # as the RocketMQ path answers it
            late = stored_status(stored.status)
            if late.code != Code.MASTER_PERSISTENCE_TIMEOUT:
                raise _NotAcknowledged(late)
        # (long polls were woken per queue by the store's arrival listener as the rows
        # became visible: a wake here by topic would wake every queue's pulls again)
        # a producer's own id wins (``typed``: the column is a string array)
        own = batch.column(order.index("unique_key")) if "unique_key" in order else None
        tag = self.broker.store.state.id_tags.at(r.batch_offset)
        schema = _ACK_SCHEMA_MESSAGE if late is None else ACK_SCHEMA.with_metadata(
            {"status": Code.Name(late.code), "message": late.message}).serialize()
        if own is None:                 # the broker's ids: the whole ack in one C call
            return _broker_ids_ack(schema, stored.queue_ids, stored.queue_offsets, tag,
                                   r.batch_offset, stored.start)
        ids = delivered_ids(own, lambda: batch_message_ids(
            tag, r.batch_offset, batch.num_rows, stored.start))
        return _ack_stream(schema, stored.queue_ids, stored.queue_offsets, ids)

    # ------------------------------------------------------------ consume
    def do_get(self, context, ticket):
        try:
            req = json.loads(ticket.ticket)
            topic = str(req["topic"])
            follow = req.get("follow")
            if follow is not None:      # [[queue, offset], ...]: a followed read
                positions = {whole(q, "follow"): whole(o, "follow") for q, o in follow}
                if not positions:
                    raise ValueError("'follow' names no queue")
            else:
                queue, offset = whole(req["queue"], "queue"), whole(req["offset"], "offset")
            limit = min(max(1, whole(req.get("max") or 1000, "max")), MAX_GET)
            poll_ms = min(max(0, whole(req.get("pollMs") or 0, "pollMs")),
                          self.broker.config.max_long_polling_ms)
            consumer_view = req.get("view") == "consumer"
            group = req.get("group")
            group = None if group is None else str(group)
            tags = req.get("tags")               # a followed read's filter (None: all)
            if tags is not None and not isinstance(tags, str):
                raise TypeError(f"'tags' is a tag expression string, got {tags!r}")
            tags = tag_set(tags)
        except (ValueError, KeyError, TypeError) as e:   # (FilterExpressionError too)
            raise pa.ArrowInvalid(f"a DoGet ticket is JSON {{topic, queue, offset, max, "
                                  f"pollMs}} or {{topic, follow: [[queue, offset], ...], "
                                  f"max, tags}}: {e}") from None
        try:
            validate_topic(topic)        # RMQ_SYS_* and the like are the broker's own
            if group is not None:
                validate_group(group)

            def authorize() -> None:
                self._authorize(context, read_resources, topic, group)
            authorize()
            if follow is not None:
                self.broker.notifier.admissible()     # (counted in _follow: holding)
                schema = self._followed_schema(topic, positions)
                return fl.GeneratorStream(schema, self._follow(
                    context, topic, positions, limit, consumer_view, tags, authorize))
            table = self._read(topic, queue, offset, limit, poll_ms)
            if consumer_view:
                table = consumer_view_of(table)
        except Exception as e:   # every failure goes back as a Flight error; the service goes on
            raise _flight_error(e) from None
        return fl.RecordBatchStream(table)

    def _followed_schema(self, topic: str, positions: dict[int, int]) -> pa.Schema:
        """The reply schema of a followed read, every queue checked first (a missing
        topic or queue is the call's error, before the stream starts)."""
        self._require_topic(topic)
        for q, o in positions.items():     # an empty read of each: its queue exists
            schema = self.broker.store.read_table(topic, q, o, o).schema
        return schema

    def _require_topic(self, topic: str) -> None:
        if self.broker.topic_conf(topic) is None:
            from ..errors import TopicNotFoundError
            raise TopicNotFoundError(f"topic {topic!r} does not exist")

    def _follow(self, context, topic: str, positions: dict[int, int], limit: int,
                consumer_view: bool, tags: frozenset[str] | None, authorize):
        """A followed read's batches: each queue's messages from its offset (at most
        ``limit`` per queue and round) as they arrive, one queue per batch, until the
        client cancels the call or the broker stops. One thread and one call serve
        every queue of it: no call or ticket per delivery; ``authorize()`` (the ACL
        check) again once a second, so a revoked right ends the stream."""
        try:
            # a long poll for its whole life: it counts against maxLongPollingRequests
            with self.broker.notifier.holding():
                yield from self._followed(context, topic, positions, limit, consumer_view,
                                          tags, authorize)
        except Exception as e:   # ends this stream with the error; the service goes on
            raise _flight_error(e) from None

    def _followed(self, context, topic: str, positions: dict[int, int], limit: int,
                  consumer_view: bool, tags: frozenset[str] | None, authorize):
        store, notifier = self.broker.store, self.broker.notifier
        checked = time.monotonic()
        # (a reader that went away fails the next write, which ends this generator: the
        # call is asked whether it was cancelled only before a wait. Asking costs the
        # sync server a poll of its completion queue with the GIL held: ~5 % of a
        # broker's time at 1,000 one-message puts a second when asked every turn)
        while not self._stopping.is_set():
            if time.monotonic() - checked >= FOLLOW_WAIT_S:
                authorize()
                checked = time.monotonic()
            seen = notifier.version(topic)            # any queue of the topic
            sent = False
            for q, offset in positions.items():
                hi = store.max_offset(topic, q)
                if hi <= offset:        # (the usual queue of a turn: nothing new)
                    end = None if hi == offset else \
                        self.broker.receiver.past_end(topic, q, offset)
                    if end is not None:     # past the end: the reader goes on from it, as DoGet
                        positions[q] = end
                        schema = store.read_table(topic, q, end, end).schema
                        yield (pa.RecordBatch.from_pylist([], schema=schema),
                               _next_metadata(q, end))
                        sent = True
                    continue
                table = store.read_table(topic, q, offset, min(hi, offset + limit))
                if table.num_rows:
                    positions[q] = table.column("queue_offset")[-1].as_py() + 1
                    if consumer_view:
                        table = consumer_view_of(table)
                    yield from _followed_batches(table, q, tags)
                    sent = True
            if not sent:
                if context.is_cancelled():
                    return
                notifier.wait(topic, seen, FOLLOW_WAIT_S, held=True)

    def _read(self, topic: str, queue: int, offset: int, limit: int, poll_ms: int) -> pa.Table:
        store, notifier = self.broker.store, self.broker.notifier
        self._require_topic(topic)
        end = self.broker.receiver.past_end(topic, queue, offset)
        if end is not None:          # no rows; where to read from instead (PROTOCOL.md)
            table = store.read_table(topic, queue, end, end)
            return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                  b"status": b"ILLEGAL_OFFSET",
                                                  b"next": str(end).encode()})
        deadline = time.monotonic() + poll_ms / 1000.0
        while True:
            seen = notifier.version(topic, queue)
            hi = store.max_offset(topic, queue)
            if hi > offset:
                return store.read_table(topic, queue, offset, min(hi, offset + limit))
            left = deadline - time.monotonic()
            if left <= 0:
                return store.read_table(topic, queue, offset, offset)
            notifier.wait(topic, seen, left, queue)

    # ------------------------------------------------------------ offsets
    def do_action(self, context, action):
        if action.type != "commitOffset":
            raise pa.ArrowInvalid(f"unknown action {action.type!r}; actions: commitOffset")
        try:
            req = json.loads(action.body.to_pybytes())
            group, topic = str(req["group"]), str(req["topic"])
            offsets = _committed_offsets(req)
            validate_group(group), validate_topic(topic)
            self._authorize(context, offset_update_resources, group, topic)
            self.broker.receiver.commit_offsets(group, topic, offsets)   # one store commit
        except (ValueError, KeyError, TypeError) as e:
            raise pa.ArrowInvalid(f"commitOffset takes JSON {{group, topic, queue, offset}} "
                                  f"or {{group, topic, offsets: [[queue, offset], ...]}}: "
                                  f"{e}") from None
        except Exception as e:   # every failure goes back as a Flight error; the service goes on
            raise _flight_error(e) from None
        return iter([fl.Result(b'{"ok": true}')])

    def list_actions(self, context):
        return [("commitOffset", "record a consumer group's next offset of one queue, or of "
                                 "several queues of a topic at once")]

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "FlightService":
        """The server serves from construction (pyarrow binds and starts it in
        ``__init__``). Never ``serve()``: it replaces the process's SIGINT/SIGTERM
        handlers with its own, which stop only the Flight server and re-raise the signal
        on the serving thread, so the daemon's main thread never learns of it and
        ``sparkmq broker`` ignores a SIGTERM."""
        return self

    def stop(self) -> None:
        """End DoPut streams after their current batch and shut the server down,
        waiting for the calls in progress (a stream held idle by a client until the
        client closes it)."""
        self._stopping.set()
        self.shutdown()


#: a read's few property keys are looked up in Python (a set), more with a kernel
_FEW_KEYS = 64


def _internal_keys_in(keys: pa.Array) -> bool:
    """Whether any of a properties map's ``keys`` (a string array) is one of
    ``INTERNAL_PROPERTY_KEYS``."""
    if len(keys) <= _FEW_KEYS:      # (a long poll's message or two: ~1 us, not ~15)
        return not INTERNAL_PROPERTY_KEYS.isdisjoint(keys.to_pylist())
    return pc.any(pc.is_in(keys, _internal_keys())).as_py()


@functools.cache
def _internal_keys() -> pa.Array:
    return pa.array(sorted(INTERNAL_PROPERTY_KEYS), pa.string())


def consumer_view_of(table: pa.Table) -> pa.Table:
    """``table`` (a DoGet read) as the RocketMQ path delivers its messages: ``message_id``
    is the producer's id where it set one (``unique_key``), and the broker's own keys
    (``INTERNAL_PROPERTY_KEYS``) are not among the ``properties``. Zero copy where no
    row carries such a key (the usual case)."""
    ids = delivered_ids(table.column("unique_key"), lambda: table.column("message_id"))
    table = table.set_column(table.schema.get_field_index("message_id"),
                             table.schema.field("message_id"), ids)
    props = table.column("properties")
    if not any(_internal_keys_in(chunk.keys) for chunk in props.chunks if len(chunk.keys)):
        return table
    kept = [None if p is None else [(k, v) for k, v in p if k not in INTERNAL_PROPERTY_KEYS]
            or None for p in props.to_pylist()]
    return table.set_column(table.schema.get_field_index("properties"),
                            table.schema.field("properties"),
                            pa.array(kept, props.type))
