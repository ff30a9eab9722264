"""The master's side of replication (RocketMQ's HAService + HAConnection).

``HAService`` listens on ``haListenPort``; each replica that authenticates
gets a ``ReplicaConnection`` (``connection.py``): one thread streams CommitLog bytes from the
replica's offset (segment boundaries and names included, so the copy is
byte-identical). The bytes streamed are those the store has written
(``SegmentRef.size``: whole batches only), sent from the segment files with
``os.sendfile`` (no copy through Python); a sealed segment's bytes include its
end-of-stream marker, so the replica seals at the same byte. To a replica caught
up, an append's bytes are sent by the appending thread itself as they are written
(``push``, from ``CommitLog.written_hook``), if the socket takes them without
waiting; the streaming thread is then not woken. The replica's acks are read on
the broker's event loop (``ack_loop``: ``loopacks.py``) or, without one or over
TLS, on a thread of their own.

SYNC_MASTER: ``wait_replicated(offset, timeout_ms)`` blocks the sender until
some replica acked ``offset`` (``PUT_OK``), or answers ``SLAVE_NOT_AVAILABLE``
at once when no replica is attached, or ``FLUSH_SLAVE_TIMEOUT`` after the
timeout (the message is stored on the master either way). ``replicated_async`` gives
the same answers to a coroutine (the gRPC loop's sends, ``broker/replicawait.py``): the
ack's reader settles its future, so no thread waits. A replica acks what
it has written to its own segment file (page cache), as RocketMQ's slave does.

Topic configs, consumer offsets and the retention floor (so that a replica
starting past removed segments numbers its queues as the master does) travel
as ``meta`` frames, sent before any
byte that could refer to a newer topic (the size is read first, the topics
after, and a topic is always committed before its first append).

Thread-safety: all public methods may be called from any thread. Every wait is
bounded; ``stop`` closes every connection and joins the threads.
"""
from __future__ import annotations

import logging
import socket
import threading
import time

from ..errors import BindError
from ..log.commitlog import SegmentRef
from ..log.replication import meta_frame
from ..log.services import AwaitedOffsets
from ..log.status import PutMessageStatus
from ..log.store import Store
from . import epochs as epoch_history
from .connection import ReplicaConnection

log = logging.getLogger("sparkmq.ha")

