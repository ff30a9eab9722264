"""Network helpers for tests: every server a test starts binds 127.0.0.1 only."""
from __future__ import annotations

import os
import random
import socket
import threading

_given: set[int] = set()        # every port free_port has returned in this process
_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):    # not Linux: the IANA dynamic range
        return 49152


def free_port() -> int:
    """A TCP port on 127.0.0.1 for a server a test starts: free now, never returned before
    in this process, and below the kernel's ephemeral range.

    A port is chosen some time before its server binds it (a broker's config names three:
    gRPC, Flight, admin). Three things can take it in between, and each has failed a CI run:
    - another pick. The kernel's ``bind(port 0)`` may hand the same port out twice in a
      row once the first socket is closed (three picks for one broker gave its admin
      server a port its gRPC or Flight server held: EADDRINUSE), so a port is returned
      at most once per process;
    - an outgoing connection, which takes its local port from the ephemeral range (a
      replica's HA port, bound only when it is promoted: SPARKMQ_BIND_FAILED). Below
      that range only an explicit bind takes a port, and the explicit binds are these;
    - another pytest-xdist worker's pick (a master's admin port bound first by the other
      worker's gRPC server: the health check read HTTP/2 frames), so each worker picks
      from a slice of the range of its own (``_worker_slice``);
    - a broker's derived Flight port (listenPort + 2, bound before its admin port: a
      broker's admin port picked as its own or another broker's listenPort + 2 failed a
      CI run with EADDRINUSE), so no port two above or below one already returned is.
    """
    low = _ephemeral_low()
    first, end = _worker_slice(max(1024, low - 16384), low)
    end -= 2                    # a derived port stays in this worker's slice
    rng = random.Random()
    with _lock:
        for _ in range(1000):
            port = rng.randrange(first, end)
            if port in _given or port - 2 in _given or port + 2 in _given:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _given.add(port)
            return port
    raise RuntimeError(f"no free port in {first}..{end - 1} that this process has not "
                       "handed out")


def _worker_slice(first: int, end: int) -> tuple[int, int]:
    """The part of ports ``first..end-1`` this pytest-xdist worker picks from (``gwN`` of
    ``PYTEST_XDIST_WORKER_COUNT``; its subprocesses inherit both): the whole range
    without workers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return first, end
    width = (end - first) // count
    at = first + int(worker[2:]) % count * width
    return at, at + width
