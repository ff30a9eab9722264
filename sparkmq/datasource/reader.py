"""Reading a store from Spark: batch (``spark.read``) and streaming (``spark.readStream``).

Where things run:

* ``SparkMQBatchReader.__init__``, ``pushFilters`` and ``partitions`` run on
  the driver (Spark's Python planner worker). The reader pins ONE committed
  snapshot version there; every partition carries (url, version), so all
  tasks of a read see the same whole committed version.
* ``read(partition)`` runs on executors: it opens that version (from the
  process's snapshot cache, ``snapshots.py``: kept across tasks and triggers, a
  newer version advanced from the newest cached by replaying only the newer
  commits), and yields
  ``pyarrow.RecordBatch`` es straight from the memory-mapped segments
  (``Snapshot.iter_tables``, cast to :data:`ARROW_SCHEMA` a step of up to
  65,536 messages at a time; no per-row or per-batch Python). A schema the
  user declares (a subset of :data:`SPARK_SCHEMA`) limits what is read.
* Streaming reads (``stream.py``: ``SparkMQStreamReader``) plan each micro-batch
  with the same ranges and read them with the same :func:`read_range`.

A read of several stores (``stores.py``: one per broker) plans each store's
pinned version the same way; rows carry the store's ``broker_name``.

Pushed filters (batch only) are applied exactly: topic / queue_id / queue_offset /
broker_name prune the plan; store_timestamp lower bounds prune via the ConsumeQueue time
column and are re-checked per row; ``keys = array(...)`` uses the Index; tags
are filtered per batch. Anything else goes back to Spark.
"""
from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (DataSourceReader, EqualTo,
                                    GreaterThan, GreaterThanOrEqual, In, InputPartition,
                                    LessThan, LessThanOrEqual)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (ArrayType, BinaryType, ByteType, IntegerType, LongType,
                               MapType, StringType, StructField, StructType, TimestampType)

from ..errors import DataLossError, UserError
from ..log.reader import Snapshot
from . import kafka
from .options import (ReadOptions, TopicQueue, parse_options, resolve_offsets, select_queues,
                      select_topics)

log = logging.getLogger("sparkmq.datasource")

#: Output columns of a read, in order (see the README's schema table).
SPARK_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("queue_offset", LongType(), False),
    StructField("message_id", StringType(), False),
    StructField("tags", StringType(), True),
    StructField("keys", ArrayType(StringType(), True), True),
    StructField("body", BinaryType(), False),
    StructField("properties", MapType(StringType(), StringType(), True), True),
    StructField("born_timestamp", TimestampType(), False),
    StructField("store_timestamp", TimestampType(), False),
    StructField("born_host", StringType(), True),
    StructField("store_host", StringType(), True),
    StructField("broker_name", StringType(), False),
    StructField("physical_offset", LongType(), False),
    StructField("reconsume_times", IntegerType(), False),
    StructField("delivery_timestamp", TimestampType(), True),
    StructField("message_group", StringType(), True),
    StructField("transaction_id", StringType(), True),
    StructField("message_type", ByteType(), False),
    StructField("unique_key", StringType(), True),
])
ARROW_SCHEMA = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")
_STORE_COLUMNS = [f.name for f in SPARK_SCHEMA.fields if f.name != "broker_name"]
_SPARK_FIELDS = {f.name: f for f in SPARK_SCHEMA.fields}


def output_schema(schema: StructType | None, opts: ReadOptions | None = None,
                  ) -> pa.Schema | None:
    """The Arrow schema a read returns: None for all of :data:`SPARK_SCHEMA`, else
    that of a schema the user declared (``spark.read.schema(...)``), checked.

    A declared schema picks columns of SPARK_SCHEMA by name (any order, same
    types); only those are read and sent to Spark (the Python data source API
    has no column pruning, so declaring the columns is how a query avoids
    materializing all twenty). With ``columns=kafka`` (``opts.kafka``) the columns
    are Kafka's (:mod:`sparkmq.datasource.kafka`) and the schema is always given.
    """
    full, what = SPARK_SCHEMA, "sparkmq"
    if opts is not None and opts.kafka:
        full, what = kafka.kafka_schema(opts.include_headers), "Kafka (columns=kafka)"
        schema = schema or full
    if schema is None:
        return None
    fields = {f.name: f for f in full.fields}
    names = []
    for f in schema.fields:
        known = fields.get(f.name)
        if known is None:
            raise UserError(f"column {f.name!r} of the declared schema is not a {what} "
                            f"column; columns are: {', '.join(fields)}")
        if f.dataType != known.dataType:
            raise UserError(f"column {f.name!r} is {known.dataType.simpleString()} in {what}, "
                            f"not {f.dataType.simpleString()}; fix the declared schema")
        names.append(f.name)
    if len(set(names)) != len(names):
        raise UserError(f"the declared schema names a column twice: {names}")
    if not names:
        raise UserError("the declared schema has no columns")
    if schema == SPARK_SCHEMA:
        return None
    return to_arrow_schema(StructType(list(schema.fields)), timezone="UTC")

