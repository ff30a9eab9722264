"""Kafka's columns for the ``sparkmq`` data source, read and written (issue 15).

Read option ``columns=kafka`` makes batch and streaming reads return exactly the
schema of Spark's Kafka source, so a Kafka-source job ports by changing its
format and path (and adding this option):

=================  ============================================  =====================
Kafka column       made from                                     type (all nullable)
=================  ============================================  =====================
``key``            the first of ``keys`` as UTF-8 (null: none)   binary
``value``          ``body``                                      binary
``topic``          ``topic``                                     string
``partition``      ``queue_id``                                  int
``offset``         ``queue_offset``                              long
``timestamp``      ``born_timestamp`` (the producer's time)      timestamp
``timestampType``  0 (Kafka's CreateTime)                        int
``headers``        only with ``includeHeaders=true``: see below  array<struct<key:
                                                                 string,value:binary>>
=================  ============================================  =====================

``timestamp`` is the producer's time because that is what a Kafka topic gives
by default (``message.timestamp.type=CreateTime``, timestampType 0); the broker's
store time stays in ``columns=sparkmq`` (``store_timestamp``, what
``startingTimestamp`` and its kin compare with).

``headers`` holds the user properties (UTF-8 values), then ``TAGS`` (the tags,
when set), then ``KEYS`` (every key, space separated, RocketMQ's own form) when a
message has more than one key, so nothing but the first key is lost from ``key``.
RocketMQ reserves both names, so no user property collides with them. As in Kafka,
a message with no headers has null ``headers``.

Pushed down (batch) on Kafka's names: ``topic``, ``partition`` and ``offset``
(as topic / queue_id / queue_offset); filters on the other columns are Spark's.

Writes take Kafka's sink columns as Spark's Kafka sink does: ``value`` (binary or
string, required), ``key`` (binary or string, UTF-8: the message's key, indexed),
``topic`` (or the ``topic`` option, which wins), ``partition`` (the queue) and
``headers`` (user properties; ``TAGS`` and ``KEYS`` set the tags and the keys, so a
Kafka-column read writes back whole). A row with a key and no partition goes to
queue crc32(key) % writeQueueNums, so one key keeps its order, as Kafka's
partitioner does. ``offset``, ``timestamp`` and ``timestampType`` (a Kafka read's
other columns) are ignored, as the Kafka sink ignores them; any other column is
refused.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

from ..errors import InvalidMessageError

#: the element type of Kafka's ``headers`` column
HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()),
                                     StructField("value", BinaryType())]))
#: Spark's Kafka source schema without headers (every field nullable, as Spark's is)
KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])
KAFKA_SCHEMA_WITH_HEADERS = StructType(KAFKA_SCHEMA.fields + [StructField("headers",
                                                                          HEADERS_TYPE)])
#: Kafka's CreateTime (timestampType 0): the producer's time
CREATE_TIME = 0
TAGS_HEADER, KEYS_HEADER = "TAGS", "KEYS"

#: Kafka column -> the sparkmq columns it is made from
_SOURCES = {"key": ["keys"], "value": ["body"], "topic": ["topic"], "partition": ["queue_id"],
            "offset": ["queue_offset"], "timestamp": ["born_timestamp"], "timestampType": [],
            "headers": ["properties", "tags", "keys"]}
#: Kafka column -> the sparkmq column whose pushed filters mean the same
_PUSHED_AS = {"topic": "topic", "partition": "queue_id", "offset": "queue_offset"}


def kafka_schema(include_headers: bool) -> StructType:
    return KAFKA_SCHEMA_WITH_HEADERS if include_headers else KAFKA_SCHEMA


# -- reads --------------------------------------------------------------------------------
def source_columns(names) -> list[str]:
    """The stored columns a read of Kafka columns ``names`` needs (at least one, for the
    row count)."""
    out: list[str] = []
    for name in names:
        out += [c for c in _SOURCES[name] if c not in out]
    return out or ["queue_id"]


def pushed_filter(f):
    """Filter ``f`` on a Kafka column as the same filter on sparkmq's column, or None
    when the column has no sparkmq filter of the same meaning."""
    if len(f.attribute) != 1 or f.attribute[0] not in _PUSHED_AS:
        return None
    return dataclasses.replace(f, attribute=(_PUSHED_AS[f.attribute[0]],))


def to_kafka(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A step of stored messages as Kafka's columns (``schema``: Arrow, Spark's types)."""
    n = table.num_rows
    arrays = []
    for f in schema:
        if f.name == "key":
            arr = _first_key(table.column("keys").combine_chunks()).cast(pa.binary())
        elif f.name == "value":
            arr = table.column("body")
        elif f.name == "headers":
            arr = _headers(table, f.type)
        elif f.name == "timestampType":
            arr = pa.array(np.full(n, CREATE_TIME, np.int32))
        else:
            arr = table.column({"timestamp": "born_timestamp", "partition": "queue_id",
                                "offset": "queue_offset"}.get(f.name, f.name))
        arrays.append(arr if arr.type == f.type else arr.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _first_key(keys: pa.Array) -> pa.Array:
    """The first key of each row; null for no keys (list_element refuses empty lists)."""
    some = pc.fill_null(pc.greater(pc.list_value_length(keys), 0), False)
    safe = pc.if_else(some, keys, pa.scalar([None], keys.type))
    return pc.list_element(safe, 0)


def _headers(table: pa.Table, typ: pa.DataType) -> pa.Array:
    """Per row: the properties, then TAGS (when set), then KEYS (when more than one key);
    null for a row with none. Vectorized: one take over a pool of every candidate."""
    n = table.num_rows
    entries = table.column("properties").combine_chunks().cast(
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())])))
    flat = entries.flatten()
    nprops = entries.value_lengths().fill_null(0).to_numpy().astype(np.int64)
    tags = table.column("tags").combine_chunks()
    keys = table.column("keys").combine_chunks()
    has_tags = pc.is_valid(tags).to_numpy(zero_copy_only=False)
    has_keys = pc.fill_null(pc.greater(pc.list_value_length(keys), 1), False) \
        .to_numpy(zero_copy_only=False)
    p = len(flat)
    pool_keys = pa.concat_arrays([flat.field("key"),
                                  pa.repeat(pa.scalar(TAGS_HEADER), n).cast(pa.string()),
                                  pa.repeat(pa.scalar(KEYS_HEADER), n).cast(pa.string())])
    pool_values = pa.concat_arrays([flat.field("value").cast(pa.binary()), tags.cast(pa.binary()),
                                    pc.binary_join(keys, " ").cast(pa.binary())])
    rows = np.arange(n, dtype=np.int64)
    take = np.concatenate([np.arange(p, dtype=np.int64), p + rows[has_tags],
                           p + n + rows[has_keys]])
    row_of = np.concatenate([np.repeat(rows, nprops), rows[has_tags], rows[has_keys]])
    kind = np.concatenate([np.zeros(p, np.int8), np.ones(int(has_tags.sum()), np.int8),
                           np.full(int(has_keys.sum()), 2, np.int8)])
    take = take[np.lexsort((kind, row_of))]     # by row, then properties / TAGS / KEYS
    counts = nprops + has_tags + has_keys
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    values = pa.StructArray.from_arrays([pool_keys.take(take), pool_values.take(take)],
                                        fields=list(typ.value_type))
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=typ,
                                    mask=pa.array(counts == 0))


