"""``batchsend.send_shape`` reads a Flight send batch in one C call (``_screen.send_shape``)
where the batch is the usual one, and declines every other: for any batch (hypothesis:
send columns and others, in their types and others, nulls, empty values, strings that
are not UTF-8, a name twice, sliced), it returns None exactly where pyarrow's reading
finds the batch is not the usual one, and otherwise what pyarrow reads: the names, the
columns some row sets, the one topic, each body's bytes and their bounds."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkmq.broker import batchsend
from sparkmq.broker.batchsend import SEND_COLUMNS, send_shape, typed
from sparkmq.log.batch import none_if_empty

pytest.importorskip("sparkmq._screen", reason="the C module is not built here")

TS = pa.timestamp("ms", tz="UTC")
FLAT = {"topic": pa.string(), "body": pa.binary(), "tags": pa.string(),
        "message_group": pa.string(), "unique_key": pa.string(), "born_host": pa.string(),
        "born_timestamp": TS, "queue_id": pa.int32()}
TEXT = st.sampled_from(["", "a", "T", "ab", "é|", " x"])
RAW = st.sampled_from([b"ok", b"", b"\xff", b"\xc0\xaf"])


def _raw_strings(values: list[bytes]) -> pa.Array:
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


@st.composite
def _column(draw, name: str, n: int) -> pa.Array:
    maybe = (lambda s: st.none() | s) if draw(st.booleans()) else (lambda s: s)
    kind = draw(st.sampled_from(["own", "own", "own", "other", "raw", "nulls"]))
    if kind == "nulls":
        return pa.nulls(n, FLAT.get(name, pa.string()))
    if kind == "raw" and FLAT.get(name) == pa.string():
        return _raw_strings(draw(st.lists(RAW, min_size=n, max_size=n)))
    want = FLAT.get(name, pa.string())
    if kind == "other":          # a type send_shape leaves to typed() (or a nested one)
        other = {pa.string(): pa.large_string(), pa.binary(): pa.large_binary(),
                 pa.int32(): pa.int64(), TS: pa.int64()}[want]
        return _column_of(draw, other, n, maybe).cast(other) \
            if other != pa.large_string() else pa.array(
                draw(st.lists(maybe(TEXT), min_size=n, max_size=n)), other)
    if name == "topic" and draw(st.booleans()):      # the usual: one topic, every row
        return pa.array([draw(TEXT)] * n, pa.string())
    return _column_of(draw, want, n, maybe)


def _column_of(draw, t: pa.DataType, n: int, maybe) -> pa.Array:
    if t in (pa.binary(), pa.large_binary()):
        values = st.binary(max_size=4)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        values = TEXT
    elif t == TS:
        values = st.integers(0, 2**40)
    else:
        values = st.integers(0, 3)
    return pa.array(draw(st.lists(maybe(values), min_size=n, max_size=n)),
                    t if t != pa.large_binary() else pa.binary())


@st.composite
def _usual_batch(draw, n: int) -> pa.RecordBatch:
    """Mostly a batch send_shape reads (one topic, bodies, send columns in their types,
    named once), with nulls and empty values here and there."""
    names = draw(st.lists(st.sampled_from(sorted(set(FLAT) - {"topic", "body"})),
                          unique=True, max_size=4))
    topic = pa.array([draw(TEXT)] * n, pa.string())
    body = pa.array(draw(st.lists(st.binary(max_size=4), min_size=n, max_size=n)),
                    pa.binary())
    maybe = (lambda s: st.none() | s) if draw(st.booleans()) else (lambda s: s)
    cols = [topic, body] + [_column_of(draw, FLAT[name], n, maybe) for name in names]
    return pa.RecordBatch.from_arrays(cols, names=["topic", "body"] + names)


@st.composite
def _batch(draw) -> pa.RecordBatch:
    n = draw(st.integers(1, 5))
    if draw(st.booleans()):
        batch = draw(_usual_batch(n))
        return batch.slice(1) if n > 1 and draw(st.booleans()) else batch
    names = draw(st.lists(st.sampled_from(sorted(FLAT) + ["keys", "colour"]), max_size=4))
    names = ["topic", "body"] * draw(st.booleans()) + names
    if not names:
        names = ["topic"]
    cols = []
    for name in names:
        if name == "keys":
            cols.append(pa.array([["k"]] * n, pa.list_(pa.string())))
        else:
            cols.append(draw(_column(name, n)))
    batch = pa.RecordBatch.from_arrays(cols, names=names)
    if n > 1 and draw(st.booleans()):
        batch = batch.slice(1)
    return batch


def _usual(batch: pa.RecordBatch) -> bool:
    """What send_shape must read, decided in pyarrow."""
    names = batch.schema.names
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid:
        return False
    if len(set(names)) < len(names) or not {"topic", "body"} <= set(names):
        return False
    if any(FLAT.get(name) != batch.schema.field(i).type for i, name in enumerate(names)):
        return False
    topic, body = batch.column(names.index("topic")), batch.column(names.index("body"))
    if topic.null_count or len(pc.unique(topic)) != 1 or body.null_count:
        return False
    text = [batch.column(i) for i, name in enumerate(names) if name in ("tags", "message_group")]
    return all(none_if_empty(col) is col for col in text)     # (no empty value)


@settings(max_examples=400, deadline=None)
@given(batch=_batch())
def test_send_shape_reads_the_usual_batch_as_pyarrow_does_and_declines_the_others(batch):
    shape = send_shape(batch)
    assert (shape is not None) == _usual(batch), batch.schema
    if shape is None:
        return
    n = batch.num_rows
    names = batch.schema.names
    assert shape.names == tuple(names) and shape.n == n
    assert typed(batch) is batch                 # no cast left to make
    assert set(names) <= SEND_COLUMNS
    assert shape.topic == batch.column(names.index("topic"))[0].as_py()
    assert list(shape.given) == [name for name in names if name in ("topic", "body")
                                 or batch.column(names.index(name)).null_count < n]
    sizes = pc.binary_length(batch.column(names.index("body"))).to_numpy()
    assert shape.body_sizes.tolist() == sizes.tolist()
    assert shape.body_extent == (sizes.min(), sizes.max(), sizes.sum())
    cols = batchsend._ShapeColumns(shape)
    assert list(cols) == list(shape.given)
    for name in shape.given:
        assert cols[name].equals(batch.column(names.index(name)))
        assert cols.get(name).equals(cols[name])
    for name in SEND_COLUMNS - set(shape.given):      # (its own get: no KeyError raised)
        assert cols.get(name) is None and cols.get(name, 7) == 7 and name not in cols
    # the export is the batch: pyarrow reads the same rows from it (an import moves what
    # it reads: the schema's export, kept for the batches of the same schema, is not
    # moved, as composed_rows reads it only)
    imported = pa.RecordBatch._import_from_c_capsule(batch.schema.__arrow_c_schema__(),
                                                     shape.exported.array)
    assert imported.equals(batch)
    assert send_shape(batch).names == shape.names       # the kept export still reads


def test_each_flat_send_column_in_its_type_is_read_and_in_another_is_left_to_typed():
    # a format the C call does not know (here: a mistyped table) would send every batch
    # the long way: each flat send column, alone beside topic and body, is read
    base = {"topic": pa.array(["t", "t"]), "body": pa.array([b"a", b"bc"])}
    assert send_shape(pa.RecordBatch.from_pydict(base)) is not None
    for name, t in FLAT.items():
        if name in base:
            continue
        values = {pa.string(): ["x", None], TS: [5, None], pa.int32(): [1, 1]}[t]
        batch = pa.RecordBatch.from_pydict({**base, name: pa.array(values, t)})
        shape = send_shape(batch)
        assert shape is not None, name
        assert shape.topic == "t" and shape.body_sizes.tolist() == [1, 2]
        assert shape.given == ("topic", "body", name)
        wide = batch.set_column(2, name, pa.array(values, t).cast(
            pa.large_string() if t == pa.string() else pa.int64()))
        assert send_shape(wide) is None and typed(wide).schema == batch.schema, name
