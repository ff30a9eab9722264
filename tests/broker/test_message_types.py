"""Topic message types (issue 14 item 2): RocketMQ 5's ``message.type`` topic attribute,
set by ``sparkmq admin topic create --message-type``, returned by QueryRoute
(``accept_message_types``) and checked on send as the proxy checks it
(``enableTopicMessageTypeCheck``); a topic without it takes every type."""
from __future__ import annotations

import json
import time

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.definition_pb2 import Code
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from sparkmq.admin import main as admin_main
from sparkmq.log.topics import message_type_attributes

pytestmark = pytest.mark.integration
META = [("x-mq-client-id", "types-test")]
_ID = iter(range(10**6))


def _message(topic: str, kind: str) -> pb.Message:
    sp = pb.SystemProperties(message_id=f"0A{next(_ID):030d}", body_encoding=pb.IDENTITY,
                             message_type=getattr(pb, kind))
    if kind == "FIFO":
        sp.message_group = "g1"
    if kind == "DELAY":
        sp.delivery_timestamp.CopyFrom(Timestamp(seconds=int(time.time()) + 60))
    return pb.Message(topic=pb.Resource(name=topic), body=b"x", system_properties=sp)


def _send(stub, topic: str, kind: str) -> int:
    r = stub.SendMessage(spb.SendMessageRequest(messages=[_message(topic, kind)]), timeout=10,
                         metadata=META)
    return r.entries[0].status.code if r.entries else r.status.code


@pytest.fixture
def typed(make_broker):
    def make(**props):
        b = make_broker(autoCreateTopicEnable="false", **props)
        for name, t in (("F", "FIFO"), ("D", "DELAY"), ("N", "NORMAL"), ("M", "MIXED")):
            b.store.create_topic(name, read_queue_nums=1, write_queue_nums=1,
                                 attributes=message_type_attributes(t))
        b.store.create_topic("Plain", read_queue_nums=1, write_queue_nums=1)
        return b
    return make


KINDS = ("NORMAL", "FIFO", "DELAY", "TRANSACTION")


def test_sends_are_checked_against_the_topics_type(typed):
    b = typed()
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        for topic, accepted in (("F", {"FIFO"}), ("D", {"DELAY"}), ("N", {"NORMAL"}),
                                ("M", set(KINDS)), ("Plain", set(KINDS))):
            for kind in KINDS:
                code = _send(stub, topic, kind)
                if kind in accepted:
                    assert code == Code.OK, (topic, kind, code)
                else:
                    assert code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, (topic, kind)


def test_query_route_names_the_accepted_types(typed):
    b = typed()
    with grpc.insecure_channel(b.endpoint) as channel:
        stub = MessagingServiceStub(channel)
        for topic, types in (("F", [pb.FIFO]), ("D", [pb.DELAY]),
                             ("Plain", [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION])):
            r = stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=topic)),
                                timeout=10, metadata=META)
            assert list(r.message_queues[0].accept_message_types) == types


def test_the_check_can_be_turned_off_as_on_the_proxy(typed):
    b = typed(enableTopicMessageTypeCheck="false")
    with grpc.insecure_channel(b.endpoint) as channel:
        assert _send(MessagingServiceStub(channel), "F", "NORMAL") == Code.OK


def test_admin_creates_typed_topics_and_lists_their_type(make_broker, capsys):
    b = make_broker()
    base = ["--broker", b.admin_url, f"--token={b.admin_token}", "--json"]
    assert admin_main([*base, "topic", "create", "Orders", "--queues", "2",
                       "--message-type", "fifo"]) == 0
    assert json.loads(capsys.readouterr().out)["messageType"] == "FIFO"
    assert admin_main(["--store", b.config.store_path, "--json", "topic", "list"]) == 0
    listed = {r["topic"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["Orders"]["messageType"] == "FIFO"
    with grpc.insecure_channel(b.endpoint) as channel:
        assert _send(MessagingServiceStub(channel), "Orders", "NORMAL") == \
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
