"""ACL 2.0 decisions (sparkmq.auth.model) and the users and ACLs kept in the store's
transaction log (sparkmq.auth.meta): validation, matching precedence, restarts,
checkpoints and replicas."""
from __future__ import annotations

import os

import pytest

from sparkmq import Store
from sparkmq.auth import meta, model
from sparkmq.errors import UserError


def _compiled(*entries, default=()):
    policies = [{"policyType": "Custom", "entries": list(entries)}] if entries else []
    if default:
        policies.append({"policyType": "Default", "entries": list(default)})
    return model.compile_policies(model.parse_policies(policies))


def _e(resource, actions="Pub", decision="Allow", ips=()):
    return {"resource": resource, "actions": actions.split(","), "decision": decision,
            "sourceIps": list(ips)}


@pytest.mark.parametrize("entries, kind, name, actions, ip, allowed", [
    ([_e("Topic:orders")], "Topic", "orders", ("Pub",), None, True),
    ([_e("Topic:orders")], "Topic", "orders2", ("Pub",), None, False),       # literal
    ([_e("Topic:orders")], "Topic", "orders", ("Sub",), None, False),        # action
    ([_e("Topic:orders")], "Group", "orders", ("Pub",), None, False),        # type
    ([_e("Topic:ord*")], "Topic", "orders", ("Pub",), None, True),           # prefix
    ([_e("Topic:*")], "Topic", "anything", ("Pub",), None, True),            # any topic
    ([_e("*", "All")], "Group", "g", ("Sub",), None, True),                  # any, All
    ([_e("Topic:*", "Pub,Sub")], "Topic", "t", ("Pub", "Sub"), None, True),  # any of
    # the most specific resource decides ...
    ([_e("Topic:*", decision="Deny"), _e("Topic:orders")], "Topic", "orders", ("Pub",),
     None, True),
    ([_e("Topic:ord*"), _e("Topic:orders", decision="Deny")], "Topic", "orders", ("Pub",),
     None, False),
    ([_e("Topic:o*", decision="Deny"), _e("Topic:ord*")], "Topic", "orders", ("Pub",),
     None, True),
    # ... and at equal specificity Deny wins
    ([_e("Topic:orders"), _e("Topic:orders", decision="Deny")], "Topic", "orders", ("Pub",),
     None, False),
    # source IP ranges
    ([_e("Topic:t", ips=["10.0.0.0/8"])], "Topic", "t", ("Pub",), "10.1.2.3", True),
    ([_e("Topic:t", ips=["10.0.0.0/8"])], "Topic", "t", ("Pub",), "127.0.0.1", False),
    ([_e("Topic:t", ips=["10.0.0.0/8"])], "Topic", "t", ("Pub",), None, False),
    ([_e("Topic:t", ips=["::1"])], "Topic", "t", ("Pub",), "::1", True),
])
def test_decisions(entries, kind, name, actions, ip, allowed):
    assert model.decide(_compiled(*entries), kind, name, actions, ip)[0] is allowed


def test_default_policy_applies_only_when_no_custom_entry_matches():
    c = _compiled(_e("Topic:a"), default=[_e("Topic:*", decision="Deny"), _e("Topic:b")])
    assert model.decide(c, "Topic", "a", ("Pub",), None)[0]          # custom
    assert model.decide(c, "Topic", "b", ("Pub",), None)[0]          # default, literal
    assert not model.decide(c, "Topic", "z", ("Pub",), None)[0]      # default, deny
    assert not model.decide(None, "Topic", "a", ("Pub",), None)[0]   # no ACL at all


