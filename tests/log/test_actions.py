"""Typed transaction-log actions (sparkmq/log/actions.py): exact JSON round trips,
unknown fields and action types kept, malformed actions refused with CorruptStoreError."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.clock import Clock
from sparkmq import Message, Store
from sparkmq.errors import CorruptStoreError
from sparkmq.log import format as fmt
from sparkmq.log.actions import (AddFile, GroupConfig, Lease, QueueStats, TopicConfig,
                                 UnknownAction, parse_action)


def _log_lines(root) -> list[dict]:
    out = []
    for f in sorted((root / fmt.LOG_DIR).glob("*.json")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def test_every_action_a_store_writes_round_trips_exactly(tmp_path):
    root = tmp_path / "store"
    clock = Clock()
    with Store.open(str(root), mappedFileSizeCommitLog=4096, clock_ms=clock) as s:
        s.create_topic("Orders", read_queue_nums=2, write_queue_nums=2)
        s.create_topic("Clicks", retention_ms=3_600_000, retention_bytes=1 << 30)
        for i in range(20):
            s.append([Message("Orders", b"x" * 300, tags="t", keys=[f"k{i}"],
                              message_group="g")])
        s.commit_consumer_offsets("G", {("Orders", 0): 3})
        s.create_group("G", retry_max_times=3)
        s.delete_group("G")
        s.flush()
        clock.advance(100 * 3_600_000)     # past fileReservedTime (72 h)
        assert s.run_retention(force_hour=True)
    lines = _log_lines(root)
    kinds = {next(iter(a)) for a in lines}
    assert {"protocol", "metaData", "topic", "add", "remove", "lease", "consumerOffset",
            "subscriptionGroup", "retention", "commitInfo"} <= kinds
    for a in lines:
        typed = parse_action(a, "test")
        assert not isinstance(typed, UnknownAction)
        assert typed.to_json() == a


def test_fields_a_newer_writer_added_survive_a_rewrite():
    raw = {"topic": {"name": "A", "id": 3, "readQueueNums": 2, "writeQueueNums": 2, "perm": 4,
                     "createdTime": 1, "attributes": {"x": "y"}, "deleted": False,
                     "futureField": [1, 2]}}
    t = parse_action(raw)
    assert isinstance(t, TopicConfig)
    assert (t.name, t.id, t.read_queue_nums, t.write_queue_nums) == ("A", 3, 2, 2)
    assert t.readable and not t.writable
    assert t.to_json() == raw


def test_an_unknown_action_type_is_kept_as_it_was():
    raw = {"shinyNewAction": {"a": 1}}
    t = parse_action(raw)
    assert isinstance(t, UnknownAction) and t.kind == "shinyNewAction"
    assert t.to_json() == raw


@pytest.mark.parametrize("raw, says", [
    ({"topic": {"name": "A"}, "add": {}}, "exactly one key"),
    ([1, 2], "exactly one key"),
    ({"topic": {"name": "A", "readQueueNums": 1, "writeQueueNums": 1}}, "lacks 'id'"),
    ({"add": {"path": "x", "kind": "mystery", "size": 1}}, "unknown kind"),
    ({"add": {"path": "x", "kind": "segment", "size": 1}}, "baseOffset"),
    ({"lease": "not an object"}, "not an object"),
])
def test_malformed_actions_are_corrupt_store_errors_naming_where(raw, says):
    with pytest.raises(CorruptStoreError) as e:
        parse_action(raw, "_log/00000000000000000007.json:3")
    assert says in str(e.value)
    if "exactly one key" in says or "not an object" in says:
        assert "00000000000000000007.json:3" in str(e.value)


def test_optional_fields_stay_absent_and_defaults_read_as_rocketmq():
    g = parse_action({"subscriptionGroup": {"groupName": "G", "deleted": True}})
    assert isinstance(g, GroupConfig)
    assert g.receives_allowed and g.broadcast_allowed and g.retry_max_times is None
    assert g.to_json() == {"subscriptionGroup": {"groupName": "G", "deleted": True}}
    lease = Lease(owner="h:1:t", epoch=2, expires_time=5)
    assert lease.to_json() == {"lease": {"owner": "h:1:t", "epoch": 2, "expiresTime": 5,
                                         "released": False}}


_ints = st.integers(min_value=0, max_value=1 << 62)
_names = st.text(min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(name=_names, tid=_ints, rq=st.integers(1, 1024), wq=st.integers(1, 1024),
       perm=st.sampled_from([0, 2, 4, 6]), ret=st.none() | _ints,
       attrs=st.dictionaries(_names, _names, max_size=3))
def test_topic_configs_round_trip(name, tid, rq, wq, perm, ret, attrs):
    t = TopicConfig(name=name, id=tid, read_queue_nums=rq, write_queue_nums=wq, perm=perm,
                    retention_ms=ret, attributes=attrs)
    back = parse_action(json.loads(json.dumps(t.to_json())))
    assert back == t and back.to_json() == t.to_json()


@settings(max_examples=100, deadline=None)
@given(stats=st.lists(st.tuples(_ints, _ints, _ints, _ints), min_size=1, max_size=8),
       rows=_ints, size=_ints)
def test_consumequeue_adds_round_trip(stats, rows, size):
    queues = tuple(QueueStats(topic_id=a, queue_id=b, min_offset=c, max_offset=c + d,
                              min_timestamp=a, max_timestamp=b, min_batch_offset=c,
                              max_batch_offset=d) for a, b, c, d in stats)
    add = AddFile(path="consumequeue/x.parquet", kind="consumequeue", size=size, rows=rows,
                  queues=queues)
    back = parse_action(json.loads(json.dumps(add.to_json())))
    assert back == add and back.to_json() == add.to_json()
