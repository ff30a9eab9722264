"""Who may call the broker's admin endpoint: the checks every request passes first.

In order (the first that fails answers):

1. **Cross-origin** -> 403. A browser marks a request a web page makes with ``Origin``
   (and ``Sec-Fetch-Site``). A present ``Origin`` that is not the admin endpoint's own
   (``scheme://host:port`` for the listen address, plus ``localhost``/``127.0.0.1``/
   ``[::1]`` when it listens on loopback) is refused, as is ``Sec-Fetch-Site: cross-site``.
   Tools (curl, urllib, Prometheus) send neither header.
2. **Credential** -> 401 with ``WWW-Authenticate: Bearer``. Every route but ``/health``
   (liveness) and ``/metrics`` (Prometheus scrapes without credentials by default; with
   ``adminMetricsAuthEnable=true`` it needs the token too) needs
   ``Authorization: Bearer <admin token>`` (``sparkmq.admin_auth``) or, with
   ``authenticationEnabled``, the RocketMQ 5 signature of an ACL super user
   (``authorization: MQv2-HMAC-SHA1 ...`` + ``x-mq-date-time`` within 15 minutes).
3. **Body type** -> 415. A POST must say ``Content-Type: application/json`` (a browser
   cannot send that cross-origin without a CORS preflight, which this endpoint never
   grants).

The web console (``/console...``, ``sparkmq.console``) is served to browsers, so its
requests differ in three ways: its session cookie (``console_cookie()``, HttpOnly,
SameSite=Strict, set by ``POST /console/login`` for the right token) is a credential
there and nowhere else; ``/console/login`` itself needs none; its POSTs are HTML forms
(``application/x-www-form-urlencoded``) and, unless they carry the token in
``Authorization``, must carry this endpoint's own ``Origin`` (403 without: CSRF).
The cookie's value is an HMAC of the token, not the token.

Thread-safe (immutable after construction).
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Mapping

from ..admin_auth import MISSING_TOKEN_HINT, bearer_matches

OPEN_PATHS = frozenset({"/health"})
CONSOLE_PREFIX = "/console"
CONSOLE_LOGIN = "/console/login"
CONSOLE_COOKIE = "sparkmq_console_"   # + a tag of the token: brokers on one host differ
FORM_TYPE = "application/x-www-form-urlencoded"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class Refusal:
    """An answer given instead of serving the request."""

    status: int
    code: str
    message: str
    headers: tuple[tuple[str, str], ...] = ()


def is_console(path: str) -> bool:
    """Whether ``path`` is one of the web console's (``/console`` and below)."""
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


def own_origins(scheme: str, listen_host: str, advertised_host: str, port: int) -> frozenset:
    """The ``Origin`` values of pages served by this endpoint itself."""
    hosts = {listen_host, advertised_host}
    if listen_host in ("127.0.0.1", "localhost", "::1") or listen_host.startswith("127."):
        hosts.update(LOOPBACK_NAMES)
    hosts = {f"[{h}]" if ":" in h and not h.startswith("[") else h for h in hosts if h}
    return frozenset(f"{scheme}://{h}:{port}" for h in hosts)


class AdminGuard:
    """The checks of the module docstring for one endpoint (``token``: the admin token)."""

    def __init__(self, token: str, origins: frozenset, *, metrics_need_token: bool = False,
                 super_user=None):
        self._token = token
        self._super_user = super_user     # headers -> name of a signed super user, or None
        self.origins = origins
        self.open_paths = OPEN_PATHS if metrics_need_token else OPEN_PATHS | {"/metrics"}

    def refusal(self, method: str, path: str, headers: Mapping[str, str]) -> Refusal | None:
        """None if the request may be served, else the answer to give."""
        origin = headers.get("Origin")
        if origin is not None and origin not in self.origins:
            return Refusal(403, "FORBIDDEN", f"cross-origin request from {origin!r} refused; "
                           "the admin endpoint serves tools, not web pages")
        if (headers.get("Sec-Fetch-Site") or "").lower() == "cross-site":
            return Refusal(403, "FORBIDDEN", "cross-site request refused")
        console = is_console(path)
        bearer = self._credential_ok(headers)
        if path not in self.open_paths and not bearer and not (
                console and (path == CONSOLE_LOGIN or self._console_cookie_ok(headers))):
            return Refusal(401, "UNAUTHORIZED", MISSING_TOKEN_HINT,
                           (("WWW-Authenticate", 'Bearer realm="sparkmq-admin"'),))
        if method == "POST" and console:
            ctype = (headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
            if ctype != FORM_TYPE:
                return Refusal(415, "UNSUPPORTED_MEDIA_TYPE", f"console POSTs are HTML forms "
                               f"({FORM_TYPE}), got {ctype or 'none'!r}")
            if origin is None and not bearer:
                return Refusal(403, "FORBIDDEN", "a console form must come from a page of this "
                               "endpoint (no Origin header); reload the page and submit again")
        elif method == "POST":
            ctype = (headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                return Refusal(415, "UNSUPPORTED_MEDIA_TYPE",
                               f"POST bodies must be Content-Type: application/json, got "
                               f"{ctype or 'none'!r}")
        return None

    def token_matches(self, presented: str) -> bool:
        """Whether ``presented`` is the admin token (constant time; the console login)."""
        return hmac.compare_digest(presented.strip().encode(), self._token.encode())

    def console_cookie(self) -> tuple[str, str]:
        """The console's session cookie ``(name, value)``: HMACs of the token, so the
        cookie is worth nothing outside the console and changes with the token. Cookies
        ignore ports, so the name is tagged too: brokers of one host with different
        tokens keep apart."""
        def mac(label: bytes) -> str:
            return hmac.new(self._token.encode(), label, hashlib.sha256).hexdigest()
        return (CONSOLE_COOKIE + mac(b"sparkmq-console-name")[:12],
                mac(b"sparkmq-console-session-v1"))

    def _console_cookie_ok(self, headers: Mapping[str, str]) -> bool:
        name, value = self.console_cookie()
        for part in (headers.get("Cookie") or "").split(";"):   # other apps' cookies too
            key, eq, presented = part.strip().partition("=")
            if eq and key == name and hmac.compare_digest(presented.strip().encode(),
                                                          value.encode()):
                return True
        return False

    def _credential_ok(self, headers: Mapping[str, str]) -> bool:
        if bearer_matches(headers.get("Authorization"), self._token):
            return True
        signed = (headers.get("Authorization") or "").startswith("MQv2-HMAC-SHA1")
        return bool(signed and self._super_user is not None and self._super_user(
            [(k, headers.get(k) or "") for k in ("authorization", "x-mq-date-time")]))
