"""Signed NameServer writes: the cluster secret and the HMAC over each request.

Registrations, unregistrations (and with them the master epochs a registration
carries, which fence old masters) change what every client is routed to, so a
NameServer serves them only to a caller that proves it knows the **cluster secret**
shared by the NameServers and brokers of one cluster. Route queries stay open
(the official clients query routes unauthenticated).

A signed request carries three headers::

    X-Sparkmq-Timestamp: <ms since the epoch>
    X-Sparkmq-Nonce:     <32 hex, random per request>
    X-Sparkmq-Signature: hex HMAC-SHA256(secret, METHOD \\n PATH \\n TIMESTAMP \\n NONCE \\n
                                         hex SHA-256(body))

The NameServer refuses (401) a missing or wrong signature, a timestamp more than
``window_ms`` (300 s) from its clock, a nonce already seen within the window (a
replay), and a timestamp from before the verifier started: the nonces are remembered
in memory only, so a request captured before a restart would otherwise be taken again
for up to a window after it (its sender signs again on its next try; a sender whose
clock is behind is refused until its clock passes the restart). The remembered nonces
are bounded (``max_nonces``; when full, new requests are refused until old nonces age
out rather than forgetting them).

The secret (:func:`resolve_secret`): ``clusterSecret`` (config), else the file
``clusterSecretFile``, else ``SPARKMQ_CLUSTER_SECRET``, else the file
``~/.sparkmq/cluster.secret``, made (0600) by whichever process of the user starts
first: a NameServer and brokers started by one user on one machine share it
without set-up; on several machines copy that file or set ``clusterSecret``.
Secrets shorter than 16 bytes are refused.

Thread-safe: the verifier's nonce memory is locked.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from typing import Callable, Mapping

from ..errors import InvalidConfigError
from ..secretfile import load_or_create

SECRET_ENV = "SPARKMQ_CLUSTER_SECRET"
MIN_SECRET_BYTES = 16
WINDOW_MS = 300_000
MAX_NONCES = 100_000
TS_HEADER, NONCE_HEADER, SIG_HEADER = ("X-Sparkmq-Timestamp", "X-Sparkmq-Nonce",
                                       "X-Sparkmq-Signature")


def default_secret_file() -> str:
    return os.path.join(os.path.expanduser("~"), ".sparkmq", "cluster.secret")


def check_secret(secret: str, name: str = "clusterSecret") -> str:
    """``secret`` if it is long enough, else InvalidConfigError saying what to do."""
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise InvalidConfigError(
            f"{name} is {len(secret.encode())} bytes; it must be at least {MIN_SECRET_BYTES} "
            "random bytes: make one with `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`")
    return secret


def resolve_secret(secret: str | None = None, secret_file: str | None = None) -> str:
    """The cluster secret by the precedence of the module docstring."""
    if secret:
        return check_secret(secret)
    if secret_file:
        from ..secretfile import read_secret
        try:
            return check_secret(read_secret(secret_file), f"clusterSecretFile {secret_file}")
        except FileNotFoundError:
            raise InvalidConfigError(f"clusterSecretFile {secret_file} does not exist; copy "
                                     "the cluster's secret file there") from None
    env = os.environ.get(SECRET_ENV, "").strip()
    if env:
        return check_secret(env, SECRET_ENV)
    made, _ = load_or_create(default_secret_file())
    return check_secret(made, default_secret_file())


def _string_to_sign(method: str, path: str, body: bytes, timestamp_ms: int, nonce: str) -> bytes:
    return "\n".join((method.upper(), path, str(timestamp_ms), nonce,
                      hashlib.sha256(body).hexdigest())).encode()


def sign(secret: str, method: str, path: str, body: bytes, *,
         timestamp_ms: int | None = None, nonce: str | None = None) -> dict[str, str]:
    """The headers that sign one request."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    nonce = nonce or secrets.token_hex(16)
    mac = hmac.new(secret.encode(), _string_to_sign(method, path, body, ts, nonce),
                   hashlib.sha256).hexdigest()
    return {TS_HEADER: str(ts), NONCE_HEADER: nonce, SIG_HEADER: mac}


class RequestVerifier:
    """Checks signed requests for one NameServer (see the module docstring)."""

    def __init__(self, secret: str, *, window_ms: int = WINDOW_MS, max_nonces: int = MAX_NONCES,
                 clock_ms: Callable[[], int] | None = None):
        self._secret = check_secret(secret).encode()
        self.window_ms = window_ms
        self.max_nonces = max_nonces
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._nonces: dict[str, int] = {}      # nonce -> the time it may be forgotten
        self._lock = threading.Lock()
        self.started_ms = self.clock_ms()    # nonces seen before it are not known here

    def refusal(self, method: str, path: str, body: bytes,
                headers: Mapping[str, str]) -> str | None:
        """None if the request is signed with the cluster secret, fresh and not a
        replay (its nonce is then remembered); else why it is refused."""
        ts_raw, nonce, mac = (headers.get(h) for h in (TS_HEADER, NONCE_HEADER, SIG_HEADER))
        if not (ts_raw and nonce and mac):
            return ("unsigned request: brokers sign registrations with the cluster secret "
                    "(clusterSecret / clusterSecretFile / SPARKMQ_CLUSTER_SECRET)")
        try:
            ts = int(ts_raw)
        except ValueError:
            return f"malformed {TS_HEADER}"
        now = self.clock_ms()
        if abs(now - ts) > self.window_ms:
            return (f"stale request: {TS_HEADER} is {abs(now - ts)} ms from this NameServer's "
                    f"clock (limit {self.window_ms} ms); check the clocks")
        want = hmac.new(self._secret, _string_to_sign(method, path, body, ts, nonce),
                        hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want.encode(), mac.encode()):
            return "bad signature: this NameServer's cluster secret differs from the broker's"
        if ts < self.started_ms:
            return (f"request signed {self.started_ms - ts} ms before this server started: "
                    "refused as a possible replay (its nonces of before are not known); "
                    "sign it again now (if this repeats, the sender's clock is behind)")
        return self._remember(nonce, now)

    def _remember(self, nonce: str, now_ms: int) -> str | None:
        with self._lock:
            if len(self._nonces) >= self.max_nonces:
                self._nonces = {n: t for n, t in self._nonces.items() if t > now_ms}
            if nonce in self._nonces:
                return "replayed request (nonce already seen)"
            if len(self._nonces) >= self.max_nonces:
                return "too many signed requests in the window; retry later"
            self._nonces[nonce] = now_ms + 2 * self.window_ms
            return None
