"""Users and ACLs kept in a store's transaction log (RocketMQ 5's
``AuthenticationMetadataManager`` / ``AuthorizationMetadataManager`` operations:
create, update, delete, get, list), each change one atomic commit.

Used by the broker's admin routes and by ``sparkmq admin user|acl --store``; the
broker reads the committed state (``store.state.users`` / ``.acls``) on every
request, so a change applies to the next request, on replicas too (the HA meta
frame mirrors them). Listings never show passwords.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import UserError
from ..log.auth_actions import Acl, User
from . import model

REDACTED = "******"


def _user_json(u: User) -> dict:
    return {"username": u.username, "userType": u.user_type, "userStatus": u.user_status,
            "password": REDACTED}


def _acl_json(a: Acl) -> dict:
    return {"subject": a.subject,
            "policies": [{"policyType": p["policyType"], "entries": [dict(e, actions=list(
                e["actions"]), sourceIps=list(e.get("sourceIps") or ())) for e in p["entries"]]}
                for p in a.policies]}


def _user(state, username: str) -> User:
    u = state.users.get(username)
    if u is None:
        raise UserError(f"user {username!r} does not exist; create it with "
                        "`sparkmq admin user create`")
    return u


# ---------------------------------------------------------------- users
def create_user(store, username: str, password: str, user_type: str = "Normal",
                user_status: str = "enable") -> dict:
    model.check_username(username)
    u = User(username=username, password=model.check_password(password),
             user_type=model.user_type(user_type), user_status=model.user_status(user_status),
             created_time=store.clock_ms())

    def build(state):
        if username in state.users:
            raise UserError(f"user {username!r} already exists; change it with "
                            "`sparkmq admin user update`")
        return [u]
    store.require_writable()
    store.commit_actions(build, "CREATE USER", {"username": username})
    return _user_json(u)


def update_user(store, username: str, *, password: str | None = None,
                user_type: str | None = None, user_status: str | None = None) -> dict:
    changes: dict[str, Any] = {}
    if password is not None:
        changes["password"] = model.check_password(password)
    if user_type is not None:
        changes["user_type"] = model.user_type(user_type)
    if user_status is not None:
        changes["user_status"] = model.user_status(user_status)
    if not changes:
        raise UserError("nothing to update: give a password, user type or user status")
    done: list[User] = []

    def build(state):
        done[:] = [replace(_user(state, username), **changes)]
        return done
    store.require_writable()
    store.commit_actions(build, "UPDATE USER", {"username": username})
    return _user_json(done[0])


def delete_user(store, username: str) -> dict:
    """Delete a user and its ACL in one commit."""
    def build(state):
        out = [replace(_user(state, username), deleted=True)]
        acl = state.acls.get(model.subject_of(username))
        return out + ([replace(acl, deleted=True)] if acl is not None else [])
    store.require_writable()
    store.commit_actions(build, "DELETE USER", {"username": username})
    return {"deleted": username}


def get_user(state, username: str) -> dict:
    return _user_json(_user(state, username))


def list_users(state, name_filter: str = "") -> list[dict]:
    return [_user_json(state.users[n]) for n in sorted(state.users) if name_filter in n]


# ---------------------------------------------------------------- ACLs
def _merged(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` policies with ``new``'s entries replacing those of the same resource
    (RocketMQ's updateAcl)."""
    by_type = {p["policyType"]: {e["resource"]: e for e in p["entries"]} for p in old}
    for p in new:
        by_type.setdefault(p["policyType"], {}).update({e["resource"]: e for e in p["entries"]})
    return [{"policyType": t, "entries": list(by_type[t].values())}
            for t in model.POLICY_TYPES if by_type.get(t)]


def _plain(policies) -> list[dict]:
    return _acl_json(Acl(subject="", policies=policies))["policies"]


