"""Shared parts of sparkmq's clients: messages, the gRPC connection pool and routes.

The clients speak the Apache RocketMQ 5.x ``apache.rocketmq.v2.MessagingService``
(the generated modules shipped with ``rocketmq-python-client``) to a sparkmq
broker or any RocketMQ 5 proxy.

Contracts:
- Every RPC carries a deadline (``request_timeout_s``; long polls add their polling
  time), so no call blocks forever.
- Routes are asked of every configured endpoint and merged by (broker name, queue
  id): with a NameServer behind the brokers one endpoint is enough, without one the
  client still sees every broker it was given. A route is cached ``route_ttl_s``.
- A broker that serves Arrow Flight says where on its QueryRoute answers (initial
  metadata ``x-sparkmq-flight-endpoint: grpc+tcp://host:port`` or ``grpc+tls://...``;
  older brokers say ``host:port``, plaintext); :meth:`RouteCache.flight_endpoint` keeps
  what each gRPC endpoint said (client/flight.py sends and reads over it).
- With ``credentials=(access_key, secret_key)`` every call carries the RocketMQ 5
  signature headers the official clients send (``authorization``, ``x-mq-date-time``).
- With ``tls=`` (:class:`ClientTLS`: ``True`` trusts gRPC's default roots, which
  ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` can point at; a PEM file path or PEM bytes trust
  those) every gRPC channel is TLS, and so is every Flight connection
  (client/flight.py: the broker advertises ``grpc+tls://``), with the same roots.
  The server's certificate is always verified.
- :class:`Connections` and :class:`RouteCache` are thread-safe.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import threading
import time
import uuid
from typing import Iterable, Sequence

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from ..errors import (BrokerUnavailableError, ClientError, InvalidConfigError, RetriableError,  # noqa: F401
                      SparkMQError, TopicNotFoundError, UserError)

Code = pb.Code
DEFAULT_REQUEST_TIMEOUT_S = 10.0   # above the broker's syncFlushTimeout (5 s): a slow
                                   # fsync or replica ack is answered, not retried as a duplicate
DEFAULT_ROUTE_TTL_S = 30.0
FLIGHT_ENDPOINT_HEADER = "x-sparkmq-flight-endpoint"


@dataclasses.dataclass
class Message:
    """A message to send. ``message_group`` is the sharding key: messages with equal
    keys go to the same queue and keep their send order (FIFO). ``delivery_timestamp_ms``
    makes it a DELAY message, delivered at that time (epoch ms); its send receipt carries
    a ``recall_handle`` to cancel it before then (``Producer.recall_message``)."""

    topic: str
    body: bytes
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    message_group: str | None = None
    delivery_timestamp_ms: int | None = None

    def plain(self) -> bool:
        """A bytes body and no tag, keys or properties: what the Producer's C encoders
        write on both transports (``_wire.encode_plain``, ``_wire.send_struct``)."""
        return type(self.body) is bytes and not (self.tag or self.keys or self.properties)

    def to_pb(self, born_host: str, message_id: str, born_timestamp) -> pb.Message:
        """The protocol message; ``born_timestamp`` is a protobuf Timestamp shared by a batch."""
        out = pb.Message()
        self.fill_pb(out, born_host, message_id, born_timestamp)
        return out

    def fill_pb(self, out: pb.Message, born_host: str, message_id: str, born_timestamp) -> None:
        """Write this message into the empty protocol message ``out`` (e.g. one from
        ``request.messages.add()``): filling in place avoids building and copying
        sub-messages, the larger part of a send's client-side cost."""
        body = self.body
        if type(body) is not bytes:
            if not isinstance(body, (bytes, bytearray)):
                raise UserError(f"message body must be bytes, got {type(body).__name__}")
            body = bytes(body)
        out.topic.name = self.topic
        out.body = body
        sp = out.system_properties
        sp.message_id = message_id
        sp.born_timestamp.CopyFrom(born_timestamp)
        sp.born_host = born_host
        sp.body_encoding = pb.IDENTITY
        if self.delivery_timestamp_ms is not None:
            if self.message_group:
                raise UserError("a message cannot be both FIFO (message_group) and delayed "
                                "(delivery_timestamp_ms)")
            sp.message_type = pb.DELAY
            sp.delivery_timestamp.FromMilliseconds(int(self.delivery_timestamp_ms))
        elif self.message_group:
            sp.message_type = pb.FIFO
            sp.message_group = self.message_group
        else:
            sp.message_type = pb.NORMAL
        if self.tag:
            sp.tag = self.tag
        if self.keys:
            sp.keys.extend(self.keys)
        if self.properties:
            out.user_properties.update(self.properties)


