"""Named background threads with a lifecycle (start, wakeup, stop).

Every package's background work (a store's flush and publish, a broker's
registration, a NameServer's scan) is a :class:`ServiceThread`: a daemon thread
named ``sparkmq-<name>`` that runs ``run_once`` every ``interval_ms`` until
stopped. A failing pass is logged and retried at the next interval; ``stop``
joins the thread (bounded). Thread-safe: ``wakeup`` and ``stop`` may be called
from any thread.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("sparkmq.services")


class ServiceThread:
    """A named daemon thread running ``run_once`` every ``interval_ms`` until stopped."""

    name = "service"

    def __init__(self, interval_ms: int):
        self.interval_ms = interval_ms
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"sparkmq-{self.name}",
                                        daemon=True)
        self._thread.start()

    def wakeup(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_ms / 1000.0)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.run_once()
            except Exception:  # a service never dies of one bad pass
                log.exception("%s pass failed; will retry", self.name)

    def run_once(self) -> None:
        raise NotImplementedError

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


class CallbackService(ServiceThread):
    def __init__(self, name: str, interval_ms: int, fn: Callable[[], None]):
        super().__init__(interval_ms)
        self.name = name
        self._fn = fn

    def run_once(self) -> None:
        self._fn()
