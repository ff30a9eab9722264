"""The send of a record batch: the one core behind a Flight DoPut batch and a plain
RocketMQ SendMessage request read into columns (``grpc_service``, ``sparkmq._wire``).

A batch holds the columns a producer sets (``SEND_COLUMNS``: ``topic`` and ``body``
required). ``BatchSender.check`` holds it to the RocketMQ path's rules before anything is
stored (the topic may be written, the topic's message type, the broker may append, each
row's body and input limits) and builds it in SEGMENT_SCHEMA with the log's one
builder; ``store`` appends it (concurrent batches waiting together as ONE append:
``SendMerger``) with the broker's durability (SYNC_FLUSH fsynced, SYNC_MASTER
replicated) and counts it. What a refusal looks like on the wire, and the ack, are the
callers' (Flight errors and an Arrow ack; the RocketMQ path's statuses and entries).

Thread-safety: ``check`` and ``store`` may be called from any thread.
"""
from __future__ import annotations

import functools
import sys
from typing import Mapping, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import MessageLimitError, UserError
from ..log import format as fmt
from ..arrowcols import constant_column
from ..log.batch import group_message_types
from ..log.built import BuiltRows, Exported, build_rows, composed_rows
from ..log.dispatch import measured_bodies
from ..log.limits import RESERVED_PROPERTY_KEYS, MessageLimits, check_batch
from ..log.status import PutMessageStatus
from ..log.topics import topic_message_type, type_conflict
from .protocol import Code
from .replicawait import HELD, merges
from .sendlimits import first_body_refusal
from .sendmerge import SendMerger

try:
    from .. import _ipc                      # sparkmq/_ipc.c (array_capsule)
    from .. import _screen as _c_screen      # sparkmq/_screen.c (send_shape)
except ImportError:     # not built here (no C compiler): every send batch is read in pyarrow
    _c_screen = None

SEND_COLUMNS = {"topic", "body", "tags", "keys", "properties", "message_group", "unique_key",
                "born_timestamp", "born_host", "queue_id"}


_SEND_TYPES = {f.name: f.type for f in fmt.SEGMENT_FIELDS if f.name in SEND_COLUMNS}