def set_acl(store, username: str, policies: Any, *, create: bool) -> dict:
    """Create the ACL of ``username`` (``create``; an error if it has one) or merge
    ``policies`` into it (entries of the same resource replaced)."""
    canonical = model.parse_policies(policies)
    subject = model.subject_of(username)
    done: list[Acl] = []

    def build(state):
        _user(state, username)
        old = state.acls.get(subject)
        if create and old is not None:
            raise UserError(f"{subject} already has an ACL; change it with "
                            "`sparkmq admin acl update`")
        if not create and old is None:
            raise UserError(f"{subject} has no ACL; create one with `sparkmq admin acl create`")
        merged = canonical if old is None else _merged(_plain(old.policies), canonical)
        done[:] = [Acl(subject=subject, policies=tuple(merged))]
        return done
    store.require_writable()
    store.commit_actions(build, "CREATE ACL" if create else "UPDATE ACL", {"subject": subject})
    return _acl_json(done[0])


def delete_acl(store, username: str, resource: str | None = None) -> dict:
    """Delete the ACL of ``username``, or only its entries on ``resource``."""
    subject = model.subject_of(username)
    key = str(model.Resource.parse(resource)) if resource else None

    def build(state):
        old = state.acls.get(subject)
        if old is None:
            raise UserError(f"{subject} has no ACL")
        if key is None:
            return [replace(old, deleted=True)]
        kept = [{"policyType": p["policyType"],
                 "entries": [e for e in p["entries"] if e["resource"] != key]}
                for p in _plain(old.policies)]
        kept = [p for p in kept if p["entries"]]
        return [Acl(subject=subject, policies=tuple(kept), deleted=not kept)]
    store.require_writable()
    store.commit_actions(build, "DELETE ACL", {"subject": subject, "resource": key})
    return {"deleted": subject, **({"resource": key} if key else {})}


def get_acl(state, username: str) -> dict:
    acl = state.acls.get(model.subject_of(username))
    if acl is None:
        raise UserError(f"{model.subject_of(username)} has no ACL")
    return _acl_json(acl)


def list_acls(state, subject_filter: str = "", resource_filter: str = "") -> list[dict]:
    out = []
    for s in sorted(state.acls):
        if subject_filter not in s:
            continue
        row = _acl_json(state.acls[s])
        if resource_filter and not any(resource_filter in e["resource"]
                                       for p in row["policies"] for e in p["entries"]):
            continue
        out.append(row)
    return out


# ---------------------------------------------------------------- one entry point
def _field(request: dict, key: str, required: bool = True):
    v = request.get(key)
    if required and (v is None or v == ""):
        raise UserError(f"{request.get('area')} {request.get('op')} needs {key!r}")
    return v


def _username(request: dict) -> str:
    """``username``, or the name in ``subject`` (``User:<name>``)."""
    name = request.get("username")
    subject = request.get("subject")
    if not name and isinstance(subject, str):
        if not subject.startswith(model.SUBJECT_PREFIX):
            raise UserError(f"subject {subject!r} is not User:<name>")
        name = subject[len(model.SUBJECT_PREFIX):]
    return model.check_username(name)


def execute(store, request: dict) -> Any:
    """Carry out one user or ACL request — ``{"area": "user"|"acl", "op":
    "create"|"update"|"delete"|"get"|"list", ...}`` with the fields of the functions
    above (JSON names: username, password, userType, userStatus, subject, policies,
    resource, filter) — on ``store``: the one implementation behind the broker's
    ``POST /admin/auth`` and ``sparkmq admin user|acl --store``."""
    area, op = request.get("area"), request.get("op")
    if area == "user":
        if op == "list":
            return list_users(store.state, request.get("filter") or "")
        name = _username(request)
        if op == "create":
            return create_user(store, name, _field(request, "password"),
                               request.get("userType") or "Normal",
                               request.get("userStatus") or "enable")
        if op == "update":
            return update_user(store, name, password=request.get("password"),
                               user_type=request.get("userType"),
                               user_status=request.get("userStatus"))
        if op == "delete":
            return delete_user(store, name)
        if op == "get":
            return get_user(store.state, name)
    elif area == "acl":
        if op == "list":
            return list_acls(store.state, request.get("filter") or "",
                             request.get("resource") or "")
        name = _username(request)
        if op in ("create", "update"):
            return set_acl(store, name, _field(request, "policies"), create=op == "create")
        if op == "delete":
            return delete_acl(store, name, request.get("resource"))
        if op == "get":
            return get_acl(store.state, name)
    else:
        raise UserError(f"area must be 'user' or 'acl', got {area!r}")
    raise UserError(f"{area} op must be create, update, delete, get or list; got {op!r}")
