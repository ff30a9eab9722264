"""Authorization (ACL 2.0, issue 13 items 2, 7, 8): with authenticationEnabled and
authorizationEnabled every RPC is decided by the user's ACL — no credential or a wrong
secret: UNAUTHORIZED; a user whose ACL does not allow it: FORBIDDEN; an allowed user
and the super user: neither. Users and ACLs are managed with `sparkmq admin user|acl`
through the broker's admin port and apply to the next request."""
from __future__ import annotations

import datetime as dt
import json

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.grpc_protocol.definition_pb2 import Code

from sparkmq.admin import main as admin_main
from sparkmq.broker import Broker
from sparkmq.broker.authn import signature
from sparkmq.errors import InvalidConfigError

from helpers.brokers import broker_config, msg

pytestmark = pytest.mark.integration

ROOT = '{"username": "root", "password": "root-secret-key"}'
KEYS = {"root": "root-secret-key", "alice": "alice-secret-key", "bob": "bob-secret-key"}


def _admin(broker, *argv) -> object:
    """Run `sparkmq admin --broker URL --token T --json ...` and return its JSON output."""
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = admin_main(["--broker", broker.admin_url, f"--token={broker.admin_token}", "--json",
                         *argv])
    assert rc == 0, out.getvalue()
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(broker_config(tmp_path_factory.mktemp("authz"), authenticationEnabled="true",
                             authorizationEnabled="true", initAuthenticationUser=ROOT)).start()
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    b.store.create_topic("OTHER", read_queue_nums=1, write_queue_nums=1)
    b.store.create_topic("T2", read_queue_nums=1, write_queue_nums=1)   # the client test's
    for name in ("alice", "bob"):
        _admin(b, "user", "create", "--username", name, "--password", KEYS[name])
    _admin(b, "acl", "create", "--subject", "User:alice", "--resources",
           "Topic:T,Topic:T2,Group:G", "--actions", "Pub,Sub,Get,Update")
    _admin(b, "acl", "create", "--subject", "User:bob", "--resources", "Topic:OTHER",
           "--actions", "All")              # bob may use another topic only
    yield b
    b.stop()


def _metadata(user: str | None, secret: str | None = None) -> list[tuple[str, str]]:
    md = [("x-mq-client-id", "authz-test")]
    if user is not None:
        when = dt.datetime.now().strftime("%Y%m%dT%H%M%SZ")
        sig = signature(secret if secret is not None else KEYS[user], when)
        md += [("x-mq-date-time", when),
               ("authorization", f"MQv2-HMAC-SHA1 Credential={user}, "
                                 f"SignedHeaders=x-mq-date-time, Signature={sig}")]
    return md


T, G = pb.Resource(name="T"), pb.Resource(name="G")
MQ = pb.MessageQueue(topic=T, id=0, broker=pb.Broker(name="broker-a"))
# every RPC with a request that names topic T and group G
REQUESTS = {
    "QueryRoute": spb.QueryRouteRequest(topic=T),
    "Heartbeat": spb.HeartbeatRequest(group=G, client_type=pb.SIMPLE_CONSUMER),
    "SendMessage": spb.SendMessageRequest(messages=[pb.Message(
        topic=T, body=b"x", system_properties=pb.SystemProperties(
            message_id="01AUTHZ", body_encoding=pb.IDENTITY, message_type=pb.NORMAL))]),
    "QueryAssignment": spb.QueryAssignmentRequest(topic=T, group=G),
    "AckMessage": spb.AckMessageRequest(group=G, topic=T),
    "ForwardMessageToDeadLetterQueue": spb.ForwardMessageToDeadLetterQueueRequest(
        group=G, topic=T),
    "EndTransaction": spb.EndTransactionRequest(topic=T),
    "NotifyClientTermination": spb.NotifyClientTerminationRequest(group=G),
    "ChangeInvisibleDuration": spb.ChangeInvisibleDurationRequest(group=G, topic=T),
    "RecallMessage": spb.RecallMessageRequest(topic=T),
    "GetOffset": spb.GetOffsetRequest(group=G, message_queue=MQ),
    "QueryOffset": spb.QueryOffsetRequest(message_queue=MQ),
    "UpdateOffset": spb.UpdateOffsetRequest(group=G, message_queue=MQ, offset=0),
    "ReceiveMessage": spb.ReceiveMessageRequest(
        group=G, message_queue=MQ, batch_size=1,
        long_polling_timeout={"seconds": 0, "nanos": 1_000_000}),
    "PullMessage": spb.PullMessageRequest(group=G, message_queue=MQ, batch_size=1,
                                          long_polling_timeout={"nanos": 1_000_000}),
}
REQUESTS = {k: v for k, v in REQUESTS.items() if hasattr(spb, f"{k}Request")}
STREAMS = {"ReceiveMessage", "PullMessage"}
CALLERS = {"no credential": (None, None), "wrong secret": ("alice", "guess-1234"),
           "user without permission": ("bob", None), "allowed user": ("alice", None),
           "super user": ("root", None)}


def _codes(broker, method: str, caller: str) -> list[int]:
    with grpc.insecure_channel(broker.endpoint) as channel:
        call = getattr(service_pb2_grpc.MessagingServiceStub(channel), method)
        md = _metadata(*CALLERS[caller])
        if method in STREAMS:
            return [a.status.code for a in call(REQUESTS[method], timeout=30, metadata=md)
                    if a.HasField("status")]
        return [call(REQUESTS[method], timeout=30, metadata=md).status.code]


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("method", sorted(REQUESTS))
def test_every_rpc_by_every_kind_of_caller(broker, method, caller):
    codes = _codes(broker, method, caller)
    if caller in ("no credential", "wrong secret"):
        assert codes[:1] == [Code.UNAUTHORIZED]
    elif caller == "user without permission":
        assert codes[:1] == [Code.FORBIDDEN]
    else:                    # past both checks: whatever the request itself gets
        assert Code.UNAUTHORIZED not in codes and Code.FORBIDDEN not in codes, codes


