"""Authentication of gRPC clients as the official RocketMQ 5 clients sign requests
(issue 13 item 1): with authenticationEnabled=true every RPC without a valid
credential gets UNAUTHORIZED before the request is looked at; the official Python
client with the right access key and secret key sends and receives."""
from __future__ import annotations


import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, Producer, SimpleConsumer
from rocketmq import FilterExpression
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.grpc_protocol.definition_pb2 import Code

from sparkmq.broker import Broker
from sparkmq.errors import InvalidConfigError

from helpers.brokers import broker_config, msg, signed_headers

pytestmark = pytest.mark.integration

USER = '{"username": "alice", "password": "alice-secret-key"}'

# every unary RPC of the MessagingService, with the request type it takes
UNARY = {name: getattr(spb, f"{name}Request") for name in (
    "QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "AckMessage",
    "ForwardMessageToDeadLetterQueue", "EndTransaction", "NotifyClientTermination",
    "ChangeInvisibleDuration", "RecallMessage", "GetOffset", "QueryOffset", "UpdateOffset")
    if hasattr(spb, f"{name}Request")}
STREAMS = {name: getattr(spb, f"{name}Request") for name in ("ReceiveMessage", "PullMessage")
           if hasattr(spb, f"{name}Request")}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Broker(broker_config(tmp_path_factory.mktemp("authn"), authenticationEnabled="true",
                             initAuthenticationUser=USER)).start()
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    yield b
    b.stop()


def _metadata(ak: str | None, sk: str | None) -> list[tuple[str, str]]:
    return [("x-mq-client-id", "authn-test"), *signed_headers(ak, sk)]


CREDENTIALS = {"none": (None, None), "empty": ("", ""), "wrong secret": ("alice", "guess-123"),
               "unknown user": ("mallory", "alice-secret-key"),
               "allowed": ("alice", "alice-secret-key")}


def _statuses(broker, method: str, request_type, cred: str) -> list[int]:
    with grpc.insecure_channel(broker.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        call = getattr(stub, method)
        md = _metadata(*CREDENTIALS[cred])
        if method in STREAMS:
            answers = list(call(request_type(), timeout=30, metadata=md))
            return [a.status.code for a in answers if a.HasField("status")]
        return [call(request_type(), timeout=30, metadata=md).status.code]


@pytest.mark.parametrize("cred", sorted(CREDENTIALS))
@pytest.mark.parametrize("method", sorted({**UNARY, **STREAMS}))
def test_every_rpc_needs_a_valid_credential(broker, method, cred):
    codes = _statuses(broker, method, {**UNARY, **STREAMS}[method], cred)
    if cred == "allowed":
        assert Code.UNAUTHORIZED not in codes          # past authentication (other checks)
    else:
        assert codes[:1] == [Code.UNAUTHORIZED]


def test_the_telemetry_stream_needs_a_valid_credential(broker):
    with grpc.insecure_channel(broker.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Telemetry(iter([]), timeout=10, metadata=_metadata(None, None)))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_official_client_with_credentials_sends_and_receives(broker, clients):
    conf = ClientConfiguration(broker.endpoint, Credentials("alice", "alice-secret-key"),
                               request_timeout=5)
    producer = clients(Producer(conf, ("T",)))
    sent = producer.send(msg("T", b"signed"))
    consumer = clients(SimpleConsumer(conf, "GA", {"T": FilterExpression()}))
    got = consumer.receive(1, 20)
    assert [m.body for m in got] == [b"signed"] and got[0].message_id == sent.message_id
    consumer.ack(got[0])


def test_the_official_client_with_a_wrong_secret_is_refused(broker, caplog):
    conf = ClientConfiguration(broker.endpoint, Credentials("alice", "not-the-key"),
                               request_timeout=5)
    producer = Producer(conf, ("T",))
    try:
        with pytest.raises(Exception):
            producer.startup()
            producer.send(msg("T", b"forged"))
        # the client logs the broker's answer: 40100 (UNAUTHORIZED) and why
        assert "40100" in caplog.text and "wrong access key or secret key" in caplog.text
    finally:
        try:
            producer.shutdown()
        except Exception:     # noqa: BLE001 (a refused client may fail to shut down cleanly)
            pass
    assert broker.store.max_offset("T", 0) <= 1        # nothing stored by it


@pytest.mark.parametrize("user", ["", "{}", '{"username": "a", "password": "short"}'])
def test_enabling_authentication_needs_an_initial_user(tmp_path, user):
    with pytest.raises(InvalidConfigError, match="initAuthenticationUser"):
        Broker(broker_config(tmp_path, authenticationEnabled="true",
                             initAuthenticationUser=user)).start()


def test_with_authentication_off_no_rpc_reads_the_headers(make_broker):
    # grpc.aio builds a call's headers anew for each invocation_metadata() (~8 us): with
    # nothing to check, a send does not ask for them. (The general path reads the client
    # id, lazily, for a message that needs it; a plain send needs none.)
    from rocketmq.grpc_protocol import definition_pb2 as pb

    from helpers.brokers import GrpcContext
    from sparkmq.broker.grpc_service import MessagingServicer

    class Unread(GrpcContext):
        def invocation_metadata(self):
            raise AssertionError("the headers were read")

        def send_initial_metadata(self, metadata):   # (QueryRoute's Flight endpoint)
            self.sent = metadata

    b = make_broker(autoCreateTopicEnable="true")
    m = pb.Message(topic=pb.Resource(name="quiet"), body=b"x")
    m.system_properties.message_id = "01" + "0" * 30
    m.system_properties.born_host = "10.0.0.1"
    m.system_properties.born_timestamp.FromMilliseconds(1_700_000_000_000)
    m.system_properties.message_type = pb.NORMAL
    resp = MessagingServicer(b).send_message(spb.SendMessageRequest(messages=[m]), Unread())
    assert resp.status.code == Code.OK, resp.status
    route = MessagingServicer(b).QueryRoute(spb.QueryRouteRequest(
        topic=pb.Resource(name="quiet")), Unread())
    assert route.status.code == Code.OK, route.status
