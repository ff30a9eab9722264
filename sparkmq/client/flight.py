"""The Arrow Flight transport of sparkmq's Producer and PullConsumer (docs/PROTOCOL.md).

A broker serving Flight advertises its Flight location on QueryRoute answers
(``RouteCache.flight_endpoint``: ``grpc+tls://host:port`` when its client ports are TLS,
else ``grpc+tcp://host:port``; an older broker's bare ``host:port`` is plaintext); TLS
connections trust the roots of the client's gRPC TLS settings (``tls=``). For that
broker the clients then
- send batches as one DoPut record batch each, on a stream kept open and reused (a send
  is one write and one ack read: ~0.4 ms less than opening a DoPut per send, see
  bench/bench_flight.py), acknowledged with (queue id, queue offset, message id) per row;
- pull a queue from an offset with DoGet (``"view": "consumer"``: the messages as the
  RocketMQ path delivers them) and commit offsets with DoAction ``commitOffset``.

Which transport (``transport=``): ``"auto"`` (default) uses Flight where the broker offers
it and gRPC otherwise, and falls back to gRPC when Flight fails to connect, marking that
Flight endpoint down for ``down_s``; ``"flight"`` is the same without the fallback (a
connection failure is the broker's: BrokerUnavailableError); ``"grpc"`` never uses
Flight. Whatever Flight refuses by design (delayed and transactional messages) goes over
gRPC in every mode. Messages are the same once stored: the producer sends the columns
the RocketMQ path stores (message id, born time and host, tag, keys, properties, group).

Streams: at most one per sending thread, endpoint and schema (``PLAIN_SEND_SCHEMA`` or
``SEND_SCHEMA``) is in use at a time; a stream idle
``idle_s`` is closed by a reaper thread (a broker being stopped waits for its open
streams, so none is held longer than that), and one older than ``stream_lifetime_s``
(the call's deadline: it bounds a send to a hung broker) is not reused.

Thread-safe.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from ..arrowcols import constant_column, fixed_width_strings
from .core import (BrokerUnavailableError, ClientError, ClientTLS, Code, Message,
                   ReceivedMessage)

try:
    from .. import _wire
except ImportError:     # not built here (no C compiler): batches are made in pyarrow
    _wire = None

log = logging.getLogger("sparkmq.client.flight")

TRANSPORTS = ("auto", "flight", "grpc")
TS = pa.timestamp("ms", tz="UTC")
#: The columns every batch a producer sends has (docs/PROTOCOL.md, DoPut): one schema for
#: every send, so one stream serves them all.
SEND_SCHEMA = pa.schema([
    ("topic", pa.string()), ("body", pa.binary()), ("tags", pa.string()),
    ("keys", pa.list_(pa.string())), ("properties", pa.map_(pa.string(), pa.string())),
    ("message_group", pa.string()), ("unique_key", pa.string()), ("born_timestamp", TS),
    ("born_host", pa.string())])
#: A batch of plain messages (no tag, keys or properties) leaves those three columns out:
#: the broker stores the same rows, reads three columns fewer and the stream carries
#: three fewer buffers (a stream has one schema: the Producer keeps a stream per schema).
PLAIN_SEND_SCHEMA = pa.schema([f for f in SEND_SCHEMA
                               if f.name not in ("tags", "keys", "properties")])
SEND = fl.FlightDescriptor.for_path("send")


class _FlightDown(BrokerUnavailableError):
    """Flight could not be reached at an endpoint (nothing was stored by this call); the
    clients catch it and take the RocketMQ path (never seen by users)."""


def flight_carries(message: Message) -> bool:
    """Whether Flight takes ``message``: not a delayed one (delivery time, recall)."""
    return message.delivery_timestamp_ms is None


def send_batch(messages: Sequence[Message], ids: Sequence[str], born_ms: int,
               host: str) -> pa.RecordBatch:
    """The DoPut record batch of ``messages`` (one topic and message group, as a send
    request has) with message ids ``ids``: in ``PLAIN_SEND_SCHEMA`` when no message has a
    tag, keys or properties, else in ``SEND_SCHEMA``. The columns every row shares
    (topic, group, host) are shared from ``arrowcols``' cache; the ids are joined."""
    n = len(messages)
    first = messages[0]
    bodies = [m.body for m in messages]
    if not all(map(_is_bytes, bodies)):
        from ..errors import UserError
        bad = next(b for b in bodies if not _is_bytes(b))
        raise UserError(f"message body must be bytes, got {type(bad).__name__}")
    plain = not any(m.tag or m.keys or m.properties for m in messages)
    cols = [constant_column(first.topic, pa.string(), n), pa.array(bodies, pa.binary())]
    if not plain:
        cols += [pa.array([m.tag or None for m in messages], pa.string()),
                 pa.array([list(m.keys) or None for m in messages],
                          SEND_SCHEMA.field("keys").type),
                 pa.array([list(m.properties.items()) or None for m in messages],
                          SEND_SCHEMA.field("properties").type)]
    cols += [constant_column(first.message_group, pa.string(), n),
             fixed_width_strings(list(ids), 32),          # (MessageIds' width)
             pa.Array.from_buffers(TS, n, [None, pa.py_buffer(np.full(n, born_ms, np.int64))]),
             constant_column(host, pa.string(), n)]
    return pa.RecordBatch.from_arrays(cols, schema=PLAIN_SEND_SCHEMA if plain else SEND_SCHEMA)


