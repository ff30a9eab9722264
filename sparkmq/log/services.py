"""Background services of a store: named threads with start and stop.

:class:`StoreServices` runs the ones a writable store needs, each a
:class:`~sparkmq.lifecycle.CallbackService` thread named ``sparkmq-<name>``:

* ``flush`` (ASYNC_FLUSH) fsyncs the active segment every ``flush_interval_ms``;
  under SYNC_FLUSH a :class:`GroupCommitService` (``sparkmq-group-commit``) fsyncs
  on demand instead: appenders call ``wait_for(offset)`` (a coroutine awaits
  ``flushed_async``), and one fsync covers every append written before it
  (RocketMQ's GroupCommitService);
* ``publish`` (:class:`PublishService`) commits the store's progress to the
  transaction log every ``publish_interval_ms`` (and at once after a segment roll:
  ``wake_publisher``); while a stream reader is live (the publish pass finds its
  ``_readers/`` marker, :mod:`.publish`) also as messages arrive, passes at least
  ``publish_min_gap_ms`` apart (``set_publish_gap``, ``on_arrival``);
* ``retention`` runs a retention pass every ``retention_check_interval_ms``.

Every wait is bounded; ``stop`` joins the thread.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable

from ..lifecycle import CallbackService, ServiceThread  # noqa: F401  (re-exported)

log = logging.getLogger("sparkmq.services")


def settle_soon(loop, fut, answer) -> None:
    """Give ``fut`` its ``answer`` on its own ``loop``, from any thread (a closed loop:
    its server has stopped, nobody awaits it); at once when called on that loop."""
    if asyncio._get_running_loop() is loop:
        _settle(fut, answer)
        return
    try:
        loop.call_soon_threadsafe(_settle, fut, answer)
    except RuntimeError:
        pass


def _settle(fut, answer) -> None:
    """``fut`` answered ``answer`` unless it has its answer (or was cancelled)."""
    if not fut.done():
        fut.set_result(answer)


class AwaitedOffsets:
    """Coroutines awaiting an answer about an offset (fsynced, acked; or a key naming
    one: the owner's ``answer`` reads it), each on its own loop, answered from another
    thread. Its owner holds its own lock around ``add`` and ``settle``; ``wait`` takes
    that lock to forget a waiter that gave up."""

    def __init__(self):
        self._waiting: list[tuple] = []      # (offset, future, its loop)

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, offset: int) -> tuple:
        """A waiter for ``offset`` on the running loop (under the owner's lock)."""
        loop = asyncio.get_running_loop()
        waiter = (offset, loop.create_future(), loop)
        self._waiting.append(waiter)
        return waiter

    async def wait(self, waiter: tuple, lock, timeout_s: float, timed_out):
        """``waiter``'s answer, or ``timed_out`` after ``timeout_s``. (The timeout
        settles the same future: ``asyncio.wait_for`` would wrap it in a second one and
        take two more turns of the loop per answer.)"""
        _, fut, loop = waiter
        timer = loop.call_later(timeout_s, _settle, fut, timed_out)
        try:
            return await fut
        finally:
            timer.cancel()
            with lock:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)

    def settle(self, answer: Callable[[int], object]) -> None:
        """Answer each waiter whose ``answer(offset)`` is not None (under the owner's
        lock); the others keep waiting."""
        waiting = []
        for w in self._waiting:
            a = answer(w[0])
            if a is None:
                waiting.append(w)
            else:
                settle_soon(w[2], w[1], a)
        self._waiting = waiting


class GroupCommitService:
    """SYNC_FLUSH: fsync on request; one fsync serves all waiting appenders."""

    name = "group-commit"

    def __init__(self, flush: Callable[[], int]):
        self._flush = flush                 # fsyncs all written bytes, returns flushed offset
        self._cond = threading.Condition()
        self._requested = 0
        self._flushed = 0
        self._stopping = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._awaited = AwaitedOffsets()     # flushed_async's waiters

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sparkmq-group-commit",
                                        daemon=True)
        self._thread.start()

    def wait_for(self, offset: int, timeout_ms: int) -> bool:
        """Block until bytes below ``offset`` are fsynced; False on timeout."""
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._cond:
            if offset > self._requested:
                self._requested = offset
                self._cond.notify_all()
            while self._flushed < offset and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._flushed >= offset

    async def flushed_async(self, offset: int, timeout_ms: int) -> bool:
        """``wait_for`` for a coroutine, with the same answers: the fsync thread settles
        a future on the caller's loop, so no thread waits for the disk."""
        with self._cond:
            if self._flushed >= offset or self._stopping:
                return self._flushed >= offset
            if offset > self._requested:
                self._requested = offset
                self._cond.notify_all()
            waiter = self._awaited.add(offset)
        return await self._awaited.wait(waiter, self._cond, timeout_ms / 1000.0, False)

    def _settle(self) -> None:
        """Answer the awaited waits that have their answer (under ``_cond``)."""
        if self._awaited:
            self._awaited.settle(lambda offset: self._flushed >= offset
                                 if self._flushed >= offset or self._stopping else None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._requested <= self._flushed and not self._stopping:
                    self._cond.wait(1.0)
                if self._stopping:
                    return
            try:
                flushed = self._flush()
            except Exception:   # the flush daemon must survive a failed fsync and try again
                log.exception("fsync failed; appenders waiting will time out")
                time.sleep(0.05)
                continue
            with self._cond:
                self._flushed = max(self._flushed, flushed)
                self._cond.notify_all()
                self._settle()

    def note_flushed(self, offset: int) -> None:
        with self._cond:
            self._flushed = max(self._flushed, offset)
            self._cond.notify_all()
            self._settle()

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            self._settle()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


class PublishService(ServiceThread):
    """The ``publish`` thread: one pass every ``interval_ms``; while fast publishing
    is on (``set_gap``), also a pass soon after messages arrive (``on_arrival``
    wakes it), passes at least ``gap_ms`` apart. A pass with nothing new commits
    nothing, so the fast cadence costs commits only when there is data: at most
    one per ``gap_ms``. Thread-safe: ``set_gap``, ``on_arrival`` and ``wakeup`` may
    be called from any thread."""

    name = "publish"

    def __init__(self, interval_ms: int, fn: Callable[[], object]):
        super().__init__(interval_ms)
        self._fn = fn
        self.gap_ms: int | None = None     # None: the interval cadence only

    def set_gap(self, gap_ms: int | None) -> None:
        """Publish at arrivals, ``gap_ms`` apart (None: every ``interval_ms`` only)."""
        self.gap_ms = gap_ms
        self.min_pass_interval_ms = gap_ms or 0

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """A store arrival listener: messages became readable in this process."""
        if self.gap_ms is not None:
            self.wakeup()

    def run_once(self) -> None:
        self._fn()


class StoreServices:
    """The background services of one writable store: ``flush`` (ASYNC_FLUSH) or
    ``group-commit`` (SYNC_FLUSH), ``publish`` and ``retention``, each a named
    thread. ``start`` and ``stop`` are called by the store's open and close (one
    thread); ``wake_publisher`` and ``group_commit`` may be used from any thread."""

    def __init__(self):
        #: monotonic time (s) of the publish pass's last look at ``_readers/`` (publish.py)
        self.readers_checked_s: float | None = None
        #: whether ``on_arrival`` is one of the store's arrival listeners (publish.py)
        self.arrival_listener_added = False
        self.group_commit: GroupCommitService | None = None
        self._publisher: PublishService | None = None
        self._threads: list[ServiceThread] = []

    def start(self, *, sync_flush: bool, flush: Callable[[], int], flush_interval_ms: int,
              publish: Callable[[], object], publish_interval_ms: int,
              retention: Callable[[], object], retention_interval_ms: int) -> None:
        if sync_flush:
            self.group_commit = GroupCommitService(flush)
            self.group_commit.start()
        else:
            self._threads.append(CallbackService("flush", flush_interval_ms, flush))
        self._publisher = PublishService(publish_interval_ms, publish)
        self._threads.append(self._publisher)
        self._threads.append(CallbackService("retention", retention_interval_ms, retention))
        for t in self._threads:
            t.start()

    def wake_publisher(self) -> None:
        """Publish now (a segment rolled), not only on the interval."""
        if self._publisher is not None:
            self._publisher.wakeup()

    def set_publish_gap(self, gap_ms: int | None) -> None:
        """Fast publishing, at arrivals ``gap_ms`` apart (a stream reader is live), or
        None: back to ``publish_interval_ms``. A no-op when the services are not
        running."""
        if self._publisher is not None:
            self._publisher.set_gap(gap_ms)

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """The store's arrival listener (``Store.add_listener``, publish.py adds it)."""
        publisher = self._publisher
        if publisher is not None:
            publisher.on_arrival(topic, queue_id, max_offset)

    @property
    def publish_gap_ms(self) -> int | None:
        """The fast cadence in force, or None (interval cadence, or not running)."""
        return self._publisher.gap_ms if self._publisher is not None else None

    def stop(self) -> None:
        for t in self._threads:
            t.stop()
        self._threads.clear()
        self._publisher = None
        if self.group_commit is not None:
            self.group_commit.stop()
            self.group_commit = None