# -- snapshots -----------------------------------------------------------------
def open_snapshot(url: str, version: int | None = None, *, timestamp_ms: int | None = None,
                  storage_options: dict | None = None) -> Snapshot:
    """A Snapshot of ``version`` (default: the newest), from this process's cache
    (``snapshots.CACHE``: a newer version is advanced from the newest one cached,
    replaying only the commits after it). Thread-safe."""
    from .snapshots import CACHE
    return CACHE.get(url, version, timestamp_ms=timestamp_ms, storage_options=storage_options)


def broker_name(snap: Snapshot) -> str:
    """The store's brokerName (metaData configuration), else its store id."""
    conf = snap.state.metadata.configuration if snap.state.metadata else {}
    return str(conf.get("brokerName") or snap.store_id)


# -- partitions ---------------------------------------------------------------
@dataclass
class RangeFilter:
    """Row filters applied per batch (all exact): tags, store_timestamp, keys."""

    tags_in: tuple | None = None
    ts_min_ms: int | None = None          # store_timestamp >= (inclusive)
    ts_max_ms: int | None = None          # store_timestamp <= (inclusive)
    ts_min_strict: bool = False
    ts_max_strict: bool = False
    keys_equal: tuple | None = None       # keys = array(...)
    key_any: str | None = None            # option key: the keys hold this one

    def active(self) -> bool:
        return any(v is not None for v in (self.tags_in, self.ts_min_ms, self.ts_max_ms,
                                           self.keys_equal, self.key_any))

    def columns(self) -> list[str]:
        """The stored columns these filters look at."""
        return [c for c, on in (("tags", self.tags_in is not None),
                                ("store_timestamp", self.ts_min_ms is not None or
                                 self.ts_max_ms is not None),
                                ("keys", self.keys_equal is not None or
                                 self.key_any is not None)) if on]


@dataclass
class QueueRange(InputPartition):
    """Queue offsets ``[start, end)`` of one queue in one committed version
    (or the explicit ``offsets`` list, sorted, for Index lookups)."""

    url: str
    version: int
    topic: str
    queue_id: int
    start: int
    end: int
    fail_on_data_loss: bool = True
    row_filter: RangeFilter = field(default_factory=RangeFilter)
    offsets: tuple | None = None
    storage_options: dict | None = None
    schema: pa.Schema | None = None       # declared output schema (None: ARROW_SCHEMA)
    kafka: bool = False                   # schema holds Kafka's columns (kafka.py)

    def __post_init__(self):
        InputPartition.__init__(self, None)