@pytest.mark.parametrize("policies, words", [
    ([], "non-empty list of policies"),
    ([{"policyType": "Custom", "entries": []}], "at least one"),
    ([{"entries": [_e("Queue:x")]}], "type of resource"),
    ([{"entries": [_e("Topic:a*b")]}], "may only end a name"),
    ([{"entries": [_e("Topic:")]}], "not Type:name"),
    ([{"entries": [_e("Topic:t", "Publish")]}], "an action must be one of"),
    ([{"entries": [_e("Topic:t", decision="Maybe")]}], "decision must be one of"),
    ([{"entries": [_e("Topic:t", ips=["10.0.0.300"])]}], "sourceIps"),
    ([{"policyType": "Other", "entries": [_e("Topic:t")]}], "policyType"),
])
def test_malformed_policies_are_refused_with_what_is_wrong(policies, words):
    with pytest.raises(UserError, match=words):
        model.parse_policies(policies)


def _setup(store):
    meta.execute(store, {"area": "user", "op": "create", "username": "app",
                         "password": "app-secret-1"})
    meta.execute(store, {"area": "acl", "op": "create", "subject": "User:app",
                         "policies": [{"entries": [_e("Topic:T", "pub")]}]})


def test_users_and_acls_survive_restart_and_checkpoint(tmp_path):
    url = str(tmp_path / "s")
    with Store.open(url, mode="w", create=True) as s:
        _setup(s)
        meta.execute(s, {"area": "acl", "op": "update", "subject": "User:app",
                         "policies": [{"entries": [_e("Group:G*", "Sub")]}]})
        for i in range(12):        # past a checkpoint (every 10 versions): the load
            s.create_topic(f"X{i}", read_queue_nums=1, write_queue_nums=1)  # starts there
    assert any(n.endswith(".checkpoint.json") for n in os.listdir(os.path.join(url, "_log")))
    with Store.open(url, mode="r") as s:
        assert s.state.users["app"].password == "app-secret-1"
        got = meta.get_acl(s.state, "app")["policies"][0]["entries"]
        assert [(e["resource"], e["actions"]) for e in got] == [("Topic:T", ["Pub"]),
                                                              ("Group:G*", ["Sub"])]
        assert meta.list_users(s.state) == [{"username": "app", "userType": "Normal",
                                             "userStatus": "enable", "password": "******"}]


def test_user_and_acl_operations_refuse_what_cannot_be_done(tmp_path):
    with Store.open(str(tmp_path / "s"), mode="w", create=True) as s:
        _setup(s)
        for request, words in [
            ({"area": "user", "op": "create", "username": "app", "password": "x" * 8},
             "already exists"),
            ({"area": "user", "op": "create", "username": "b", "password": "short"},
             "8..256"),
            ({"area": "user", "op": "create", "username": "a b", "password": "x" * 8},
             "without spaces"),
            ({"area": "acl", "op": "create", "subject": "User:nobody",
              "policies": [{"entries": [_e("Topic:T")]}]}, "does not exist"),
            ({"area": "acl", "op": "create", "subject": "User:app",
              "policies": [{"entries": [_e("Topic:T")]}]}, "already has an ACL"),
            ({"area": "acl", "op": "get", "subject": "Group:app"}, "not User:"),
            ({"area": "user", "op": "rename", "username": "app"}, "op must be"),
        ]:
            before = s.state.version
            with pytest.raises(UserError, match=words):
                meta.execute(s, request)
            assert s.state.version == before              # nothing committed
        meta.execute(s, {"area": "user", "op": "delete", "username": "app"})
        assert "app" not in s.state.users and not s.state.acls   # its ACL went too


def test_replica_mirrors_users_and_acls_and_their_deletion(tmp_path):
    from sparkmq.log.replication import ReplicaLog, meta_frame
    with Store.open(str(tmp_path / "m"), mode="w", create=True) as master, \
            Store.open(str(tmp_path / "r"), mode="w", create=True) as replica:
        _setup(master)
        rlog = ReplicaLog(replica)
        rlog.apply_meta(meta_frame(master.state))
        assert replica.state.users == master.state.users
        assert replica.state.acls == master.state.acls
        meta.execute(master, {"area": "user", "op": "delete", "username": "app"})
        rlog.apply_meta(meta_frame(master.state))
        assert not replica.state.users and not replica.state.acls
