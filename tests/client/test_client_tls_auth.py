"""sparkmq's clients against a broker that asks for TLS and credentials (issue 16, trust
items): the Producer and PullConsumer send and pull over Flight with TLS (the roots of
their gRPC TLS settings) and signed calls; the SimpleConsumer and PushConsumer take
credentials (and TLS) like them; a client without them is refused, not served."""
from __future__ import annotations

import threading

import pytest

from helpers.brokers import broker_config, tls_props
from helpers.net import free_port
from helpers.waiting import wait_until
from sparkmq.broker import Broker
from sparkmq.client import (BrokerUnavailableError, ClientError, ConsumeResult, Message,
                            Producer, PullConsumer, PushConsumer, SimpleConsumer)
from sparkmq.client.core import ClientTLS
from sparkmq.errors import InvalidConfigError
from sparkmq.tls import make_self_signed

pytestmark = pytest.mark.integration

ROOT = ("root", "root-secret")


@pytest.fixture(scope="module")
def broker(tmp_path_factory, tls_pair):
    """tlsServerMode=enforcing, Flight on, credentials required."""
    b = Broker(broker_config(tmp_path_factory.mktemp("clienttls"), flightEnable="true",
                             flightPort=free_port(), **tls_props(tls_pair),
                             authenticationEnabled="true",
                             initAuthenticationUser='{"username": "root", '
                                                    '"password": "root-secret"}')).start()
    yield b
    b.stop()


def test_producer_and_pull_consumer_over_flight_with_tls(broker, tls_pair, closing):
    broker.store.create_topic("FT", read_queue_nums=1, write_queue_nums=1)
    p = closing(Producer(broker.endpoint, transport="flight", credentials=ROOT,
                         tls=tls_pair[0]))
    receipts = p.send_batch([Message("FT", b"a"), Message("FT", b"b")])
    assert {r.transport for r in receipts} == {"flight"}
    assert p.send(Message("FT", b"c")).transport == "flight"
    assert p.sent_over == {"flight": 3, "grpc": 0}
    pc = closing(PullConsumer(broker.endpoint, "GFT", transport="flight", credentials=ROOT,
                              tls=tls_pair[0]))
    (q,) = pc.queues("FT")
    msgs, nxt = pc.pull(q, 0, max_messages=10)
    assert [m.body for m in msgs] == [b"a", b"b", b"c"] and nxt == 3
    assert pc.pulled_over == {"flight": 3, "grpc": 0}
    pc.commit_offset(q, nxt)
    assert broker.store.consumer_offsets("GFT") == {("FT", 0): 3}


def test_auto_takes_flight_over_tls_too(broker, tls_pair, closing):
    p = closing(Producer(broker.endpoint, credentials=ROOT, tls=ClientTLS.of(tls_pair[0])))
    assert p.send(Message("FA", b"x")).transport == "flight"


def test_a_client_without_tls_or_trust_is_refused(broker, tls_pair, tmp_path, closing):
    plain = closing(Producer(broker.endpoint, credentials=ROOT, max_retries=0,
                             request_timeout_s=5))
    with pytest.raises(BrokerUnavailableError):
        plain.send(Message("FT", b"in the clear"))
    other_cert, _ = make_self_signed(str(tmp_path), ["127.0.0.1"])
    untrusting = closing(Producer(broker.endpoint, credentials=ROOT, tls=other_cert,
                                  max_retries=0, request_timeout_s=5))
    with pytest.raises(BrokerUnavailableError):
        untrusting.send(Message("FT", b"to whom?"))
    with pytest.raises(InvalidConfigError, match="cannot read"):
        Producer(broker.endpoint, tls=str(tmp_path / "missing.pem"))


def test_simple_consumer_takes_credentials(broker, tls_pair, closing):
    broker.store.create_topic("ST", read_queue_nums=1, write_queue_nums=1)
    closing(Producer(broker.endpoint, credentials=ROOT, tls=tls_pair[0])).send(
        Message("ST", b"for a signed consumer"))
    anonymous = closing(SimpleConsumer(broker.endpoint, "GS", {"ST": "*"}, tls=tls_pair[0]))
    with pytest.raises(ClientError, match="UNAUTHORIZED"):
        anonymous.receive(wait_s=0)
    c = closing(SimpleConsumer(broker.endpoint, "GS", {"ST": "*"}, credentials=ROOT,
                               tls=tls_pair[0]))
    got = []
    wait_until(lambda: got.extend(c.receive(wait_s=2)) or got, "a signed receive")
    assert [m.body for m in got] == [b"for a signed consumer"]
    c.ack(got[0])


def test_push_consumer_takes_credentials(broker, tls_pair, closing):
    broker.store.create_topic("PT", read_queue_nums=1, write_queue_nums=1)
    seen, lock = [], threading.Lock()

    def listener(m):
        with lock:
            seen.append(m.body)
        return ConsumeResult.SUCCESS
    closing(PushConsumer(broker.endpoint, "GP", {"PT": "*"}, listener, credentials=ROOT,
                         tls=tls_pair[0], wait_s=1))
    closing(Producer(broker.endpoint, credentials=ROOT, tls=tls_pair[0])).send_batch(
        [Message("PT", b"p1"), Message("PT", b"p2")])
    wait_until(lambda: len(seen) == 2, "both messages consumed")
    assert sorted(seen) == [b"p1", b"p2"]


def test_client_tls_settings_are_checked():
    assert ClientTLS.of(False) is None and ClientTLS.of(None) is None
    assert ClientTLS.of(True) == ClientTLS(None)
    with pytest.raises(InvalidConfigError, match="not PEM"):
        ClientTLS.of(b"not a certificate")
    with pytest.raises(InvalidConfigError, match="PEM file path"):
        ClientTLS.of(42)