class MessageIds:
    """Unique message ids: a random per-process prefix and a counter (32 hex digits,
    like RocketMQ's unique key): the prefix's 20 digits, then the counter's 12 (mod
    2**48). Thread-safe: ``take`` reserves a block of counter values under a lock."""

    def __init__(self):
        self.prefix = uuid.uuid4().hex[:20].upper()
        self.prefix_ascii = self.prefix.encode("ascii")
        self._next = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> int:
        """Reserve ``n`` consecutive counter values; the first (ids: ``prefix`` and
        each value's 12 hex digits, as ``sparkmq._wire.encode_plain`` writes them)."""
        with self._lock:
            start = self._next
            self._next = start + n
        return start

    def text(self, value: int) -> str:
        """The id of counter ``value``: the prefix, then the value's 12 hex digits."""
        return f"{self.prefix}{value & 0xFFFFFFFFFFFF:012X}"

    def ascii(self, value: int) -> bytes:
        """``text(value)`` as ASCII bytes (for requests encoded by hand)."""
        return b"%s%012X" % (self.prefix_ascii, value & 0xFFFFFFFFFFFF)

    def next(self) -> str:
        return self.text(self.take(1))

    def many(self, n: int) -> list[str]:
        """``n`` ids, one block of the counter."""
        return self.strings(self.take(n), n)

    def strings(self, start: int, n: int) -> list[str]:
        """The ids of the ``n`` counter values ``take`` reserved from ``start``
        (formatted by one ``map``, ~14 against ~17 us for 100, unless the block wraps
        past 2**48)."""
        start, prefix = start & 0xFFFFFFFFFFFF, self.prefix
        if start + n <= 1 << 48:
            return list(map((prefix + "%012X").__mod__, range(start, start + n)))
        return [self.text(c) for c in range(start, start + n)]


def timestamp(ms: int):
    """A protobuf Timestamp of epoch ``ms``."""
    from google.protobuf.timestamp_pb2 import Timestamp
    ts = Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def now_timestamp():
    return timestamp(int(time.time() * 1000))


@dataclasses.dataclass(frozen=True)
class ReceivedMessage:
    """A message as delivered to a consumer. ``receipt_handle`` and ``endpoint`` identify
    this delivery for ack / change_invisible_duration (SimpleConsumer, PushConsumer)."""

    topic: str
    body: bytes
    message_id: str
    tag: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    message_group: str | None
    queue_id: int
    queue_offset: int
    born_timestamp_ms: int
    delivery_attempt: int
    receipt_handle: str
    endpoint: str

    @classmethod
    def from_pb(cls, m: pb.Message, endpoint: str) -> "ReceivedMessage":
        sp = m.system_properties
        return cls(topic=m.topic.name, body=m.body, message_id=sp.message_id,
                   tag=sp.tag if sp.HasField("tag") else None, keys=tuple(sp.keys),
                   properties=dict(m.user_properties),
                   message_group=sp.message_group if sp.HasField("message_group") else None,
                   queue_id=sp.queue_id, queue_offset=sp.queue_offset,
                   born_timestamp_ms=sp.born_timestamp.ToMilliseconds(),
                   delivery_attempt=sp.delivery_attempt, receipt_handle=sp.receipt_handle,
                   endpoint=endpoint)