def plain_send_batch(messages: Sequence[Message], prefix: bytes, start: int, born_ms: int,
                     host: str) -> pa.RecordBatch | None:
    """:func:`send_batch`'s batch of plain ``messages`` (bytes bodies; no tag, keys or
    properties) whose ids are a block of ``MessageIds`` (``prefix`` in ASCII, the first
    counter value ``start``), made in one C call (``sparkmq._wire.send_struct``: every
    value copied once into one block, ~4x cheaper for one message); None where it cannot
    be (the module not built, a message not plain, text that is not UTF-8): then
    :func:`send_batch` makes it."""
    if _wire is None or not all(m.plain() for m in messages):
        return None
    first = messages[0]
    group = first.message_group
    try:
        topic, host_bytes = first.topic.encode(), host.encode()
        group = None if group is None else group.encode()
    except UnicodeEncodeError:      # (pyarrow's refusal names it: send_batch's)
        return None
    _, address = made = _wire.send_struct(topic, group, host_bytes, [m.body for m in messages],
                                          prefix, start, born_ms)
    batch = pa.RecordBatch._import_from_c(address, PLAIN_SEND_SCHEMA)
    del made                        # (the capsule frees the moved-out struct)
    return batch


def _is_bytes(body) -> bool:
    return isinstance(body, (bytes, bytearray))


_CONTINUATION = b"\xff\xff\xff\xff"      # an IPC message's first four bytes
_END = _CONTINUATION + b"\0\0\0\0"        # an IPC stream's end marker
#: the schema message of the last ack read, and its schema (acks of one broker share it
#: but for a ``status``): reading it again cost ~10 us of an ack's ~17
_LAST_ACK_SCHEMA: tuple = (b"", None)


def parse_ack(buf) -> "pa.RecordBatch | pa.Table":
    """A DoPut ack (``app_metadata``: an IPC stream of one batch, docs/PROTOCOL.md):
    (queue_id, queue_offset, message_id) per row, and its schema's ``status``. Where its
    schema message is the last ack's, that message is not read again: the one batch after
    it (then the end, or nothing) is read against the schema kept. Any other stream is
    read whole."""
    global _LAST_ACK_SCHEMA
    view = memoryview(buf).cast("B")      # (a pyarrow Buffer's view is of signed bytes)
    end = 8 + int.from_bytes(view[4:8], "little") if len(view) >= 16 else len(view)
    if view[:4] == _CONTINUATION and len(view) >= end + 8 and view[end:end + 8] != _END:
        head = view[:end]
        message = pa.ipc.read_message(pa.py_buffer(view[end:]))
        after = end + 8 + int.from_bytes(view[end + 4:end + 8], "little") + message.body.size
        if message.type == "record batch" and view[after:] in (b"", _END):   # one batch
            last = _LAST_ACK_SCHEMA
            if head != last[0]:
                last = _LAST_ACK_SCHEMA = (bytes(head), pa.ipc.read_schema(pa.py_buffer(head)))
            return pa.ipc.read_record_batch(message, last[1])
    return pa.ipc.open_stream(buf).read_all()


def ack_status(ack: "pa.RecordBatch | pa.Table") -> int:
    """The RocketMQ status of an acked batch: OK, or the ``status`` its schema metadata
    names (MASTER_PERSISTENCE_TIMEOUT: stored, its fsync late; docs/PROTOCOL.md). A
    name this client does not know counts as OK: an acked batch is stored."""
    name = (ack.schema.metadata or {}).get(b"status")
    try:
        return Code.OK if name is None else Code.Value(name.decode())
    except ValueError:          # a newer broker's status
        return Code.OK


