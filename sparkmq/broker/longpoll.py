"""Long polling: receives that found nothing wait here until a message arrives.

``ArrivalNotifier.on_arrival`` is registered with ``Store.add_listener``; it
bumps the arrival counters of the topic and of the queue and wakes their waiters
(no sleep loop). A waiter reads ``version(topic)`` (a receive: any queue of the
topic) or ``version(topic, queue)`` (a pull of one queue) *before* looking for
messages and then calls ``wait(topic, seen, timeout_s[, queue])``, so an arrival
between the look and the wait is never lost. A pull waiter is woken only by its own
queue (16 pulls of a 16-queue topic are not all woken by each send). Every wait is
bounded by its timeout; ``close()`` and ``poke()`` wake all.

A SendMessage appends inside ``deferred()`` and hands the topics to
``wake_after_reply``: the messages are readable at once (a poll that looks finds them),
only sleeping waiters are woken later. On grpc.aio's loop, where SendMessage runs, the
context has no callback for that: the wake is made as the handler ends, and the
coroutines it wakes run at the loop's next turn, once the reply's batch was started
(grpc's ``_finish_handler_with_unary_response`` starts it before it yields).

Two kinds of waiter share the counters: a thread blocked in :meth:`wait` (the Arrow
Flight consume path, whose server is threaded) and a coroutine suspended in
:meth:`wait_async` (the gRPC ReceiveMessage/PullMessage long polls on the broker's
asyncio server, grpc_server.py): a suspended poll holds a future, not a thread, so
thousands of them cost memory only. Wake-ups reach a coroutine through its loop's
``call_soon_threadsafe``.

Thread-safety: one lock, one condition variable per waited-on key sharing it; safe
from any thread.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class _Held(threading.local):
    """Per thread: the arrivals a ``deferred`` block holds (None outside one; a class
    default, so reading it never raises and formats an AttributeError)."""
    held: set | None = None


class _Deferred:
    """``ArrivalNotifier.deferred``'s block: from entry to exit, this thread's arrivals go
    to ``held``. (A class, not ``contextlib.contextmanager``: 1.2 against 2.3 us a block.)"""
    __slots__ = ("_local", "held")

    def __init__(self, local: _Held):
        self._local, self.held = local, set()

    def __enter__(self) -> set:
        self._local.held = self.held
        return self.held

    def __exit__(self, *exc) -> None:
        self._local.held = None


class ArrivalNotifier:
    """``capacity``: waits held at once (``maxLongPollingRequests``); one more raises
    ``TooManyRequestsError`` at once (the proxy's TOO_MANY_REQUESTS).

    Keys: a topic (``str``) for receives, ``(topic, queue)`` for pulls. An arrival in
    a queue moves both; a wake naming only a topic (the queue unknown) moves the
    topic's and, through its ``blind`` counter, every queue key of that topic."""

    def __init__(self, capacity: int = 1 << 30):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._conds: dict = {}             # key -> [Condition on _lock, threads waiting]
        self._local = _Held()
        self._versions: dict = {}          # key -> arrivals
        self._blind: dict[str, int] = {}   # topic -> wakes that named no queue
        self._pokes = 0
        self._closed = False
        self.waiting = 0
        #: suspended coroutines: key -> {future: its loop}
        self._futures: dict = {}

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store listener: messages of ``topic``'s queue became readable. On a thread
        inside :meth:`deferred` the wake-up waits until that block hands it over."""
        held = self._local.held
        if held is not None:
            held.add((topic, queue_id))
            return
        self.wake(((topic, queue_id),))

    def wake_after_reply(self, keys, context) -> None:
        """Wake ``keys`` (what ``deferred`` held) once: through ``context.add_callback``
        where the gRPC context has one (grpc's threaded server: once the reply is sent;
        it returns False for an RPC already over, then now; grpc.aio's context of a
        handler run on its workers: as the handler returns, and it returns None), else
        now (grpc.aio's loop: see the module docstring)."""
        if not keys:
            return
        add_callback = getattr(context, "add_callback", None)
        if add_callback is None or add_callback(lambda: self.wake(keys)) is False:
            self.wake(keys)

    def wake(self, keys) -> None:
        """Wake the waiters of ``keys``: topics, or (topic, queue) pairs."""
        versions, conds, futures = self._versions, self._conds, self._futures
        with self._lock:
            for key in keys:
                queued = type(key) is tuple
                # the topic's key, then the queue's (a send wakes both: each bumped and
                # signalled here, not by a call per key, the usual send's one wake-up)
                for k in (key[0], key) if queued else (key,):
                    versions[k] = versions.get(k, 0) + 1
                    if k in conds or futures.get(k):
                        self._signal(k)
                if not queued:             # queue unknown: every queue key of the topic
                    self._blind[key] = self._blind.get(key, 0) + 1
                    for k in [k for k in (*conds, *futures)
                              if type(k) is tuple and k[0] == key]:
                        self._signal(k)

    def _signal(self, key) -> None:
        """Wake the threads and coroutines waiting on ``key`` (under the lock)."""
        c = self._conds.get(key)
        if c is not None:
            c[0].notify_all()
        waiters = self._futures.get(key)
        if waiters:
            self._resolve(waiters)

    def deferred(self) -> "_Deferred":
        """Hold this thread's arrival wake-ups: a context manager giving the set of
        (topic, queue) held, which the caller must pass to :meth:`wake` (e.g. once its
        own reply is on its way, so the woken long polls do not compete with it for the
        GIL). Nesting is not supported."""
        return _Deferred(self._local)

    def poke(self) -> None:
        """Wake every waiter (a client went away, a lease expires, shutdown)."""
        with self._lock:
            self._pokes += 1
            self._signal_all()

    def _signal_all(self) -> None:
        for c in self._conds.values():
            c[0].notify_all()
        for waiters in self._futures.values():
            self._resolve(waiters)

    @staticmethod
    def _resolve(waiters) -> None:
        """Wake suspended coroutines (under the lock; each on its own loop)."""
        if not waiters:
            return
        for fut, loop in waiters.items():
            try:
                loop.call_soon_threadsafe(_settle, fut)
            except RuntimeError:          # its loop is closed: the server has stopped
                pass

    def _version(self, key) -> tuple:
        if type(key) is tuple:
            return self._versions.get(key, 0), self._blind.get(key[0], 0), self._pokes
        return self._versions.get(key, 0), self._pokes

    @staticmethod
    def _key(topic: str, queue_id: int | None):
        return topic if queue_id is None else (topic, queue_id)

    def version(self, topic: str, queue_id: int | None = None) -> tuple:
        """What a waiter passes to :meth:`wait` as ``seen``: the arrival counters of
        ``topic`` (any queue), or of its queue ``queue_id``."""
        with self._lock:
            return self._version(self._key(topic, queue_id))

    @contextlib.contextmanager
    def holding(self):
        """Count a reader that holds a thread for its whole life (a followed Flight
        read) against the capacity while it lasts; past it, TooManyRequestsError at
        once. Its waits then pass ``held=True`` (counted once)."""
        with self._lock:
            self._admit()
            self.waiting += 1
        try:
            yield
        finally:
            with self._lock:
                self.waiting -= 1

    def admissible(self) -> None:
        """TooManyRequestsError now if one more waiter would be refused."""
        with self._lock:
            self._admit()

    def wait(self, topic: str, seen: tuple, timeout_s: float,
             queue_id: int | None = None, held: bool = False) -> bool:
        """Wait until ``topic`` (or its queue ``queue_id``) changed since ``seen``
        (True) or the timeout (False); ``held``: by a reader inside :meth:`holding`."""
        key = self._key(topic, queue_id)
        deadline = time.monotonic() + max(0.0, timeout_s)
        counted = 0 if held else 1
        with self._lock:
            if counted:
                self._admit()
            c = self._conds.get(key)
            if c is None:
                c = self._conds[key] = [threading.Condition(self._lock), 0]
            c[1] += 1
            self.waiting += counted
            try:
                while not self._closed:
                    if self._version(key) != seen:
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    c[0].wait(left)
                return True
            finally:
                self.waiting -= counted
                c[1] -= 1
                if c[1] == 0:
                    del self._conds[key]

    async def wait_async(self, topic: str, seen: tuple, timeout_s: float,
                         queue_id: int | None = None) -> bool:
        """:meth:`wait` for a coroutine: suspended (no thread held) until the key
        changed since ``seen`` (True) or the timeout (False). Cancelling the calling
        task (the client went away) removes the waiter."""
        key = self._key(topic, queue_id)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            if self._closed or self._version(key) != seen:
                return True
            self._admit()
            self.waiting += 1
            self._futures.setdefault(key, {})[fut] = loop
        try:
            done, _ = await asyncio.wait((fut,), timeout=max(0.0, timeout_s))
            return bool(done)
        finally:
            with self._lock:
                self.waiting -= 1
                waiters = self._futures.get(key)
                if waiters is not None:
                    waiters.pop(fut, None)
                    if not waiters:
                        del self._futures[key]

    def _admit(self) -> None:
        """Refuse one more waiter past the capacity (under the lock)."""
        if self.waiting >= self.capacity:
            from ..errors import TooManyRequestsError
            raise TooManyRequestsError(
                f"the broker holds {self.waiting} long polls, its capacity "
                "(maxLongPollingRequests); retry after a pause")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._signal_all()


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(True)
