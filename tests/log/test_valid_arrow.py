"""Data that is not valid Arrow in full never reaches a store
(``log.limits.check_valid_arrow``): a string that is not UTF-8 in any string column of an
appended batch or table, at any row, is refused with an error that names the column,
nothing is stored, and the topic stays readable. (Arrow's IPC reader and
``Array.from_buffers`` do not check UTF-8, so such a batch can be built, and can arrive
over the network.) A ``Message`` field that is not text is refused as clearly. Fast tier:
no servers."""
from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkmq import Message, Snapshot, Store
from sparkmq.errors import InvalidMessageError
from sparkmq.log import format as fmt

# not UTF-8: a stray continuation byte, an overlong form, a surrogate, a cut sequence, 0xFF
BAD = [b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xff"]
STRING_COLUMNS = ("topic", "tags", "keys", "properties", "born_host", "message_group",
                  "unique_key")


def _strings(values: list[bytes]) -> pa.Array:
    """A string array of exactly these bytes (from buffers: nothing checks them)."""
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


def _column(name: str, values: list[bytes]) -> pa.Array:
    s = _strings(values)
    offsets = pa.array(np.arange(len(values) + 1, dtype=np.int32))
    if name == "keys":
        return pa.ListArray.from_arrays(offsets, s)
    if name == "properties":
        return pa.MapArray.from_arrays(offsets, s, pa.array(["v"] * len(values)))
    return s


@pytest.fixture
def store(local_store_url):
    s = Store.open(local_store_url, start_services=False)
    s.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    yield s
    s.close()


def _bodies(store) -> list[bytes]:
    store.flush()
    return Snapshot.load(store.url).read_table("T", 0, 0).column("body").to_pylist()


@settings(deadline=None, max_examples=60)
@given(name=st.sampled_from(STRING_COLUMNS), n=st.integers(1, 6), data=st.data(),
       bad=st.sampled_from(BAD), segment_schema=st.booleans())
def test_a_string_that_is_not_utf8_is_refused_and_nothing_is_stored(
        name, n, data, bad, segment_schema):
    row = data.draw(st.integers(0, n - 1))
    good = b"T" if name == "topic" else b"ok-\xc3\xa9"          # (valid UTF-8: e acute)
    values = [b"a" + bad if i == row else good for i in range(n)]
    cols = {"topic": _strings([b"T"] * n), "body": pa.array([b"%d" % i for i in range(n)])}
    cols[name] = _column(name, values)
    s = Store.open(f"memory://sparkmq-test-{uuid.uuid4().hex}", start_services=False)
    try:
        s.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        s.append_batch(pa.table({"topic": ["T"], "body": [b"before"]}))
        written = s.commitlog.written_offset
        table = pa.table(cols)
        if segment_schema:       # the no-cast path: a batch already in SEGMENT_SCHEMA
            full = {f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in fmt.SEGMENT_FIELDS}
            full["queue_id"] = pa.array([0] * n, pa.int32())
            full["born_timestamp"] = full["store_timestamp"] = \
                pa.array([1_700_000_000_000] * n, pa.int64()).cast(fmt.TS)
            full["reconsume_times"] = pa.array([0] * n, pa.int32())
            full["message_type"] = pa.array([0] * n, pa.int8())
            table = pa.RecordBatch.from_arrays(list(full.values()), schema=fmt.SEGMENT_SCHEMA)
        with pytest.raises(InvalidMessageError, match=f"column '{name}'.*UTF8"):
            s.append_batch(table)
        assert s.commitlog.written_offset == written
        s.append_batch(pa.table({"topic": ["T"], "body": [b"after"]}))
        assert _bodies(s) == [b"before", b"after"]
    finally:
        s.close()


def test_a_valid_batch_of_multibyte_text_is_stored_as_sent(store):
    n = 3
    cols = {"topic": ["T"] * n, "body": [b"1", b"2", b"3"], "tags": ["é", "日本", "🙂"],
            "keys": [["ключ"], [], None]}
    store.append_batch(pa.table(cols))
    store.flush()
    t = Snapshot.load(store.url).read_table("T", 0, 0)
    assert t.column("tags").to_pylist() == ["é", "日本", "🙂"]
    assert t.column("keys").to_pylist()[0] == ["ключ"]


@pytest.mark.parametrize("field", ["tags", "born_host", "message_group", "properties", "keys"])
def test_a_message_field_that_is_not_text_is_refused(store, field):
    value = {"properties": {"k": "v\udcff"}, "keys": ["k\udcff"]}.get(field, "x\udcff")
    written = store.commitlog.written_offset
    with pytest.raises(InvalidMessageError, match="not valid text"):
        store.append(Message("T", b"x", **{field: value}))
    assert store.commitlog.written_offset == written


@pytest.mark.parametrize("names", [["topic", "body", "topic"], ["topic", "body", "tags", "tags"]])
def test_a_column_named_twice_is_refused(store, names):
    arrays = [pa.array(["T"]), pa.array([b"x"])] + [pa.array(["a"])] * (len(names) - 2)
    written = store.commitlog.written_offset
    with pytest.raises(InvalidMessageError, match=rf"\['{names[-1]}'\] come more than once"):
        store.append_batch(pa.Table.from_arrays(arrays, names=names))
    assert store.commitlog.written_offset == written
