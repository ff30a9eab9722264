"""Topic/group name rules and the RocketMQ-named store configuration."""
from __future__ import annotations

import pytest

from sparkmq.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from sparkmq.errors import InvalidConfigError, InvalidNameError, UserError
from sparkmq.log.names import validate_group, validate_topic


@pytest.mark.parametrize("name", ["../x", "", "a" * 128, "a/b", "a b", "tópico", "x.y",
                                  "a\nb", "a\\b", "*", "t:1"])
def test_bad_topic_names_are_refused(name):
    with pytest.raises(InvalidNameError) as exc:
        validate_topic(name)
    assert exc.value.code == "SPARKMQ_INVALID_NAME"
    assert isinstance(exc.value, UserError)


@pytest.mark.parametrize("name", [None, 3, b"topic"])
def test_non_string_names_are_refused(name):
    with pytest.raises(InvalidNameError):
        validate_topic(name)
    with pytest.raises(InvalidNameError):
        validate_group(name)


@pytest.mark.parametrize("name", ["TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRACE_TOPIC",
                                  "rmq_sys_anything"])
def test_reserved_topics_need_system(name):
    with pytest.raises(InvalidNameError, match="reserved"):
        validate_topic(name)
    assert validate_topic(name, system=True) == name


@pytest.mark.parametrize("name", ["a", "a" * 127, "Orders_2024-v1", "%RETRY%g", "%DLQ%g", "a|b"])
def test_legal_topic_names(name):
    assert validate_topic(name) == name
    assert validate_topic(name, system=True) == name


def test_group_names():
    assert validate_group("g" * 255) == "g" * 255
    assert validate_group("%RETRY%g") == "%RETRY%g"
    for bad in ("", "g" * 256, "../g", "g g"):
        with pytest.raises(InvalidNameError):
            validate_group(bad)


def test_error_message_names_the_bad_characters():
    with pytest.raises(InvalidNameError, match=r"'\./'|'\.\/'|contains"):
        validate_topic("../x")


def test_store_refuses_bad_topic_names(store_url):
    from sparkmq import Store
    with Store.open(store_url, start_services=False) as store:
        for bad in ("../x", "", "a" * 128, "TBW102"):
            with pytest.raises(InvalidNameError):
                store.create_topic(bad)
        assert store.create_topic("%RETRY%g")["name"] == "%RETRY%g"
        assert store.create_topic("TBW102", system=True)["name"] == "TBW102"
        assert store.topic_names() == ["%RETRY%g", "TBW102"]


def test_rocketmq_property_names_are_parsed():
    conf = StoreConfig.from_options({
        "mappedFileSizeCommitLog": "8192", "flushDiskType": "SYNC_FLUSH",
        "flushIntervalCommitLog": "200", "fileReservedTime": "48", "deleteWhen": "04;16",
        "maxMessageSize": "1024", "defaultTopicQueueNums": "8",
        "autoCreateTopicEnable": "true", "diskMaxUsedSpaceRatio": "80",
        "brokerName": "broker-b", "listenPort": "10911"})
    assert conf.segment_size_bytes == 8192
    assert conf.flush_disk_type == SYNC_FLUSH
    assert conf.flush_interval_ms == 200
    assert conf.file_reserved_time_hours == 48.0
    assert conf.delete_hours() == {4, 16}
    assert conf.max_message_size_bytes == 1024
    assert conf.default_topic_queue_nums == 8
    assert conf.auto_create_topic is True
    assert conf.disk_max_used_space_ratio == 80
    assert conf.broker_name == "broker-b"


def test_attribute_names_and_defaults():
    conf = StoreConfig.from_options(segment_size_bytes=4096)
    assert conf.segment_size_bytes == 4096
    assert conf.flush_disk_type == ASYNC_FLUSH
    assert StoreConfig.from_options(autoCreateTopicEnable="no").auto_create_topic is False
    props = conf.to_properties()
    assert props["segment_size_bytes"] == 4096 and "_ALIASES" not in props


@pytest.mark.parametrize("options", [
    {"flushDiskType": "SOMETIMES"},
    {"mappedFileSizeCommitLog": "12"},
    {"mappedFileSizeCommitLog": "big"},
    {"flushIntervalCommitLog": "0"},
    {"maxMessageSize": "-1"},
    {"deleteWhen": "25"},
    {"deleteWhen": "noon"},
    {"deleteWhen": ""},
    {"diskMaxUsedSpaceRatio": "99"},
    {"autoCreateTopicEnable": "maybe"},
    {"fileReservedTime": "three days"},
    {"checkpointInterval": "0"},
    # values given as Python or JSON values, not strings: a number must be whole
    {"mappedFileSizeCommitLog": 8192.5},
    {"maxMessageSize": True},
    {"maxMessageSize": None},
    {"autoCreateTopicEnable": 2},
    {"autoCreateTopicEnable": None},
])
def test_bad_config_values(options):
    with pytest.raises(InvalidConfigError) as exc:
        StoreConfig.from_options(options)
    assert exc.value.code == "SPARKMQ_INVALID_CONFIG"
    assert str(next(iter(options.values()))) in exc.value.message    # names what it got


def test_config_values_given_as_values_not_strings():
    conf = StoreConfig.from_options({"maxMessageSize": 2048, "autoCreateTopicEnable": False,
                                     "defaultTopicQueueNums": " 4 "})
    assert conf.max_message_size_bytes == 2048 and conf.auto_create_topic is False
    assert conf.default_topic_queue_nums == 4
    assert StoreConfig.from_options({"autoCreateTopicEnable": 1}).auto_create_topic is True
    import numpy as np          # an integer of another type (a DataFrame's, say) is one
    assert StoreConfig.from_options({"maxMessageSize": np.int64(4096)}).max_message_size_bytes \
        == 4096


def test_broker_config_integers_are_whole():
    from sparkmq.broker.config import BrokerConfig
    assert BrokerConfig.from_properties({"listenPort": "18081"}).listen_port == 18081
    for bad in (18081.5, True, "18081.0"):
        with pytest.raises(InvalidConfigError, match="listenPort must be an integer"):
            BrokerConfig.from_properties({"listenPort": bad})


def test_store_open_refuses_bad_config_and_mode(store_url):
    from sparkmq import Store
    with pytest.raises(InvalidConfigError):
        Store.open(store_url, flushDiskType="NEVER")
    with pytest.raises(InvalidConfigError):
        Store.open(store_url, mode="x")
