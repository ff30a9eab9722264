"""Long polling: receives that found nothing wait here until a message arrives.

``ArrivalNotifier.on_arrival`` is registered with ``Store.add_listener``; it
bumps the topic's arrival counter and wakes every waiter (no sleep loop).
A waiter reads ``version(topic)`` *before* looking for messages and then calls
``wait(topic, seen, timeout_s)``, so an arrival between the look and the wait
is never lost. Every wait is bounded by its timeout; ``close()`` wakes all.

A SendMessage appends inside ``deferred()`` and hands the topics to ``wake`` once
its reply is sent (gRPC ``add_callback``): the messages are readable at once (a
poll that looks finds them), only sleeping waiters are woken a reply later.

Two kinds of waiter share the counters: a thread blocked in :meth:`wait` (the Arrow
Flight consume path, whose server is threaded) and a coroutine suspended in
:meth:`wait_async` (the gRPC ReceiveMessage/PullMessage long polls on the broker's
asyncio server, grpc_server.py): a suspended poll holds a future, not a thread, so
thousands of them cost memory only. Wake-ups reach a coroutine through its loop's
``call_soon_threadsafe``.

Thread-safety: one condition variable; safe from any thread.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class ArrivalNotifier:
    """``capacity``: waits held at once (``maxLongPollingRequests``); one more raises
    ``TooManyRequestsError`` at once (the proxy's TOO_MANY_REQUESTS)."""

    def __init__(self, capacity: int = 1 << 30):
        self.capacity = capacity
        self._cond = threading.Condition()
        self._local = threading.local()
        self._versions: dict[str, int] = {}
        self._pokes = 0
        self._closed = False
        self.waiting = 0
        #: suspended coroutines: topic -> {future: its loop}
        self._futures: dict[str, dict[asyncio.Future, asyncio.AbstractEventLoop]] = {}

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store listener: messages of ``topic`` became readable. On a thread inside
        :meth:`deferred` the wake-up waits until that block hands it over."""
        held = getattr(self._local, "held", None)
        if held is not None:
            held.add(topic)
            return
        self.wake((topic,))

    def wake(self, topics) -> None:
        """Wake the waiters of ``topics`` (their arrival counters move on)."""
        with self._cond:
            for topic in topics:
                self._versions[topic] = self._versions.get(topic, 0) + 1
                self._resolve(self._futures.get(topic))
            self._cond.notify_all()

    @contextlib.contextmanager
    def deferred(self):
        """Hold this thread's arrival wake-ups; yields the set of topics held, which the
        caller must pass to :meth:`wake` (e.g. once its own reply is on its way, so the
        woken long polls do not compete with it for the GIL). Nesting is not supported."""
        held: set[str] = set()
        self._local.held = held
        try:
            yield held
        finally:
            self._local.held = None

    def poke(self) -> None:
        """Wake every waiter (a client went away, a lease expires, shutdown)."""
        with self._cond:
            self._pokes += 1
            for waiters in self._futures.values():
                self._resolve(waiters)
            self._cond.notify_all()

    @staticmethod
    def _resolve(waiters) -> None:
        """Wake suspended coroutines (under the lock; each on its own loop)."""
        for fut, loop in (waiters or {}).items():
            try:
                loop.call_soon_threadsafe(_settle, fut)
            except RuntimeError:          # its loop is closed: the server has stopped
                pass

    def version(self, topic: str) -> tuple[int, int]:
        with self._cond:
            return self._versions.get(topic, 0), self._pokes

    def wait(self, topic: str, seen: tuple[int, int], timeout_s: float) -> bool:
        """Wait until ``topic`` changed since ``seen`` (True) or the timeout (False)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            self._admit()
            self.waiting += 1
            try:
                while not self._closed:
                    if (self._versions.get(topic, 0), self._pokes) != seen:
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self.waiting -= 1

    async def wait_async(self, topic: str, seen: tuple[int, int], timeout_s: float) -> bool:
        """:meth:`wait` for a coroutine: suspended (no thread held) until ``topic``
        changed since ``seen`` (True) or the timeout (False). Cancelling the calling task
        (the client went away) removes the waiter."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._cond:
            if self._closed or (self._versions.get(topic, 0), self._pokes) != seen:
                return True
            self._admit()
            self.waiting += 1
            self._futures.setdefault(topic, {})[fut] = loop
        try:
            done, _ = await asyncio.wait((fut,), timeout=max(0.0, timeout_s))
            return bool(done)
        finally:
            with self._cond:
                self.waiting -= 1
                waiters = self._futures.get(topic)
                if waiters is not None:
                    waiters.pop(fut, None)
                    if not waiters:
                        del self._futures[topic]

    def _admit(self) -> None:
        """Refuse one more waiter past the capacity (under the lock)."""
        if self.waiting >= self.capacity:
            from ..errors import TooManyRequestsError
            raise TooManyRequestsError(
                f"the broker holds {self.waiting} long polls, its capacity "
                "(maxLongPollingRequests); retry after a pause")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for waiters in self._futures.values():
                self._resolve(waiters)
            self._cond.notify_all()


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(True)
