"""The one batch builder and validator, and the one queue chooser.

Every message that enters a store becomes a row of a record batch in
``SEGMENT_SCHEMA`` here: from :class:`~sparkmq.log.message.Message` objects
(:func:`messages_to_batch`), from an Arrow table or batch of any compatible
schema (:meth:`BatchBuilder.normalize`, :meth:`BatchBuilder.check_segment_batch`),
from per-column Python lists of a send (:func:`build_segment_batch`), or from
a Spark task's Arrow batches (the data source's writer, which validates with
:func:`check_bodies` and chooses with a :class:`QueueChooser`).

Queue choice (:class:`QueueChooser`), the same for every writer: an explicit
queue id is kept and range-checked against the topic's ``writeQueueNums``;
else a row with a message group goes to ``crc32(group) % writeQueueNums`` (so
a group keeps its order whoever writes it); else round robin per topic.

On disk: nothing (batches are appended by the CommitLog). Thread-safety: the
functions are pure; a :class:`QueueChooser` (round-robin state) and a
:class:`BatchBuilder` are used under the store's append lock or by one task.
"""
from __future__ import annotations

import functools
import sys
import zlib
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..arrowcols import constant_column
from ..errors import (InvalidMessageError, PermissionDeniedError, QueueNotFoundError,
                      TopicNotFoundError)
from . import format as fmt
from .actions import PERM_READ, PERM_RW, PERM_WRITE  # noqa: F401  (re-exported)
from .actions import TopicConfig
from .dispatch import SHARED_ROWS, RowInfo, binary_lengths, distinct_strings
from .limits import MessageLimits, check_batch, check_message, not_text
from .message import Message, group_hashes

if TYPE_CHECKING:
    from .built import BuiltRows

MAX_BATCH_BODY_BYTES = 256 << 20

_MESSAGE_GROUP_COLUMN = fmt.SEGMENT_SCHEMA.get_field_index("message_group")


# ---------------------------------------------------------------------- topics
def writable_topic_conf(topics: Mapping[str, TopicConfig], name: str, *, where: str = "",
                        store: str = "", then: str = "first") -> TopicConfig:
    """``topics[name]`` if the topic exists and is writable; else TopicNotFoundError /
    PermissionDeniedError (``where`` prefixes the message, e.g. a file name; ``store``
    names the store; ``then`` ends the advice)."""
    conf = topics.get(name)
    if conf is None:
        in_store = f" in {store}" if store else ""
        raise TopicNotFoundError(f"{where}topic {name!r} does not exist{in_store} (topics: "
                                 f"{sorted(topics) or 'none'}); create it {then}")
    if not conf.writable:
        raise PermissionDeniedError(f"topic {name!r} is not writable (perm {conf.perm})")
    return conf


def check_bodies(body: pa.Array, max_message_size_bytes: int,
                 sizes: np.ndarray | None = None, hint: str = "") -> None:
    """No null body, none longer than ``max_message_size_bytes`` (InvalidMessageError)."""
    if body.null_count:
        raise InvalidMessageError("body column has nulls; every message needs a body")
    if sizes is not None:
        longest = int(sizes.max()) if len(sizes) else 0
    else:
        longest = pc.max(pc.binary_length(body)).as_py() or 0
    if longest > max_message_size_bytes:
        raise InvalidMessageError(f"a body of {longest} bytes exceeds maxMessageSize "
                                  f"({max_message_size_bytes} bytes){hint}")


# ---------------------------------------------------------------------- queues
def spread(n: int, start: int, queues: int) -> np.ndarray:
    """Queue ids for ``n`` unkeyed rows: ``queues`` contiguous blocks of near-equal
    size, block ``j`` to queue ``(start + j) % queues``. Round robin by block, not by
    row, so each queue's rows of a batch are one contiguous run: a reader slices
    them from the segment (zero copy) instead of gathering every n-th row."""
    block = np.arange(n, dtype=np.int64) * queues // max(n, 1)
    return (start + block) % queues