class HAService:
    """The master's replication endpoint; see the module docstring."""

    def __init__(self, store: Store, *, broker_name: str, secret: str,
                 host: str = "127.0.0.1", port: int = 0, ssl_context=None,
                 ack_loop=None):
        if not secret:
            from ..errors import InvalidConfigError
            raise InvalidConfigError("replication needs haSecret (a shared secret in the "
                                     "master's and the replica's config)")
        self.store = store
        self.broker_name = broker_name
        self.secret = secret
        self.host = host
        self.port = port
        self.ssl_context = ssl_context     # TLS on the link (haTlsEnable; tlslink.py)
        self.ack_loop = ack_loop           # an event loop to read acks on (loopacks.py)
        self.stopped = threading.Event()
        self._cond = threading.Condition()     # streamers wait here for new bytes
        self._ack_cond = threading.Condition()  # SYNC_MASTER senders wait here for acks
        self._waiters = AwaitedOffsets()   # replicated_async's
        self._waiters_by = AwaitedOffsets()   # replicated_by_async's, by (offset, ids)
        self.generation = 0          # bumped on every notify (new bytes, closes)
        self._conns: list[ReplicaConnection] = []
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._meta_cache: tuple[int, dict] | None = None

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> "HAService":
        epoch_history.append(self.store.sfs, self.store.epoch, self.store.store_id,
                             self.store.commitlog.written_offset)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            raise BindError(f"cannot bind HA port {self.host}:{self.port}: {e}; set haListenPort "
                            "to a free port or stop the process holding it") from None
        sock.listen(16)
        sock.settimeout(0.5)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self.store.add_listener(self._on_arrival)
        self.store.commitlog.written_hook = self._on_written
        t = threading.Thread(target=self._accept_loop, name="sparkmq-ha-accept", daemon=True)
        t.start()
        self._threads.append(t)
        log.info("HA service of %s listening on %s:%d", self.broker_name, self.host, self.port)
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.store.remove_listener(self._on_arrival)
        if self.store.commitlog.written_hook == self._on_written:
            self.store.commitlog.written_hook = None
        self.notify()
        self.note_acked()
        if self._sock is not None:
            self._sock.close()
        with self._ack_cond:
            conns = list(self._conns)
        for c in conns:
            c.close()
        for t in self._threads:
            t.join(10)

    def _accept_loop(self) -> None:
        while not self.stopped.is_set():
            try:
                sock, addr = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = ReplicaConnection(self, sock, addr)
            t = threading.Thread(target=conn.run, name="sparkmq-ha-conn", daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def attach(self, conn: ReplicaConnection) -> None:
        """A replica connection starts counting for SYNC_MASTER acks."""
        with self._ack_cond:      # a new list, not changed in place: ``_on_arrival`` reads it
            self._conns = [*self._conns, conn]
        self.note_acked()

    def detach(self, conn: ReplicaConnection) -> None:
        """A replica connection ended: it no longer counts; waiters re-check."""
        with self._ack_cond:
            self._conns = [c for c in self._conns if c is not conn]
        self.note_acked()
        self.notify()

    # -- signals -----------------------------------------------------------
    def _on_written(self, ref: SegmentRef, pos: int, data) -> None:
        """An append's bytes, as written (``CommitLog.written_hook``): pushed to each
        replica by the appending thread where it can (``ReplicaConnection.push``)."""
        for c in self._conns:
            c.push(ref, pos, data)

    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """New rows: the streaming threads of replicas that lack bytes are woken."""
        end = self.store.commitlog.written_offset
        conns = self._conns
        if not conns or not all([c.caught_up(end) for c in conns]):
            self.notify()

    def notify(self) -> None:
        """New bytes in the CommitLog (or something else changed): wake the streamers."""
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def note_acked(self) -> None:
        """A replica acked more bytes (or the set changed, or the service stops): wake
        SYNC_MASTER waiters, and settle the awaited ones that have their answer."""
        with self._ack_cond:
            self._ack_cond.notify_all()
            if self._waiters:
                self._waiters.settle(self._replicated_status)
            if self._waiters_by:
                self._waiters_by.settle(self._replicated_by_status)

    def wait_for_bytes(self, seen: int, timeout_s: float) -> None:
        with self._cond:
            if self.generation == seen and not self.stopped.is_set():
                self._cond.wait(timeout_s)

    # -- SYNC_MASTER -------------------------------------------------------
    def acked_offset(self) -> int:
        """The highest offset any attached replica acked (0 with none)."""
        with self._ack_cond:
            return max((c.acked_offset for c in self._conns if not c.closed.is_set()),
                       default=0)

    def wait_replicated(self, offset: int, timeout_ms: int) -> PutMessageStatus:
        """Block until a replica acked ``offset`` (replicas ack at whole-batch ends, so
        ``batch_offset + 1`` waits for exactly one batch); see the module docstring."""
        return self._wait(self._replicated_status, offset, timeout_ms)

    async def replicated_async(self, offset: int, timeout_ms: int) -> PutMessageStatus:
        """``wait_replicated`` for a coroutine, with the same answers: the ack's reader
        settles a future on the caller's loop (``broker/replicawait.py``), so no
        thread waits for the replica."""
        return await self._awaited(self._waiters, self._replicated_status, offset,
                                   timeout_ms)

    def wait_replicated_by(self, offset: int, replica_ids: list[int],
                           timeout_ms: int) -> PutMessageStatus:
        """Block until every replica in ``replica_ids`` acked ``offset`` (controller
        mode: every other SyncStateSet member); PUT_OK at once when there is none."""
        return self._wait(self._replicated_by_status, (offset, frozenset(replica_ids)),
                          timeout_ms)

    async def replicated_by_async(self, offset: int, replica_ids: list[int],
                                  timeout_ms: int) -> PutMessageStatus:
        """``wait_replicated_by`` for a coroutine, with the same answers (controller
        mode's sends on the gRPC loop)."""
        return await self._awaited(self._waiters_by, self._replicated_by_status,
                                   (offset, frozenset(replica_ids)), timeout_ms)

    def _wait(self, status, key, timeout_ms: int) -> PutMessageStatus:
        """Block until ``status(key)`` has an answer (re-asked on every ack), or
        FLUSH_SLAVE_TIMEOUT after ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._ack_cond:
            while True:
                st = status(key)
                if st is not None:
                    return st
                left = deadline - time.monotonic()
                if left <= 0:
                    return PutMessageStatus.FLUSH_SLAVE_TIMEOUT
                self._ack_cond.wait(left)

    async def _awaited(self, waiters: AwaitedOffsets, status, key,
                       timeout_ms: int) -> PutMessageStatus:
        """``_wait`` for a coroutine: a future in ``waiters``, which ``note_acked``
        settles with ``status``."""
        with self._ack_cond:
            st = status(key)
            if st is not None:
                return st
            waiter = waiters.add(key)
        return await waiters.wait(waiter, self._ack_cond, timeout_ms / 1000.0,
                                  PutMessageStatus.FLUSH_SLAVE_TIMEOUT)

    def _replicated_by_status(self, key: tuple) -> PutMessageStatus | None:
        """A wait for ``key`` (offset, replica ids) now (under ``_ack_cond``), None to
        wait on: every one of them acked the offset, PUT_OK; stopping,
        FLUSH_SLAVE_TIMEOUT."""
        offset, wanted = key
        acked = {c.broker_id: c.acked_offset for c in self._conns if not c.closed.is_set()}
        if all(acked.get(i, -1) >= offset for i in wanted):
            return PutMessageStatus.PUT_OK
        if self.stopped.is_set():
            return PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        return None

    def _replicated_status(self, offset: int) -> PutMessageStatus | None:
        """A wait for ``offset``'s answer now (under ``_ack_cond``), None to wait on:
        no replica attached, SLAVE_NOT_AVAILABLE; one acked it, PUT_OK; stopping,
        FLUSH_SLAVE_TIMEOUT."""
        live = [c for c in self._conns if not c.closed.is_set()]
        if not live:
            return PutMessageStatus.SLAVE_NOT_AVAILABLE
        if max(c.acked_offset for c in live) >= offset:
            return PutMessageStatus.PUT_OK
        if self.stopped.is_set():
            return PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        return None

    # -- state ---------------------------------------------------------------
    def history(self) -> list[dict]:
        return epoch_history.load(self.store.sfs)

    def meta(self) -> dict:
        """Topic configs, consumer offsets and subscription group configs to mirror
        (cached per log version)."""
        state = self.store.state
        cached = self._meta_cache
        if cached is not None and cached[0] == state.version:
            return cached[1]
        meta = meta_frame(state)
        self._meta_cache = (state.version, meta)
        return meta

    def acked_by_replica(self) -> dict[int, int]:
        """Attached replica id -> the offset it acked."""
        with self._ack_cond:
            return {c.broker_id: c.acked_offset for c in self._conns if not c.closed.is_set()}

    def has_replica(self) -> bool:
        """A replica is attached (one that could acknowledge a SYNC_MASTER send)."""
        with self._ack_cond:
            return any(not c.closed.is_set() for c in self._conns)

    def replicas(self) -> list[dict]:
        with self._ack_cond:
            return [c.info() for c in self._conns if not c.closed.is_set()]

    def lag_bytes(self) -> int | None:
        """Bytes written here that no replica acked (None with no replica)."""
        reps = self.replicas()
        if not reps:
            return None
        return min(r["lagBytes"] for r in reps)