def test_the_telemetry_settings_are_decided_too(broker):
    settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[T]))
    with grpc.insecure_channel(broker.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for user, code in (("bob", Code.FORBIDDEN), ("alice", Code.OK)):
            replies = stub.Telemetry(iter([spb.TelemetryCommand(settings=settings)]),
                                     timeout=10, metadata=_metadata(user))
            assert next(iter(replies)).status.code == code
            replies.cancel()


def test_the_official_client_end_to_end_and_acl_changes_apply_to_the_next_request(broker,
                                                                                clients):
    def conf(user):
        return ClientConfiguration(broker.endpoint, Credentials(user, KEYS[user]),
                                   request_timeout=5)
    producer = clients(Producer(conf("alice"), ("T2",)))
    sent = producer.send(msg("T2", b"allowed"))
    consumer = clients(SimpleConsumer(conf("alice"), "G", {"T2": FilterExpression()}))
    got = consumer.receive(1, 20)
    assert [m.message_id for m in got] == [sent.message_id]
    consumer.ack(got[0])
    # a Deny entry on the exact topic beats the Allow and applies at once
    _admin(broker, "acl", "update", "--subject", "User:alice", "--resources", "Topic:T2",
           "--actions", "Pub", "--decision", "Deny")
    try:
        before = broker.store.max_offset("T2", 0)
        with pytest.raises(Exception, match="40300|FORBIDDEN|may not"):
            producer.send(msg("T2", b"denied"))
        assert broker.store.max_offset("T2", 0) == before        # nothing stored
    finally:
        _admin(broker, "acl", "update", "--subject", "User:alice", "--resources", "Topic:T2",
               "--actions", "Pub,Sub,Get,Update")
    assert producer.send(msg("T2", b"allowed again")).message_id


def test_a_disabled_user_fails_authentication(broker):
    _admin(broker, "user", "update", "--username", "bob", "--user-status", "disable")
    try:
        assert _codes(broker, "QueryRoute", "user without permission") == [Code.UNAUTHORIZED]
    finally:
        _admin(broker, "user", "update", "--username", "bob", "--user-status", "enable")
    assert _codes(broker, "QueryRoute", "user without permission") == [Code.FORBIDDEN]


def test_admin_listings_never_show_passwords(broker):
    users = _admin(broker, "user", "list")
    assert {u["username"] for u in users} >= {"alice", "bob"}
    assert all(u["password"] == "******" for u in users)
    acls = _admin(broker, "acl", "list", "--filter", "alice")
    assert [a["subject"] for a in acls] == ["User:alice"]


def test_authorization_needs_authentication(tmp_path):
    with pytest.raises(InvalidConfigError, match="needs authenticationEnabled"):
        Broker(broker_config(tmp_path, authorizationEnabled="true")).start()


def _admin_status(broker, headers) -> int:
    import urllib.error
    import urllib.request
    req = urllib.request.Request(broker.admin_url + "/status", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("user, secret, expected", [
    ("root", None, 200),                 # the configured super user
    ("carol", None, 200),                # a stored Super user
    ("alice", None, 401),                # a normal user is not an admin
    ("root", "wrong-secret-1", 401),
])
def test_an_acl_super_user_may_use_the_admin_endpoint_instead_of_the_token(
        broker, user, secret, expected):
    if user == "carol" and "carol" not in broker.store.state.users:
        _admin(broker, "user", "create", "--username", "carol", "--password",
               "carol-secret-key", "--user-type", "Super")
    keys = {**KEYS, "carol": "carol-secret-key"}
    md = dict(_metadata(user, secret if secret is not None else keys[user])[1:])
    assert _admin_status(broker, md) == expected


def test_a_plain_send_read_without_upb_is_decided_by_its_topic(broker):
    """A plain SendMessage of ``MIN_MESSAGES`` or more is read from the client's bytes,
    not by upb (plainsend.PlainRequest): its topic is still what authorization decides,
    and a refused request stores nothing."""
    from sparkmq.broker import plainsend
    from sparkmq.broker.grpc_service import request_reader

    def message(i):
        s = pb.SystemProperties(message_id=f"01PLAIN{i}", message_type=pb.NORMAL,
                                born_host="10.0.0.1")
        s.born_timestamp.seconds = 1_700_000_000
        return pb.Message(topic=T, body=b"x", system_properties=s)
    request = spb.SendMessageRequest(messages=[message(i) for i in
                                               range(plainsend.MIN_MESSAGES)])
    assert isinstance(request_reader("SendMessage")(request.SerializeToString()),
                      plainsend.PlainRequest)
    before = broker.store.max_offset("T", 0)
    with grpc.insecure_channel(broker.endpoint) as channel:
        send = service_pb2_grpc.MessagingServiceStub(channel).SendMessage
        for caller, code in (("no credential", Code.UNAUTHORIZED),
                             ("user without permission", Code.FORBIDDEN)):
            assert send(request, timeout=30, metadata=_metadata(*CALLERS[caller])
                        ).status.code == code
            assert broker.store.max_offset("T", 0) == before
        assert send(request, timeout=30, metadata=_metadata("alice")).status.code == Code.OK
    assert broker.store.max_offset("T", 0) == before + plainsend.MIN_MESSAGES