class QueueChooser:
    """Chooses queues (see the module docstring); keeps the round-robin position per
    topic. ``by_block``: unkeyed rows of one call go to contiguous blocks
    (:func:`spread`) and the position advances by one per call (the Spark writer,
    starting at its partition number ``start``); else row by row, continuing where
    the previous call left off. Not thread-safe: one owner serializes calls."""

    def __init__(self, *, start: int = 0, by_block: bool = False):
        self.start = start
        self.by_block = by_block
        self._next: dict[str, int] = {}

    def round_robin(self, topic: str, count: int, queues: int) -> np.ndarray:
        """Queue ids for ``count`` unkeyed rows of ``topic``."""
        first = self._next.get(topic, self.start)
        if self.by_block:
            self._next[topic] = (first + 1) % queues
            return spread(count, first, queues)
        self._next[topic] = (first + count) % queues
        return (first + np.arange(count)) % queues

    def next_queue(self, topic: str, queues: int) -> int:
        """The queue of one unkeyed row of ``topic`` (``round_robin`` of one, as an int)."""
        first = self._next.get(topic, self.start)
        self._next[topic] = (first + 1) % queues
        return first % queues

    def choose_one(self, conf: TopicConfig, queue_id, message_group: str | None) -> int:
        """The queue of one message of topic ``conf``."""
        n = conf.write_queue_nums
        if queue_id is not None:
            if not isinstance(queue_id, int) or not 0 <= queue_id < n:
                raise QueueNotFoundError(
                    f"queue_id {queue_id!r} is out of range for topic {conf.name!r} "
                    f"(0..{n - 1})")
            return queue_id
        if message_group:
            return zlib.crc32(message_group.encode()) % n
        return self.next_queue(conf.name, n)

    def choose(self, qcol: pa.Array | None, names: list[str], idx: np.ndarray | None,
               queue_nums: list[int], n: int, groups: pa.Array | None = None) -> np.ndarray:
        """Queue ids (int32) for ``n`` rows (``idx``: row -> topic in ``names``, None
        when one topic; ``queue_nums``: each topic's writeQueueNums). A row whose
        ``qcol`` value is set keeps it (range-checked: QueueNotFoundError); a null
        row with a ``groups`` value goes to its group's queue; the others round robin."""
        if qcol is None or qcol.null_count == len(qcol):
            given = np.zeros(n, bool)
            qarr = np.zeros(n, np.int64)
        else:
            given = np.asarray(pc.is_valid(qcol).to_numpy(zero_copy_only=False))
            qarr = np.array(qcol.cast(pa.int64()).fill_null(0).to_numpy(), np.int64)
        ghash = None
        if groups is not None and groups.null_count < len(groups):
            ghash = group_hashes(groups)
        for i, (t, nq) in enumerate(zip(names, queue_nums)):
            mine = np.ones(n, bool) if idx is None else idx == i
            bad = mine & given & ((qarr < 0) | (qarr >= nq))
            if bad.any():
                raise QueueNotFoundError(
                    f"queue_id {int(qarr[bad][0])} is out of range for topic {t!r} "
                    f"(0..{nq - 1})")
            free = mine & ~given
            if ghash is not None:
                grouped = free & (ghash >= 0)
                qarr[grouped] = ghash[grouped] % nq
                free &= ~grouped
            rows = np.flatnonzero(free)
            if len(rows):
                qarr[rows] = self.round_robin(t, len(rows), nq)
        return qarr.astype(np.int32, copy=False)


# ---------------------------------------------------------------------- builders
def pack(items: list, max_size: int, size_of: Callable[[object], int]) -> list[list]:
    """Consecutive parts of ``items`` of at most ``max_size`` each (by ``size_of``),
    greedy in order (an item bigger than that is a part of its own)."""
    parts: list[list] = []
    cur: list = []
    size = 0
    for item in items:
        n = size_of(item)
        if cur and size + n > max_size:
            parts.append(cur)
            cur, size = [], 0
        cur.append(item)
        size += n
    if cur:
        parts.append(cur)
    return parts


