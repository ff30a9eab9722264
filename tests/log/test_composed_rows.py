"""A send's segment batch composed in C (``sparkmq._compose`` through
``log/built.py``'s ``composed_rows``) against the same rows built in pyarrow
(``build_rows``): the same batch and the same segment bytes, for any columns a producer
may give; refused (None, nothing moved) where they do not fit; its memory held exactly
as long as something reads it. Fast tier: no servers."""
from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers.clock import Clock
from sparkmq import Store
from sparkmq.log import format as fmt
from sparkmq.log import segment as seg
from sparkmq.log.built import build_rows, composed_rows
from sparkmq.log.dispatch import binary_lengths

_compose = pytest.importorskip("sparkmq._compose", reason="the C module is not built here")
from sparkmq import _ipc  # noqa: E402  (built with it)

NOW = 1_700_000_000_000
HOST = "10.0.0.9:10911"
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)


def _source(n: int, columns: dict) -> pa.RecordBatch:
    types = {f.name: f.type for f in fmt.SEGMENT_FIELDS}
    return pa.RecordBatch.from_arrays(
        [pa.array(v, types[k]) for k, v in columns.items()], names=list(columns))


def _both(source: pa.RecordBatch, queue: int = 1):
    """(built in pyarrow, composed in C) of ``source``, as the broker's send gives them."""
    n = source.num_rows
    cols = {name: col for name, col in zip(source.schema.names, source.columns)
            if name in ("topic", "body") or col.null_count < n}
    sizes = binary_lengths(cols["body"])
    args = dict(store_host=HOST, now_ms=NOW, body_sizes=sizes, topic="t", queue=queue)
    composed = composed_rows(source, cols, n, **args)
    cols["queue_id"] = pa.array(np.full(n, queue, np.int32))     # (the builder's column)
    return build_rows(cols, n, **args), composed


@st.composite
def send_batches(draw):
    n = draw(st.integers(1, 40))
    rows = st.lists  # (each optional column: absent, all null, or some values)

    def column(values):
        kind = draw(st.sampled_from(["absent", "null", "values"]))
        if kind == "absent":
            return None
        if kind == "null":
            return [None] * n
        return draw(rows(values, min_size=n, max_size=n))
    cols = {"topic": ["t"] * n, "body": draw(rows(st.binary(min_size=1, max_size=64),
                                                  min_size=n, max_size=n))}
    optional = {
        "tags": column(st.none() | TEXT),
        "keys": column(st.none() | st.lists(TEXT, max_size=3)),
        "properties": column(st.none() | st.dictionaries(TEXT, TEXT, max_size=3).map(
            lambda d: list(d.items()))),
        "born_timestamp": column(st.integers(0, 2**41)),
        "born_host": column(st.none() | TEXT),
        "unique_key": column(st.none() | TEXT),
    }
    for name, values in optional.items():
        if values is not None:
            cols[name] = values
    order = draw(st.permutations(list(cols)))
    return _source(n, {name: cols[name] for name in order})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=send_batches(), queue=st.integers(0, 7), stamp=st.integers(NOW, NOW + 10**6))
def test_a_composed_batch_is_the_built_batch_and_writes_the_same_bytes(source, queue, stamp):
    built, composed = _both(source, queue)
    assert composed is not None
    assert len(composed) == source.num_rows and composed.given == built.given
    assert composed.body_sizes.tolist() == built.body_sizes.tolist()
    built.stamp(stamp)
    composed.stamp(stamp)                    # through the C struct, before any import
    data = seg.serialize_batch(composed, composed.c_array())
    assert data.equals(seg.serialize_batch(built.batch, built.c_array()))
    assert composed.batch.equals(built.batch)
    composed.batch.validate(full=True)
    assert composed.batch.schema.equals(fmt.SEGMENT_SCHEMA, check_metadata=True)


def test_a_born_time_with_nulls_is_left_to_the_builder():
    # fill_required's work (a null born time is the build's clock): not composed
    source = _source(2, {"topic": ["t", "t"], "body": [b"a", b"b"],
                         "born_timestamp": [None, NOW + 5]})
    built, composed = _both(source)
    assert composed is None
    assert built.batch.column("born_timestamp").to_pylist()[0].timestamp() * 1000 == NOW


@pytest.mark.parametrize("name, filled", [("reconsume_times", 0), ("message_type", 0),
                                          ("store_host", None)])
