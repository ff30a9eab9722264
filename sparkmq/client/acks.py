"""Acknowledgements sent in batches: a PushConsumer's listeners hand each consumed
message to an :class:`AckBatcher`, whose thread sends one AckMessage per (broker,
topic) for every message waiting at that moment (RocketMQ 5's AckMessageRequest
takes many entries; the broker answers each entry on its own). Under load a consume
thread no longer waits for a round trip per message, and the broker takes one RPC
for many acks; alone, a message is acked as soon as the thread is free.

Thread-safety: ``add`` from any thread; one sender thread; ``close`` flushes.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from .core import BrokerUnavailableError, ClientError, Code

log = logging.getLogger(__name__)

#: entries in one AckMessage request at most
MAX_ENTRIES = 64


class AckBatcher:
    """``call(endpoint, method, request)`` sends an RPC (the client's connections);
    ``on_acked(n)`` is told how many entries the broker accepted."""

    def __init__(self, group: str, call: Callable, on_acked: Callable[[int], None]):
        self.group = group
        self._call = call
        self._on_acked = on_acked
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, str], list] = {}     # (endpoint, topic) -> messages
        self._busy = False
        self._closed = False
        self.requests = 0                                   # AckMessage calls made
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"sparkmq-ack-{group}")
        self._thread.start()

    def add(self, m) -> None:
        with self._cond:
            if self._closed:
                raise ClientError("the consumer is shut down: its acks are not sent",
                                  Code.BAD_REQUEST)
            self._pending.setdefault((m.endpoint, m.topic), []).append(m)
            self._cond.notify()

    def _take(self):
        """The next (endpoint, topic, messages) to ack; None when closed and empty."""
        with self._cond:
            while not self._pending:
                self._busy = False
                self._cond.notify_all()                     # flush() waits for idle
                if self._closed:
                    return None
                self._cond.wait()
            self._busy = True
            key = next(iter(self._pending))
            ms = self._pending[key]
            batch, rest = ms[:MAX_ENTRIES], ms[MAX_ENTRIES:]
            if rest:
                self._pending[key] = rest
            else:
                del self._pending[key]
            return key[0], key[1], batch

    def _run(self) -> None:
        while (item := self._take()) is not None:
            endpoint, topic, batch = item
            try:
                self._send(endpoint, topic, batch)
            except (ClientError, BrokerUnavailableError) as e:
                log.warning("ack of %d messages of %s failed (%s); they will be redelivered",
                            len(batch), topic, e)
            except Exception:   # the ack thread must not die: these come back to the group
                log.exception("ack of %d messages of %s failed", len(batch), topic)

    def _send(self, endpoint: str, topic: str, batch: list) -> None:
        self.requests += 1
        r = self._call(endpoint, "AckMessage", spb.AckMessageRequest(
            group=pb.Resource(name=self.group), topic=pb.Resource(name=topic),
            entries=[spb.AckMessageEntry(message_id=m.message_id,
                                         receipt_handle=m.receipt_handle) for m in batch]))
        if r.status.code not in (Code.OK, Code.MULTIPLE_RESULTS):
            raise ClientError(f"AckMessage: {Code.Name(r.status.code)}: {r.status.message}",
                              r.status.code)
        ok = 0
        for e in r.entries:
            if e.status.code == Code.OK:
                ok += 1
            else:
                log.warning("ack of %s refused: %s (it will be redelivered)", e.message_id,
                            e.status.message)
        self._on_acked(ok if r.entries else len(batch))

    def flush(self, timeout_s: float) -> bool:
        """Wait until every ack added so far is sent (True), or ``timeout_s``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is pending (bounded by ``timeout_s``), then stop the thread."""
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