def split_by_size(msgs: list[Message]) -> list[list[Message]]:
    """``msgs`` in order, cut into groups of at most MAX_BATCH_BODY_BYTES of bodies."""
    return pack(msgs, MAX_BATCH_BODY_BYTES,
                lambda m: len(m.body) if isinstance(m.body, (bytes, bytearray, str)) else 0)


def messages_to_batch(messages: Iterable[Message], *, queue_ids: Sequence[int],
                      store_timestamp_ms: int, store_host: str,
                      max_message_size_bytes: int | None = None,
                      limits: MessageLimits | None = None,
                      check_limits: bool = True) -> pa.RecordBatch:
    """Build a segment batch from messages whose queues are already chosen; with
    ``check_limits`` each message is held to ``limits`` (default: MessageLimits with
    ``max_message_size_bytes``) first (:func:`~sparkmq.log.limits.check_message`)."""
    msgs = list(messages)
    now = store_timestamp_ms
    if limits is None:
        limits = MessageLimits() if max_message_size_bytes is None else \
            MessageLimits(max_message_size_bytes=max_message_size_bytes)
    bodies = [_checked_body(m, limits if check_limits else None) for m in msgs]
    n = len(msgs)

    def optional(values: list, typ: pa.DataType) -> pa.Array:
        # most messages leave most fields unset: an all-null column needs no conversion
        for v in values:
            if v is not None:
                return pa.array(values, typ)
        return pa.nulls(n, typ)

    try:
        arrays = [
            pa.array([m.topic for m in msgs], pa.string()),
            pa.array(queue_ids, pa.int32()),
            pa.array(bodies, pa.binary()),
            optional([m.tags for m in msgs], pa.string()),
            optional([list(m.keys) if m.keys else None for m in msgs], pa.list_(pa.string())),
            optional([list(m.properties.items()) if m.properties else None for m in msgs],
                     pa.map_(pa.string(), pa.string())),
            pa.array([m.born_timestamp if m.born_timestamp is not None else now for m in msgs],
                     fmt.TS),
            pa.array([now] * n, fmt.TS),
            optional([m.born_host for m in msgs], pa.string()),
            pa.array([store_host] * n, pa.string()),
            pa.array([m.reconsume_times for m in msgs], pa.int32()),
            optional([m.delivery_timestamp for m in msgs], fmt.TS),
            optional([m.message_group for m in msgs], pa.string()),
            optional([m.transaction_id for m in msgs], pa.string()),
            pa.array([m.message_type for m in msgs], pa.int8()),
            optional([m.unique_key for m in msgs], pa.string()),
        ]
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise InvalidMessageError(f"message field has the wrong type: {exc}") from exc
    except UnicodeEncodeError as exc:            # a str that is not text (a lone surrogate)
        raise not_text(exc) from None
    return pa.RecordBatch.from_arrays(arrays, schema=fmt.SEGMENT_SCHEMA)


def _checked_body(m: Message, limits: MessageLimits | None) -> bytes:
    """``m``'s body as bytes, once ``m`` passed the ``limits`` (InvalidMessageError;
    None: the caller checked them)."""
    body = m.body
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise InvalidMessageError(
            f"message body must be bytes or str, got {type(m.body).__name__}")
    if isinstance(m.keys, str):
        raise InvalidMessageError("message keys must be a list of strings, not one string")
    if limits is None:
        return bytes(body)
    try:
        check_message(limits, topic=m.topic, body_bytes=len(body), tag=m.tags,
                      keys=list(m.keys or ()), properties=dict(m.properties or {}),
                      message_group=m.message_group, message_id=m.unique_key,
                      born_host=m.born_host, transaction_id=m.transaction_id,
                      born_timestamp_ms=m.born_timestamp,
                      delivery_timestamp_ms=m.delivery_timestamp, message_type=m.message_type)
    except (TypeError, AttributeError) as exc:   # a field of the wrong type
        raise InvalidMessageError(f"message field has the wrong type: {exc}") from None
    except UnicodeEncodeError as exc:            # a str that is not text (a lone surrogate)
        raise not_text(exc) from None
    return bytes(body)


