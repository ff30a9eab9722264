"""Fixtures of the client tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def closing():
    """Register clients to shut down at teardown, before the brokers the test started
    stop (even if the test failed)."""
    items = []
    yield lambda c: items.append(c) or c
    for c in reversed(items):
        try:
            (getattr(c, "shutdown", None) or c.close)()
        except Exception:       # a client of a broker the test killed: nothing to close
            pass