@dataclasses.dataclass(frozen=True)
class Queue:
    """One queue of a route: where it lives and what it permits."""

    topic: str
    queue_id: int
    broker_name: str
    broker_id: int
    endpoint: str
    permission: int

    @property
    def writable(self) -> bool:
        return self.permission in (pb.WRITE, pb.READ_WRITE) and self.broker_id == 0

    @property
    def readable(self) -> bool:
        return self.permission in (pb.READ, pb.READ_WRITE)

    def to_pb(self) -> pb.MessageQueue:
        host, port = self.endpoint.rsplit(":", 1)
        return pb.MessageQueue(
            topic=pb.Resource(name=self.topic), id=self.queue_id, permission=self.permission,
            broker=pb.Broker(name=self.broker_name, id=self.broker_id, endpoints=pb.Endpoints(
                scheme=pb.IPv4, addresses=[pb.Address(host=host, port=int(port))])))


def parse_endpoints(endpoints: str | Iterable[str]) -> list[str]:
    """``"h1:p1;h2:p2"`` (or a list of ``host:port``) -> list of ``host:port``."""
    items = endpoints.replace(",", ";").split(";") if isinstance(endpoints, str) else endpoints
    out = [e.strip() for e in items if e and e.strip()]
    for e in out:
        host, _, port = e.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidConfigError(f"endpoint {e!r} is not host:port")
    if not out:
        raise InvalidConfigError("no endpoints given; pass 'host:port' or a list of them")
    return out


def duration(seconds: float):
    from google.protobuf.duration_pb2 import Duration
    d = Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


def check(st: pb.Status, what: str) -> None:
    """Raise ClientError unless ``st`` is OK."""
    if st.code != Code.OK:
        raise ClientError(f"{what}: {Code.Name(st.code)}: {st.message}", st.code)


@dataclasses.dataclass(frozen=True)
class ClientTLS:
    """The TLS settings of a client's connections, gRPC and Flight alike:
    ``root_certs`` (PEM) are the certificates trusted to have signed the broker's,
    None for gRPC's default roots. Immutable."""

    root_certs: bytes | None = None

    @classmethod
    def of(cls, tls: "bool | str | bytes | ClientTLS | None") -> "ClientTLS | None":
        """``tls=`` as the clients take it: False/None plaintext; True TLS with the
        default roots; a path of a PEM file (a CA, or a self-signed certificate
        itself) or PEM bytes: TLS trusting those. InvalidConfigError if unreadable."""
        if tls is None or tls is False:
            return None
        if tls is True:
            return cls()
        if isinstance(tls, cls):
            return tls
        if isinstance(tls, (bytes, bytearray)):
            pem = bytes(tls)
        elif isinstance(tls, str):
            try:
                with open(tls, "rb") as f:
                    pem = f.read()
            except OSError as e:
                raise InvalidConfigError(f"tls={tls!r}: cannot read it ({e.strerror}); give "
                                         "the PEM file of the CA that signed the broker's "
                                         "certificate") from None
        else:
            raise InvalidConfigError(f"tls is True, a PEM file path or PEM bytes; got "
                                     f"{type(tls).__name__}")
        if b"-----BEGIN CERTIFICATE" not in pem:
            raise InvalidConfigError("tls: the trusted certificates are not PEM "
                                     "(-----BEGIN CERTIFICATE-----)")
        return cls(pem)