# ---------------------------------------------------------------------- columns
def list_column(values: list, type_: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array. A column of one value (the usual case in a batch:
    one topic, host, born time and type; optional fields all null) is built from that
    value alone (``constant_column``) where ``pa.array`` converts value by value
    (~10-100 us for 100 strings)."""
    n = len(values)
    first = values[0] if n else None
    if n and values.count(first) == n:
        if first is None or type(first) in (str, int):
            return constant_column(first, type_, n)
        return pa.repeat(pa.scalar(first, type_), n)     # lists (keys, properties)
    return pa.array(values, type_)




def binary_column(values: list[bytes]) -> pa.Array:
    """``values`` (bytes, none null) as a ``pa.binary()`` array built from its two buffers:
    one join and one cumulative sum, ~10x cheaper than ``pa.array`` for 100 bodies of 1 KiB
    (~30 vs ~290 us), which converts value by value."""
    n = len(values)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter(map(len, values), np.int64, n), out=offsets[1:])
    if offsets[-1] >= 2**31:          # beyond int32 offsets: let pyarrow decide (chunks)
        return pa.array(values, pa.binary())
    offsets = offsets.astype(np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(b"".join(values))])


def none_if_empty(col: pa.Array) -> pa.Array:
    """Text column ``col`` with each empty value null. An empty tag or message group is
    none, as the proxy reads a SendMessage's (no tag; a NORMAL message), so every
    writer of a producer's rows (the Flight send, the Spark writer) reads them so.
    A column that is not text is returned as it is (its writer names the type)."""
    if col.null_count == len(col) or not (pa.types.is_string(col.type)
                                          or pa.types.is_large_string(col.type)):
        return col
    lengths = pc.binary_length(col)
    if pc.min(lengths).as_py() != 0:
        return col
    return pc.if_else(pc.equal(lengths, 0), pa.scalar(None, col.type), col)


def group_message_types(groups: pa.Array) -> pa.Array:
    """The ``message_type`` (int8) of a producer's rows from their message groups (after
    :func:`none_if_empty`): FIFO for a row with a group, NORMAL for the others, as the
    RocketMQ path stores them."""
    return pc.if_else(pc.is_valid(groups), pa.scalar(fmt.MESSAGE_TYPE_FIFO, pa.int8()),
                      pa.scalar(fmt.MESSAGE_TYPE_NORMAL, pa.int8()))


def build_segment_batch(columns: Mapping[str, Sequence | pa.Array], n: int, *,
                        store_host: str, now_ms: int, given: set | None = None
                        ) -> pa.RecordBatch:
    """A batch in SEGMENT_SCHEMA from per-column values (Python lists or Arrow arrays,
    any subset of the schema's columns, ``n`` rows each; other names are ignored).
    Missing columns get their defaults: ``queue_id`` null (the store chooses:
    :class:`QueueChooser`), ``born_timestamp`` and ``store_timestamp`` ``now_ms`` (the
    store restamps the latter under its append lock), ``store_host``, ``reconsume_times``
    0, ``message_type`` NORMAL, the rest null. A ``born_timestamp`` list may hold None
    (then ``now_ms``). Feed the result to ``Store.append_batch`` (its no-cast path).
    One pass over what ``columns`` gives (a send: 2-5 of the 16), set on the defaults;
    the names of those set (not left to their defaults) are added to ``given``, a set."""
    out = _default_row(n, store_host)
    for name, v in columns.items():
        at = _FIELD_AT.get(name)
        if at is None or v is None:
            continue
        i, f = at
        if isinstance(v, pa.ChunkedArray):
            v = v.chunk(0) if v.num_chunks == 1 else pa.concat_arrays(v.chunks)
        if isinstance(v, pa.Array):
            out[i] = v if v.type == f.type else v.cast(f.type)
        elif name in _NULL_DEFAULTS and type(v) is list and v.count(None) == n:
            continue                     # (a list of nulls where the default is null)
        else:
            if name == "born_timestamp" and None in v:
                v = [now_ms if b is None else b for b in v]
            out[i] = binary_column(v) if name == "body" else list_column(v, f.type)
        if given is not None:
            given.add(name)
    if out[_BORN_AT] is None or out[_STORE_AT] is None:
        now = time_column(time_values(now_ms, n), n)   # (both defaults: one array)
        for i in (_BORN_AT, _STORE_AT):
            if out[i] is None:
                out[i] = now
    if n > SHARED_ROWS:                  # (longer batches: defaults built, not shared)
        for i, f in enumerate(fmt.SEGMENT_FIELDS):
            if out[i] is None:
                out[i] = constant_column(_default_value(f.name, store_host), f.type, n)
    return pa.RecordBatch.from_arrays(out, schema=fmt.SEGMENT_SCHEMA)


_FIELD_AT = {f.name: (i, f) for i, f in enumerate(fmt.SEGMENT_FIELDS)}
_BORN_AT = _FIELD_AT["born_timestamp"][0]
_STORE_AT = _FIELD_AT["store_timestamp"][0]


_TIME_COLUMNS = frozenset({"born_timestamp", "store_timestamp"})


def time_values(ms: int, n: int) -> bytes:
    """``n`` times ``ms`` as a timestamp column's values (int64, native order): one
    buffer of repeated bytes (``pa.repeat`` of a timestamp scalar costs ~37 us,
    ``numpy.full`` ~0.7 more)."""
    return ms.to_bytes(8, sys.byteorder, signed=True) * n


def time_column(values: bytes | bytearray, n: int) -> pa.Array:
    """The timestamp column of ``n`` ``values`` (:func:`time_values`), zero copy: the
    column of a bytearray reads what is written into it later."""
    return pa.Array.from_buffers(fmt.TS, n, [None, pa.py_buffer(values)])


def _default_value(name: str, store_host: str):
    return store_host if name == "store_host" else \
        0 if name in ("reconsume_times", "message_type") else None


# the optional columns, null by default (a send's list of them is often all None)
_NULL_DEFAULTS = frozenset(f.name for f in fmt.SEGMENT_FIELDS
                           if f.name not in _TIME_COLUMNS and f.name not in ("topic", "body")
                           and _default_value(f.name, "") is None)


def _default_row(n: int, store_host: str) -> list:
    """A new list of each column's default (``constant_column``'s shared arrays, looked up
    once a batch); None for the two times, and for all past 1,024 rows (built later)."""
    return list(shared_defaults(n, store_host)) if n <= SHARED_ROWS else \
        [None] * len(fmt.SEGMENT_FIELDS)


@functools.lru_cache(maxsize=64)
def shared_defaults(n: int, store_host: str) -> tuple:
    """Each SEGMENT_SCHEMA column's default for ``n`` rows (at most 1,024), shared from
    batch to batch (Arrow arrays are immutable); None for the two times."""
    return tuple(None if f.name in _TIME_COLUMNS else
                 constant_column(_default_value(f.name, store_host), f.type, n)
                 for f in fmt.SEGMENT_FIELDS)


def _queue_ids(n: int, queue: int) -> np.ndarray:
    """``n`` rows' queue id ``queue`` (int32, read-only): shared up to 1,024 rows; a longer
    batch's own (64 cached ones could keep megabytes alive)."""
    return _shared_queue_ids(n, queue) if n <= SHARED_ROWS else _new_queue_ids(n, queue)


