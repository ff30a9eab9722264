"""RocketMQ 5's ACL 2.0 model: users, resources, actions, policy entries, and the
decision for one request.

* A **user** is ``Super`` (allowed everything) or ``Normal`` (allowed what its ACL
  allows), ``enable`` or ``disable`` (a disabled user fails authentication).
* An **ACL** belongs to a subject ``User:<name>`` and holds policies of type
  ``Custom`` or ``Default``; each has entries: a resource, actions, optional source
  IP ranges, and a decision ``Allow`` or ``Deny``.
* A **resource** is ``Topic:<name>``, ``Group:<name>`` or ``Cluster:<name>``;
  ``<name>`` may end in ``*`` (prefixed) or be ``*`` (any topic / group); ``*`` alone
  is any resource.
* **Actions**: Pub, Sub, Create, Update, Delete, Get, List, All (All matches every
  action).

Deciding (as RocketMQ's ``AclAuthorizationHandler`` intends): the entries of the
Custom policy that match the resource, one of the requested actions and the source
IP are taken — or, when none does, those of the Default policy; no match is a deny.
Of the matches the most specific resource decides (literal, then the longest
prefix, then "any"); at equal specificity Deny wins.

Pure functions and immutable values: thread-safe.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..errors import UserError

USER_TYPES = ("Super", "Normal")
USER_STATUSES = ("enable", "disable")
ACTIONS = ("Pub", "Sub", "Create", "Update", "Delete", "Get", "List", "All")
RESOURCE_TYPES = ("Topic", "Group", "Cluster")
DECISIONS = ("Allow", "Deny")
POLICY_TYPES = ("Custom", "Default")
SUBJECT_PREFIX = "User:"

# resource specificity: a literal name beats any prefix, a prefix beats "any"
_LITERAL, _PREFIXED, _ANY = 2, 1, 0


def _canonical(value: Any, choices: Sequence[str], what: str) -> str:
    """``value`` spelled as in ``choices`` (case-insensitive); UserError otherwise."""
    if isinstance(value, str):
        for c in choices:
            if c.lower() == value.strip().lower():
                return c
    raise UserError(f"{what} must be one of {', '.join(choices)}; got {value!r}")


def user_type(value: Any) -> str:
    return _canonical(value, USER_TYPES, "user type")


def user_status(value: Any) -> str:
    return _canonical(value, USER_STATUSES, "user status")


def subject_of(username: str) -> str:
    """The ACL subject of a user: ``User:<name>``."""
    return SUBJECT_PREFIX + username


def check_username(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > 256 or \
            any(c in name for c in " :,*\t\r\n"):
        raise UserError(f"a username is 1..256 characters without spaces, ':', ',' or '*'; "
                        f"got {name!r}")
    return name


def check_password(password: Any) -> str:
    if not isinstance(password, str) or len(password) < 8 or len(password) > 256:
        raise UserError("a password (the client's secret key) needs 8..256 characters")
    return password


@dataclass(frozen=True)
class Resource:
    """``type`` is Topic, Group, Cluster or None (any resource); ``name`` is the
    literal name or prefix (empty for any name of the type)."""

    type: str | None
    name: str
    specificity: int

    @classmethod
    def parse(cls, text: Any) -> "Resource":
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"a resource is Topic:<name>, Group:<name>, Cluster:<name> (a name "
                            f"may end in '*'), or '*'; got {text!r}")
        text = text.strip()
        if text == "*":
            return cls(None, "", _ANY)
        kind, sep, name = text.partition(":")
        if not sep or not name:
            raise UserError(f"resource {text!r} is not Type:name (e.g. Topic:orders, "
                            "Group:billing, Topic:orders-*, Topic:*)")
        kind = _canonical(kind, RESOURCE_TYPES, f"the type of resource {text!r}")
        if name == "*":
            return cls(kind, "", _ANY)
        if "*" in name[:-1]:
            raise UserError(f"resource {text!r}: '*' may only end a name (a prefix)")
        if name.endswith("*"):
            return cls(kind, name[:-1], _PREFIXED)
        return cls(kind, name, _LITERAL)

    def __str__(self) -> str:
        if self.type is None:
            return "*"
        return f"{self.type}:{self.name}{'*' if self.specificity != _LITERAL else ''}"

    def matches(self, kind: str, name: str) -> bool:
        if self.type is not None and self.type != kind:
            return False
        if self.specificity == _LITERAL:
            return name == self.name
        return name.startswith(self.name)


@dataclass(frozen=True)
class Entry:
    """One policy entry, parsed."""

    resource: Resource
    actions: frozenset[str]
    source_ips: tuple          # ip_network values; empty: any source
    decision: str

    def matches(self, kind: str, name: str, actions: Iterable[str], ip) -> bool:
        if not self.resource.matches(kind, name):
            return False
        if "All" not in self.actions and self.actions.isdisjoint(actions):
            return False
        return not self.source_ips or (ip is not None and any(ip in n for n in self.source_ips))


def parse_entry(body: Any) -> tuple[dict, Entry]:
    """The canonical JSON of one policy entry and its parsed form; UserError naming
    what is wrong."""
    if not isinstance(body, Mapping):
        raise UserError(f"a policy entry is an object with resource, actions, decision "
                        f"(and sourceIps); got {body!r}")
    resource = Resource.parse(body.get("resource"))
    raw_actions = body.get("actions")
    if isinstance(raw_actions, str):
        raw_actions = [a for a in raw_actions.split(",") if a.strip()]
    if not raw_actions or not isinstance(raw_actions, (list, tuple)):
        raise UserError(f"entry for {resource}: actions must be a non-empty list of "
                        f"{', '.join(ACTIONS)}")
    actions = sorted({_canonical(a, ACTIONS, "an action") for a in raw_actions})
    ips = body.get("sourceIps") or []
    if isinstance(ips, str):
        ips = [i for i in ips.split(",") if i.strip()]
    try:
        nets = tuple(ipaddress.ip_network(i.strip(), strict=False) for i in ips)
    except (ValueError, AttributeError) as e:
        raise UserError(f"entry for {resource}: sourceIps must be IP addresses or CIDR "
                        f"ranges: {e}") from None
    decision = _canonical(body.get("decision", "Allow"), DECISIONS, "decision")
    canonical = {"resource": str(resource), "actions": actions,
                 "sourceIps": [str(n) for n in nets], "decision": decision}
    return canonical, Entry(resource, frozenset(actions), nets, decision)


def parse_policies(policies: Any) -> list[dict]:
    """The canonical ACL 2.0 JSON of ``policies`` (a list of {policyType, entries});
    UserError naming the first problem."""
    if not isinstance(policies, (list, tuple)) or not policies:
        raise UserError("an ACL needs a non-empty list of policies "
                        "[{\"policyType\": \"Custom\", \"entries\": [...]}]")
    merged: dict[str, list] = {}
    for p in policies:
        if not isinstance(p, Mapping) or not isinstance(p.get("entries"), (list, tuple)) \
                or not p["entries"]:
            raise UserError(f"a policy is {{\"policyType\": \"Custom\"|\"Default\", "
                            f"\"entries\": [at least one]}}; got {p!r}")
        ptype = _canonical(p.get("policyType", "Custom"), POLICY_TYPES, "policyType")
        merged.setdefault(ptype, []).extend(parse_entry(e)[0] for e in p["entries"])
    return [{"policyType": t, "entries": merged[t]} for t in POLICY_TYPES if t in merged]


def compile_policies(policies: Iterable[Mapping]) -> dict[str, list[Entry]]:
    """policyType -> parsed entries, for :func:`decide` (policies already validated)."""
    out: dict[str, list[Entry]] = {}
    for p in policies:
        out.setdefault(p.get("policyType", "Custom"), []).extend(
            parse_entry(e)[1] for e in p.get("entries") or ())
    return out


def decide(compiled: Mapping[str, list[Entry]] | None, kind: str, name: str,
           actions: Sequence[str], source_ip: str | None) -> tuple[bool, str]:
    """(allowed, why) for a Normal user's request of one of ``actions`` on resource
    ``kind:name`` from ``source_ip``; see the module docstring."""
    if not compiled:
        return False, "the user has no ACL"
    try:
        ip = ipaddress.ip_address(source_ip) if source_ip else None
    except ValueError:
        ip = None
    for ptype in POLICY_TYPES:
        matched = [e for e in compiled.get(ptype, ()) if e.matches(kind, name, actions, ip)]
        if matched:
            best = max(matched, key=lambda e: (e.resource.specificity, len(e.resource.name),
                                               e.decision == "Deny"))
            if best.decision == "Deny":
                return False, f"the ACL entry {best.resource} denies it"
            return True, ""
    return False, "no ACL entry allows it"
