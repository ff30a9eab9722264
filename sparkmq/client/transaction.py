"""The producer side of transactional messages (RocketMQ 5.x protocol).

A transactional send is three steps: the producer sends a *half* message (message
type TRANSACTION; stored by the broker but invisible to consumers), runs its local
transaction, and ends the transaction with ``EndTransaction`` COMMIT or ROLLBACK.
When the local transaction cannot tell yet (UNKNOWN), or the producer dies before
ending it, the broker asks back after ``transactionTimeOut``: it sends a
``RecoverOrphanedTransactionCommand`` down the producer's Telemetry stream, the
producer runs its *checker* on the message and answers with ``EndTransaction``
(source SERVER_CHECK); an UNKNOWN answer leaves the broker to ask again later.

:class:`TelemetryStreams` keeps one Telemetry stream per broker endpoint open for a
producer with a checker: it sends the producer's Settings (client type PRODUCER and
its topics, so the broker can route check-backs of half messages sent by an earlier
producer instance of the same topics here), and re-opens a stream that broke (broker
restart) after a bounded back-off. Check-backs run on the producer's thread pool.

Thread-safety: every method may be called from any thread.
"""
from __future__ import annotations

import enum
import logging
import queue
import threading
from typing import Callable

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from .core import Code, Connections, ReceivedMessage, duration

log = logging.getLogger("sparkmq.client.transaction")

RECONNECT_MIN_S = 0.2
RECONNECT_MAX_S = 5.0
HANDSHAKE_TIMEOUT_S = 5.0


class TransactionResolution(enum.Enum):
    """What a local transaction or a checker decided."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"      # not decided yet: the broker checks back later

    def to_pb(self) -> int:
        return {TransactionResolution.COMMIT: pb.COMMIT,
                TransactionResolution.ROLLBACK: pb.ROLLBACK}[self]


def as_resolution(value, what: str) -> TransactionResolution:
    """``value`` as a resolution; anything else is UNKNOWN (logged: a bug in ``what``)."""
    if isinstance(value, TransactionResolution):
        return value
    if isinstance(value, str) and value.upper() in TransactionResolution.__members__:
        return TransactionResolution[value.upper()]
    log.error("%s returned %r, not a TransactionResolution (COMMIT, ROLLBACK, UNKNOWN); "
              "treated as UNKNOWN", what, value)
    return TransactionResolution.UNKNOWN


def end_transaction(conns: Connections, endpoint: str, topic: str, message_id: str,
                    transaction_id: str, resolution: TransactionResolution,
                    from_check: bool) -> None:
    """EndTransaction at ``endpoint``; raises ClientError / BrokerUnavailableError."""
    from .core import check
    r = conns.call(endpoint, "EndTransaction", spb.EndTransactionRequest(
        topic=pb.Resource(name=topic), message_id=message_id, transaction_id=transaction_id,
        resolution=resolution.to_pb(),
        source=pb.SOURCE_SERVER_CHECK if from_check else pb.SOURCE_CLIENT))
    check(r.status, f"EndTransaction {transaction_id} at {endpoint}")


class _Stream:
    """One Telemetry stream to one endpoint, re-opened while the producer lives."""

    def __init__(self, owner: "TelemetryStreams", endpoint: str):
        self.owner = owner
        self.endpoint = endpoint
        self.ready = threading.Event()          # the broker answered our Settings
        self._outbound: queue.Queue = queue.Queue()
        self._call = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"sparkmq-telemetry-{endpoint}")
        self._thread.start()

    def _requests(self, outbound: queue.Queue):
        yield spb.TelemetryCommand(settings=self.owner.settings())
        while True:
            item = outbound.get()
            if item is None:
                return
            yield item

    def _run(self) -> None:
        backoff = RECONNECT_MIN_S
        while not self.owner.closed.is_set():
            outbound: queue.Queue = queue.Queue()
            self._outbound = outbound
            try:
                stub = self.owner.conns.stub(self.endpoint)
                self._call = stub.Telemetry(self._requests(outbound),
                                            metadata=self.owner.conns.metadata)
                for cmd in self._call:
                    backoff = RECONNECT_MIN_S
                    self._on_command(cmd)
            except grpc.RpcError as e:
                if not self.owner.closed.is_set():
                    log.debug("telemetry stream to %s broke: %s", self.endpoint, e.code())
            except Exception:   # the telemetry daemon must reconnect, not die, on any failure
                log.exception("telemetry stream to %s failed", self.endpoint)
            finally:
                outbound.put(None)
                self.ready.clear()
            if self.owner.closed.wait(backoff):
                return
            backoff = min(RECONNECT_MAX_S, backoff * 2)

    def _on_command(self, cmd) -> None:
        if cmd.HasField("settings"):
            if cmd.status.code not in (Code.OK, 0):
                log.warning("broker %s refused the producer settings: %s", self.endpoint,
                            cmd.status.message)
            self.ready.set()
        elif cmd.HasField("recover_orphaned_transaction_command"):
            c = cmd.recover_orphaned_transaction_command
            self.owner.on_check(self.endpoint, c.message, c.transaction_id)

    def close(self) -> None:
        self._outbound.put(None)
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(RECONNECT_MAX_S + 1)


class TelemetryStreams:
    """The producer's Telemetry streams and its transaction checker (see module doc)."""

    def __init__(self, conns: Connections, topics: Callable[[], list[str]],
                 checker: Callable[[ReceivedMessage], object],
                 submit: Callable[[Callable[[], None]], object]):
        self.conns = conns
        self.topics = topics
        self.checker = checker
        self.submit = submit
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self.checks_answered = 0

    def settings(self) -> pb.Settings:
        return pb.Settings(client_type=pb.PRODUCER,
                           request_timeout=duration(self.conns.request_timeout_s),
                           publishing=pb.Publishing(
                               topics=[pb.Resource(name=t) for t in self.topics()]))

    def ensure(self, endpoints, *, wait_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        """Open streams to ``endpoints`` (if not open) and wait, at most ``wait_s``, for
        each broker to answer the Settings handshake."""
        opened = []
        with self._lock:
            if self.closed.is_set():
                return
            for ep in endpoints:
                s = self._streams.get(ep)
                if s is None:
                    s = self._streams[ep] = _Stream(self, ep)
                opened.append(s)
        for s in opened:
            if not s.ready.wait(wait_s):
                log.warning("broker %s did not answer the telemetry handshake within %.1f s; "
                            "check-backs may not reach this producer yet", s.endpoint, wait_s)

    def on_check(self, endpoint: str, message: pb.Message, transaction_id: str) -> None:
        self.submit(lambda: self._check(endpoint, message, transaction_id))

    def _check(self, endpoint: str, message: pb.Message, transaction_id: str) -> None:
        received = ReceivedMessage.from_pb(message, endpoint)
        try:
            decided = as_resolution(self.checker(received), "the transaction checker")
        except Exception:   # a user callback: whatever it raises means UNKNOWN
            log.exception("transaction checker raised for %s; answering nothing (UNKNOWN)",
                          transaction_id)
            return
        if decided is TransactionResolution.UNKNOWN:
            return
        try:
            end_transaction(self.conns, endpoint, received.topic, received.message_id,
                            transaction_id, decided, from_check=True)
            self.checks_answered += 1
        except Exception as e:       # the broker checks again later
            log.warning("answering the check of %s failed: %s", transaction_id, e)

    def close(self) -> None:
        self.closed.set()
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for s in streams:
            s.close()