def split_ranges(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Split big ranges so there are at least ``min_partitions`` (like Kafka's option)."""
    ranges = [r for r in ranges if r.offsets is not None or r.end > r.start]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges if r.offsets is None)
    if total == 0:
        return ranges
    out = []
    for r in ranges:
        size = r.end - r.start
        pieces = 1 if r.offsets is not None else max(1, min(size, -(-size * min_partitions // total)))
        bounds = np.linspace(r.start, r.end, pieces + 1).astype(np.int64).tolist()
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            if hi > lo or r.offsets is not None:
                out.append(replace(r, start=lo, end=hi))
    return out


def check_data_loss(snap: Snapshot, r: QueueRange) -> QueueRange | None:
    """Apply failOnDataLoss to a planned range whose start retention removed."""
    earliest = snap.min_offset(r.topic, r.queue_id)
    if r.start >= earliest or r.end <= r.start:
        return r
    if r.fail_on_data_loss:
        raise DataLossError(
            f"offsets {r.start}..{min(r.end, earliest) - 1} of {r.topic}/{r.queue_id} were "
            f"removed by retention; the earliest available offset is {earliest}. Restart from "
            "it (startingOffsets) or set failOnDataLoss=false to skip removed offsets.",
            earliest_offset=earliest)
    log.warning("failOnDataLoss=false: skipping removed offsets %d..%d of %s/%d (earliest "
                "available is %d)", r.start, min(r.end, earliest) - 1, r.topic, r.queue_id,
                earliest)
    if earliest >= r.end:
        return None
    return replace(r, start=earliest)


# -- reading a partition (executors) ----------------------------------------------
def _runs(offsets: tuple) -> list[tuple[int, int]]:
    runs = []
    for o in offsets:
        if runs and runs[-1][1] == o:
            runs[-1][1] = o + 1
        else:
            runs.append([o, o + 1])
    return [(a, b) for a, b in runs]


def _to_spark(table: pa.Table, broker: str, schema: pa.Schema) -> pa.Table:
    """A step of messages as Spark's Arrow types (one cast per column and step)."""
    arrays = []
    for f in schema:
        if f.name == "broker_name":
            arrays.append(pa.chunked_array(
                [pa.repeat(pa.scalar(broker, pa.string()), table.num_rows)]))
        else:
            col = table.column(f.name)
            arrays.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _filter_rows(batch: pa.Table, flt: RangeFilter) -> pa.Table:
    mask = None

    def both(m):
        return m if mask is None else pc.and_(mask, m)
    if flt.tags_in is not None:
        mask = both(pc.fill_null(pc.is_in(batch.column("tags"), pa.array(flt.tags_in, pa.string())),
                                 False))
    if flt.ts_min_ms is not None or flt.ts_max_ms is not None:
        ts = batch.column("store_timestamp").cast(pa.int64())
    if flt.ts_min_ms is not None:
        fn = pc.greater if flt.ts_min_strict else pc.greater_equal
        mask = both(fn(ts, flt.ts_min_ms))
    if flt.ts_max_ms is not None:
        fn = pc.less if flt.ts_max_strict else pc.less_equal
        mask = both(fn(ts, flt.ts_max_ms))
    if flt.keys_equal is not None:   # few rows (Index hits): Python is fine here
        want = list(flt.keys_equal)
        mask = both(pa.array([k == want for k in batch.column("keys").to_pylist()], pa.bool_()))
    if flt.key_any is not None:
        mask = both(pa.array([bool(k) and flt.key_any in k
                              for k in batch.column("keys").to_pylist()], pa.bool_()))
    return batch if mask is None else batch.filter(mask)


def read_range(r: QueueRange):
    """Yield Spark-typed record batches of one partition (runs on executors).

    Converted a step (up to 65,536 messages) at a time: per-batch Python work
    would cost more than the zero-copy reads themselves. Only the columns the
    output and the row filters need are read; with ``r.kafka`` the output is
    Kafka's columns (``kafka.to_kafka``).
    """
    snap = open_snapshot(r.url, r.version, storage_options=r.storage_options)
    broker = broker_name(snap)
    schema = r.schema or ARROW_SCHEMA
    wanted = kafka.source_columns(schema.names) if r.kafka else \
        [c for c in schema.names if c != "broker_name"]
    wanted += [c for c in r.row_filter.columns() if c not in wanted]   # e.g. option key
    if not wanted:   # only broker_name: read the cheapest stored column for the row count
        wanted = ["queue_id"]
    convert = kafka.to_kafka if r.kafka else (lambda t, s: _to_spark(t, broker, s))
    spans = _runs(r.offsets) if r.offsets is not None else [(r.start, r.end)]
    on_removed = "error" if r.fail_on_data_loss else "skip"
    for lo, hi in spans:
        try:
            for table in snap.iter_tables(r.topic, r.queue_id, lo, hi, columns=wanted,
                                          on_removed=on_removed):
                if r.row_filter.active():
                    table = _filter_rows(table, r.row_filter)
                if table.num_rows:
                    yield from convert(table, schema).to_batches()
        except DataLossError:
            if r.fail_on_data_loss:
                raise
            log.warning("failOnDataLoss=false: offsets %d..%d of %s/%d are gone; skipped",
                        lo, hi - 1, r.topic, r.queue_id)


# -- filter pushdown ------------------------------------------------------------
def _ms(value) -> int | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.astimezone()
        return int(value.timestamp() * 1000)
    if isinstance(value, (int, float)):
        return int(value)
    return None


@dataclass
class PushedPlan:
    """What pushed filters narrowed: all exact (see module docstring)."""

    topics: set | None = None
    queues: set | None = None
    brokers: set | None = None       # broker_name: which stores of a read
    offset_lo: int = 0               # queue_offset >= (inclusive)
    offset_hi: int | None = None     # queue_offset < (exclusive)
    row_filter: RangeFilter = field(default_factory=RangeFilter)
    empty: bool = False

    def intersect(self, name: str, values) -> None:
        cur = getattr(self, name)
        values = set(values)
        setattr(self, name, values if cur is None else cur & values)

    def push(self, f) -> bool:
        """Record filter ``f`` if it can be applied exactly; False leaves it to Spark."""
        if len(f.attribute) != 1:
            return False
        col = f.attribute[0]
        if isinstance(f, EqualTo) and col in ("topic", "queue_id", "tags", "broker_name"):
            return self._push_in(col, [f.value])
        if isinstance(f, In) and col in ("topic", "queue_id", "tags", "broker_name"):
            return self._push_in(col, list(f.value))
        if isinstance(f, EqualTo) and col == "keys" and isinstance(f.value, (list, tuple)):
            if not f.value or not all(isinstance(k, str) for k in f.value):
                return False
            if self.row_filter.keys_equal not in (None, tuple(f.value)):
                self.empty = True
            self.row_filter.keys_equal = tuple(f.value)
            return True
        if isinstance(f, EqualTo) and col in ("queue_offset", "store_timestamp"):
            return all(self.push(cls(f.attribute, f.value))
                       for cls in (GreaterThanOrEqual, LessThanOrEqual))
        if isinstance(f, In) and col == "queue_offset" and f.value and \
                all(isinstance(v, int) for v in f.value):
            self._push_offset(GreaterThanOrEqual(f.attribute, min(f.value)))
            self._push_offset(LessThanOrEqual(f.attribute, max(f.value)))
            return False   # pruned to [min, max]; Spark still applies the exact IN
        bound = (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
        if isinstance(f, bound) and col == "queue_offset" and isinstance(f.value, int):
            self._push_offset(f)
            return True
        if isinstance(f, bound) and col == "store_timestamp" and _ms(f.value) is not None:
            self._push_time(f, _ms(f.value))
            return True
        return False

    def _push_in(self, col: str, values: list) -> bool:
        if col == "topic" and all(isinstance(v, str) for v in values):
            self.intersect("topics", values)
        elif col == "broker_name" and all(isinstance(v, str) for v in values):
            self.intersect("brokers", values)
        elif col == "queue_id" and all(isinstance(v, int) for v in values):
            self.intersect("queues", values)
        elif col == "tags" and all(isinstance(v, str) for v in values):
            cur = self.row_filter.tags_in
            self.row_filter.tags_in = tuple(values) if cur is None else \
                tuple(v for v in cur if v in values)
        else:
            return False
        return True

    def _push_offset(self, f) -> None:
        v = f.value
        if isinstance(f, GreaterThan):
            self.offset_lo = max(self.offset_lo, v + 1)
        elif isinstance(f, GreaterThanOrEqual):
            self.offset_lo = max(self.offset_lo, v)
        else:
            hi = v if isinstance(f, LessThan) else v + 1
            self.offset_hi = hi if self.offset_hi is None else min(self.offset_hi, hi)

    def _push_time(self, f, ms: int) -> None:
        rf = self.row_filter
        if isinstance(f, (GreaterThan, GreaterThanOrEqual)):
            strict = isinstance(f, GreaterThan)
            if rf.ts_min_ms is None or ms > rf.ts_min_ms or (ms == rf.ts_min_ms and strict):
                rf.ts_min_ms, rf.ts_min_strict = ms, strict
        else:
            strict = isinstance(f, LessThan)
            if rf.ts_max_ms is None or ms < rf.ts_max_ms or (ms == rf.ts_max_ms and strict):
                rf.ts_max_ms, rf.ts_max_strict = ms, strict


# -- batch reader -------------------------------------------------------------------
class SparkMQBatchReader(DataSourceReader):
    """``spark.read.format("sparkmq")``: one committed version of each store (one, or
    one per broker: ``stores.py``), planned on the driver."""

    def __init__(self, options, schema: StructType | None = None):
        from .stores import plan_stores
        self.opts: ReadOptions = parse_options(options)
        self.schema = output_schema(schema, self.opts)
        self.pushed = PushedPlan()
        stores = plan_stores(self.opts, self._open_pinned, broker_name)
        #: (store, pinned version) per broker, sorted by broker name
        self.stores = [(r, snap.version) for r, snap in stores]
        self.version = self.stores[0][1]

    @staticmethod
    def _open_pinned(opts: ReadOptions) -> Snapshot:
        return open_snapshot(opts.url, opts.version_as_of, timestamp_ms=opts.timestamp_as_of_ms,
                             storage_options=opts.storage_options)

    def pushFilters(self, filters):
        for f in filters:
            # columns=kafka: topic / partition / offset are pushed as sparkmq's columns
            g = kafka.pushed_filter(f) if self.opts.kafka else f
            if g is None or not self.pushed.push(g):
                yield f

    def planned_ranges(self) -> list[QueueRange]:
        """Queue ranges of this read, after options and pushed filters (driver)."""
        if self.pushed.empty:
            return []
        out = []
        for store, version in self.stores:
            if self.pushed.brokers is None or store.broker in self.pushed.brokers:
                snap = open_snapshot(store.opts.url, version,
                                     storage_options=store.opts.storage_options)
                out += self._store_ranges(snap, store.opts)
        return split_ranges(out, self.opts.min_partitions)

    def _store_ranges(self, snap: Snapshot, opts: ReadOptions) -> list[QueueRange]:
        """The ranges of one store's snapshot (before minPartitions splits them)."""
        pushed = self.pushed
        topics = [t for t in select_topics(snap, opts)
                  if pushed.topics is None or t in pushed.topics]
        pairs = [(t, q) for t, q in select_queues(snap, topics, opts)
                 if pushed.queues is None or q in pushed.queues]
        starts = resolve_offsets(snap, pairs, opts.starting_offsets, opts.starting_timestamp_ms,
                                 "earliest", "startingOffsets", opts.starting_by_timestamp,
                                 opts.by_timestamp_strategy)
        ends = resolve_offsets(snap, pairs, opts.ending_offsets, opts.ending_timestamp_ms,
                               "latest", "endingOffsets", opts.ending_by_timestamp)
        rf = pushed.row_filter
        if opts.key is not None:        # option key: the Index finds the messages
            rf = replace(rf, key_any=opts.key)
        key = rf.keys_equal[0] if rf.keys_equal else opts.key
        key_hits = self._key_hits(snap, topics, key) if key is not None else None
        out = []
        for t, q in pairs:
            lo = max(starts[(t, q)], pushed.offset_lo)
            hi = min(ends[(t, q)], snap.max_offset(t, q))
            if pushed.offset_hi is not None:
                hi = min(hi, pushed.offset_hi)
            if rf.ts_min_ms is not None and lo < hi:
                lo = max(lo, min(snap.offset_for_time(t, q, rf.ts_min_ms), hi))
            offsets = None
            if key_hits is not None:
                offsets = tuple(o for o in key_hits.get((t, q), ()) if lo <= o < hi)
                if not offsets:
                    continue
            r = check_data_loss(snap, QueueRange(opts.url, snap.version, t, q, lo, hi,
                                                 opts.fail_on_data_loss, rf, offsets,
                                                 opts.storage_options, self.schema,
                                                 self.opts.kafka))
            if r is not None:
                if r.offsets is not None:
                    r.offsets = tuple(o for o in r.offsets if o >= r.start)
                out.append(r)
        return out

    def _key_hits(self, snap: Snapshot, topics: list[str],
                  key: str) -> dict[TopicQueue, list[int]]:
        """Queue offsets of the messages carrying ``key``, per queue (via the Index)."""
        hits: dict[TopicQueue, set] = {}
        for t in topics:
            table = snap.index_hits(snap.topic_id(t), key)
            for q, o in zip(table.column("queue_id").to_pylist(),
                            table.column("queue_offset").to_pylist()):
                hits.setdefault((t, q), set()).add(o)
        return {k: sorted(v) for k, v in hits.items()}

    def partitions(self):
        ranges = self.planned_ranges()
        store, version = self.stores[0]
        return ranges or [QueueRange(store.opts.url, version, "", 0, 0, 0)]

    def read(self, partition: QueueRange):
        if partition.end <= partition.start and partition.offsets is None:
            return iter(())
        return read_range(partition)