class Connections:
    """One gRPC channel and stub per endpoint, plus the client id sent as
    ``x-mq-client-id`` on every call, signed with ``credentials`` (access key, secret
    key) when given; TLS channels with ``tls`` (:meth:`ClientTLS.of`). Thread-safe;
    ``close()`` closes the channels."""

    def __init__(self, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 extra_metadata: Sequence[tuple[str, str]] = (),
                 credentials: tuple[str, str] | None = None,
                 tls: "bool | str | bytes | ClientTLS | None" = None):
        self.request_timeout_s = request_timeout_s
        self.tls = ClientTLS.of(tls)
        self.client_id = f"sparkmq-py@{uuid.uuid4().hex[:12]}"
        self._base = (("x-mq-client-id", self.client_id), ("x-mq-language", "PYTHON"),
                      ("x-mq-protocol", "v2"), *extra_metadata)
        if credentials is not None and (len(credentials) != 2 or not all(credentials)):
            raise InvalidConfigError("credentials are (access key, secret key), both non-empty")
        self.credentials = credentials
        self._signed: tuple[str, tuple] = ("", ())       # (date-time, headers) of this second
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, MessagingServiceStub]] = {}
        self._encoded: dict[tuple[str, str], object] = {}   # (endpoint, method) -> callable

    @property
    def metadata(self) -> tuple:
        """The metadata of a call made now (signed for this second with credentials)."""
        return self._base + self.signed_headers() if self.credentials else self._base

    def signed_headers(self) -> tuple:
        """``(("x-mq-date-time", ...), ("authorization", ...))`` signed now, or () without
        credentials: the RocketMQ 5 signature (HMAC-SHA1 of the date-time)."""
        if not self.credentials:
            return ()
        when = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        signed = self._signed
        if signed[0] != when:
            ak, sk = self.credentials
            sig = hmac.new(sk.encode(), when.encode(), hashlib.sha1).hexdigest()
            signed = self._signed = (when, (("x-mq-date-time", when), (
                "authorization", f"MQv2-HMAC-SHA1 Credential={ak}, "
                                 f"SignedHeaders=x-mq-date-time, Signature={sig}")))
        return signed[1]

    def stub(self, endpoint: str) -> MessagingServiceStub:
        with self._lock:
            pair = self._stubs.get(endpoint)
            if pair is None:
                options = [("grpc.max_receive_message_length", 64 << 20),
                           ("grpc.max_send_message_length", 64 << 20)]
                if self.tls is None:
                    ch = grpc.insecure_channel(endpoint, options=options)
                else:
                    ch = grpc.secure_channel(endpoint, grpc.ssl_channel_credentials(
                        self.tls.root_certs), options=options)
                pair = self._stubs[endpoint] = (ch, MessagingServiceStub(ch))
            return pair[1]

    def call(self, endpoint: str, method: str, request, timeout_s: float | None = None):
        """Unary call with a deadline; gRPC failures become BrokerUnavailableError."""
        fn = getattr(self.stub(endpoint), method)
        try:
            return fn(request, timeout=timeout_s or self.request_timeout_s, metadata=self.metadata)
        except grpc.RpcError as e:
            raise BrokerUnavailableError(f"{method} to {endpoint} failed: {e.code()} "
                                         f"{e.details()}") from None

    def call_with_metadata(self, endpoint: str, method: str, request,
                           timeout_s: float | None = None) -> tuple[object, dict[str, str]]:
        """``call``, also returning the answer's initial metadata (name -> value)."""
        fn = getattr(self.stub(endpoint), method)
        try:
            response, call = fn.with_call(request, timeout=timeout_s or self.request_timeout_s,
                                          metadata=self.metadata)
        except grpc.RpcError as e:
            raise BrokerUnavailableError(f"{method} to {endpoint} failed: {e.code()} "
                                         f"{e.details()}") from None
        return response, dict(call.initial_metadata() or ())

    def call_encoded(self, endpoint: str, method: str, data: bytes, response_class,
                     timeout_s: float | None = None):
        """``call`` with the request already serialized (``data``): the same RPC and
        metadata, the answer parsed as ``response_class``."""
        key = (endpoint, method)
        fn = self._encoded.get(key)
        if fn is None:
            self.stub(endpoint)                  # opens the channel
            with self._lock:
                entry = self._stubs.get(endpoint)
                if entry is None:                # close() ran meanwhile on another thread
                    raise BrokerUnavailableError(f"{method} to {endpoint}: the client's "
                                                 "connections were closed")
                fn = self._encoded[key] = entry[0].unary_unary(
                    f"/apache.rocketmq.v2.MessagingService/{method}",
                    request_serializer=None, response_deserializer=response_class.FromString)
        try:
            return fn(data, timeout=timeout_s or self.request_timeout_s, metadata=self.metadata)
        except grpc.RpcError as e:
            raise BrokerUnavailableError(f"{method} to {endpoint} failed: {e.code()} "
                                         f"{e.details()}") from None

    def close(self) -> None:
        with self._lock:
            self._encoded = {}
            pairs, self._stubs = list(self._stubs.values()), {}
        for ch, _ in pairs:
            ch.close()


