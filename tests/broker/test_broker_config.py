"""Broker configuration: RocketMQ-style properties files, shipped conf/ examples."""
from __future__ import annotations

from pathlib import Path

import pytest

from sparkmq.broker.config import BrokerConfig
from sparkmq.properties import load_properties, parse_properties
from sparkmq.errors import InvalidConfigError

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_parse_properties_comments_separators_and_errors():
    props = parse_properties("# c\n! also\n\na=1\nb : two words \nc=x=y\n")
    assert props == {"a": "1", "b": "two words", "c": "x=y"}
    with pytest.raises(InvalidConfigError, match="line|expected"):
        parse_properties("no separator here\n", source="f")


def test_shipped_conf_is_a_two_group_cluster():
    a = BrokerConfig.from_file(str(CONF / "broker-a.properties"))
    b = BrokerConfig.from_file(str(CONF / "broker-b.properties"))
    assert (a.cluster_name, a.broker_name, b.broker_name) == ("DefaultCluster", "broker-a", "broker-b")
    assert a.listen_port != b.listen_port and a.admin_port != b.admin_port
    assert a.store_path != b.store_path and a.namesrv_addr == b.namesrv_addr
    sc = a.store_config
    assert sc.flush_disk_type == "SYNC_FLUSH" and sc.max_message_size_bytes == 4 << 20
    assert sc.auto_create_topic is True and sc.file_reserved_time_hours == 72
    assert a.max_delivery_attempts == 17 and a.is_master
    assert load_properties(str(CONF / "namesrv.properties"))["listenPort"] == "9876"


def test_shipped_replica_conf_follows_broker_a_and_can_run_beside_both_groups():
    a = BrokerConfig.from_file(str(CONF / "broker-a.properties"))
    b = BrokerConfig.from_file(str(CONF / "broker-b.properties"))
    s = BrokerConfig.from_file(str(CONF / "broker-a-s.properties"))
    assert (s.broker_name, s.broker_id, s.is_master) == ("broker-a", 1, False)
    assert s.ha_master_address == f"127.0.0.1:{a.ha_listen_port}" and s.ha_secret_file == a.ha_secret_file
    ports = [c.listen_port for c in (a, b, s)] + [c.admin_port for c in (a, b, s)] + \
        [a.ha_listen_port, s.ha_listen_port]
    assert len(set(ports)) == len(ports), f"shipped configs share a port: {ports}"
    assert len({a.store_path, b.store_path, s.store_path}) == 3


def test_store_options_pass_through_and_validation():
    c = BrokerConfig.from_properties({"brokerName": "x", "listenPort": "1", "adminPort": "2",
                                      "flushDiskType": "ASYNC_FLUSH", "maxMessageSize": "100"})
    assert c.store_config.max_message_size_bytes == 100 and c.endpoint == "127.0.0.1:1"
    with pytest.raises(InvalidConfigError, match="brokerRole"):
        BrokerConfig.from_properties({"brokerRole": "BOSS"})
    with pytest.raises(InvalidConfigError, match="listenPort"):
        BrokerConfig.from_properties({"listenPort": "eighty"})
    with pytest.raises(InvalidConfigError, match="flushDiskType"):
        BrokerConfig.from_properties({"flushDiskType": "SOMETIMES"})
    with pytest.raises(InvalidConfigError, match="cannot read"):
        load_properties("/nonexistent/broker.properties")


@pytest.mark.parametrize("host", ["10.1.2.3", "0.0.0.0", "broker-a.example.com", "::"])
def test_a_broker_on_a_network_address_needs_authentication(host):
    """Safe by default: a client port other machines reach is refused without
    authenticationEnabled, naming both ways out; loopback needs nothing."""
    base = {"brokerName": "x", "brokerIP1": host}
    with pytest.raises(InvalidConfigError, match="without authentication.*authenticationEnabled"
                                                 ".*allowAnonymousNetworkAccess"):
        BrokerConfig.from_properties(base)
    user = '{"username": "root", "password": "12345678"}'
    assert BrokerConfig.from_properties({**base, "authenticationEnabled": "true",
                                         "initAuthenticationUser": user}).host == host
    assert BrokerConfig.from_properties({**base, "allowAnonymousNetworkAccess": "true"}).host == host
    for local in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert BrokerConfig.from_properties({"brokerName": "x", "brokerIP1": local}).host == local


@pytest.mark.parametrize("secret", ["change-me-shared-by-broker-a-and-its-replicas",
                                    "CHANGEME", "short-secret"])
def test_placeholder_and_short_ha_secrets_are_refused_at_start(secret):
    for props in ({"haListenPort": "10912"},                       # a master
                  {"brokerRole": "SLAVE", "brokerId": "1", "haMasterAddress": "h:1"}):
        with pytest.raises(InvalidConfigError, match="haSecret.*(placeholder|at least 16)"):
            BrokerConfig.from_properties({**props, "haSecret": secret})


def test_ha_secret_file_is_made_private_once_and_shared(tmp_path):
    import os
    import stat
    path = tmp_path / "broker-a.ha-secret"
    master = BrokerConfig.from_properties({"haListenPort": "10912", "haSecretFile": str(path)})
    replica = BrokerConfig.from_properties({"brokerRole": "SLAVE", "brokerId": "1",
                                            "haMasterAddress": "h:1", "haSecretFile": str(path)})
    secret = master.resolved_ha_secret()
    assert len(secret) >= 32 and replica.resolved_ha_secret() == secret
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    path.write_text("change-me\n")
    with pytest.raises(InvalidConfigError, match="placeholder"):
        master.resolved_ha_secret()
