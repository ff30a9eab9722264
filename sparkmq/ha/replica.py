"""The replica's side of replication (RocketMQ's HAClient) and promotion.

The store side -- writing the master's bytes into the replica's own store,
finding whole messages by their headers, dispatching them
(``sparkmq-replica-reput``), mirroring metadata, truncating to a consistent
point, cutting an unfinished tail -- is :class:`sparkmq.log.replication.ReplicaLog`
(re-exported here). This module keeps the network side.

``HAClient`` connects to the master's HA port, authenticates (HMAC over
``haSecret``), reports its offset, applies ``meta``/``segment``/``data``
frames and acks after each write. A data frame's payload goes from the socket
to the segment file with ``os.splice`` (Linux: socket -> pipe -> file, one copy
in the kernel; else ``recv_into`` a reused buffer and ``os.write``). It
reconnects with a bounded backoff and catches up from any gap (from empty,
across rolls and adopted Spark segments). A rejoining old master is told by
its new master where to truncate (``ReplicaLog.truncate_to``; the dropped
bytes are kept in ``<store>.diverged-<ms>/``).

``promote`` turns the replica's store into a master's: an unfinished message
at the tail is cut, the writer lease of the replica's store is re-taken with an
epoch above every epoch the replica has seen, and the epoch history records
where the new master's bytes begin.

Durability of an ack: the bytes are written (page cache), as RocketMQ's slave
acks; the replica's store fsyncs them by its own flush mode (ASYNC_FLUSH: every
``flushIntervalCommitLog``; SYNC_FLUSH: a group-commit fsync requested after
each write, not waited for) and at every segment seal.

Thread-safety: ``HAClient`` runs one thread (``sparkmq-ha-client``), the
ReplicaLog's dispatch one more. Every wait and retry is bounded.
"""
from __future__ import annotations

import errno
import logging
import os
import select
import socket
import time
from typing import Callable

from ..errors import HAProtocolError, InvalidConfigError, SparkMQError
from ..lifecycle import ServiceThread
from ..log import segment as seg
from ..log.replication import ReplicaLog  # noqa: F401  (the store side; re-exported)
from ..log.store import Store
from . import epochs as epoch_history
from .tlslink import TLSLink
from .protocol import (check_proof, new_nonce, parse_address, proof, recv_frame, recv_header,
                       send_frame)

log = logging.getLogger("sparkmq.ha")

MASTER_SILENCE_S = 5.0          # no frame for this long: the link is dead, reconnect
CONNECT_TIMEOUT_S = 3.0
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 2.0
PIPE_BYTES = 1 << 20            # splice pipe (Linux caps it at fs.pipe-max-size)
RECV_BUFFER_BYTES = 1 << 20     # without splice: recv_into this buffer, then write
PROGRESS_BYTES = 512 << 10      # within a frame, look for whole batches to ack this often


def promote(store: Store, replica_log: ReplicaLog | None, seen_epoch: int) -> int:
    """Make this replica's store a master's: cut an unfinished tail, re-take the
    store's lease with an epoch above ``seen_epoch`` (the master's, learned from
    the stream) and every epoch in the history, record the new epoch's start
    offset, publish. Returns the new epoch."""
    if replica_log is not None:
        dropped = replica_log.cut_unfinished()
        if dropped:
            log.warning("promotion: dropped %d bytes of an unfinished message", dropped)
    history = epoch_history.load(store.sfs)
    floor = max([seen_epoch] + [e["epoch"] for e in history])
    epoch = store.raise_epoch(floor)
    store.replica = False          # from now on it appends its own batches
    epoch_history.append(store.sfs, epoch, store.store_id, store.commitlog.written_offset)
    store.publish(force=True)
    log.warning("store %s promoted: writer epoch %d from physical offset %d", store.url, epoch,
                store.commitlog.written_offset)
    return epoch


