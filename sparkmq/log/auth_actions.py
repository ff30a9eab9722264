"""Transaction-log actions of RocketMQ 5's ACL 2.0 metadata: users and their ACLs
(FORMAT.md section 5, ``user`` and ``acl``).

The log only stores them, so that restarts, replicas (the HA meta frame) and
checkpoints keep them; what they mean (resource patterns, actions, decisions,
matching) is ``sparkmq.auth``'s. As with topics, the newest action of a name
replaces the previous one and ``deleted`` removes it.

Passwords are stored as given: RocketMQ 5 clients sign each request with
HMAC-SHA1 over the secret key, so the broker needs the key itself (RocketMQ's
own metadata store keeps it the same way). Whoever can read the store's files
can read them, as they can read every message: the store directory's
permissions are the boundary (docs/ARCHITECTURE.md, security).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .actions_base import _EMPTY, _Action, _frozen


def _deep_frozen(v: Any) -> Any:
    """``v`` with every dict made read-only and every list a tuple."""
    if isinstance(v, Mapping):
        return _frozen({k: _deep_frozen(x) for k, x in v.items()})
    if isinstance(v, (list, tuple)):
        return tuple(_deep_frozen(x) for x in v)
    return v


@dataclass(frozen=True)
class User(_Action):
    """An ACL 2.0 user: ``user_type`` ``Super`` (every action allowed) or ``Normal``
    (what its ACL allows); ``user_status`` ``enable`` or ``disable`` (a disabled
    user fails authentication)."""

    KIND = "user"
    FIELDS = {"created_time": "createdTime", "deleted": "deleted", "password": "password",
              "user_status": "userStatus", "user_type": "userType", "username": "username"}
    OPTIONAL = frozenset({"created_time"})
    username: str
    password: str = ""
    user_type: str = "Normal"
    user_status: str = "enable"
    created_time: int | None = None
    deleted: bool = False
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class Acl(_Action):
    """The ACL of one subject (``User:<name>``): ``policies`` as RocketMQ 5's ACL 2.0
    JSON, ``[{"policyType": "Custom"|"Default", "entries": [{"resource": "Topic:T",
    "actions": ["Pub"], "sourceIps": ["10.0.0.0/8"], "decision": "Allow"}]}]``
    (validated by ``sparkmq.auth.model`` before it is committed)."""

    KIND = "acl"
    FIELDS = {"deleted": "deleted", "policies": "policies", "subject": "subject"}
    subject: str
    policies: tuple = ()
    deleted: bool = False
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "policies", _deep_frozen(self.policies))