# -- writes -------------------------------------------------------------------------------
#: Kafka sink column -> (accepted Spark types, what to tell the user)
WRITE_COLUMNS = {
    "key": ((BinaryType, StringType), "binary or string (UTF-8)"),
    "value": ((BinaryType, StringType), "binary or string"),
    "topic": ((StringType,), "string"),
    "partition": ((IntegerType,), "int"),
    "headers": ((ArrayType,), "array<struct<key:string,value:binary>>"),
}
#: columns of a Kafka read that the Kafka sink ignores, and so does this one
IGNORED_COLUMNS = ("offset", "timestamp", "timestampType")


def is_kafka_write(schema: StructType) -> bool:
    """A DataFrame in Kafka's sink columns (it has ``value``; sparkmq's has ``body``)."""
    return "value" in schema.fieldNames()


def validate_write(schema: StructType, *, topic_option: str | None) -> None:
    """InvalidMessageError naming every wrong or unknown column of a Kafka-column write."""
    problems = []
    for f in schema.fields:
        spec = WRITE_COLUMNS.get(f.name)
        if spec is None:
            if f.name not in IGNORED_COLUMNS:
                problems.append(f"unknown column {f.name!r}")
            continue
        ok = isinstance(f.dataType, spec[0])
        if f.name == "headers":
            ok = ok and _headers_type_ok(f.dataType)
        if not ok:
            problems.append(f"column {f.name!r} has type {f.dataType.simpleString()}, "
                            f"expected {spec[1]}")
    if "topic" not in schema.fieldNames() and not topic_option:
        problems.append("no 'topic' column and no topic option")
    if problems:
        accepted = ", ".join(f"{k} ({v[1]})" for k, v in WRITE_COLUMNS.items())
        raise InvalidMessageError(
            "cannot write this DataFrame to sparkmq: " + "; ".join(problems) +
            f". A write with Kafka's columns (it has 'value') takes {accepted}, and ignores "
            f"{', '.join(IGNORED_COLUMNS)}; sparkmq's own columns (body, keys, ...) are "
            "not mixed in")