@functools.lru_cache(maxsize=64)
def _shared_queue_ids(n: int, queue: int) -> np.ndarray:
    return _new_queue_ids(n, queue)


def _new_queue_ids(n: int, queue: int) -> np.ndarray:
    ids = np.full(n, queue, np.int32)
    ids.flags.writeable = False
    return ids


def _col(table: pa.Table, name: str) -> pa.Array:
    """Column ``name`` as one array; zero copy when it has one chunk
    (``ChunkedArray.combine_chunks`` copies even then)."""
    col = table.column(name)
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


class BatchBuilder:
    """Builds and validates a store's batches (see the module docstring).

    ``topic_conf(name)`` returns a writable topic's config or raises (the store
    creates topics there when auto-create is on); ``clock_ms`` stamps
    ``born_timestamp`` defaults. Used under the store's append lock or by one
    thread (the chooser's round robin is not locked)."""

    def __init__(self, topic_conf: Callable[[str], dict], *, limits: MessageLimits,
                 store_host: str, clock_ms: Callable[[], int],
                 chooser: QueueChooser | None = None):
        self.topic_conf = topic_conf
        self.limits = limits
        self.max_message_size_bytes = limits.max_message_size_bytes
        self.store_host = store_host
        self.clock_ms = clock_ms
        self.chooser = chooser or QueueChooser()

    def queue_ids_for(self, msgs: list[Message]) -> list[int]:
        """The queue of each message (checks its topic)."""
        qids = []
        confs: dict[str, dict] = {}
        for m in msgs:
            conf = confs.get(m.topic) if isinstance(m.topic, str) else None
            if conf is None:
                conf = confs[m.topic] = self.topic_conf(m.topic)
            try:
                qids.append(self.chooser.choose_one(conf, m.queue_id, m.message_group))
            except UnicodeEncodeError as exc:    # a message group that is not text
                raise not_text(exc) from None
        return qids

    def check_segment_batch(self, batch: pa.RecordBatch, *, limits_checked: bool = False,
                            built: "BuiltRows | None" = None) -> tuple[pa.RecordBatch, RowInfo]:
        """Validate a batch already in SEGMENT_SCHEMA (no cast, no copy): the same
        checks as :meth:`normalize` (the input limits unless ``limits_checked``; of
        ``built``, the BuiltRows ``batch`` comes from, what its caller checked not again).
        Returns the batch (with queue ids chosen if the column had nulls; ``built`` itself
        where it is unchanged, read as a batch only if needed) and what dispatch can
        reuse."""
        n = batch.num_rows
        if n == 0:
            raise InvalidMessageError("append_batch got no rows")
        if built is None:
            if batch.schema.metadata != fmt.SEGMENT_SCHEMA.metadata:   # zero copy
                batch = pa.RecordBatch.from_arrays(batch.columns, schema=fmt.SEGMENT_SCHEMA)
            batch = fmt.fill_required(batch, self.clock_ms)
            topics = batch.column(0)
            if topics.null_count:
                raise InvalidMessageError("topic column has nulls")
            body = batch.column(2)
            sizes = binary_lengths(body) if not body.null_count else None
            check_bodies(body, self.max_message_size_bytes, sizes)
        else:                            # (the builder's schema; defaults filled, bodies checked)
            sizes = built.body_sizes
        if not limits_checked:
            check_batch(batch, self.limits)
        if built is not None and built.topic is not None:
            names, idx = [built.topic], None
        elif n == 1:
            names, idx = fmt.record_batch(batch).column(0).to_pylist(), None
        else:
            topics = fmt.record_batch(batch).column(0)
            names, idx = distinct_strings(topics), None     # (cheaper than encoding)
            if len(names) > 1:
                enc = pc.dictionary_encode(topics)
                names = enc.dictionary.to_pylist()
                idx = enc.indices.to_numpy()
        confs = [self.topic_conf(t) for t in names]
        one = built.queue if built is not None else None
        qcol = None if one is not None else fmt.record_batch(batch).column(1)
        if qcol is None or qcol.null_count == 0:
            qids = _queue_ids(n, one) if qcol is None else qcol.to_numpy()
            for i, conf in enumerate(confs):
                q = qids if idx is None else qids[idx == i]
                if one is not None:
                    lo = hi = one
                elif len(q) > 16:
                    lo, hi = int(q.min()), int(q.max())
                else:                    # (a numpy min costs as much as 16 rows' in Python)
                    lo, hi = min(q.tolist()), max(q.tolist())
                if lo < 0 or hi >= conf.write_queue_nums:
                    raise QueueNotFoundError(
                        f"queue_id out of range for topic {names[i]!r} "
                        f"(0..{conf.write_queue_nums - 1})")
        else:
            batch = fmt.record_batch(batch)
            qids = self.chooser.choose(qcol, names, idx, [c.write_queue_nums for c in confs],
                                       n, batch.column(_MESSAGE_GROUP_COLUMN))
            batch = batch.set_column(1, fmt.SEGMENT_SCHEMA.field(1), pa.array(qids, pa.int32()))
        if built is None:
            return batch, RowInfo(names, idx, qids, sizes)
        return batch, RowInfo(names, idx, qids, sizes, given=built.given, queue=built.queue)

    def normalize(self, table: pa.Table, *, limits_checked: bool = False) -> pa.RecordBatch:
        """A batch in SEGMENT_SCHEMA from a table with at least ``topic`` and ``body``
        (other columns cast; missing ones get their defaults; queue ids chosen)."""
        names = table.schema.names
        for need in ("topic", "body"):
            if need not in names:
                raise InvalidMessageError(f"append_batch needs a {need!r} column; got {names}")
        n = table.num_rows
        if n == 0:
            raise InvalidMessageError("append_batch got no rows")
        table = table.combine_chunks()   # now one chunk per column: _col is zero copy
        topics = _col(table, "topic")
        if topics.null_count:
            raise InvalidMessageError("topic column has nulls")
        body = _col(table, "body")
        if pa.types.is_string(body.type) or pa.types.is_large_string(body.type):
            body = body.cast(pa.binary())
        check_bodies(body, self.max_message_size_bytes)
        confs = {t: self.topic_conf(t) for t in pc.unique(topics).to_pylist()}
        if "queue_id" in names and table.column("queue_id").null_count == 0:
            qids = self._checked_queue_ids(_col(table, "queue_id").cast(pa.int32()), topics,
                                           confs)
        else:   # no queue_id column, or one with nulls: the null rows are chosen
            qids = pa.array(self._choose_missing(table, topics, confs, n), pa.int32())
        cols = {"topic": topics.cast(pa.string()), "queue_id": qids, "body": body}
        for f in fmt.SEGMENT_FIELDS:
            if f.name in cols or f.name not in names:
                continue
            try:
                cols[f.name] = _col(table, f.name).cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidMessageError(
                    f"column {f.name!r} has type {table.column(f.name).type}, expected "
                    f"{f.type}: {exc}") from None
        batch = build_segment_batch(cols, n, store_host=self.store_host, now_ms=self.clock_ms())
        batch = fmt.fill_required(batch, self.clock_ms)
        if not limits_checked:
            check_batch(batch, self.limits)
        return batch

    @staticmethod
    def _checked_queue_ids(qids: pa.Array, topics: pa.Array, confs: dict) -> pa.Array:
        for t, conf in confs.items():
            if len(confs) == 1:   # every row has this topic: min/max decide
                lo_hi = pc.min_max(qids)
                bad = lo_hi["min"].as_py() < 0 or lo_hi["max"].as_py() >= conf.write_queue_nums
            else:
                mask = pc.equal(topics, t)
                bad = pc.any(pc.and_(mask, pc.or_(pc.less(qids, 0), pc.greater_equal(
                    qids, conf.write_queue_nums)))).as_py()
            if bad:
                raise QueueNotFoundError(
                    f"queue_id out of range for topic {t!r} (0..{conf.write_queue_nums - 1})")
        return qids

    def _choose_missing(self, table: pa.Table, topics: pa.Array, confs: dict,
                        n: int) -> np.ndarray:
        names = table.schema.names
        enc = pc.dictionary_encode(topics)
        tnames = enc.dictionary.to_pylist()
        idx = enc.indices.to_numpy() if len(tnames) > 1 else None
        given = _col(table, "queue_id") if "queue_id" in names else None
        if given is not None and not pa.types.is_integer(given.type) and given.null_count < n:
            raise InvalidMessageError(
                f"column 'queue_id' has type {given.type}, expected an integer type")
        groups = None
        if "message_group" in names:
            groups = _col(table, "message_group")
            if not (pa.types.is_string(groups.type) or pa.types.is_large_string(groups.type)
                    or pa.types.is_null(groups.type)):
                raise InvalidMessageError(
                    f"column 'message_group' has type {groups.type}, expected string")
            groups = None if pa.types.is_null(groups.type) else groups
        return self.chooser.choose(given, tnames, idx,
                                   [confs[t].write_queue_nums for t in tnames], n, groups)
