"""The golden store of format version 1 (tests/golden/v1, made once by
tests/golden/make_golden.py): today's code must keep reading it exactly, read-only, so
every later format change stays able to read stores written before it.

What it holds: topics Orders (3 queues) and Events (2 queues), 48 messages with tags,
keys, properties, message groups, a delayed and a transactional message; ten rolled
4 KiB CommitLog segments; published and compacted ConsumeQueue/Index side files; group
G1's subscription config and consumer offsets; 17 log versions with checkpoints.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers.storetools import GOLDEN_FIELDS, read_only_copy
from sparkmq import Snapshot, Store
from sparkmq.log import format as fmt

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "v1"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
FIELDS = GOLDEN_FIELDS


def version_of(label: str) -> dict:
    return next(v for v in EXPECTED["versions"] if v["label"] == label)


def as_expected(m) -> dict:
    got = {f: getattr(m, f) for f in FIELDS}
    got["body"] = m.body.decode()
    got["keys"] = list(got["keys"])
    got["properties"] = dict(got["properties"])
    return got



@pytest.fixture
def golden(tmp_path):
    """A copy of the golden store; the test fails if reading it changed any file."""
    with read_only_copy(GOLDEN / "store", tmp_path) as copy:
        yield copy


@pytest.fixture
def store(golden):
    with Store.open(golden, mode="r") as s:
        yield s


def test_the_golden_store_is_what_its_manifest_says():
    assert EXPECTED["format_version"] == 1 < fmt.FORMAT_VERSION    # an older version
    segments = os.listdir(GOLDEN / "store" / "commitlog")
    assert len(segments) == 10                                # rolled at 4 KiB
    log = os.listdir(GOLDEN / "store" / "_log")
    assert "00000000000000000010.checkpoint.json" in log and "_last_checkpoint" in log
    assert len(EXPECTED["messages"]) == 48


def test_every_message_reads_back_exactly(store):
    for want in EXPECTED["messages"]:
        got = store.read(want["topic"], want["queue_id"], want["queue_offset"], 1)
        assert [as_expected(m) for m in got] == [want]


def test_queue_ranges_and_topics(store):
    assert store.topic_names() == ["Events", "Orders"]
    assert [store.max_offset("Orders", q) for q in range(3)] == [11, 11, 10]
    assert [store.max_offset("Events", q) for q in range(2)] == [
        sum(1 for m in EXPECTED["messages"] if m["topic"] == "Events" and m["queue_id"] == q)
        for q in range(2)]
    assert sum(store.max_offset("Events", q) for q in range(2)) == 16
    assert all(store.min_offset(t, q) == 0 for t, n in (("Orders", 3), ("Events", 2))
               for q in range(n))


def test_literal_values(store):
    first = store.read("Orders", 0, 0, 1)[0]
    assert first.body == b"order-000|" + b"o" * 40
    assert (first.tags, first.keys, first.properties) == ("paid", ["order-0"],
                                                          {"n": "0", "region": "us"})
    assert first.store_timestamp == 1_700_000_001_000
    delayed = store.read("Orders", 0, 8, 1)[0]
    assert (delayed.body, delayed.message_type) == (b"delayed-1", fmt.MESSAGE_TYPE_DELAY)
    assert delayed.delivery_timestamp == 1_700_000_065_000
    groups = {m.message_group: m.queue_id for q in range(2)
              for m in store.read("Events", q, 0, 100)}
    assert sorted(groups) == ["user-0", "user-1", "user-2"]   # one queue per group


def test_consumer_offsets_and_group_config(store):
    assert store.consumer_offsets("G1") == {("Orders", 0): 3, ("Orders", 1): 2,
                                            ("Events", 0): 1}
    conf = store.subscription_groups()["G1"]
    assert conf["retryMaxTimes"] == 3 and conf["consumeEnable"] is True


def test_key_lookup(store):
    assert [m.body[:10] for m in store.query_by_key("Orders", "order-7")] == [b"order-007|"]
    users = store.query_by_key("Events", "user-1")
    assert sorted(m.body[:10] for m in users) == [b"event-001|", b"event-004|", b"event-007|",
                                                  b"event-010|", b"event-013|"]
    assert [m.body for m in store.query_by_key("Orders", "tx-1")] == [b"tx-1"]


def test_time_query(store):
    t = version_of("round-1")["timestamp_ms"]                  # round 1 was stored at t
    got = store.query_by_time("Orders", t, t)
    assert sorted(m.body[:10] for m in got) == [f"order-{n:03d}|".encode() for n in range(6, 12)]
    assert store.offset_for_time("Orders", 0, t) == 2


def test_message_id_lookup(store, golden):
    tx = next(m for m in EXPECTED["messages"] if m["transaction_id"])
    assert tx["message_id"].endswith("00000000000076C000000001")   # store hash + offset
    assert as_expected(store.lookup(tx["message_id"])) == tx
    assert as_expected(Snapshot.load(golden).lookup(tx["message_id"])) == tx


def test_time_travel_to_older_versions(golden):
    latest = Snapshot.load(golden)
    assert latest.version == 16
    assert latest.consumer_offsets("G1")[("Orders", 0)] == 3
    v1 = version_of("round-1")
    old = Snapshot.load(golden, version=v1["version"])           # before the compaction
    assert [old.max_offset("Orders", q) for q in range(3)] == [4, 4, 4]
    assert old.consumer_offsets("G1") == {}
    assert [m.body[:10] for m in old.read("Orders", 2, 0, 100)] == [
        b"order-002|", b"order-005|", b"order-008|", b"order-011|"]
    assert old.query_by_key("Orders", "order-7")[0].body[:10] == b"order-007|"
    between = Snapshot.load(golden, timestamp_ms=v1["timestamp_ms"] + 500)
    assert between.version == v1["version"]
