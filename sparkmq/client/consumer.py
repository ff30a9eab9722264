"""Consumers: SimpleConsumer (receive / ack / change invisible duration) and PushConsumer
(a listener fed by long-polling receives); PullConsumer (by queue and offset) is in
pull.py.

Delivery model (RocketMQ 5 "pop"): ReceiveMessage asks one broker for up to N
messages of a topic for a group; the broker picks the queues, hides each delivered
message for its invisible duration and redelivers it (attempt + 1) unless it is acked
in time. Clustering: the broker gives each message to one consumer of the group.
Broadcasting (sparkmq extension, request metadata ``x-sparkmq-consume-mode``): every
consumer instance gets every message, with offsets of its own.

Every RPC has a deadline: a long poll waits at most ``wait_s`` plus the request timeout.
Every consumer takes ``credentials=(access_key, secret_key)`` (every call signed, as the
official clients sign: for a broker with ``authenticationEnabled``) and ``tls=``
(``core.ClientTLS``: for a broker with ``tlsServerMode=enforcing``).
SimpleConsumer methods are thread-safe; PushConsumer runs one poller
thread per (topic, broker) and a pool of ``consume_threads`` listener threads.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import enum
import itertools
import logging
import threading
import time
from typing import Callable, Mapping

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from ..errors import SparkMQError, UserError
from .core import (DEFAULT_REQUEST_TIMEOUT_S, BrokerUnavailableError, ClientError, Code,
                   Connections, Queue, ReceivedMessage, RouteCache, check, duration,
                   parse_endpoints)
from .acks import AckBatcher
from .retry import RetryPolicy, consumer_settings, group_retry_policy

log = logging.getLogger("sparkmq.client.consumer")
NACK_DELAY_S = 1.0     # a failed message's wait when the group's retry policy is unknown
BROADCAST_HEADER = "x-sparkmq-consume-mode"


class ConsumeResult(enum.Enum):
    """What a PushConsumer listener returns: SUCCESS acks, FAILURE (or an exception)
    nacks: the message comes back after the group's retry delay (see PushConsumer)."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"


