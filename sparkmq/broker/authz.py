"""Authorization of RocketMQ 5 requests (``authorizationEnabled=true``): ACL 2.0.

After :class:`~sparkmq.broker.authn.Authenticator` has named the user, every RPC
(and each Settings command of a Telemetry stream) is turned into the resources it
touches and the actions it needs — as the RocketMQ proxy's
``DefaultAuthorizationContextBuilder`` does for the gRPC protocol, extended to the
RPCs it leaves out (offsets, pull, recall) — and each is decided by the user's ACL
(``sparkmq.auth.model.decide``). Super users (and ``initAuthenticationUser``) are
allowed everything. A refusal is ``AuthorizationError`` (the proxy's FORBIDDEN).

The users and ACLs are read from the store's committed state on every request, so
``sparkmq admin user|acl`` changes apply to the next request. Compiled ACLs are
cached per ACL value (a change makes a new value).

Thread-safe: the cache is replaced, never changed in place, under the GIL.
"""
from __future__ import annotations

from typing import Callable, Iterable

from rocketmq.grpc_protocol import definition_pb2 as pb

from ..auth import model
from ..errors import AuthorizationError, InvalidConfigError
from .plainsend import PlainRequest

PUB, SUB = ("Pub",), ("Sub",)
_CONSUMERS = (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER, pb.PULL_CONSUMER)


def _sub(group: str, topic: str, actions=SUB) -> list[tuple]:
    return [("Group", group, actions), ("Topic", topic, actions)]


def send_resources(topics: Iterable[str]) -> list[tuple[str, str, tuple]]:
    """A send to ``topics`` (RocketMQ SendMessage, Flight DoPut): Pub on each."""
    return [("Topic", t, PUB) for t in sorted(set(topics))]


def offset_update_resources(group: str, topic: str) -> list[tuple[str, str, tuple]]:
    """Moving ``group``'s offset of ``topic`` (UpdateOffset, Flight commitOffset)."""
    return _sub(group, topic, ("Sub", "Update"))


def read_resources(topic: str, group: str | None = None) -> list[tuple[str, str, tuple]]:
    """Reading ``topic`` by offset (Flight DoGet): Sub on the topic, and on the group
    when the reader names one (then exactly as PullMessage)."""
    return _sub(group, topic) if group else [("Topic", topic, SUB)]


def rpc_resources(method: str, request) -> list[tuple[str, str, tuple]]:
    """(resource type, name, actions: any one suffices) that ``method``'s ``request``
    needs; empty for RPCs that touch no topic or group. The Flight service asks the
    functions above for its calls, so both wire paths decide a send, a read and an
    offset move by one rule each."""
    match method:
        case "SendMessage":
            if isinstance(request, PlainRequest):     # read without upb: one topic
                return send_resources([request.topic])
            return send_resources(m.topic.name for m in request.messages)
        case "EndTransaction" | "RecallMessage":
            return [("Topic", request.topic.name, PUB)]
        case "QueryRoute":
            return [("Topic", request.topic.name, ("Pub", "Sub"))]
        case "Heartbeat" | "NotifyClientTermination":
            if method == "Heartbeat" and request.client_type not in _CONSUMERS:
                return []
            return [("Group", request.group.name, SUB)] if request.group.name else []
        case "ReceiveMessage" | "PullMessage":
            return _sub(request.group.name, request.message_queue.topic.name)
        case ("AckMessage" | "ForwardMessageToDeadLetterQueue" | "ChangeInvisibleDuration"
              | "QueryAssignment"):
            return _sub(request.group.name, request.topic.name)
        case "GetOffset":
            return _sub(request.group.name, request.message_queue.topic.name, ("Sub", "Get"))
        case "QueryOffset":
            return [("Topic", request.message_queue.topic.name, ("Sub", "Get"))]
        case "UpdateOffset":
            return offset_update_resources(request.group.name, request.message_queue.topic.name)
    return []


def settings_resources(settings: pb.Settings) -> list[tuple[str, str, tuple]]:
    """What a Telemetry Settings command declares: Pub on its publishing topics, Sub on
    its group and subscribed topics."""
    out = []
    if settings.HasField("publishing"):
        out += [("Topic", t.name, PUB) for t in settings.publishing.topics]
    if settings.HasField("subscription"):
        s = settings.subscription
        out.append(("Group", s.group.name, SUB))
        out += [("Topic", e.topic.name, SUB) for e in s.subscriptions]
    return out


def peer_ip(peer: str | None) -> str | None:
    """The IP of a gRPC ``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    if not peer or ":" not in peer:
        return None
    family, _, rest = peer.partition(":")
    if family == "ipv6" and rest.startswith("["):
        return rest[1:rest.find("]")]
    return rest.rsplit(":", 1)[0] if family == "ipv4" else None


class Authorizer:
    """Decides requests of authenticated users; off when ``enabled`` is false."""

    def __init__(self, enabled: bool, state: Callable[[], object],
                 super_users: Iterable[str] = ()):
        self.enabled = enabled
        self._state = state
        self._super = frozenset(super_users)
        self._compiled: dict[str, tuple[object, dict]] = {}

    @classmethod
    def from_config(cls, config, authenticator, state) -> "Authorizer":
        if config.authorization_enabled and not authenticator.enabled:
            raise InvalidConfigError(
                "authorizationEnabled=true needs authenticationEnabled=true (an ACL "
                "belongs to an authenticated user)")
        return cls(config.authorization_enabled, state, authenticator.super_users())

    def check(self, username: str | None, resources: list[tuple[str, str, tuple]],
              source_ip: str | None) -> None:
        """AuthorizationError unless ``username`` may do every one of ``resources``."""
        if not self.enabled or not resources or username in self._super:
            return
        state = self._state()
        user = state.users.get(username)
        if user is not None and user.user_type == "Super":
            return
        compiled = self._acl(state, model.subject_of(username or ""))
        for kind, name, actions in resources:
            allowed, why = model.decide(compiled, kind, name, actions, source_ip)
            if not allowed:
                raise AuthorizationError(
                    f"User:{username} may not {'/'.join(actions)} {kind}:{name}"
                    f"{f' from {source_ip}' if source_ip else ''}: {why}; grant it with "
                    "`sparkmq admin acl create|update`")

    def _acl(self, state, subject: str) -> dict | None:
        acl = state.acls.get(subject)
        if acl is None:
            return None
        cached = self._compiled.get(subject)
        if cached is not None and cached[0] is acl:
            return cached[1]
        compiled = model.compile_policies(acl.policies)
        self._compiled = {**self._compiled, subject: (acl, compiled)}
        return compiled
