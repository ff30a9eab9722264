"""Network helpers for tests: every server a test starts binds 127.0.0.1 only."""
from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it); a server
    started on it right after will almost always get it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_late_port() -> int:
    """A TCP port on 127.0.0.1, free now and below the kernel's ephemeral range, for a
    server that binds it long after it is chosen (a replica's HA port, bound when it is
    promoted). Outgoing connections take their local ports from the ephemeral range,
    where ``free_port`` picks too, so one of them can take such a port in the meantime
    and the late bind fails (SPARKMQ_BIND_FAILED, HTTP 400 from /admin/promote: the
    likely cause of one CI failure); below it only a bind can take it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):    # not Linux: the IANA dynamic range
        low = 49152
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(max(1024, low - 10_000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port below {low}")
