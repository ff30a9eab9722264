"""TLS on the HA link (``haTlsEnable``): the socket both sides use once it is on.

The master reads a replica's acks on one thread while it streams to the replica on
another. One OpenSSL connection must not be used by two threads at once, so
:class:`TLSLink` runs every TLS call non-blocking under one lock and waits for the
socket (``select``) outside it: the reader never holds the lock while it waits,
and a sender holds it only while OpenSSL copies a record. It offers the part of the
socket API the HA code uses (``sendall``, ``recv_into``, ``settimeout``,
``shutdown``, ``close``, ``fileno``), so the frame functions of ``protocol.py`` work
unchanged; ``sendfile``/``splice`` are not used over it (the bytes must be
encrypted in Python's process).

Certificates: the master serves ``haTlsCertPath``/``haTlsKeyPath``; a replica
checks the master's certificate against ``haTlsCaPath`` (default: the system's
roots) and the host name of ``haMasterAddress``. ``haSecret`` still authenticates
both sides inside the TLS connection.
"""
from __future__ import annotations

import select
import socket
import ssl
import threading
import time


class TLSLink:
    """A TLS connection over ``raw`` that two threads (one reading, one writing) may
    use at once. ``server_side``: the handshake's role."""

    def __init__(self, raw: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                 server_hostname: str | None = None, handshake_timeout_s: float = 10.0):
        raw.setblocking(False)
        self._lock = threading.Lock()
        self._timeout_s: float | None = handshake_timeout_s
        # wrap_socket takes ``raw``'s descriptor over: use ``_tls`` from here on
        self._tls = context.wrap_socket(raw, server_side=server_side,
                                        server_hostname=server_hostname,
                                        do_handshake_on_connect=False)
        self._call(self._tls.do_handshake)

    # -- the socket API the HA code uses -----------------------------------
    def settimeout(self, seconds: float | None) -> None:
        self._timeout_s = seconds

    def fileno(self) -> int:
        return self._tls.fileno()

    def sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = self._call(self._tls.send, view[:1 << 16])
            view = view[n:]

    def recv_into(self, buf, nbytes: int = 0) -> int:
        return self._call(self._tls.recv_into, buf, nbytes or len(buf))

    def shutdown(self, how: int) -> None:
        socket.socket.shutdown(self._tls, how)   # the TCP stream, both threads wake

    def close(self) -> None:
        self._tls.close()

    # -- one TLS call at a time, waiting outside the lock ---------------------
    def _call(self, fn, *args):
        deadline = None if self._timeout_s is None else time.monotonic() + self._timeout_s
        while True:
            with self._lock:
                try:
                    return fn(*args)
                except ssl.SSLWantReadError:
                    want = ([self._tls], [])
                except ssl.SSLWantWriteError:
                    want = ([], [self._tls])
                except ssl.SSLZeroReturnError:
                    return 0               # the peer closed the TLS session: EOF
            wait = 1.0 if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                raise socket.timeout("HA link: no progress before the timeout")
            select.select(want[0], want[1], [], min(wait, 1.0))


def server_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    from ..tls import server_ssl_context
    return server_ssl_context(cert_path, key_path, "haTlsCertPath/haTlsKeyPath")


def client_context(ca_path: str | None) -> ssl.SSLContext:
    """Verifies the master's certificate against ``ca_path`` (None: system roots)."""
    from ..errors import InvalidConfigError
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_path:
        try:
            ctx.load_verify_locations(cafile=ca_path)
        except (OSError, ssl.SSLError) as e:
            raise InvalidConfigError(f"haTlsCaPath {ca_path} cannot be loaded: {e}") from None
    return ctx