def typed(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` (columns of ``SEND_COLUMNS``) with each column in its SEGMENT_SCHEMA type,
    cast where it is not (a dictionary of strings, large strings, an int64 queue id): the
    first thing done to a send batch, so no later step meets a type it cannot take.
    UserError names a column that does not cast (docs/PROTOCOL.md gives each type)."""
    names = tuple(batch.schema.names)
    if batch.schema.equals(_typed_schema(names)):    # the usual batch: one compare
        return batch
    for i, name in enumerate(names):
        want = _SEND_TYPES.get(name)
        if want is None or batch.schema.field(i).type == want:
            continue
        try:
            col = batch.column(i).cast(want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise UserError(f"the send batch's column {name!r} is {batch.schema.field(i).type}, "
                            f"which does not cast to {want}: {e} (docs/PROTOCOL.md gives each "
                            "column's type)") from None
        batch = batch.set_column(i, pa.field(name, want), col)
    return batch


def _one_queue(own: pa.Array) -> int | None:
    """The queue id every row of ``own`` (a producer's int32 queue ids) names, if they
    name one and none is null (a compare of the values' bytes)."""
    n = len(own)
    if not n or own.null_count or own.type != pa.int32():
        return None
    data = bytes(memoryview(own.buffers()[1])[4 * own.offset:4 * (own.offset + n)])
    return int.from_bytes(data[:4], sys.byteorder, signed=True) \
        if data == data[:4] * n else None


# the Arrow C format of each send column that is not nested (``send_shape`` reads these)
_FORMATS = {pa.string(): b"u", pa.binary(): b"z", pa.int32(): b"i",
            pa.timestamp("ms", tz="UTC"): b"tsm:UTC"}
_FLAT_FORMATS = {name: _FORMATS[t] for name, t in _SEND_TYPES.items() if t in _FORMATS}


class Shape(NamedTuple):
    """A send batch as ``send_shape`` read it: its column ``names``, ``n`` rows, the
    columns some row sets (``given``: topic and body always), its one ``topic``, each
    row's body bytes (``body_sizes``) and their (least, greatest, total), and the batch
    exported to the C data interface (``exported``: what its segment batch is composed
    from)."""
    batch: pa.RecordBatch
    names: tuple
    n: int
    given: tuple
    topic: str
    body_sizes: np.ndarray
    body_extent: tuple
    exported: Exported


def send_shape(batch: pa.RecordBatch) -> Shape | None:
    """The usual send batch (valid Arrow in full; each column a send column in its type,
    not nested, named once; one topic; every body present; no empty tag or message
    group) read in one C call (``sparkmq._screen.send_shape``) over one export of it:
    what ``check_valid_arrow`` less Arrow's own validation, :func:`typed`, the topics'
    distinct values, the null counts and the bodies' sizes each took a pyarrow call
    for. None for any other batch (or the modules not built): then it is checked and
    read in pyarrow, the same rules, whose refusals name what is wrong."""
    if _c_screen is None:
        return None
    try:
        batch.validate(full=True)            # before C reads a value
    except pa.ArrowInvalid:
        return None
    schema = _schema_capsule(batch.schema)
    array, address = _ipc.array_capsule()
    batch._export_to_c(address)
    got = _c_screen.send_shape(schema, array, _FLAT_FORMATS)
    if got is None:
        return None
    names, nulls, topic, body, empty = got
    if topic is None or body is None or empty or len(set(names)) < len(names):
        return None
    n = batch.num_rows
    given = tuple(name for name, c in zip(names, nulls)
                  if c < n or name in ("topic", "body"))
    return Shape(batch, names, n, given, topic, np.frombuffer(body[0], np.int32), body[1:],
                 Exported(names, schema, array))


_LAST_SCHEMA: tuple = (pa.schema([]), pa.schema([]).__arrow_c_schema__())


def _schema_capsule(schema: pa.Schema):
    """``schema`` exported ("arrow_schema" capsule: its readers never move it). Where
    ``schema`` equals the schema exported last (metadata too), that export is returned:
    a DoPut stream's batches share their stream's schema, so its export (~a third of
    the batch's) is made once a stream, not once a batch."""
    global _LAST_SCHEMA
    last = _LAST_SCHEMA
    if not schema.equals(last[0], check_metadata=True):
        last = _LAST_SCHEMA = (schema, schema.__arrow_c_schema__())
    return last[1]


class _ShapeColumns(Mapping):
    """A ``Shape``'s given columns, name -> array; each made when first read."""
    __slots__ = ("_shape",)

    def __init__(self, shape: Shape):
        self._shape = shape

    def __getitem__(self, name: str) -> pa.Array:
        if name not in self._shape.given:
            raise KeyError(name)
        return self._shape.batch.column(self._shape.names.index(name))

    def __iter__(self):
        return iter(self._shape.given)

    def __len__(self) -> int:
        return len(self._shape.given)

    def __contains__(self, name) -> bool:
        return name in self._shape.given

    def get(self, name: str, default=None):
        """(Mapping's ``get`` raises and catches a KeyError for a column not given.)"""
        return self[name] if name in self._shape.given else default


@functools.lru_cache(maxsize=64)
def _typed_schema(names: tuple[str, ...]) -> pa.Schema:
    """The schema of a send batch of columns ``names`` in their types (another name: null)."""
    return pa.schema([(name, _SEND_TYPES.get(name, pa.null())) for name in names])


class Stored:
    """Rows ``[start, stop)`` of a stored append (``r``: its BatchAppendResult) and
    its status once replicated; slicing gives one request's part of a merged append."""
    __slots__ = ("r", "status", "start", "stop")

    def __init__(self, r, status: PutMessageStatus, start: int, stop: int):
        self.r, self.status, self.start, self.stop = r, status, start, stop

    def __getitem__(self, part: slice) -> "Stored":
        return Stored(self.r, self.status, self.start + part.start, self.start + part.stop)

    @property
    def queue_ids(self) -> np.ndarray:
        return self.r.queue_ids[self.start:self.stop]

    @property
    def queue_offsets(self) -> np.ndarray:
        return self.r.queue_offsets[self.start:self.stop]


class BatchSender:
    """See the module docstring; ``broker`` is the Broker."""

    def __init__(self, broker):
        self.broker = broker
        self.merger = SendMerger(self._append, self._append, BuiltRows.concat,
                                 nbytes=lambda rows: rows.nbytes)
        # the topics a send may write: (the store state that says so, {topic: the message
        # type it accepts}); and (the store config, its MessageLimits)
        self._writable: tuple = (None, {})
        self._limits: tuple = (None, None)

    def check(self, batch: pa.RecordBatch, topics: list[str]) -> BuiltRows:
        """``batch`` (its ``topics``, each named once; its columns in their types:
        :func:`typed`) ready to store, or the refusal of the RocketMQ path: UserError (a
        topic that may not be written, a message type the topic does not take),
        MessageLimitError (a row's body or input limits, with the proxy's status),
        PermissionDeniedError / ReplicaNotAvailableError (the broker may not append).
        Nothing is stored."""
        n = batch.num_rows            # (a column no row sets: the schema's default)
        return self.check_columns({name: col for name, col in zip(batch.schema.names,
                                                                  batch.columns)
                                   if name in ("topic", "body") or col.null_count < n},
                                  n, topics, source=batch)

    def check_shape(self, shape: Shape) -> BuiltRows:
        """``check`` of a batch ``send_shape`` read (typed already; its one topic)."""
        return self.check_columns(_ShapeColumns(shape), shape.n, [shape.topic],
                                  body_sizes=shape.body_sizes, body_extent=shape.body_extent,
                                  source=shape.exported)

    def check_columns(self, cols: Mapping[str, pa.Array], n: int, topics: list[str], *,
                      body_sizes: np.ndarray | None = None,
                      body_extent: tuple[int, int, int] | None = None,
                      source: "pa.RecordBatch | Exported | None" = None) -> BuiltRows:
        """``check`` of a send batch given as its columns (name -> array of ``n`` rows;
        topic, body and those some row sets), ``body_sizes`` each body's bytes if the
        caller measured them (``body_extent``: their least, greatest and sum, if it has
        them): a plain RocketMQ request's columns, read from the client's
        bytes, are checked without being put in a batch (``PlainColumns``: arrays only
        where the rows are built in pyarrow). ``source``: the record batch the columns
        are (``typed``), or it exported, whose segment batch may then be composed in C
        (``log/built.py``)."""
        sender, broker = self.broker.sender, self.broker
        for t in topics:
            expected = self._writable_type(t)
            if broker.config.enable_topic_message_type_check:
                groups = cols.get("message_group")
                if groups is not None and len(topics) > 1:
                    groups = groups.filter(pc.equal(cols["topic"], t))
                _check_types(groups, expected)
        sender.check_append()
        rows = self._segment_batch(cols, n, topics, body_sizes, source, body_extent)
        self._check_limits(rows)
        return rows

    def store(self, rows: BuiltRows, topics: list[str]) -> Stored:
        """Append ``rows`` (of ``topics``, each named once; alone or merged with the
        batches waiting now) and count them."""
        # (on the gRPC loop, sends run one at a time, not merged: replicawait.merges)
        stored = self.merger.submit(rows, merge=merges())
        stored.status = self.broker.sender.replicated(stored.r)   # (after the merger)
        metrics = self.broker.metrics
        if len(topics) == 1:
            counts = {topics[0]: (len(rows), rows.nbytes)}
        else:                                        # one pass over the rows, no filter
            enc = pc.dictionary_encode(rows.batch.column(0))   # (SEGMENT_SCHEMA: topic 0)
            idx, k = enc.indices.to_numpy(), len(enc.dictionary)
            counts = dict(zip(enc.dictionary.to_pylist(), zip(
                np.bincount(idx, minlength=k).tolist(),
                np.bincount(idx, weights=rows.body_sizes, minlength=k).astype(int).tolist())))
        for t, (count, nbytes) in counts.items():
            metrics.count_sent(t, count, nbytes)
        return stored

    def _writable_type(self, topic: str) -> str:
        """The message type ``topic`` accepts, once a send may write it: else UserError
        (``SendService.topic_refusal``: an illegal name, or no such topic and none may be
        created). Both follow from the store's state (its topics) and the name alone, so
        they are kept while the state is the same object: a commit replaces it (a topic
        created, changed or deleted), and the next send finds them again."""
        state = self.broker.store.state
        writable = self._writable
        if writable[0] is not state:
            writable = self._writable = (state, {})
        expected = writable[1].get(topic)
        if expected is None:
            refused = self.broker.sender.topic_refusal(topic)    # (may create the topic)
            if refused is not None:
                raise UserError(refused.message)
            expected = writable[1][topic] = topic_message_type(self.broker.topic_conf(topic))
        return expected

    def _message_limits(self) -> MessageLimits:
        """The store config's MessageLimits, made once per config."""
        config = self.broker.store.config
        if self._limits[0] is not config:
            self._limits = (config, MessageLimits.of(config))
        return self._limits[1]

    def _check_limits(self, rows: BuiltRows) -> None:
        """The RocketMQ path's refusals of a message's own fields, row by row as
        ``SendService`` decides them: its body (``body_refusal``: empty, or over
        maxMessageSize), then the input limits with the system's property keys
        reserved (so the store, given the rows, does not check them again)."""
        limits = self._message_limits()
        refused = first_body_refusal(rows.body_sizes, limits.max_message_size_bytes,
                                     rows.body_extent)
        if refused is not None:
            r, st = refused
            raise MessageLimitError(Code.Name(st.code), f"row {r}: {st.message}")
        check_batch(rows, limits, RESERVED_PROPERTY_KEYS, c_array=rows.c_array())

    def _append(self, rows: BuiltRows) -> Stored:
        """Store ``rows`` as one append (SendMerger's, alone or merged; held to every
        rule by ``check``: the store takes BuiltRows without checking them again)."""
        r = self.broker.store.append_batch(rows, later=HELD.flushes)
        return Stored(r, None, 0, r.num_rows)    # its status: ``store``, each request's

    def _segment_batch(self, given: Mapping[str, pa.Array], n: int, topics: list[str],
                       body_sizes: np.ndarray | None,
                       source: "pa.RecordBatch | Exported | None" = None,
                       extent: tuple[int, int, int] | None = None) -> BuiltRows:
        """The columns ``given`` in SEGMENT_SCHEMA, built by the log's one builder (the
        store's no-cast path; queue ids a producer left out placed by ``_placed`` or
        ``request_queue``), or composed in C where one topic and one queue take every
        row (``composed_rows``): columns not given are the schema's defaults, and a row
        with a message group is FIFO, as the RocketMQ path stores it. (valid Arrow,
        checked by the callers before ``check``; its bodies measured here unless
        ``body_sizes`` gives them, and ``extent`` their least, greatest and sum; ``given``
        is not changed.)"""
        cols, own = given, given.get("queue_id")      # (a producer's queue ids: ``one``)
        grouped = "message_group" in given
        if grouped:
            cols = {name: col for name, col in given.items() if name != "queue_id"}
            cols["message_type"] = group_message_types(cols["message_group"])
        if body_sizes is None:
            body_sizes, extent = measured_bodies(cols["body"])
        one = None
        if not grouped and len(topics) == 1:
            # the usual send; or a producer's queue, every row's the same (as a selector
            # chooses one): the store checks it is one of the topic's
            one = self.broker.sender.request_queue(topics[0]) if own is None \
                else _one_queue(own)
        if one is not None:
            if source is not None:                              # composed in C
                rows = composed_rows(source, [name for name in cols if name != "queue_id"],
                                     n, body_sizes=body_sizes, topic=topics[0],
                                     queue=one, store_host=self.broker.store.config.store_host,
                                     now_ms=self.broker.clock_ms(), body_extent=extent)
                if rows is not None:
                    return rows
            queues = constant_column(one, pa.int32(), n) if own is None else own
        else:
            queues = self._placed(cols, n, own)
        return build_rows({**cols, "queue_id": queues}, n,
                          store_host=self.broker.store.config.store_host,
                          now_ms=self.broker.clock_ms(), body_sizes=body_sizes,
                          topic=topics[0] if len(topics) == 1 else None, queue=one,
                          body_extent=extent)

    def _placed(self, cols: dict, n: int, own: pa.Array | None) -> pa.Array:
        """The rows' queue ids: a row's own; a message group's left to the store
        (crc32); the others by the RocketMQ path's rule for one request
        (``SendService.request_queues``: ONE queue per topic of this batch; a batch of one
        topic with neither column: ``_segment_batch`` asks for that queue itself)."""
        sender = self.broker.sender
        own = pa.nulls(n, pa.int32()) if own is None else own
        free = pc.is_null(own)
        if "message_group" in cols:
            free = pc.and_(free, pc.is_null(cols["message_group"]))
        if not pc.any(free).as_py():
            return own
        placed = sender.request_queues(cols["topic"].to_pylist(), free.to_pylist())
        return pc.if_else(free, pa.array(placed, pa.int32()), own)


def _check_types(groups: pa.Array | None, expected: str) -> None:
    """Rows (of a topic that accepts ``expected``; ``groups`` their message groups, None:
    no row has one) with a message group are FIFO, the others NORMAL (the proxy's
    reading); each type present must be one the topic accepts."""
    if groups is None:                   # (the usual send)
        present: tuple = ("NORMAL",)
    else:                                # (in this order: the first refusal is FIFO's)
        present = ("FIFO",) * (groups.null_count < len(groups)) + \
            ("NORMAL",) * (groups.null_count > 0)
    for actual in present:
        why = type_conflict(expected, actual)
        if why is not None:
            raise UserError(why)
