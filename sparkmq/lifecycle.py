"""Named background threads with a lifecycle (start, wakeup, stop).

Every package's background work (a store's flush and publish, a broker's
registration, a NameServer's scan, the delay scheduler, the transaction
check-back) is a :class:`ServiceThread`: a daemon thread named
``sparkmq-<name>`` that runs ``run_once`` every ``wait_s()`` seconds (by default
``interval_ms``; a service with timers returns the time to its next one) or at
once after ``wakeup``, until stopped. At most one pass per
``min_pass_interval_ms`` (passes woken close together are one pass). A failing
pass is logged and retried after ``retry_after_failure_s``; ``stop`` joins the
thread (bounded). Thread-safe: ``wakeup`` and ``stop`` may be called from any
thread.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("sparkmq.services")


class ServiceThread:
    """A named daemon thread running ``run_once`` every ``interval_ms`` until stopped."""

    name = "service"
    #: passes are at least this far apart (a wakeup inside it waits for its end)
    min_pass_interval_ms = 0
    #: after a failed pass, wait this long before the next one
    retry_after_failure_s = 0.1

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
        last_pass = 0.0
        while not self._stop.is_set():
            self._wake.wait(self.wait_s())
            rest_s = last_pass + self.min_pass_interval_ms / 1000.0 - time.monotonic()
            if rest_s > 0:
                self._stop.wait(rest_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            last_pass = time.monotonic()
            try:
                self.run_once()
            except Exception:  # a service never dies of one bad pass
                log.exception("%s pass failed; will retry", self.name)
                self._stop.wait(self.retry_after_failure_s)

    def wait_s(self) -> float:
        """Seconds to wait for the next pass (unless woken); called before each wait."""
        return self.interval_ms / 1000.0

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


#: an HTTP connection that sends nothing for this long (a request line, headers or a body
#: cut short: a slow or stuck client) is closed, so it holds no thread for ever
REQUEST_TIMEOUT_S = 30.0


class HttpServerThread:
    """A ``ThreadingHTTPServer`` on ``host:port`` (0: a free port, read ``port`` after
    ``start``) serving ``handler`` on a daemon thread named ``name``; ``stop`` shuts it
    down and closes the socket (idempotent). A connection whose next bytes take longer
    than ``request_timeout_s`` is closed (``REQUEST_TIMEOUT_S``)."""

    def __init__(self, host: str, port: int, handler, name: str, *,
                 request_timeout_s: float = REQUEST_TIMEOUT_S):
        self.host, self.port, self.name = host, port, name
        # (socketserver sets the timeout on each connection's socket; http.server's
        # handle_one_request answers a timed-out read by closing the connection)
        self._handler = type(handler.__name__, (handler,), {"timeout": request_timeout_s})
        self._httpd = None
        self._thread: threading.Thread | None = None

    def start(self) -> "HttpServerThread":
        from http.server import ThreadingHTTPServer
        self._httpd = ThreadingHTTPServer((self.host, self.port), self._handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=self.name,
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


class StopSignals:
    """A daemon's SIGINT/SIGTERM, caught from construction (on the main thread) on:
    :meth:`wait` blocks until one came. The handlers only record the signal: a handler
    that called ``threading.Event.set`` could deadlock, since it runs on the main thread,
    possibly inside that same event's ``wait`` while it holds the event's lock, which is
    not re-entrant (a daemon stopped that way hung). The main thread looks every
    ``poll_s`` too: a signal another thread received does not interrupt its sleep."""

    def __init__(self):
        import signal
        self.received: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _frame: self.received.append(signum))

    def wait(self, poll_s: float = 1.0) -> int:
        """Block until a signal came; its number."""
        while not self.received:
            time.sleep(poll_s)
        return self.received[0]
