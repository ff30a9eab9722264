"""In-process brokers for tests: a ``BrokerConfig`` on free 127.0.0.1 ports with a
store under the test's ``tmp_path``. The ``make_broker``, ``clients`` and
``tx_broker`` fixtures (conftest.py) start brokers and clients and stop them."""
from __future__ import annotations

from conftest import free_port
from sparkmq.broker import BrokerConfig


def broker_config(tmp_path, name="broker-a", **props) -> BrokerConfig:
    base = {"brokerName": name, "storePathRootDir": str(tmp_path / name),
            "listenPort": str(free_port()), "adminPort": str(free_port()),
            "flushDiskType": "SYNC_FLUSH", "autoCreateTopicEnable": "true",
            "defaultTopicQueueNums": "2", "flushConsumerOffsetInterval": "500"}
    base.update({k: str(v) for k, v in props.items()})
    return BrokerConfig.from_properties(base)
