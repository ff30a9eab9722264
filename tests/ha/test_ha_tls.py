"""TLS on the HA link (issue 13 item 6): a replica follows a TLS master byte for byte
across segment rolls while the master reads acks and streams at once (one TLS
connection, two threads); a plaintext replica, or one that does not trust the
master's certificate, gets nothing."""
from __future__ import annotations

import os

import pytest

from helpers.storetools import segment_paths
from helpers.waiting import wait_until
from sparkmq import Message, Store
from sparkmq.broker import Broker
from sparkmq.errors import InvalidConfigError
from sparkmq.ha.master import HAService
from sparkmq.ha.replica import HAClient, ReplicaLog
from sparkmq.ha.tlslink import client_context, server_context
from sparkmq.log.status import PutMessageStatus
from sparkmq.tls import make_self_signed

from helpers.brokers import broker_config
from helpers.net import free_port

pytestmark = [pytest.mark.integration]

SECRET = "s3cret-for-tls-tests"
OPTS = {"mappedFileSizeCommitLog": 64 << 10}


@pytest.fixture
def tls(tmp_path):
    return make_self_signed(str(tmp_path / "tls"), ["127.0.0.1"])


@pytest.fixture
def master(tmp_path, tls):
    store = Store.open(str(tmp_path / "master"), **OPTS)
    ha = HAService(store, broker_name="broker-a", secret=SECRET,
                   ssl_context=server_context(*tls)).start()
    yield store, ha
    ha.stop()
    store.close()


@pytest.fixture
def follow(tmp_path):
    started = []

    def start(ha, ssl_context, name="replica"):
        store = Store.open(str(tmp_path / name), replica=True, **OPTS)
        client = HAClient(ReplicaLog(store), broker_name="broker-a", broker_id=1,
                          secret=SECRET, master_address=lambda: f"127.0.0.1:{ha.port}",
                          ssl_context=ssl_context).start()
        started.append((client, store))
        return client, store
    yield start
    for client, store in reversed(started):
        client.stop()
        store.close()


def _send(store, n, start=0):
    for i in range(start, start + n, 50):
        store.append([Message("T", f"m{j}".encode() * 40, keys=[f"k{j}"])
                      for j in range(i, min(i + 50, start + n))])


def test_a_replica_follows_a_tls_master_byte_for_byte(master, follow, tls, tmp_path):
    store, ha = master
    store.create_topic("T", read_queue_nums=2, write_queue_nums=2)
    _send(store, 600)                          # several 64 KiB segments before it joins
    client, replica = follow(ha, client_context(tls[0]))
    wait_until(lambda: client.rlog.offset == store.commitlog.written_offset, "catch-up")
    _send(store, 600, start=600)               # and more while it follows (acks meanwhile)
    assert ha.wait_replicated(store.commitlog.written_offset, 20_000) is PutMessageStatus.PUT_OK
    wait_until(lambda: client.rlog.offset == store.commitlog.written_offset, "the rest")
    ours = segment_paths(str(tmp_path / "master"))
    theirs = segment_paths(str(tmp_path / "replica"))
    assert len(ours) > 3 and [os.path.basename(p) for p in ours] == \
        [os.path.basename(p) for p in theirs]
    for a, b in zip(ours, theirs):
        assert open(a, "rb").read() == open(b, "rb").read()


def test_a_plaintext_replica_gets_nothing_from_a_tls_master(master, follow):
    store, ha = master
    store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    _send(store, 50)
    client, _ = follow(ha, None)
    wait_until(lambda: client.last_error is not None, "the replica's failure")
    assert client.rlog.offset == 0 and not client.connected


def test_a_replica_that_does_not_trust_the_certificate_refuses_the_master(master, follow,
                                                                          tmp_path):
    store, ha = master
    store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    _send(store, 50)
    other_cert, _ = make_self_signed(str(tmp_path / "other"), ["127.0.0.1"])
    client, _ = follow(ha, client_context(other_cert))
    wait_until(lambda: client.last_error is not None, "the replica's failure")
    assert "certificate" in client.last_error.lower() and client.rlog.offset == 0


def test_a_tls_master_needs_its_certificate_and_key(tmp_path):
    with pytest.raises(InvalidConfigError, match="haTlsCertPath"):
        Broker(broker_config(tmp_path, haListenPort=str(free_port()), haSecret=SECRET,
                             haTlsEnable="true")).start().stop()


def test_brokers_replicate_over_tls_with_sync_master_acks(tmp_path, tls):
    from sparkmq.broker import BrokerConfig
    from sparkmq.client import Message as CMessage, Producer
    cert, key = tls
    common = {"brokerClusterName": "C", "brokerName": "broker-a", "listenPort": "0",
              "adminPort": "0", "haSecret": SECRET, "flushDiskType": "ASYNC_FLUSH",
              "syncFlushTimeout": "5000", "autoCreateTopicEnable": "true",
              "haTlsEnable": "true", "haTlsCertPath": cert, "haTlsKeyPath": key,
              "haTlsCaPath": cert}
    master = Broker(BrokerConfig.from_properties({
        **common, "brokerRole": "SYNC_MASTER", "brokerId": "0",
        "haListenPort": str(free_port()), "storePathRootDir": str(tmp_path / "bm")})).start()
    replica = None
    try:
        replica = Broker(BrokerConfig.from_properties({
            **common, "brokerRole": "SLAVE", "brokerId": "1",
            "haMasterAddress": f"127.0.0.1:{master.ha_service.port}",
            "storePathRootDir": str(tmp_path / "br")})).start()
        master.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        wait_until(lambda: master.ha_service.replicas(), "the replica to attach over TLS")
        with Producer(master.endpoint, max_retries=0) as p:
            for i in range(20):      # SYNC_MASTER: each answered after the replica's ack
                p.send(CMessage("T", f"tls-{i}".encode()))
        assert replica.replica_log.offset >= master.store.commitlog.written_offset
        wait_until(lambda: len(replica.store.read("T", 0, 0, 50)) == 20, "dispatch")
    finally:
        if replica is not None:
            replica.stop()
        master.stop()
