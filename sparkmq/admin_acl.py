"""``sparkmq admin user …`` and ``sparkmq admin acl …``: RocketMQ 5's ACL 2.0 users and
ACLs (mqadmin createUser/updateUser/deleteUser/getUser/listUser and
createAcl/updateAcl/deleteAcl/getAcl/listAcl), against a broker (``--broker``, its
admin token) or a store (``--store``, taking the writer lease: the broker must be
stopped). Both go through ``sparkmq.auth.meta.execute``.

Examples::

    sparkmq admin --broker http://127.0.0.1:8082 user create --username app --password s3cret-key
    sparkmq admin --broker ... acl create --subject User:app \\
        --resources Topic:orders,Group:billing --actions Pub,Sub --source-ips 10.0.0.0/8
    sparkmq admin --broker ... acl list --json
"""
from __future__ import annotations

from typing import Any


def _run(args, request: dict) -> Any:
    from .admin import _emit, _http, _store
    from .auth.meta import execute
    if args.broker:
        result = _http(args, "/admin/auth", request)
    else:
        with _store(args, write=request["op"] not in ("get", "list")) as s:
            result = execute(s, request)
    if isinstance(result, list) and request["area"] == "acl" and not args.json:
        result = [{"subject": a["subject"], "policyType": p["policyType"], **e}
                  for a in result for p in a["policies"] for e in p["entries"]]
    elif isinstance(result, dict) and "policies" in result and not args.json:
        result = [{"policyType": p["policyType"], **e} for p in result["policies"]
                  for e in p["entries"]]
    _emit(args, result)


def _user(args) -> None:
    _run(args, {"area": "user", "op": args.op, "username": args.username,
                "password": args.password, "userType": args.user_type,
                "userStatus": args.user_status, "filter": args.filter})


def _acl(args) -> None:
    request = {"area": "acl", "op": args.op, "subject": args.subject,
               "filter": args.filter, "resource": args.resource}
    if args.op in ("create", "update"):
        if not (args.resources and args.actions):
            from .errors import UserError
            raise UserError(f"acl {args.op} needs --resources and --actions")
        request["policies"] = [{"policyType": args.policy_type, "entries": [
            {"resource": r.strip(), "actions": args.actions.split(","),
             "sourceIps": args.source_ips.split(",") if args.source_ips else [],
             "decision": args.decision} for r in args.resources.split(",") if r.strip()]}]
    _run(args, request)


def add_parsers(sub) -> None:
    u = sub.add_parser("user", help="ACL 2.0 users (authenticationEnabled)").add_subparsers(
        dest="op", required=True)
    for op in ("create", "update", "delete", "get", "list"):
        c = u.add_parser(op)
        c.add_argument("--username", required=op != "list")
        c.add_argument("--password", required=op == "create",
                       help="the client's secret key (8+ characters)")
        c.add_argument("--user-type", choices=["Super", "Normal"],
                       default="Normal" if op == "create" else None)
        c.add_argument("--user-status", choices=["enable", "disable"])
        c.add_argument("--filter", default="", help="list: names containing this")
        c.set_defaults(fn=_user)
    a = sub.add_parser("acl", help="ACL 2.0 policies (authorizationEnabled)").add_subparsers(
        dest="op", required=True)
    for op in ("create", "update", "delete", "get", "list"):
        c = a.add_parser(op)
        c.add_argument("--subject", required=op != "list", help="User:<name>")
        c.add_argument("--resources", help="comma list: Topic:T, Group:G, Topic:pre*, Topic:*, *")
        c.add_argument("--actions", help="comma list of Pub, Sub, Create, Update, Delete, "
                                         "Get, List, All")
        c.add_argument("--source-ips", help="comma list of IPs or CIDR ranges (default: any)")
        c.add_argument("--decision", default="Allow", choices=["Allow", "Deny"])
        c.add_argument("--policy-type", default="Custom", choices=["Custom", "Default"])
        c.add_argument("--resource", help="delete: only this resource's entries; "
                                          "list: entries on resources containing this")
        c.add_argument("--filter", default="", help="list: subjects containing this")
        c.set_defaults(fn=_acl)