class ConsumeMode(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


def _filter_of(subscription) -> tuple[int, str]:
    """A subscription value -> (protocol filter type, expression): a string is a tag
    expression (``"TagA || TagB"``, ``"*"``); ``("SQL92", "a > 1")`` is a property filter
    (the broker must have enablePropertyFilter=true)."""
    if isinstance(subscription, str):
        return pb.TAG, subscription
    if isinstance(subscription, tuple) and len(subscription) == 2 \
            and str(subscription[0]).upper() in ("TAG", "SQL92", "SQL"):
        return (pb.TAG if str(subscription[0]).upper() == "TAG" else pb.SQL), subscription[1]
    raise UserError(f"subscription {subscription!r} is neither a tag expression string nor "
                    "a ('SQL92', expression) pair")


class _GroupClient:
    """Shared plumbing of the consumers of one group."""

    def __init__(self, endpoints, group: str, subscriptions: Mapping[str, "str | tuple[str, str]"], *,
                 request_timeout_s: float, mode: ConsumeMode,
                 credentials: tuple[str, str] | None = None, tls=None):
        if not group:
            raise UserError("a consumer needs a consumer group name")
        if not subscriptions:
            raise UserError("a consumer needs at least one subscription {topic: 'TagA || TagB'}")
        self.endpoints = parse_endpoints(endpoints)
        self.group = group
        self.subscriptions = {t: (e or "*") for t, e in subscriptions.items()}
        for e in self.subscriptions.values():
            _filter_of(e)
        extra = [(BROADCAST_HEADER, "BROADCASTING")] if mode is ConsumeMode.BROADCASTING else []
        self.conns = Connections(request_timeout_s, extra, credentials=credentials, tls=tls)
        self.routes = RouteCache(self.conns, self.endpoints)
        self._closed = False
        self._received_from: set[str] = set()    # broker endpoints received from

    @property
    def client_id(self) -> str:
        return self.conns.client_id

    def _endpoints_of_subscriptions(self) -> set[str]:
        endpoints = set()
        for t in self.subscriptions:
            try:
                endpoints |= {q.endpoint for q in self.routes.queues(t)}
            except SparkMQError as e:       # topic not there yet, brokers down: try later
                log.warning("no route for %r yet: %s", t, e)
        return endpoints

    def _heartbeat(self) -> None:
        req = spb.HeartbeatRequest(group=pb.Resource(name=self.group),
                                   client_type=pb.SIMPLE_CONSUMER)
        for ep in self._endpoints_of_subscriptions():
            try:
                self.conns.call(ep, "Heartbeat", req)
            except BrokerUnavailableError as e:
                log.info("heartbeat: %s", e)

    def _broker_groups(self, topic: str) -> list[list[Queue]]:
        """Per broker group of ``topic``, one readable queue per broker to try in
        order: the master's (id 0) first, then its replicas' by id. A consumer reads
        from a replica while the master is unreachable or gone from the route."""
        groups: dict[str, dict[int, Queue]] = {}
        for q in self.routes.queues(topic):
            if q.readable:
                groups.setdefault(q.broker_name, {}).setdefault(q.broker_id, q)
        return [[g[i] for i in sorted(g)] for _, g in sorted(groups.items())]

    def _brokers(self, topic: str) -> list[Queue]:
        """One readable queue per broker group of ``topic`` (the broker chooses inside):
        the master's, or a replica's when the route lists no master."""
        return [g[0] for g in self._broker_groups(topic)]

    def _receive_from(self, queue: Queue, max_messages: int, invisible_s: float | None,
                      wait_s: float) -> list[ReceivedMessage]:
        """One receive; ``invisible_s`` None: with ``auto_renew`` (the broker's default
        invisible time, renewed until acked)."""
        kind, expr = _filter_of(self.subscriptions[queue.topic])
        mq = queue.to_pb()
        mq.id = -1
        req = spb.ReceiveMessageRequest(
            group=pb.Resource(name=self.group), message_queue=mq,
            filter_expression=pb.FilterExpression(type=kind, expression=expr),
            batch_size=max_messages, auto_renew=invisible_s is None,
            long_polling_timeout=duration(wait_s))
        if invisible_s is not None:
            req.invisible_duration.CopyFrom(duration(invisible_s))
        self._received_from.add(queue.endpoint)
        stub = self.conns.stub(queue.endpoint)
        out: list[ReceivedMessage] = []
        try:
            for r in stub.ReceiveMessage(req, timeout=wait_s + self.conns.request_timeout_s,
                                         metadata=self.conns.metadata):
                kind = r.WhichOneof("content")
                if kind == "message":
                    out.append(ReceivedMessage.from_pb(r.message, queue.endpoint))
                elif kind == "status" and r.status.code not in (Code.OK, Code.MESSAGE_NOT_FOUND):
                    check(r.status, f"ReceiveMessage {queue.topic!r} at {queue.endpoint}")
        except grpc.RpcError as e:
            raise BrokerUnavailableError(f"ReceiveMessage at {queue.endpoint}: {e.code()} "
                                         f"{e.details()}") from None
        return out

    def _change_invisible(self, message: ReceivedMessage, seconds: float) -> ReceivedMessage:
        r = self.conns.call(message.endpoint, "ChangeInvisibleDuration",
                            spb.ChangeInvisibleDurationRequest(
                                group=pb.Resource(name=self.group),
                                topic=pb.Resource(name=message.topic),
                                receipt_handle=message.receipt_handle,
                                invisible_duration=duration(seconds),
                                message_id=message.message_id))
        check(r.status, f"ChangeInvisibleDuration {message.message_id}")
        return dataclasses.replace(message, receipt_handle=r.receipt_handle)

    def _ack(self, m: ReceivedMessage) -> None:
        r = self.conns.call(m.endpoint, "AckMessage", spb.AckMessageRequest(
            group=pb.Resource(name=self.group), topic=pb.Resource(name=m.topic),
            entries=[spb.AckMessageEntry(message_id=m.message_id, receipt_handle=m.receipt_handle)]))
        check(r.status, f"AckMessage {m.message_id}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            req = spb.NotifyClientTerminationRequest(group=pb.Resource(name=self.group))
            # (a broker it received from lets go of what the broker renewed for it)
            for ep in dict.fromkeys([*self.endpoints, *self._received_from]):
                try:
                    self.conns.call(ep, "NotifyClientTermination", req, timeout_s=1.0)
                except BrokerUnavailableError:
                    pass
        finally:
            self.conns.close()


class SimpleConsumer(_GroupClient):
    """Receive, process, ack at your own pace. ``receive`` long-polls one (topic, broker)
    after another, round robin, and returns what the first non-empty one gave."""

    def __init__(self, endpoints, group: str, subscriptions: Mapping[str, "str | tuple[str, str]"], *,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 mode: ConsumeMode = ConsumeMode.CLUSTERING,
                 credentials: tuple[str, str] | None = None, tls=None):
        super().__init__(endpoints, group, subscriptions, request_timeout_s=request_timeout_s,
                         mode=mode, credentials=credentials, tls=tls)
        self._rr = itertools.count()
        self._heartbeat()

    def receive(self, max_messages: int = 16, invisible_duration_s: float = 30.0,
                wait_s: float = 5.0) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages; waits up to ``wait_s`` per (topic, broker)
        for one to arrive. Each must be acked within ``invisible_duration_s`` or it
        is delivered again."""
        targets = [g for t in self.subscriptions for g in self._broker_groups(t)]
        start = next(self._rr)
        errors = []
        failed_groups = 0
        for i in range(len(targets)):
            group = targets[(start + i) % len(targets)]
            got = None
            for q in group:           # master first; its replicas if it is unreachable
                try:
                    got = self._receive_from(q, max_messages, invisible_duration_s, wait_s)
                    break
                except BrokerUnavailableError as e:
                    errors.append(str(e))
            if got is None:
                failed_groups += 1
                continue
            if got:
                return got
        if errors and failed_groups == len(targets):
            raise BrokerUnavailableError("; ".join(errors))
        return []

    def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge a delivery; raises ClientError(INVALID_RECEIPT_HANDLE) if it expired."""
        self._ack(message)

    def change_invisible_duration(self, message: ReceivedMessage,
                                  invisible_duration_s: float) -> ReceivedMessage:
        """Hide the message ``invisible_duration_s`` from now; returns it with the new
        receipt handle (use that one to ack)."""
        return self._change_invisible(message, invisible_duration_s)


class PushConsumer(_GroupClient):
    """Background consumption: per (topic, broker) a poller thread long-polls receives
    and hands messages to ``listener(message) -> ConsumeResult`` on ``consume_threads``
    threads; SUCCESS acks; FAILURE or an exception nacks: the message comes back after
    the group's retry policy's delay for its attempt (``retry_policy``, from the brokers'
    Telemetry settings, as the official push consumers apply it), else after 1 s.
    ``invisible_duration_s=None`` (the default): receives ask for ``auto_renew``, as the
    official push consumers do, so the broker keeps a message hidden while its listener
    runs, however long (broker/renew.py); a number: each message is hidden that long
    and comes back after it if not acked by then.
    Acks go in batches (one AckMessage per broker and topic for every ack waiting then;
    ``consumed`` counts acks the broker accepted); orderly groups ack one by one.

    ``orderly=True``: messages of one message group from one receive are processed one
    after another in order, and after a failure the rest of that group is not processed
    (the broker redelivers from the failed one). At most ``consume_threads * batch_size``
    messages are in flight; a poller waits for room before receiving again.
    ``shutdown()`` stops polling, lets running listeners finish (unacked ones come back
    to the group), and closes the connections."""

    def __init__(self, endpoints, group: str, subscriptions: Mapping[str, "str | tuple[str, str]"],
                 listener: Callable[[ReceivedMessage], ConsumeResult], *,
                 consume_threads: int = 4, orderly: bool = False, batch_size: int = 16,
                 invisible_duration_s: float | None = None, wait_s: float = 2.0,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 mode: ConsumeMode = ConsumeMode.CLUSTERING, refresh_s: float = 20.0,
                 start: bool = True, credentials: tuple[str, str] | None = None, tls=None):
        super().__init__(endpoints, group, subscriptions, request_timeout_s=request_timeout_s,
                         mode=mode, credentials=credentials, tls=tls)
        self.listener = listener
        self.orderly = orderly
        self.batch_size = batch_size
        self.invisible_duration_s = invisible_duration_s
        self.wait_s = wait_s
        self._pool = cf.ThreadPoolExecutor(consume_threads, thread_name_prefix="sparkmq-consume")
        self._room = threading.BoundedSemaphore(consume_threads * batch_size)
        self._stop = threading.Event()
        self._pollers: list[threading.Thread] = []
        self._polled: set[tuple[str, str]] = set()
        self._maintainer: threading.Thread | None = None
        self.refresh_s = refresh_s
        self.consumed = 0
        self.failed = 0
        self._count_lock = threading.Lock()
        # acks of concurrently consumed messages go in batches (acks.py); an orderly
        # group acks each message before the next of its group, as it must
        self._acks = None if orderly else AckBatcher(group, self.conns.call, self._acked)
        self.retry_policy: RetryPolicy | None = None     # the group's (client/retry.py)
        if start:
            self.start()

    def _acked(self, n: int) -> None:
        with self._count_lock:
            self.consumed += n

    def start(self) -> "PushConsumer":
        self._heartbeat()
        self._fetch_retry_policy()
        try:
            self._start_pollers()
        except SparkMQError as e:           # the maintenance loop retries every refresh_s
            log.warning("consumer %s: no route yet (%s); retrying every %.0f s",
                        self.group, e, self.refresh_s)
        t = threading.Thread(target=self._maintain_loop, daemon=True, name="sparkmq-push-maintain")
        t.start()
        self._maintainer = t
        return self

    def _start_pollers(self) -> None:
        """One poller per (topic, broker) not polled yet (brokers that joined the route)."""
        for topic in self.subscriptions:
            for q in self._brokers(topic):
                if (topic, q.broker_name) in self._polled:
                    continue
                self._polled.add((topic, q.broker_name))
                t = threading.Thread(target=self._poll_loop, args=(q,), daemon=True,
                                     name=f"sparkmq-poll-{topic}-{q.broker_name}")
                t.start()
                self._pollers.append(t)

    def _maintain_loop(self) -> None:
        """Every ``refresh_s``: heartbeat, refresh routes, poll brokers that joined."""
        while not self._stop.wait(self.refresh_s):
            try:
                for topic in self.subscriptions:
                    self.routes.queues(topic, refresh=True)
                self._heartbeat()
                self._fetch_retry_policy()
                self._start_pollers()
            except Exception as e:      # a broker down must not end the consumer
                log.info("route refresh failed: %s", e)

    def _fetch_retry_policy(self) -> None:
        settings = consumer_settings(
            self.group, {t: _filter_of(e) for t, e in self.subscriptions.items()},
            request_timeout_s=self.conns.request_timeout_s, long_polling_s=self.wait_s)
        self.retry_policy = group_retry_policy(
            self.conns, self._endpoints_of_subscriptions(), settings) or self.retry_policy

    def _nack(self, m: ReceivedMessage) -> None:
        policy = self.retry_policy
        if not m.receipt_handle or (policy is None and self.invisible_duration_s is not None):
            return                                     # back after its invisible time
        try:
            self._change_invisible(m, NACK_DELAY_S if policy is None
                                   else policy.delay_s(m.delivery_attempt))
        except (ClientError, BrokerUnavailableError) as e:
            log.info("nack of %s failed (%s); it comes back after its invisible duration",
                     m.message_id, e)

    def _poll_loop(self, queue: Queue) -> None:
        while not self._stop.is_set():
            n = self._reserve()
            if n == 0:
                continue
            try:
                got = self._receive_from(queue, n, self.invisible_duration_s, self.wait_s)
            except (BrokerUnavailableError, ClientError) as e:   # a broker down or refusing
                log.info("receive from %s failed: %s", queue.endpoint, e)
                got = []
                self._stop.wait(1.0)
            except Exception:   # this receive thread must not die on one bad answer
                log.exception("receive from %s failed", queue.endpoint)
                got = []
                self._stop.wait(1.0)
            for _ in range(n - len(got)):
                self._room.release()
            self._dispatch(got)

    def _reserve(self) -> int:
        """Take room for up to batch_size messages (at least one; waits up to 1 s)."""
        if not self._room.acquire(timeout=1.0):
            return 0
        n = 1
        while n < self.batch_size and self._room.acquire(blocking=False):
            n += 1
        return n

    def _dispatch(self, got: list[ReceivedMessage]) -> None:
        if not self.orderly:
            for m in got:
                self._pool.submit(self._consume_all, [m])
            return
        groups: dict[str | None, list[ReceivedMessage]] = {}
        for m in got:
            groups.setdefault(m.message_group, []).append(m)
        for g, ms in groups.items():
            if g is None:
                for m in ms:
                    self._pool.submit(self._consume_all, [m])
            else:
                self._pool.submit(self._consume_all, ms)

    def _consume_all(self, messages: list[ReceivedMessage]) -> None:
        ok = True
        for m in messages:
            try:
                if ok and not self._stop.is_set():
                    ok = self._consume_one(m)
            finally:
                self._room.release()

    def _consume_one(self, m: ReceivedMessage) -> bool:
        try:
            result = self.listener(m)
        except Exception:   # a user callback: whatever it raises means "consume failed"
            log.exception("listener raised on %s; it will be redelivered", m.message_id)
            result = ConsumeResult.FAILURE
        if result is ConsumeResult.SUCCESS:
            if self._acks is not None:
                self._acks.add(m)            # counted in ``consumed`` once acked
                return True
            try:
                self._ack(m)
            except (ClientError, BrokerUnavailableError) as e:
                log.warning("ack of %s failed (%s); it will be redelivered", m.message_id, e)
                return False
            with self._count_lock:
                self.consumed += 1
            return True
        with self._count_lock:
            self.failed += 1
        self._nack(m)
        return False

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop polling, wait (bounded) for pollers and running listeners, close. Idempotent."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in [*self._pollers, *([self._maintainer] if self._maintainer else [])]:
            t.join(max(0.0, deadline - time.monotonic()))
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._acks is not None:
            self._acks.close(max(1.0, deadline - time.monotonic()))
        self.close()

    def __enter__(self) -> "PushConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
