"""Authentication of RocketMQ 5 clients, as the official clients sign their requests.

Every request of an official client with session credentials (access key + secret
key) carries ``x-mq-date-time`` and ``authorization: MQv2-HMAC-SHA1
Credential=<access key>, SignedHeaders=x-mq-date-time, Signature=<hex
HMAC-SHA1(secret key, x-mq-date-time)>`` (rocketmq-clients, ``Signature.metadata``).
With ``authenticationEnabled=true`` the broker checks it on every RPC of every
wire path through :meth:`Authenticator.check` (the one implementation), before
the request is looked at; a missing or wrong credential is ``AuthenticationError``
(the proxy's UNAUTHORIZED). Users: ``initAuthenticationUser`` (RocketMQ 5.3's
name: ``{"username": .., "password": ..}``, the password being the secret key; a
super user) and the ACL 2.0 users committed to the store (``sparkmq admin user``,
read on every request; a disabled one is refused).

Thread-safe (immutable after construction).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Callable, Iterable, Mapping

from ..errors import AuthenticationError, InvalidConfigError

SCHEME = "MQv2-HMAC-SHA1"
_AUTH_RE = re.compile(r"^\s*MQv2-HMAC-SHA1\s+Credential=([^,\s]*)\s*,\s*"
                      r"SignedHeaders=x-mq-date-time\s*,\s*Signature=([0-9a-fA-F]+)\s*$")


def signature(secret_key: str, date_time: str) -> str:
    """The hex HMAC-SHA1 an official client sends for ``date_time``."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


class Authenticator:
    """Checks the credentials of RPCs; ``users`` (name -> secret key, from the
    configuration) is None when authentication is off; ``stored()`` gives the
    store's users (name -> ``User`` action)."""

    def __init__(self, users: Mapping[str, str] | None = None,
                 stored: Callable[[], Mapping] = dict):
        self.users = dict(users) if users is not None else None
        self.stored = stored

    def super_users(self) -> frozenset[str]:
        """The configured users (``initAuthenticationUser``): allowed everything."""
        return frozenset(self.users or ())

    @property
    def enabled(self) -> bool:
        return self.users is not None

    @classmethod
    def from_config(cls, enabled: bool, init_user: str,
                    stored: Callable[[], Mapping] = dict) -> "Authenticator":
        if not enabled:
            return cls(None)
        try:
            user = json.loads(init_user) if init_user else None
            name, password = user["username"], user["password"]
            if not (isinstance(name, str) and isinstance(password, str) and name
                    and len(password) >= 8):
                raise ValueError("username and a password of 8 or more characters")
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidConfigError(
                "authenticationEnabled=true needs initAuthenticationUser="
                "{\"username\": \"...\", \"password\": \"<8+ characters>\"} (RocketMQ 5's "
                f"initial user; clients use them as access key and secret key): {exc}") from None
        return cls({name: password}, stored)

    def check(self, metadata: Iterable[tuple[str, str]]) -> str | None:
        """The authenticated user's name (None when authentication is off);
        AuthenticationError when the request carries no valid credential."""
        if self.users is None:
            return None
        md = {k.lower(): v for k, v in metadata or ()}
        header, when = md.get("authorization"), md.get("x-mq-date-time")
        if not header or not when:
            raise AuthenticationError(
                "this broker requires credentials: configure the client's session "
                "credentials (access key and secret key)")
        m = _AUTH_RE.match(header)
        if m is None:
            raise AuthenticationError(f"the authorization header is not {SCHEME} "
                                      "Credential=..., SignedHeaders=x-mq-date-time, Signature=...")
        name, sig = m.groups()
        if not name:
            raise AuthenticationError(
                "this broker requires credentials and the request has an empty access key: "
                "configure the client's session credentials (access key and secret key)")
        password = self.users.get(name)
        if password is None:
            user = self.stored().get(name)
            if user is not None and user.user_status == "disable":
                raise AuthenticationError(f"user {name!r} is disabled; enable it with "
                                          "`sparkmq admin user update --user-status enable`")
            password = user.password if user is not None else None
        expected = signature(password if password is not None else "", when)
        if password is None or not hmac.compare_digest(sig.lower(), expected):
            raise AuthenticationError(f"wrong access key or secret key for {name!r}")
        return name

    def super_user(self, metadata: Iterable[tuple[str, str]], *, max_skew_s: int = 900) -> str | None:
        """The name of a super user (``initAuthenticationUser`` or a stored ``Super``
        user) whose signed credential ``metadata`` carries, dated within ``max_skew_s``
        of now (the admin endpoint's alternative to its token); None otherwise."""
        import datetime as dt
        if self.users is None:
            return None
        md = dict((k.lower(), v) for k, v in metadata or ())
        try:
            when = dt.datetime.strptime(md.get("x-mq-date-time", ""), "%Y%m%dT%H%M%SZ")
            name = self.check(md.items())
        except (ValueError, AuthenticationError):
            return None
        # the official clients write local time with a 'Z': accept UTC or local time
        utc_now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        if min(abs((now - when).total_seconds()) for now in (utc_now, dt.datetime.now())) \
                > max_skew_s:
            return None
        stored = self.stored().get(name)
        if name in self.users or (stored is not None and stored.user_type == "Super"):
            return name
        return None