def test_a_column_with_nulls_where_the_schema_has_a_default_is_left_to_the_builder(
        name, filled):
    # the template holds a value in every row of these (the C code refuses the given
    # column's nulls there): the builder fills those fill_required fills, as for any batch
    values = {"reconsume_times": 3, "message_type": 1, "store_host": "h:1"}[name]
    source = _source(2, {"topic": ["t", "t"], "body": [b"a", b"b"], name: [None, values]})
    built, composed = _both(source)
    assert composed is None
    assert built.batch.column(name).to_pylist() == [filled, values]


@pytest.mark.parametrize("source", [
    # a column in another type than the segment's (the C code compares the formats)
    pa.RecordBatch.from_pydict({"topic": ["t"], "body": pa.array(["x"], pa.string())}),
    pa.RecordBatch.from_pydict({"topic": ["t"], "body": [b"x"],
                                "tags": pa.array(["a"], pa.large_string())}),
    # an array that starts past its buffers' start
    pa.RecordBatch.from_pydict({"topic": ["t"] * 3, "body": [b"x", b"y", b"z"]}).slice(1, 1),
    # a queue id of the producer's own (a composed batch has one queue: the template's)
    pa.RecordBatch.from_pydict({"topic": ["t"], "body": [b"x"],
                                "queue_id": pa.array([0], pa.int32())}),
], ids=["string-body", "large-string-tags", "sliced", "queue-id"])
def test_columns_that_do_not_fit_are_refused_and_nothing_is_moved(source):
    n = source.num_rows
    cols = dict(zip(source.schema.names, source.columns))
    assert composed_rows(source, cols, n, store_host=HOST, now_ms=NOW,
                         body_sizes=np.ones(n, np.int32), topic="t", queue=0) is None
    source.validate(full=True)               # still whole, still readable
    assert source.column(0).to_pylist() == ["t"] * n


def test_up_to_1024_rows_are_composed_and_more_are_built_in_pyarrow():
    # (the template holds 1,024 rows of each default: a batch takes the first n)
    source = _source(1024, {"topic": ["t"] * 1024, "body": [b"x%d" % i for i in range(1024)],
                            "tags": ["a", None] * 512})
    built, composed = _both(source, queue=3)
    assert composed is not None
    assert seg.serialize_batch(composed, composed.c_array()).equals(
        seg.serialize_batch(built.batch, built.c_array()))
    source = _source(1025, {"topic": ["t"] * 1025, "body": [b"x"] * 1025})
    assert _both(source)[1] is None


def _over(body: bytearray) -> pa.RecordBatch:
    """A one-row send batch whose body column reads ``body`` in place (so its refcount
    tells who holds the batch's buffers)."""
    return pa.RecordBatch.from_arrays(
        [pa.array(["t"]), pa.Array.from_buffers(pa.binary(), 1, [
            None, pa.py_buffer(np.array([0, len(body)], np.int32)), pa.py_buffer(body)])],
        names=["topic", "body"])


def test_the_batch_outlives_its_source_and_releases_every_buffer_once_read():
    # the composed struct holds the producer's buffers, the template and the store times;
    # after the rows and their batch go, every one of them is let go (no leak, no early
    # free: the batch is read after its source and every other handle are gone)
    body = bytearray(b"payload!" * 16)
    base = sys.getrefcount(body)
    source = _over(body)
    rows = _both(source)[1]
    del source
    gc.collect()
    assert sys.getrefcount(body) > base      # held by the composed struct
    batch = rows.batch
    del rows
    gc.collect()
    assert batch.column("body").to_pylist() == [bytes(body)]
    del batch
    gc.collect()
    assert sys.getrefcount(body) == base


def test_rows_never_read_as_a_batch_release_everything_too():
    body = bytearray(b"never read")
    base = sys.getrefcount(body)
    source = _over(body)
    rows = _both(source)[1]
    seg.serialize_batch(rows, rows.c_array())
    del source, rows
    gc.collect()
    assert sys.getrefcount(body) == base


