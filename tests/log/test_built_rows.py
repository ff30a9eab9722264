"""``BuiltRows`` (log/built.py): rows a caller checked, which the store appends without
checking them again and stamps with its store time in place. The stamp lands in the
stored rows and nowhere else; what the receipt does not vouch for (the topic, its
queues, the store's state) is still refused. Fast tier: in-memory stores, no servers."""
from __future__ import annotations

import uuid
import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from helpers.clock import Clock
from sparkmq import Store
from sparkmq.errors import QueueNotFoundError, StoreClosedError, SparkMQError
from sparkmq.log import format as fmt
from sparkmq.log.built import BuiltRows, build_rows
from sparkmq.log.dispatch import binary_lengths, measured_bodies
from sparkmq.log.limits import MessageLimits, check_batch

BUILD_MS = 1_700_000_000_000


def _rows(store, n: int = 2, **columns) -> BuiltRows:
    return build_rows({"topic": ["t"] * n, "body": [b"m%d" % i for i in range(n)], **columns},
                      n, store_host=store.config.store_host, now_ms=BUILD_MS)


@pytest.fixture
def store():
    clock = Clock(BUILD_MS + 1_000)
    s = Store.open(f"memory://sparkmq-built-{uuid.uuid4().hex}", clock_ms=clock,
                   start_services=False)
    s.create_topic("t", read_queue_nums=2, write_queue_nums=2)
    s.clock = clock
    yield s
    s.close()


def test_the_stamp_reaches_the_segment_bytes(tmp_path):
    # the IPC writer reads the batch through an export made before the stamp (for the
    # limit screen): the bytes on disk must hold the stamped time, read back after a reopen
    url = str(tmp_path / "store")
    with Store.open(url, clock_ms=Clock(BUILD_MS + 3_000), start_services=False) as s:
        s.create_topic("t", read_queue_nums=2, write_queue_nums=2)
        rows = _rows(s, 3)
        check_batch(rows.batch, MessageLimits(), c_array=rows.c_array())
        s.append_batch(rows)
        groups = build_rows({"topic": ["t"] * 2, "body": [b"g0", b"g1"],
                             "message_group": ["g-a", "g-d"]}, 2, store_host="h",
                            now_ms=BUILD_MS, topic="t")
        r = s.append_batch(groups)             # the store chooses their queues: a new batch
    with Store.open(url, start_services=False) as s:
        assert _times(s, "store_timestamp") == [BUILD_MS + 3_000] * 5
        assert _times(s, "born_timestamp") == [BUILD_MS] * 5
        by_queue = {row["body"]: row["queue_id"] for q in range(2)    # as the bytes say
                    for row in s.read_table("t", q, 0).to_pylist()}
        assert [by_queue[b"g0"], by_queue[b"g1"]] == r.queue_ids.tolist() == \
            [zlib.crc32(g) % 2 for g in (b"g-a", b"g-d")] == [0, 1]


def _times(store, column: str) -> list:
    return [v.timestamp() * 1000 for q in range(2)
            for v in store.read_table("t", q, 0).column(column).to_pylist()]


def test_the_store_time_is_stamped_in_the_stored_rows_and_not_the_born_time(store):
    # both times default to the build's clock: the builder shares one buffer between
    # them unless the store time has its own, which the stamp must not leak out of
    store.append_batch(_rows(store))
    store.clock.now_ms = BUILD_MS + 500            # the clock goes back: store time holds
    store.append_batch(_rows(store))
    assert _times(store, "born_timestamp") == [BUILD_MS] * 4
    assert sorted(_times(store, "store_timestamp")) == [BUILD_MS + 1_000] * 4
    store.clock.now_ms = BUILD_MS + 2_000
    store.append_batch(_rows(store, 1))
    assert max(_times(store, "store_timestamp")) == BUILD_MS + 2_000


def test_concat_has_its_own_store_times_and_the_parts_sizes(store):
    a, b = _rows(store, 1), _rows(store, 2, body=[b"xyz", b"abcdef"])
    both = BuiltRows.concat([a, b])
    assert both.body_sizes.tolist() == [2, 3, 6] and both.nbytes == 11 and len(both) == 3
    both.stamp(7)
    assert a.times.tolist() == [BUILD_MS] and b.times.tolist() == [BUILD_MS] * 2
    assert both.batch.column("store_timestamp").cast(pa.int64()).to_pylist() == [7] * 3
    r = store.append_batch(both)
    assert r.num_rows == 3 and sorted(_times(store, "store_timestamp")) == [BUILD_MS + 1_000] * 3


def test_what_the_receipt_does_not_vouch_for_is_still_refused(store):
    with pytest.raises(QueueNotFoundError, match="queue_id out of range"):
        store.append_batch(_rows(store, 1, queue_id=pa.array([5], pa.int32())))
    with pytest.raises(SparkMQError, match="no-such-topic|does not exist|not found"):
        store.append_batch(build_rows({"topic": ["no-such-topic"], "body": [b"x"]}, 1,
                                      store_host="h", now_ms=BUILD_MS))
    assert [store.read_table("t", q, 0).num_rows for q in range(2)] == [0, 0]
    store.close()
    with pytest.raises(StoreClosedError):
        store.append_batch(_rows(store, 1))