class HAClient(ServiceThread):
    """Follows a master; see the module docstring. ``master_address`` is called
    before each connection attempt (a fixed ``haMasterAddress`` or a lookup). Its
    ``sparkmq-ha-client`` thread runs one session per pass."""

    name = "ha-client"

    def __init__(self, replica_log: ReplicaLog, *, broker_name: str, broker_id: int,
                 secret: str, master_address: Callable[[], str | None], ssl_context=None):
        if not secret:
            raise InvalidConfigError("a replica needs haSecret (the master's shared secret)")
        self.rlog = replica_log
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.secret = secret
        self.master_address = master_address
        self.ssl_context = ssl_context     # TLS to the master (haTlsEnable; tlslink.py)
        self.connected = False
        self.master_epoch = 0
        self.master_offset = 0          # the master's written offset, as last heard
        self.last_error: str | None = None
        self.diverged_at: int | None = None      # where this store was truncated to rejoin
        self.diverged_kept: str | None = None    # where the dropped bytes were kept
        super().__init__(interval_ms=int(BACKOFF_MIN_S * 1000))
        self._backoff_s = self._next_wait_s = BACKOFF_MIN_S
        self._sock: socket.socket | None = None

    @property
    def offset(self) -> int:
        return self.rlog.offset

    def lag_bytes(self) -> int:
        return max(0, self.master_offset - self.rlog.offset)

    def start(self) -> "HAClient":
        self.rlog.start()
        super().start()
        self.wakeup()                 # connect at once; later attempts back off
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()              # (before the shutdown: the follow loop ends quietly)
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().stop(timeout_s)
        self.rlog.stop()

    def wait_s(self) -> float:
        return self._next_wait_s

    def run_once(self) -> None:
        """One session with the master (until the link drops); the next attempt
        waits BACKOFF_MIN_S after a session, doubling (to BACKOFF_MAX_S) while
        attempts fail."""
        addr = None
        try:
            addr = self.master_address()
            if addr:
                self._follow(addr)
                self._backoff_s = BACKOFF_MIN_S
        except (OSError, ConnectionError, HAProtocolError, ValueError, SparkMQError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            if not self._stop.is_set():
                log.warning("HA: link to master %s of %s lost: %s; retrying", addr,
                            self.broker_name, self.last_error)
        except Exception as e:   # never die: log, back off, retry
            self.last_error = f"{type(e).__name__}: {e}"
            log.exception("HA client failed")
        finally:
            self.connected = False
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._next_wait_s = self._backoff_s
            self._backoff_s = min(BACKOFF_MAX_S, self._backoff_s * 2)

    def _follow(self, addr: str) -> None:
        host, port = parse_address(addr)
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        self._sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            sock = self._sock = TLSLink(sock, self.ssl_context, server_side=False,
                                        server_hostname=host,
                                        handshake_timeout_s=CONNECT_TIMEOUT_S)
        sock.settimeout(MASTER_SILENCE_S)
        challenge, _ = recv_frame(sock)
        if challenge.get("type") != "challenge":
            raise HAProtocolError(f"{addr} is not a sparkmq HA port "
                                  f"(got {challenge.get('type')!r})")
        if challenge.get("brokerName") != self.broker_name:
            raise HAProtocolError(f"{addr} is the master of {challenge.get('brokerName')!r}, "
                                  f"not of {self.broker_name!r}")
        nonce = new_nonce()
        offset = self.rlog.offset
        send_frame(sock, {"type": "hello", "brokerName": self.broker_name,
                          "brokerId": self.broker_id, "nonce": nonce,
                          "proof": proof(self.secret, "replica", str(challenge.get("nonce")),
                                         self.broker_name),
                          "offset": offset, "epochs": epoch_history.load(self.rlog.store.sfs)})
        welcome, _ = recv_frame(sock)
        if welcome.get("type") == "error":
            raise HAProtocolError(f"master {addr} refused: {welcome.get('code')}: "
                                  f"{welcome.get('message')}")
        if welcome.get("type") != "welcome":
            raise HAProtocolError(f"expected welcome, got {welcome.get('type')!r}")
        if not check_proof(self.secret, "master", nonce, self.broker_name, welcome.get("proof")):
            raise HAProtocolError(f"{addr} failed to prove it knows haSecret; not following it")
        truncate_to = welcome.get("truncateTo")
        if isinstance(truncate_to, int) and 0 <= truncate_to < offset:
            # this store was a master before a promotion: it holds bytes the new master
            # lacks. Keep them aside, cut them here; the master streams from truncate_to.
            keep = f"{self.rlog.store.url.rstrip('/')}.diverged-{int(time.time() * 1000)}"
            dropped = self.rlog.truncate_to(truncate_to, keep_dir=keep)
            self.diverged_at, self.diverged_kept = truncate_to, keep
            log.warning("replica %s#%d: dropped %d bytes past offset %d that master %s lacks "
                        "(kept in %s)", self.broker_name, self.broker_id, dropped, truncate_to,
                        addr, keep)
        self.master_epoch = int(welcome.get("epoch") or 0)
        if isinstance(welcome.get("epochs"), list):
            epoch_history.save(self.rlog.store.sfs, welcome["epochs"])
        self.connected = True
        self.last_error = None
        log.info("HA: following master %s of %s (epoch %d) from offset %d", addr,
                 self.broker_name, self.master_epoch, offset)
        source = _SocketSource(sock)
        try:
            self._apply_frames(sock, source)
        finally:
            source.close()
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _apply_frames(self, sock: socket.socket, source: "_SocketSource") -> None:
        """Apply frames as they arrive, in this thread: a data frame's payload goes from
        the socket to the segment file (spliced in the kernel where Linux allows), then
        the whole batches in it are acked. The socket's timeout (MASTER_SILENCE_S) ends
        a silent link."""
        while not self._stop.is_set():
            header, plen = recv_header(sock)
            kind = header["type"]
            if kind == "data":           # ack the whole batches once written
                end = self.rlog.write_from(
                    header.get("path"), header.get("pos"), plen,
                    lambda a, progress: source.copy_into(a, plen, progress),
                    lambda off: send_frame(sock, {"type": "ack", "offset": off}))
                self.master_offset = max(self.master_offset, end)
                continue
            if plen:
                raise HAProtocolError(f"a {kind!r} frame with a payload of {plen} bytes")
            if kind == "segment":
                self.rlog.begin_segment(header.get("path"), header.get("baseOffset"))
            elif kind == "meta":
                self.rlog.apply_meta(header)
            elif kind == "heartbeat":
                self.master_offset = int(header.get("writtenOffset") or 0)
                self.master_epoch = int(header.get("epoch") or self.master_epoch)
                send_frame(sock, {"type": "ack", "offset": self.rlog.whole_offset})
            elif kind == "error":
                raise HAProtocolError(f"master: {header.get('code')}: {header.get('message')}")
            else:
                log.debug("HA: ignoring frame %s", kind)


class _SocketSource:
    """Moves a data frame's payload from the HA socket into a segment file: with
    ``os.splice`` socket -> pipe -> file (Linux; the bytes never enter Python, one
    copy in the kernel), else ``recv_into`` a reused buffer and ``os.write``. Falls
    back for good on the first refusal (an old kernel, a file system without
    splice)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.pipe: tuple[int, int] | None = None
        self.pipe_bytes = 0
        self.buf = memoryview(bytearray(RECV_BUFFER_BYTES))
        if hasattr(os, "splice") and not isinstance(sock, TLSLink):   # TLS: decrypt here
            r, w = os.pipe()
            self.pipe = (r, w)
            try:
                import fcntl
                self.pipe_bytes = fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031),
                                              PIPE_BYTES)
            except OSError:
                self.pipe_bytes = 64 << 10

    def close(self) -> None:
        if self.pipe is not None:
            for fd in self.pipe:
                os.close(fd)
            self.pipe = None

    def _wait_readable(self) -> None:
        if not select.select([self.sock], [], [], MASTER_SILENCE_S)[0]:
            raise ConnectionError(f"master silent for {MASTER_SILENCE_S} s")

    def copy_into(self, a: seg.SegmentWriter, count: int, progress: Callable[[], None]) -> None:
        """Append the next ``count`` bytes of the socket to ``a``; ``progress()`` after
        each part of at least PROGRESS_BYTES."""
        left = count
        since = 0
        while left and self.pipe is not None:
            try:
                n = os.splice(self.sock.fileno(), self.pipe[1], min(left, self.pipe_bytes),
                              flags=os.SPLICE_F_MOVE)
            except BlockingIOError:          # a socket with a timeout is non-blocking
                self._wait_readable()
                continue
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                log.info("HA: splice from the socket refused (%s); receiving through a "
                         "buffer", e)
                self.close()
                break
            if n == 0:
                raise ConnectionError("peer closed the connection")
            try:
                a.append_from_pipe(self.pipe[0], n)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                log.info("HA: splice into %s refused (%s); receiving through a buffer",
                         a.rel_path, e)
                start = a.size
                while a.size - start < n:        # what is still in the pipe
                    a.append(os.read(self.pipe[0], n - (a.size - start)))
                self.close()
            left -= n
            since += n
            if since >= PROGRESS_BYTES and left:
                progress()
                since = 0
        while left:
            try:
                n = self.sock.recv_into(self.buf, min(left, len(self.buf)))
            except BlockingIOError:
                self._wait_readable()
                continue
            if n == 0:
                raise ConnectionError("peer closed the connection")
            a.append(self.buf[:n])
            left -= n
            since += n
            if since >= PROGRESS_BYTES and left:
                progress()
                since = 0
