"""Bounded polling for tests: wait for a condition another thread or process makes
true, fail naming it if it never does (no test sleeps a fixed time instead)."""
from __future__ import annotations

import time
from typing import Callable

DEFAULT_TIMEOUT_S = 60.0


def wait_until(pred: Callable[[], object], what: str = "the condition",
               timeout_s: float = DEFAULT_TIMEOUT_S, interval_s: float = 0.01) -> bool:
    """Poll ``pred`` until it is true (returns True) or ``timeout_s`` passes
    (AssertionError naming ``what``)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval_s)
    return True
