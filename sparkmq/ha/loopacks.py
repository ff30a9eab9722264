"""A replica's acks read on an event loop (the broker's gRPC loop) instead of a thread.

A SYNC_MASTER send made on the gRPC loop awaits its replica's ack as a future
(``HAService.replicated_async``). With an ack thread, each ack woke that thread, which
then woke the loop through its self-pipe: two wake-ups and a hand-over of the GIL per
send. Here the loop watches the replica's socket itself (``add_reader``): an ack that
arrives wakes the loop's own ``epoll``, is read without waiting, and settles the
awaiting sends in place (``settle_soon`` on their own loop).

Only for a plain socket (a TLS link keeps its thread: OpenSSL may hold bytes the socket
no longer shows). The reader must be off the loop before the socket's descriptor is
closed (the number could be reused by another socket the loop then confuses with it):
``ReplicaConnection.close`` calls :meth:`LoopAcks.stop`, which removes it on the loop
and waits for that (at once where the loop no longer runs).
"""
from __future__ import annotations

import asyncio
import socket
import threading

from ..errors import HAProtocolError
from .protocol import take_frames

READ_BYTES = 64 << 10
STOP_WAIT_S = 5.0


class LoopAcks:
    """Reads ``conn``'s acks on ``loop``: ``conn.took(header)`` per frame, then
    ``conn.acks_ended()`` once (end of stream, an error, or ``stop``)."""

    def __init__(self, conn, loop):
        self.conn = conn
        self.loop = loop
        self._fd = conn.sock.fileno()
        self._buf = bytearray()
        self._watching = False
        self._ended = threading.Event()

    def start(self) -> bool:
        """Watch from the loop's next turn; False if the loop is gone (read on a thread)."""
        try:
            self.loop.call_soon_threadsafe(self._watch)
        except RuntimeError:        # the loop is closed
            return False
        return True

    def stop(self) -> None:
        """Stop reading (any thread); returns once the loop no longer watches the socket,
        so its descriptor may be closed."""
        if self._ended.is_set():
            return
        if self.loop.is_closed() or not self.loop.is_running() or _running_loop() is self.loop:
            self._end()             # on the loop, or nothing runs it: its selector is ours
            return
        try:
            self.loop.call_soon_threadsafe(self._end)
        except RuntimeError:        # closed meanwhile
            self._end()
            return
        if not self._ended.wait(STOP_WAIT_S):
            self._watching = False  # a stuck loop: leave it its stale entry
            self._ended.set()

    def _watch(self) -> None:
        if self._ended.is_set():
            return
        if self.conn.closed.is_set():
            self._end()
            return
        self.loop.add_reader(self._fd, self._readable)
        self._watching = True

    def _readable(self) -> None:
        try:
            data = self.conn.sock.recv(READ_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._end()
            return
        if not data:                # the replica closed its side
            self._end()
            return
        self._buf += data
        try:
            headers = take_frames(self._buf)
        except HAProtocolError:
            self._end()
            return
        for header in headers:
            self.conn.took(header)

    def _end(self) -> None:
        if self._watching:
            self._watching = False
            if not self.loop.is_closed():
                self.loop.remove_reader(self._fd)
        if not self._ended.is_set():
            self._ended.set()
            self.conn.acks_ended()


def _running_loop():
    """This thread's running event loop, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
