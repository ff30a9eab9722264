"""One replica attached to the master (RocketMQ's HAConnection): the handshake, the
stream of CommitLog bytes and meta frames, the push of an append's bytes by the
appending thread, and the replica's acks (on a thread, or on the broker's event loop:
``loopacks.py``). See ``master.py``, whose ``HAService`` owns the connections."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

from ..errors import HAProtocolError, StoreIOError
from ..log.commitlog import SegmentRef
from . import epochs as epoch_history
from .loopacks import LoopAcks
from .tlslink import TLSLink
from .protocol import (CHUNK_BYTES, check_proof, data_frame_head, new_nonce, proof, recv_frame,
                       send_frame, send_frame_from_file, send_now)

if TYPE_CHECKING:
    from .master import HAService

log = logging.getLogger("sparkmq.ha")

HEARTBEAT_INTERVAL_S = 1.0
HANDSHAKE_TIMEOUT_S = 10.0
IDLE_WAIT_S = 0.2


class ReplicaConnection:
    """One attached replica: streams to it, records what it acked."""

    def __init__(self, service: "HAService", sock: socket.socket, addr):
        self.service = service
        self.sock = sock
        self.addr = f"{addr[0]}:{addr[1]}"
        self.broker_id = -1
        self.acked_offset = 0
        self.sent_offset = 0
        self.connected_ms = int(time.time() * 1000)
        self.closed = threading.Event()
        self._fds: dict[str, int] = {}
        # the stream's state, the streaming thread's and ``push``'s under ``_tx``
        self._tx = threading.Lock()
        self._cursor = 0
        self._meta_sent: dict | None = None
        self._meta_version = -1           # the log version ``_meta_sent`` is of (or newer)
        self._started: set[str] = set()
        self._last_send = 0.0
        self._unsent: list = []           # the rest of a frame ``push`` began
        self.pushes = False               # set once streaming: a plain socket, local files
        self._acks: LoopAcks | None = None    # acks read on the broker's loop (loopacks.py)

    # -- lifecycle ---------------------------------------------------------
    def run(self) -> None:
        try:
            if self.service.ssl_context is not None:
                self.sock = TLSLink(self.sock, self.service.ssl_context, server_side=True,
                                    handshake_timeout_s=HANDSHAKE_TIMEOUT_S)
            start = self._handshake()
        except (HAProtocolError, StoreIOError, OSError, ConnectionError, ValueError) as e:
            log.warning("HA: refused replica connection from %s: %s", self.addr, e)
            self.close()
            return
        self.service.attach(self)
        reader = None
        loop = self.service.ack_loop
        if loop is not None and isinstance(self.sock, socket.socket):
            acks = LoopAcks(self, loop)
            self._acks = acks if acks.start() else None
        if self._acks is None:
            reader = threading.Thread(target=self._read_acks, daemon=True,
                                      name=f"sparkmq-ha-ack-{self.broker_id}")
            reader.start()
        self.pushes = isinstance(self.sock, socket.socket) and self.service.store.sfs.is_local
        try:
            self._stream(start)
        except (OSError, ConnectionError, HAProtocolError) as e:
            if not self.closed.is_set():
                log.info("HA: replica %s#%d at %s disconnected: %s",
                         self.service.broker_name, self.broker_id, self.addr, e)
        except Exception:   # a connection thread: one replica's failure must not go unlogged
            log.exception("HA: streaming to replica %s failed", self.addr)
        finally:
            self.close()
            if reader is not None:
                reader.join(5)
            self.service.detach(self)

    def close(self) -> None:
        self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._acks is not None:    # off the loop before the descriptor closes
            self._acks.stop()
        self.sock.close()
        # the streaming thread may drop an fd meanwhile (_drop_fd): each is popped, so
        # exactly one of the two closes it (iterating the dict closed some twice: EBADF)
        while self._fds:
            try:
                _, fd = self._fds.popitem()
            except KeyError:       # the streaming thread took the last one
                break
            os.close(fd)

    # -- handshake ---------------------------------------------------------
    def _handshake(self) -> int:
        svc = self.service
        self.sock.settimeout(HANDSHAKE_TIMEOUT_S)
        nonce = new_nonce()
        send_frame(self.sock, {"type": "challenge", "nonce": nonce,
                               "brokerName": svc.broker_name, "epoch": svc.store.epoch})
        hello, _ = recv_frame(self.sock)
        if hello.get("type") != "hello":
            raise HAProtocolError(f"expected hello, got {hello.get('type')!r}")
        if hello.get("brokerName") != svc.broker_name:
            self._refuse("WRONG_BROKER", f"this is the master of {svc.broker_name!r}, not of "
                         f"{hello.get('brokerName')!r}")
        if not check_proof(svc.secret, "replica", nonce, svc.broker_name, hello.get("proof")):
            self._refuse("AUTH_FAILED", "authentication failed: haSecret does not match")
        bid = hello.get("brokerId")
        offset = hello.get("offset")
        if not isinstance(bid, int) or bid <= 0 or not isinstance(offset, int) or offset < 0:
            self._refuse("BAD_HELLO", "hello needs brokerId > 0 and offset >= 0")
        self.broker_id = bid
        history = svc.history()
        theirs = hello.get("epochs") if isinstance(hello.get("epochs"), list) else []
        try:
            agree = epoch_history.consistent_end(history, theirs, offset)
        except (KeyError, TypeError, ValueError):
            agree = 0
        welcome = {"type": "welcome", "epoch": svc.store.epoch, "epochs": history,
                   "proof": proof(svc.secret, "master", str(hello.get("nonce")),
                                  svc.broker_name),
                   "storeId": svc.store.store_id}
        start = offset
        if agree < offset:
            welcome["truncateTo"] = agree
            start = agree
            log.warning("HA: replica %s#%d has %d bytes past offset %d that this master does "
                        "not have; it must truncate", svc.broker_name, bid, offset - agree, agree)
        end = svc.store.commitlog.written_offset
        if start > end:
            welcome["truncateTo"] = end
            start = end
        first = svc.store.commitlog.min_offset()
        if start < first and start != 0:
            self._refuse("OFFSET_REMOVED", f"replica offset {start} was removed by retention "
                         f"(earliest {first}); start the replica on an empty folder")
        send_frame(self.sock, welcome)
        self.sock.settimeout(None)
        log.info("HA: replica %s#%d attached from %s at offset %d (master at %d)",
                 svc.broker_name, bid, self.addr, start, end)
        self.acked_offset = start
        return start

    def _refuse(self, code: str, message: str):
        try:
            send_frame(self.sock, {"type": "error", "code": code, "message": message})
        except OSError:
            pass
        raise HAProtocolError(message)

    # -- acks ----------------------------------------------------------------
    # Read on the broker's event loop where it has one and the link is a plain socket
    # (loopacks.py: an ack wakes the loop itself), else on a thread of their own.
    def _read_acks(self) -> None:
        try:
            while not self.closed.is_set():
                header, _ = recv_frame(self.sock)
                self.took(header)
        except (OSError, ConnectionError, HAProtocolError):
            pass
        finally:
            self.acks_ended()

    def took(self, header: dict) -> None:
        """A frame from the replica: an ack of more bytes wakes the SYNC_MASTER waits."""
        offset = header.get("offset")
        if header.get("type") == "ack" and isinstance(offset, int) and \
                offset > self.acked_offset:
            self.acked_offset = offset
            self.service.note_acked()

    def acks_ended(self) -> None:
        """No more acks (the link closed or failed): the connection is over."""
        self.closed.set()
        self.service.notify()       # wake the streamer so it sees the close
        self.service.note_acked()   # and SYNC waiters, which stop counting this replica

    # -- streaming -----------------------------------------------------------
    # The streaming thread sends what the replica lacks: catch-up, segment starts, meta
    # and heartbeats. The bytes of an append the replica is caught up to are pushed by
    # the appending thread itself (``push``) when the socket takes them at once, so a
    # SYNC_MASTER send does not wait for this thread to wake. Both write under ``_tx``;
    # the stream state below (cursor, meta sent, segments started, a pushed frame's
    # unsent rest) is theirs under it.
    def _stream(self, cursor: int) -> None:
        svc = self.service
        segs = svc.store.commitlog.segments()
        if cursor == 0 and segs:
            cursor = segs[0].base_offset      # an empty replica starts at the earliest segment
        self._cursor = cursor
        while not self.closed.is_set() and not svc.stopped.is_set():
            seen = svc.generation
            with self._tx:
                ref = _segment_at(svc.store.commitlog.segments(), self._cursor)
                sent = self._send_next(ref)
                if not sent:
                    self._idle(ref)
            if not sent:
                svc.wait_for_bytes(seen, IDLE_WAIT_S)

    def _send_next(self, ref: SegmentRef | None) -> bool:
        """Send the next frame the replica lacks from segment ``ref`` (the one at the
        cursor; under ``_tx``); whether one was sent."""
        if self._unsent:                  # a pushed frame's rest goes first
            for part in self._unsent:
                self.sock.sendall(part)
            self._unsent = []
        if ref is None:
            return False
        store = self.service.store
        sealed = ref.sealed          # read sealed first: its size is then final
        size = ref.size
        self._send_meta()           # topics after the size: they cover those bytes
        pos = self._cursor - ref.base_offset
        if pos == 0 and ref.path not in self._started:
            send_frame(self.sock, {"type": "segment", "path": ref.path,
                                   "baseOffset": ref.base_offset})
            self._started.add(ref.path)
        if pos >= size:
            return False
        n = min(CHUNK_BYTES, size - pos)
        # ``size`` is always at a batch end: a frame reaching it is "whole"
        header = {"type": "data", "path": ref.path, "pos": pos, "offset": self._cursor,
                  "whole": pos + n == size}
        if store.sfs.is_local:
            send_frame_from_file(self.sock, header, self._fd(ref), pos, n)
        else:
            send_frame(self.sock, header, store.sfs.read_range(ref.path, pos, pos + n))
        self._sent(n)
        if sealed and pos + n == size:
            self._drop_fd(ref.path)
        return True

    def _sent(self, n: int) -> None:
        self._cursor += n
        self.sent_offset = self._cursor
        self._last_send = time.monotonic()

    def _send_meta(self) -> None:
        version = self.service.store.state.version   # (read first: at most the meta's)
        meta = self.service.meta()
        if meta is not self._meta_sent and meta != self._meta_sent:
            send_frame(self.sock, {"type": "meta", **meta})
        self._meta_sent, self._meta_version = meta, version

    def _idle(self, ref: SegmentRef | None) -> None:
        """Nothing to send (under ``_tx``): refuse a replica retention overtook, or send
        a heartbeat when the link has been quiet ``HEARTBEAT_INTERVAL_S``."""
        store = self.service.store
        if ref is None and self._cursor < store.commitlog.min_offset():
            first = store.commitlog.min_offset()
            self._refuse("OFFSET_REMOVED", f"offset {self._cursor} was removed by retention "
                         f"while the replica was behind (earliest {first}); start the "
                         "replica on an empty folder")
        if time.monotonic() - self._last_send >= HEARTBEAT_INTERVAL_S:
            self._send_meta()
            send_frame(self.sock, {"type": "heartbeat", "epoch": store.epoch,
                                   "writtenOffset": store.commitlog.written_offset})
            self._last_send = time.monotonic()

    def push(self, ref: SegmentRef, pos: int, data) -> None:
        """Send ``data``, the bytes just appended at ``pos`` of segment ``ref``, from
        the appending thread (``CommitLog.written_hook``, under the append lock), if
        this replica is caught up to them, nothing else is being sent, and the socket
        takes them without waiting (a part it did not take is sent by the streaming
        thread next). Otherwise the streaming thread sends them once woken
        (``caught_up`` is then False)."""
        if not self.pushes or not self._tx.acquire(blocking=False):
            return
        try:
            if self._unsent or self.closed.is_set() or ref.path not in self._started \
                    or ref.base_offset + pos != self._cursor \
                    or self.service.store.state.version != self._meta_version:
                return       # behind, a new segment, or a topic changed: the streamer's
            n = len(data)
            head = data_frame_head(ref.path, pos, self._cursor, True, n)
            left = send_now(self.sock, [head, data])
            if left is None:
                return                   # the socket is full: the streamer waits for it
            self._unsent = [bytes(part) for part in left]
            self._sent(n)
        except OSError:
            return                       # the streamer meets the same error and closes
        finally:
            self._tx.release()

    def caught_up(self, offset: int) -> bool:
        """Whether every byte below ``offset`` was sent (not only begun: a pushed
        frame's rest, ``_unsent``, is the streaming thread's to send)."""
        return self._cursor >= offset and not self._unsent

    def _fd(self, ref: SegmentRef) -> int:
        fd = self._fds.get(ref.path)
        if fd is None:
            path = self.service.store.sfs.local_path(ref.path)
            fd = self._fds[ref.path] = os.open(path, os.O_RDONLY)
        return fd

    def _drop_fd(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def info(self) -> dict:
        end = self.service.store.commitlog.written_offset
        return {"brokerId": self.broker_id, "address": self.addr,
                "ackedOffset": self.acked_offset, "lagBytes": max(0, end - self.acked_offset),
                "connectedMs": self.connected_ms}


def _segment_at(segs: list[SegmentRef], offset: int) -> SegmentRef | None:
    """The segment holding the byte at ``offset``; else the unsealed segment ending
    at it (caught up with the active one); else None (nothing there yet)."""
    for ref in segs:
        if ref.base_offset <= offset < ref.end_offset:
            return ref
    for ref in segs:
        if ref.end_offset == offset and not ref.sealed:
            return ref
    return None
