"""A manual clock for tests: what the store, broker services and NameServer take as
``clock_ms`` (a callable returning epoch milliseconds). Time moves only when a test
sets or advances ``now_ms``, so timing-dependent behaviour is tested without sleeping."""
from __future__ import annotations

DEFAULT_START_MS = 1_700_000_000_000


class Clock:
    """``clock()`` returns ``now_ms``; set it (``clock.now_ms = t``) or ``advance(ms)``."""

    def __init__(self, start_ms: int = DEFAULT_START_MS):
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` forward; the new time."""
        self.now_ms += ms
        return self.now_ms