def _error(e: Exception, what: str) -> Exception:
    """A Flight failure as the clients' errors; _FlightDown for a transport failure."""
    text = str(e).split(". Detail:")[0].split("\n")[0]
    if isinstance(e, fl.FlightTimedOutError) and "SLAVE_PERSISTENCE_TIMEOUT: " in text:
        # stored on the broker, not known to be on its replica: not resent
        return ClientError(f"{what}: {text}", Code.SLAVE_PERSISTENCE_TIMEOUT)
    if isinstance(e, fl.FlightUnauthenticatedError):
        return ClientError(f"{what}: UNAUTHORIZED: {text}", Code.UNAUTHORIZED)
    if isinstance(e, fl.FlightUnauthorizedError):
        return ClientError(f"{what}: FORBIDDEN: {text}", Code.FORBIDDEN)
    if isinstance(e, fl.FlightUnavailableError) and "SPARKMQ_" in text:   # the broker's
        return BrokerUnavailableError(f"{what}: {text}")
    if isinstance(e, (fl.FlightUnavailableError, fl.FlightTimedOutError,
                      fl.FlightCancelledError, OSError)):
        return _FlightDown(f"{what}: {text}")
    if isinstance(e, fl.FlightInternalError):
        return ClientError(f"{what}: INTERNAL_ERROR: {text}", Code.INTERNAL_ERROR)
    limit = re.search(r"SPARKMQ_MESSAGE_LIMIT: ([A-Z_]+): ", text)  # names the proxy's code
    if limit and limit[1] in Code.keys():
        code = Code.Value(limit[1])
    elif "TOPIC_NOT_FOUND" in text:
        code = Code.TOPIC_NOT_FOUND
    else:
        code = Code.BAD_REQUEST
    return ClientError(f"{what}: {Code.Name(code)}: {text}", code)


class _Stream:
    __slots__ = ("writer", "reader", "opened", "used")

    def __init__(self, writer, reader):
        self.writer, self.reader = writer, reader
        self.opened = self.used = time.monotonic()

    def close(self) -> None:
        error = self.ended()
        if error is not None:                      # a broken stream: nothing to save
            log.debug("closing a Flight stream: %s", error)

    def ended(self) -> Exception | None:
        """Close the call; the error it ended with, if any. A call the broker refused
        at its start (credentials, an ACL) may let the first batch be written and end
        the reply stream without a word: its status comes with the close."""
        try:
            self.writer.done_writing()
            self.writer.close()
        except (pa.ArrowException, OSError) as e:   # Flight errors are ArrowExceptions
            return e
        return None


