"""TLS on the RocketMQ gRPC service (issue 13 item 6): tlsServerMode=enforcing serves
only TLS; the official Python client connects with TLS + credentials + an ACL; bad
TLS settings fail at start with what to do."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.grpc_protocol.definition_pb2 import Code

from sparkmq.auth import meta
from sparkmq.broker import Broker
from sparkmq.errors import InvalidConfigError
from sparkmq.tls import make_self_signed

from helpers.brokers import broker_config, tls_props

pytestmark = pytest.mark.integration

ROOT = '{"username": "root", "password": "root-secret-key"}'


@pytest.fixture(scope="module")
def broker(tmp_path_factory, tls_pair):
    b = Broker(broker_config(tmp_path_factory.mktemp("tlsbroker"), **tls_props(tls_pair),
                             authenticationEnabled="true", authorizationEnabled="true",
                             initAuthenticationUser=ROOT)).start()
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    meta.create_user(b.store, "app", "app-secret-key")
    meta.set_acl(b.store, "app", [{"entries": [
        {"resource": "Topic:T", "actions": ["Pub", "Sub"]},
        {"resource": "Group:G", "actions": ["Sub"]}]}], create=True)
    yield b
    b.stop()


def test_plaintext_is_refused_and_tls_with_the_certificate_is_served(broker, tls_pair):
    request = spb.QueryRouteRequest(topic=pb.Resource(name="T"))
    with grpc.insecure_channel(broker.endpoint) as channel:
        with pytest.raises(grpc.RpcError) as err:
            service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    roots = open(tls_pair[0], "rb").read()
    with grpc.secure_channel(broker.endpoint, grpc.ssl_channel_credentials(roots)) as channel:
        reply = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(request, timeout=5)
    assert reply.status.code == Code.UNAUTHORIZED     # TLS works; credentials still needed


CLIENT = textwrap.dedent("""
    import json, sys
    from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,
                          Producer, SimpleConsumer)
    endpoint, user, key = sys.argv[1:4]
    conf = ClientConfiguration(endpoint, Credentials(user, key), request_timeout=5)
    producer = Producer(conf, ("T",), tls_enable=True)
    producer.startup()
    m = Message()
    m.topic, m.body = "T", b"over tls"
    sent = producer.send(m)
    consumer = SimpleConsumer(conf, "G", {"T": FilterExpression()}, tls_enable=True)
    consumer.startup()
    got = consumer.receive(1, 20)
    for x in got:
        consumer.ack(x)
    print(json.dumps({"sent": sent.message_id, "got": [x.message_id for x in got],
                      "bodies": [x.body.decode() for x in got]}))
    consumer.shutdown()
    producer.shutdown()
""")


def test_the_official_client_with_tls_credentials_and_acl(broker, tls_pair):
    # the official client uses gRPC's default trust store: point it at the certificate
    env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": tls_pair[0]}
    out = subprocess.run([sys.executable, "-c", CLIENT, broker.endpoint, "app",
                          "app-secret-key"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["got"] == [result["sent"]] and result["bodies"] == ["over tls"]


@pytest.mark.parametrize("props, words", [
    ({"tlsServerMode": "enforcing"}, "needs tlsServerCertPath"),
    ({"tlsServerMode": "permissive"}, "disabled or enforcing"),
    ({"tlsServerMode": "enforcing", "tlsServerCertPath": "/nonexistent.crt",
      "tlsServerKeyPath": "/nonexistent.key"}, "cannot read the TLS certificate"),
])
def test_bad_tls_settings_fail_at_start_with_what_to_do(tmp_path, props, words):
    with pytest.raises(InvalidConfigError, match=words):
        Broker(broker_config(tmp_path, **props)).start()


def test_a_key_that_is_not_the_certificates_is_refused(tmp_path, tls_pair):
    other_cert, other_key = make_self_signed(str(tmp_path / "other"), ["127.0.0.1"])
    with pytest.raises(InvalidConfigError, match="do not load as a pair"):
        Broker(broker_config(tmp_path, tlsServerMode="enforcing",
                             tlsServerCertPath=tls_pair[0], tlsServerKeyPath=other_key)).start()
