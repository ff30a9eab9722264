"""In-process brokers for tests: a ``BrokerConfig`` on free 127.0.0.1 ports with a
store under the test's ``tmp_path``. The ``make_broker``, ``clients`` and
``tx_broker`` fixtures (conftest.py) start brokers and clients and stop them."""
from __future__ import annotations

import datetime as dt
import logging

from rocketmq import ClientConfiguration, Credentials, Message

from helpers.net import free_port
from sparkmq.broker import Broker, BrokerConfig
from sparkmq.broker.authn import signature


def broker_config(tmp_path, name="broker-a", **props) -> BrokerConfig:
    base = {"brokerName": name, "storePathRootDir": str(tmp_path / name),
            "listenPort": str(free_port()), "adminPort": str(free_port()),
            "flushDiskType": "SYNC_FLUSH", "autoCreateTopicEnable": "true",
            "defaultTopicQueueNums": "2", "flushConsumerOffsetInterval": "500"}
    base.update({k: str(v) for k, v in props.items()})
    return BrokerConfig.from_properties(base)


def tls_props(pair: tuple[str, str]) -> dict:
    """Broker properties serving TLS only (gRPC and Flight) with the (cert, key) ``pair``
    (the ``tls_pair`` fixture: a self-signed pair for 127.0.0.1 and localhost)."""
    return {"tlsServerMode": "enforcing", "tlsServerCertPath": pair[0],
            "tlsServerKeyPath": pair[1]}


def client_conf(broker: Broker) -> ClientConfiguration:
    """The official client's configuration for ``broker``'s gRPC endpoint (5 s timeout)."""
    return ClientConfiguration(broker.endpoint, Credentials(), request_timeout=5)


def msg(topic, body, tag=None, keys=None) -> Message:
    """An official-client ``Message`` with the given body and optional tag and keys."""
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    if keys:
        m.keys = keys
    return m


class GrpcContext:
    """What the broker's SendMessage asks of a gRPC context, for calling a servicer in
    process: the client id header, the peer, and callbacks run after the reply."""

    def __init__(self, client_id: str = "client-1"):
        self.client_id = client_id
        self.callbacks = []

    def invocation_metadata(self):
        return (("x-mq-client-id", self.client_id),)

    def peer(self):
        return "ipv4:127.0.0.1:1"

    def add_callback(self, fn):
        self.callbacks.append(fn)
        return True


def sends_on_the_loop(broker, monkeypatch, producer, blocking: str) -> None:
    """A plain, a rich and a batch send through ``producer`` (sparkmq's, over gRPC) are
    acknowledged without any thread blocking in ``broker.ha_service.<blocking>`` (the
    wait a worker would make): they await their replicas on the gRPC loop."""
    from sparkmq.client import Message as CMessage
    from sparkmq.client.core import Code

    def blocked(*args, **kw):
        raise AssertionError(f"a gRPC send blocked a thread in {blocking}")
    monkeypatch.setattr(broker.ha_service, blocking, blocked)
    sent = [producer.send(CMessage("T", b"plain")),
            producer.send(CMessage("T", b"rich", tag="A", keys=["k"], properties={"p": "1"})),
            *producer.send_batch([CMessage("T", b"b%d" % i) for i in range(5)])]
    assert all(r.status_code == Code.OK and r.transport == "grpc" for r in sent)


def signed_headers(ak: str | None, sk: str | None) -> list[tuple[str, str]]:
    """The headers an official client signs a request with for access key ``ak`` and
    secret ``sk`` (``x-mq-date-time`` and ``authorization``); none when ``ak`` is None."""
    if ak is None:
        return []
    when = dt.datetime.now().strftime("%Y%m%dT%H%M%SZ")
    return [("x-mq-date-time", when),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={ak}, "
                              f"SignedHeaders=x-mq-date-time, Signature={signature(sk, when)}")]


class ErrorRecords(logging.Handler):
    """The ERROR records logged while it is attached (``records``)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)