def _headers_type_ok(t) -> bool:
    el = t.elementType
    return isinstance(el, StructType) and [f.name for f in el.fields] == ["key", "value"] \
        and isinstance(el.fields[0].dataType, StringType) \
        and isinstance(el.fields[1].dataType, BinaryType)


def to_sparkmq(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.Array | None]:
    """A batch of Kafka's sink columns as sparkmq's write columns (body, keys, topic,
    queue_id, tags, properties), and the shard of each row (its key: the queue of a row
    without partition) or None."""
    n = batch.num_rows
    col = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
    out = {"body": col["value"]}
    if "topic" in col:
        out["topic"] = col["topic"]
    if "partition" in col:
        out["queue_id"] = col["partition"]
    key = _utf8(col["key"], "key") if "key" in col else pa.nulls(n, pa.string())
    has_key = pc.is_valid(key).to_numpy(zero_copy_only=False)
    # null rows own no child values (the Index pairs flattened keys with their rows)
    keys = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], np.cumsum(has_key)]).astype(np.int32)),
        key.drop_null(), mask=pa.array(~has_key))
    if "headers" in col:
        tags, extra_keys, props = _split_headers(col["headers"], n)
        out["tags"], out["properties"] = tags, props
        keys = _merge_keys(key, keys, extra_keys)
    out["keys"] = keys
    return pa.RecordBatch.from_pydict(out), (key if key.null_count < n else None)


def _utf8(arr: pa.Array, what: str) -> pa.Array:
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise InvalidMessageError(f"a {what} is not UTF-8 (sparkmq keys and properties are "
                                  f"strings): {exc}") from None


def _split_headers(headers: pa.Array, n: int):
    """(tags, KEYS header or null, properties) per row from Kafka headers."""
    flat = headers.flatten()
    lengths = headers.value_lengths().fill_null(0).to_numpy().astype(np.int64)
    row_of = np.repeat(np.arange(n, dtype=np.int64), lengths)
    names = flat.field("key")
    values = _utf8(flat.field("value"), "header value")
    if names.null_count:
        raise InvalidMessageError("a header has a null key")
    enc = pc.dictionary_encode(names)
    pairs = row_of * max(1, len(enc.dictionary)) + enc.indices.to_numpy()
    if len(np.unique(pairs)) != len(pairs):
        raise InvalidMessageError("a row has two headers of one name; sparkmq properties "
                                  "are a map (one value per name)")
    is_tags = pc.equal(names, TAGS_HEADER).to_numpy(zero_copy_only=False)
    is_keys = pc.equal(names, KEYS_HEADER).to_numpy(zero_copy_only=False)
    tags = _scatter(values, row_of, is_tags, n)
    extra_keys = _scatter(values, row_of, is_keys, n)
    keep = ~(is_tags | is_keys)
    counts = np.bincount(row_of[keep], minlength=n)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    props = pa.MapArray.from_arrays(offsets, names.filter(pa.array(keep)),
                                    values.filter(pa.array(keep)), mask=pa.array(counts == 0))
    return tags, extra_keys, props


def _scatter(values: pa.Array, row_of: np.ndarray, where: np.ndarray, n: int) -> pa.Array:
    """values[where] placed at their rows (null elsewhere)."""
    idx = np.full(n, -1, np.int64)
    idx[row_of[where]] = np.flatnonzero(where)
    return values.take(pa.array(idx, mask=idx < 0))


def _merge_keys(key: pa.Array, keys: pa.Array, extra: pa.Array) -> pa.Array:
    """Rows with a KEYS header: the key first, then the header's other keys (few rows:
    a message with several keys is rare, so this is Python per such row)."""
    if extra.null_count == len(extra):
        return keys
    merged = keys.to_pylist()
    for i in np.flatnonzero(pc.is_valid(extra).to_numpy(zero_copy_only=False)):
        first = key[i].as_py()
        words = str(extra[i].as_py()).split()
        merged[i] = ([first] if first is not None else []) + [w for w in words if w != first]
        merged[i] = merged[i] or None
    return pa.array(merged, pa.list_(pa.string()))
