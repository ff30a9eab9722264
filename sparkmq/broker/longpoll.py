"""Long polling: receives that found nothing wait here until a message arrives.

``ArrivalNotifier.on_arrival`` is registered with ``Store.add_listener``; it
bumps the topic's arrival counter and wakes every waiter (no sleep loop).
A waiter reads ``version(topic)`` *before* looking for messages and then calls
``wait(topic, seen, timeout_s)``, so an arrival between the look and the wait
is never lost. Every wait is bounded by its timeout; ``close()`` wakes all.

Thread-safety: one condition variable; safe from any thread.
"""
from __future__ import annotations

import threading
import time


class ArrivalNotifier:
    def __init__(self):
        self._cond = threading.Condition()
        self._versions: dict[str, int] = {}
        self._pokes = 0
        self._closed = False
        self.waiting = 0

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store listener: messages of ``topic`` became readable."""
        with self._cond:
            self._versions[topic] = self._versions.get(topic, 0) + 1
            self._cond.notify_all()

    def poke(self) -> None:
        """Wake every waiter (a client went away, a lease expires, shutdown)."""
        with self._cond:
            self._pokes += 1
            self._cond.notify_all()

    def version(self, topic: str) -> tuple[int, int]:
        with self._cond:
            return self._versions.get(topic, 0), self._pokes

    def wait(self, topic: str, seen: tuple[int, int], timeout_s: float) -> bool:
        """Wait until ``topic`` changed since ``seen`` (True) or the timeout (False)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
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

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