class FlightTransport:
    """Flight clients (one per endpoint, reused), DoPut streams and down marks of one
    sparkmq client. ``headers()`` gives the call headers (signed credentials)."""

    def __init__(self, headers: Callable[[], Iterable[tuple[str, str]]], *,
                 request_timeout_s: float, down_s: float = 30.0, idle_s: float = 1.0,
                 stream_lifetime_s: float = 60.0, tls: ClientTLS | None = None):
        self.headers = headers
        self.tls = tls
        self.request_timeout_s = request_timeout_s
        self.down_s, self.idle_s = down_s, idle_s
        self.stream_lifetime_s = max(stream_lifetime_s, 2 * request_timeout_s)
        self._lock = threading.Lock()
        self._clients: dict[str, fl.FlightClient] = {}
        # idle DoPut streams by (endpoint, columns): a stream carries one schema, and the
        # two a producer sends (PLAIN_SEND_SCHEMA, SEND_SCHEMA) differ in width
        self._idle: dict[tuple[str, int], list[_Stream]] = {}
        self._down: dict[str, float] = {}
        self._closed = threading.Event()
        self._reaper: threading.Thread | None = None

    # ------------------------------------------------------------ endpoints
    def usable(self, endpoint: str | None) -> bool:
        """Whether to try Flight at ``endpoint`` (advertised and not marked down)."""
        if endpoint is None:
            return False
        with self._lock:
            return self._down.get(endpoint, 0.0) <= time.monotonic()

    def mark_down(self, endpoint: str, why: object) -> None:
        with self._lock:
            self._down[endpoint] = time.monotonic() + self.down_s
            streams = [s for key in [k for k in self._idle if k[0] == endpoint]
                       for s in self._idle.pop(key)]
        for s in streams:
            s.close()
        log.info("Flight at %s unreachable (%s); using gRPC for %.0f s", endpoint, why,
                 self.down_s)

    def _client(self, endpoint: str) -> fl.FlightClient:
        with self._lock:
            c = self._clients.get(endpoint)
            if c is None:
                c = self._clients[endpoint] = self._connect(endpoint)
            return c

    def _connect(self, endpoint: str) -> fl.FlightClient:
        """A client of the advertised ``endpoint``: ``grpc+tls://`` with the roots of the
        client's gRPC TLS settings, ``grpc+tcp://`` (or an older broker's bare
        ``host:port``) in plaintext."""
        location = endpoint if "://" in endpoint else f"grpc+tcp://{endpoint}"
        if location.startswith("grpc+tls://"):
            roots = self.tls.root_certs if self.tls is not None else None
            return fl.FlightClient(location, tls_root_certs=roots)
        if self.tls is not None:     # never send in plaintext what gRPC sends encrypted
            raise ClientError(f"the broker advertises Flight at {endpoint} without TLS while "
                              "this client uses TLS; refusing to send in plaintext",
                              Code.UNSUPPORTED)
        return fl.FlightClient(location)

    def _options(self, timeout_s: float) -> fl.FlightCallOptions:
        return fl.FlightCallOptions(
            timeout=timeout_s, headers=[(k.encode(), v.encode()) for k, v in self.headers()])

    # ------------------------------------------------------------ produce
    def put(self, endpoint: str, batch: pa.RecordBatch,
            what: str) -> "pa.RecordBatch | pa.Table":
        """Send ``batch`` and return its ack; _FlightDown if Flight is unreachable (then
        nothing was stored), ClientError / BrokerUnavailableError as the broker answered."""
        key = (endpoint, batch.num_columns)
        stream, reused = self._take(key, batch)
        try:
            return self._put_on(key, stream, batch, what)
        except _FlightDown:
            if not reused:
                raise
        # the broker ended an idle stream (it is stopping) or the connection was reset:
        # the batch was not read; once more on a fresh stream
        stream, _ = self._take(key, batch, fresh=True)
        return self._put_on(key, stream, batch, what)

    def _put_on(self, key: tuple, stream: _Stream, batch,
                what: str) -> "pa.RecordBatch | pa.Table":
        try:
            stream.writer.write_batch(batch)
            buf = stream.reader.read()
        except (pa.ArrowException, OSError) as e:   # Flight errors are ArrowExceptions
            stream.close()
            raise _error(e, what) from None
        if buf is None:                              # the stream ended before its ack
            error = stream.ended()
            if error is not None:                    # the broker's refusal, as it said it
                raise _error(error, what) from None
            raise _FlightDown(f"{what}: the broker ended the stream")
        stream.used = time.monotonic()
        with self._lock:
            if not self._closed.is_set():
                self._idle.setdefault(key, []).append(stream)
                stream = None
        if stream is not None:
            stream.close()
        return parse_ack(buf)

    def _take(self, key: tuple, batch: pa.RecordBatch,
              fresh: bool = False) -> tuple[_Stream, bool]:
        """An idle stream of ``key`` (endpoint, columns) and True, or a new one for
        ``batch``'s schema and False."""
        endpoint = key[0]
        too_old = time.monotonic() - (self.stream_lifetime_s - self.request_timeout_s)
        stale: list[_Stream] = []
        got = None
        with self._lock:
            idle = self._idle.get(key, [])
            while idle and not fresh:
                s = idle.pop()
                if s.opened > too_old:
                    got = s
                    break
                stale.append(s)
        for s in stale:
            s.close()
        if got is not None:
            return got, True
        try:
            writer, reader = self._client(endpoint).do_put(
                SEND, batch.schema, options=self._options(self.stream_lifetime_s))
        except (pa.ArrowException, OSError) as e:   # Flight errors are ArrowExceptions
            raise _error(e, f"DoPut at {endpoint}") from None
        self._start_reaper()
        return _Stream(writer, reader), False

    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is not None or self._closed.is_set():
                return
            self._reaper = threading.Thread(target=self._reap_loop, daemon=True,
                                            name="sparkmq-flight-reaper")
        self._reaper.start()

    def _reap_loop(self) -> None:
        while not self._closed.wait(self.idle_s / 2):
            cutoff = time.monotonic() - self.idle_s
            old: list[_Stream] = []
            with self._lock:
                for ep, streams in self._idle.items():
                    old += [s for s in streams if s.used < cutoff]
                    streams[:] = [s for s in streams if s.used >= cutoff]
            for s in old:
                s.close()

    # ------------------------------------------------------------ consume
    def get(self, endpoint: str, ticket: dict, timeout_s: float, what: str) -> pa.Table:
        try:
            return self._client(endpoint).do_get(
                fl.Ticket(json.dumps(ticket).encode()),
                options=self._options(timeout_s)).read_all()
        except (pa.ArrowException, OSError) as e:   # Flight errors are ArrowExceptions
            raise _error(e, what) from None

    def follow(self, fep: str, ticket: dict, what: str, **kw) -> "Followed":
        """Open a followed DoGet at Flight endpoint ``fep`` (``Followed``; ``kw``: its
        other arguments)."""
        try:
            reader = self._client(fep).do_get(fl.Ticket(json.dumps(ticket).encode()),
                                                   options=self._options(None))
        except (pa.ArrowException, OSError) as e:   # Flight errors are ArrowExceptions
            raise _error(e, what) from None
        return Followed(reader, what, **kw)

    def action(self, endpoint: str, name: str, body: dict, what: str) -> None:
        try:
            list(self._client(endpoint).do_action(
                fl.Action(name, json.dumps(body).encode()),
                options=self._options(self.request_timeout_s)))
        except (pa.ArrowException, OSError) as e:   # Flight errors are ArrowExceptions
            raise _error(e, what) from None

    def close(self) -> None:
        """Close the streams and clients. Idempotent."""
        self._closed.set()
        with self._lock:
            streams = [s for ss in self._idle.values() for s in ss]
            clients, self._idle, self._clients = list(self._clients.values()), {}, {}
        for s in streams:
            s.close()
        for c in clients:
            c.close()
        if self._reaper is not None and self._reaper is not threading.current_thread():
            self._reaper.join(5)


