"""Network helpers for tests: every server a test starts binds 127.0.0.1 only."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it); a server
    started on it right after will almost always get it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