def test_compose_holds_the_values_and_the_template_until_both_capsules_go():
    template = pa.RecordBatch.from_pydict({"a": [1, 2], "b": [3, 4]})
    schema = template.schema
    values = bytearray(np.array([7, 8], np.int64).tobytes())
    t_capsule, address = _ipc.array_capsule()
    template._export_to_c(address)
    g_capsule, g_address = _ipc.array_capsule()
    pa.RecordBatch.from_pydict({"a": [5, 6]})._export_to_c(g_address)
    v_base, t_base = sys.getrefcount(values), sys.getrefcount(t_capsule)
    first, first_address, kept = _compose.compose(
        t_capsule, g_capsule, pa.schema([("a", pa.int64())]).__arrow_c_schema__(),
        schema.__arrow_c_schema__(), (0, -2), (values,))
    assert sys.getrefcount(values) > v_base and sys.getrefcount(t_capsule) > t_base
    batch = pa.RecordBatch._import_from_c(first_address, schema)
    assert batch.to_pydict() == {"a": [5, 6], "b": [7, 8]}
    values[:8] = np.array([9], np.int64).tobytes()      # the column reads the buffer in place
    assert batch.column("b").to_pylist() == [9, 8]
    del first, batch
    gc.collect()
    assert sys.getrefcount(values) > v_base            # the kept capsule still holds it
    del kept
    gc.collect()
    assert sys.getrefcount(values) == v_base and sys.getrefcount(t_capsule) == t_base


@pytest.mark.parametrize("slots, values", [
    ((0, -2), (bytearray(8),)),               # a values buffer of the wrong size
    ((0, -3), (bytearray(16),)),              # values that are not there
    ((1, -1), ()),                            # a column the source does not have
    ((0,), ()),                               # fewer slots than the schema's columns
], ids=["short-values", "missing-values", "no-such-column", "too-few-slots"])
def test_compose_refuses_slots_that_do_not_fit_and_moves_nothing(slots, values):
    _refused(pa.RecordBatch.from_pydict({"a": [1, 2], "b": [3, 4]}), slots, values)


def test_compose_refuses_values_for_a_column_that_is_not_fixed_width():
    _refused(pa.RecordBatch.from_pydict({"a": [1, 2], "b": ["x", "y"]}), (0, -2),
             (bytearray(16),))
    _refused(pa.RecordBatch.from_pydict({"a": [1, 2], "b": pa.array([1, 2], pa.int32())}),
             (0, -2), (bytearray(16),))          # (int32: 8 bytes for 2 rows, not 16)


def test_compose_refuses_a_template_it_cannot_cut():
    _refused(pa.RecordBatch.from_pydict({"a": [1], "b": [3]}), (0, -1), ())   # too short
    # a column neither all null nor never null: its first rows' null count is not known
    _refused(pa.RecordBatch.from_pydict({"a": [1, 2], "b": [3, None]}), (0, -1), ())


def _refused(template: pa.RecordBatch, slots: tuple, values: tuple) -> None:
    t_capsule, address = _ipc.array_capsule()
    template._export_to_c(address)
    source = pa.RecordBatch.from_pydict({"a": [5, 6]})
    g_capsule, g_address = _ipc.array_capsule()
    source._export_to_c(g_address)
    assert _compose.compose(t_capsule, g_capsule, source.schema.__arrow_c_schema__(),
                            template.schema.__arrow_c_schema__(), slots, values) is None
    # the export was not moved: it imports whole
    assert pa.RecordBatch._import_from_c(g_address, source.schema).equals(source)


def test_threads_reading_a_composed_batch_at_once_get_one_batch():
    source = _source(3, {"topic": ["t"] * 3, "body": [b"a", b"b", b"c"]})
    rows = _both(source)[1]
    seen, start = [], threading.Barrier(8)

    def read():
        start.wait()
        seen.append(rows.batch)
    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and all(b is seen[0] for b in seen)


def test_a_store_keeps_composed_rows_and_reads_them_as_the_stored_batch(tmp_path):
    url = str(tmp_path / "store")
    with Store.open(url, clock_ms=Clock(NOW + 3_000), start_services=False) as s:
        s.create_topic("t", read_queue_nums=2, write_queue_nums=2)
        source = _source(2, {"topic": ["t", "t"], "body": [b"a", b"b"], "tags": ["x", None]})
        built, rows = _both(source, queue=1)
        r = s.append_batch(rows)
        assert r.queue_ids.tolist() == [1, 1] and r.queue_offsets.tolist() == [0, 1]
        cached = s.commitlog.read_batch(r.batch_offset)     # from the cache: imported once
        assert cached is s.commitlog.read_batch(r.batch_offset)
        built.stamp(NOW + 3_000)
        assert cached.equals(built.batch)
        live = s.read_table("t", 1, 0).to_pylist()
    with Store.open(url, start_services=False) as s:        # and the bytes on disk
        assert s.read_table("t", 1, 0).to_pylist() == live
        assert [m["tags"] for m in live] == ["x", None]
        assert [m["store_timestamp"].timestamp() * 1000 for m in live] == [NOW + 3_000] * 2