def test_build_rows_stamps_the_store_time_itself_and_measures_the_bodies(store):
    with pytest.raises(ValueError, match="store_timestamp"):
        build_rows({"topic": ["t"], "body": [b"x"], "store_timestamp": [1]}, 1,
                   store_host="h", now_ms=BUILD_MS)
    rows = _rows(store, 2, body=[b"", b"four"])
    assert rows.body_sizes.dtype == np.int32 and rows.body_sizes.tolist() == [0, 4]


def test_what_the_builder_was_given_is_dispatched_and_the_defaults_are_filled(store):
    # tags and keys given: their ConsumeQueue codes and index entries (the store skips
    # the lookups only for columns the builder was not given)
    n = 2
    born = pa.array([None, BUILD_MS - 5], pa.int64()).cast(pa.timestamp("ms"))
    store.append_batch(build_rows(
        {"topic": ["t"] * n, "body": [b"a", b"b"], "tags": ["red", None],
         "keys": [["k1"], None], "queue_id": pa.array([0, 0], pa.int32()),
         "born_timestamp": born, "message_type": pa.array([None, 1], pa.int8())},
        n, store_host="h", now_ms=BUILD_MS, topic="t"))
    entries = store.queue_entries(store.topic_id("t"), 0, 0, 2)
    assert entries.column("tags_code").to_pylist() == [fmt.tags_code("red"), 0]
    assert [m.body for m in store.query_by_key("t", "k1")] == [b"a"]
    stored = store.read_table("t", 0, 0)
    assert stored.column("born_timestamp").cast(pa.int64()).to_pylist() == \
        [BUILD_MS, BUILD_MS - 5]                     # a null born time: the build's now
    assert stored.column("message_type").to_pylist() == [fmt.MESSAGE_TYPE_NORMAL, 1]


def test_rows_of_several_topics_merged_are_stored_under_each_topic(store):
    store.create_topic("u", read_queue_nums=1, write_queue_nums=1)
    one = _rows(store, 1, queue_id=pa.array([1], pa.int32()))
    other = build_rows({"topic": ["u"], "body": [b"u0"]}, 1, store_host="h",
                       now_ms=BUILD_MS, topic="u")
    assert one.topic is None                         # (_rows does not say)
    both = BuiltRows.concat([build_rows({"topic": ["t"], "body": [b"t0"]}, 1,
                                        store_host="h", now_ms=BUILD_MS, topic="t"), other])
    assert both.topic is None and {"topic", "body"} <= both.given
    store.append_batch(both)
    store.append_batch(other)                        # alone: stored under the topic it names
    assert store.read_table("u", 0, 0).column("body").to_pylist() == [b"u0", b"u0"]
    assert [b for q in range(2) for b in store.read_table("t", q, 0).column("body")
            .to_pylist()] == [b"t0"]


def test_the_rows_one_queue_is_still_held_to_the_topic_and_merges_keep_each_queue(store):
    with pytest.raises(QueueNotFoundError, match="queue_id out of range"):
        store.append_batch(build_rows(
            {"topic": ["t"] * 20, "body": [b"x"] * 20, "queue_id": pa.array([2] * 20, pa.int32())},
            20, store_host="h", now_ms=BUILD_MS, topic="t", queue=2))

    def in_queue(q: int, n: int, tag: bytes) -> BuiltRows:
        return build_rows({"topic": ["t"] * n, "body": [tag] * n,
                           "queue_id": pa.array([q] * n, pa.int32())}, n,
                          store_host="h", now_ms=BUILD_MS, topic="t", queue=q)
    both = BuiltRows.concat([in_queue(0, 20, b"zero"), in_queue(1, 3, b"one")])
    assert both.queue is None
    store.append_batch(both)
    store.append_batch(in_queue(1, 20, b"one"))
    assert store.read_table("t", 0, 0).column("body").to_pylist() == [b"zero"] * 20
    one = store.read_table("t", 1, 0)
    assert one.column("body").to_pylist() == [b"one"] * 23
    assert one.column("queue_offset").to_pylist() == list(range(23))


@settings(max_examples=150, deadline=None)
@given(bodies=st.lists(st.binary(max_size=40), min_size=1, max_size=60), data=st.data())
def test_bodies_measured_in_one_call_are_their_lengths_and_bounds(bodies, data):
    # any slice of any binary array: the sizes binary_lengths gives, and their least,
    # greatest and total, which BuiltRows finds the same when it is not given them
    first = data.draw(st.integers(0, len(bodies) - 1))
    arr = pa.array(bodies, pa.binary()).slice(first)
    want = [len(b) for b in bodies[first:]]
    sizes, extent = measured_bodies(arr)
    assert sizes.dtype == np.int32 and sizes.tolist() == want
    assert binary_lengths(arr).tolist() == want
    assert extent == (min(want), max(want), sum(want))
    columns = {"topic": ["t"] * len(want), "body": arr}
    told = build_rows(columns, len(want), store_host="h", now_ms=BUILD_MS,
                      body_sizes=sizes, body_extent=extent)
    found = build_rows(columns, len(want), store_host="h", now_ms=BUILD_MS)
    assert told.body_extent == found.body_extent == extent and found.nbytes == sum(want)


def test_body_sizes_refuses_offsets_past_the_buffer():
    from sparkmq import _screen
    offsets = pa.array([b"ab", b"c"]).buffers()[1]             # three int32 offsets
    assert _screen.body_sizes(offsets, 0, 2)[1:] == (1, 2, 3)
    for first, n in ((0, 3), (1, 2), (3, 1), (-1, 1)):
        with pytest.raises(ValueError, match="do not fit"):
            _screen.body_sizes(offsets, first, n)