class RouteCache:
    """Topic -> queues, asked of every endpoint and merged; cached ``ttl_s``; and per
    gRPC endpoint the Flight endpoint its broker advertised (or None). Thread-safe."""

    def __init__(self, conns: Connections, endpoints: list[str], ttl_s: float = DEFAULT_ROUTE_TTL_S):
        self.conns, self.endpoints, self.ttl_s = conns, endpoints, ttl_s
        self._lock = threading.Lock()
        # topic -> (when asked, its queues, those writable)
        self._cache: dict[str, tuple[float, list[Queue], list[Queue]]] = {}
        self._flight: dict[str, tuple[float, str | None]] = {}

    def flight_endpoint(self, endpoint: str, topic: str) -> str | None:
        """The Flight location the broker at gRPC ``endpoint`` advertised on its last
        QueryRoute answer (asked now, for ``topic``, if not within ``ttl_s``); None when
        it serves no Flight (or is an older broker, or did not answer)."""
        hit = self._flight.get(endpoint)     # (one read of a dict: no lock needed)
        if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
            return hit[1]
        try:
            self._ask(endpoint, topic)
        except BrokerUnavailableError:
            self._advertised(endpoint, {})
        with self._lock:
            return self._flight[endpoint][1]

    def _advertised(self, endpoint: str, metadata: dict[str, str]) -> None:
        with self._lock:
            self._flight[endpoint] = (time.monotonic(), metadata.get(FLIGHT_ENDPOINT_HEADER))

    def _ask(self, endpoint: str, topic: str):
        """One QueryRoute at ``endpoint``, noting the Flight endpoint it advertises."""
        r, md = self.conns.call_with_metadata(endpoint, "QueryRoute", spb.QueryRouteRequest(
            topic=pb.Resource(name=topic), endpoints=_pb_endpoints(endpoint)))
        self._advertised(endpoint, md)
        return r

    def queues(self, topic: str, refresh: bool = False) -> list[Queue]:
        return self._entry(topic, refresh)[1]

    def writable(self, topic: str, refresh: bool = False) -> list[Queue]:
        """``queues`` a producer may send to (``Queue.writable``), kept with them."""
        return self._entry(topic, refresh)[2]

    def _entry(self, topic: str, refresh: bool) -> tuple[float, list[Queue], list[Queue]]:
        hit = self._cache.get(topic)         # (one read of a dict: no lock needed)
        if hit and not refresh and time.monotonic() - hit[0] < self.ttl_s:
            return hit
        queues = self._query(topic)
        entry = (time.monotonic(), queues, [q for q in queues if q.writable])
        with self._lock:
            self._cache[topic] = entry
        return entry

    def _query(self, topic: str) -> list[Queue]:
        merged: dict[tuple[str, int, int], Queue] = {}
        errors, not_found = [], None
        for ep in self.endpoints:
            try:
                r = self._ask(ep, topic)
            except BrokerUnavailableError as e:
                errors.append(str(e))
                continue
            if r.status.code == Code.TOPIC_NOT_FOUND:
                not_found = r.status.message
                continue
            check(r.status, f"QueryRoute {topic!r} at {ep}")
            for q in r.message_queues:
                a = q.broker.endpoints.addresses[0]
                queue = Queue(topic, q.id, q.broker.name, q.broker.id, f"{a.host}:{a.port}",
                              q.permission)
                merged[(queue.broker_name, queue.broker_id, queue.queue_id)] = queue
        if merged:
            return sorted(merged.values(), key=lambda q: (q.broker_name, q.queue_id))
        if not_found:
            raise TopicNotFoundError(f"topic {topic!r}: {not_found}")
        raise BrokerUnavailableError(f"no route for {topic!r}: {'; '.join(errors)}")


def _pb_endpoints(endpoint: str) -> pb.Endpoints:
    host, port = endpoint.rsplit(":", 1)
    return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=int(port))])