class Followed:
    """A followed DoGet (``PullConsumer.follow``): iterating gives, batch by batch as the
    broker sends them, ``(queue, messages, next offset)`` of one queue (``queues``: queue
    id -> Queue; ``tags``: the tag filter; ``count``: called with each batch's size).
    ``close`` (from any thread, or leaving a ``with`` block) cancels the call and ends
    the iteration."""

    def __init__(self, reader, what: str, *, queues: dict, tags, endpoint: str,
                 count: Callable[[int], None]):
        self.reader, self.what, self.queues, self.tags = reader, what, queues, tags
        self.endpoint, self.count = endpoint, count
        self.closed = False

    def __iter__(self):
        while not self.closed:
            try:
                chunk = self.reader.read_chunk()
            except StopIteration:
                return                          # the broker ended it (stopping)
            except (pa.ArrowException, OSError) as e:   # Flight errors are ArrowExceptions
                if self.closed:
                    return
                err = _error(e, self.what)
                raise (BrokerUnavailableError(str(err)) if isinstance(err, _FlightDown)
                       else err) from None
            table = pa.Table.from_batches([chunk.data])
            self.count(table.num_rows)
            if chunk.app_metadata is not None:   # {"queue", "next"}: rows may be filtered
                where = json.loads(chunk.app_metadata.to_pybytes())
                queue, nxt = where["queue"], where["next"]
            else:                                # a broker before the metadata
                queue = table.column("queue_id")[0].as_py()
                nxt = table.column("queue_offset")[-1].as_py() + 1
            # (the broker filters by tag; filtered here again for a broker that did not)
            yield (self.queues[queue], received_messages(table, self.endpoint, self.tags), nxt)

    def close(self) -> None:
        self.closed = True
        self.reader.cancel()

    def __enter__(self) -> "Followed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def received_messages(table: pa.Table, endpoint: str,
                      tags: frozenset[str] | None) -> list[ReceivedMessage]:
    """The rows of a consumer-view DoGet as the PullConsumer's messages (the fields a
    gRPC PullMessage gives), those whose tag is in ``tags`` (None: all)."""
    if table.num_rows == 0:
        return []
    c = {name: table.column(name).to_pylist() for name in (
        "topic", "body", "message_id", "tags", "keys", "properties", "message_group",
        "queue_id", "queue_offset")}
    born = table.column("born_timestamp").cast(pa.int64()).to_pylist()
    out = []
    for i in range(table.num_rows):
        tag = c["tags"][i]
        if tags is not None and tag not in tags:
            continue
        out.append(ReceivedMessage(
            topic=c["topic"][i], body=c["body"][i], message_id=c["message_id"][i], tag=tag,
            keys=tuple(c["keys"][i] or ()), properties=dict(c["properties"][i] or ()),
            message_group=c["message_group"][i], queue_id=c["queue_id"][i],
            queue_offset=c["queue_offset"][i], born_timestamp_ms=born[i],
            delivery_attempt=0, receipt_handle="", endpoint=endpoint))
    return out
