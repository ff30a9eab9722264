"""Messages: the user model, the message id, and conversion to Arrow.

A :class:`Message` is what a producer hands in; a :class:`StoredMessage` is what
a reader gets back, with the fields the store assigned (queue offset, physical
offset, store time, message id).

Message ids encode where the message lives, like RocketMQ's offset message id,
so ``lookup(message_id)`` needs no index: 32 hex digits =
``store tag (8) | batch physical offset (16) | row in batch (8)``. The store tag
is the CRC32 of the store id, so an id from another store is refused.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..arrowcols import fixed_offsets, fixed_width_strings
from ..errors import InvalidMessageIdError
from . import format as fmt

try:
    from .. import _screen as _c_screen      # sparkmq/_screen.c (body_sizes)
except ImportError:     # not built (a source checkout without a compiler): numpy measures
    _c_screen = None

try:
    from .. import _ipc
except ImportError:     # not built here (no C compiler): numpy lays the ids out
    _ipc = None


@dataclass
class Message:
    """A message to append. Only ``topic`` and ``body`` are required."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    queue_id: int | None = None          # None: the store picks (round robin / message_group)
    born_timestamp: int | None = None    # ms since epoch; now if None
    born_host: str | None = None
    reconsume_times: int = 0
    delivery_timestamp: int | None = None
    message_group: str | None = None
    transaction_id: str | None = None
    message_type: int = fmt.MESSAGE_TYPE_NORMAL
    unique_key: str | None = None


@dataclass
class StoredMessage:
    """A message read from the store."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    message_id: str
    body: bytes
    tags: str | None
    keys: list[str]
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int
    born_host: str | None
    store_host: str | None
    reconsume_times: int
    delivery_timestamp: int | None
    message_group: str | None
    transaction_id: str | None
    message_type: int
    unique_key: str | None

    @staticmethod
    def from_row(row: Mapping[str, Any]) -> "StoredMessage":
        def ms(v):
            if v is None:
                return None
            if isinstance(v, int):
                return v
            return int(v.timestamp() * 1000)
        props = row.get("properties") or []
        return StoredMessage(
            topic=row["topic"], queue_id=row["queue_id"], queue_offset=row["queue_offset"],
            physical_offset=row["physical_offset"], message_id=row["message_id"],
            body=row["body"], tags=row.get("tags"), keys=list(row.get("keys") or []),
            properties=dict(props), born_timestamp=ms(row["born_timestamp"]),
            store_timestamp=ms(row["store_timestamp"]), born_host=row.get("born_host"),
            store_host=row.get("store_host"), reconsume_times=row.get("reconsume_times") or 0,
            delivery_timestamp=ms(row.get("delivery_timestamp")),
            message_group=row.get("message_group"), transaction_id=row.get("transaction_id"),
            message_type=row.get("message_type") or 0, unique_key=row.get("unique_key"))


def stored_messages(table: pa.Table, computed: Mapping[str, list] | None = None,
                    ) -> list[StoredMessage]:
    """The rows of a message table (``MessageReader.read_table``) as StoredMessages, as
    ``StoredMessage.from_row`` reads a row, converted column by column (each column one
    list, the messages made field by field from them: ~2 us a message, not ~7 through a
    dict a row). Timestamps as int64 milliseconds: a timestamp column of 32 rows costs
    ~100 us as datetimes and ~2 us as integers. ``computed``: columns given as lists
    instead (the reader's queue offsets, physical offsets and message ids)."""
    return messages_of({**column_values(table), **(computed or {})}, table.num_rows)


def column_values(table: pa.Table) -> dict[str, list]:
    """A message table's columns as lists, as :func:`stored_messages` reads them (a
    column all null left out; timestamps int64 ms)."""
    n = table.num_rows
    values: dict[str, list] = {}
    for i, name in enumerate(table.schema.names):   # (``column_names`` wraps each field)
        col = table.column(i)
        if col.null_count == n:
            continue
        if name in _TIME_NAMES and pa.types.is_timestamp(col.type):  # (.type: a wrap)
            if col.type.unit != "ms":
                col = col.cast(pa.timestamp("ms", tz=col.type.tz))
            # a ms timestamp's values are its int64 ms: viewed, not cast (~3 against ~13 us)
            values[name] = [v for c in col.chunks for v in c.view(pa.int64()).to_pylist()]
        else:
            values[name] = col.to_pylist()
    return values


def messages_of(values: Mapping[str, list], n: int) -> list[StoredMessage]:
    """``n`` StoredMessages of their columns' values (name -> list; a column absent: all
    None), as :func:`stored_messages` converts them (timestamps int64 ms)."""
    none = [None] * n

    def of(name: str) -> list:                # a column's values, or all None
        return values.get(name, none)
    return list(map(
        StoredMessage, of("topic"), of("queue_id"), of("queue_offset"), of("physical_offset"),
        of("message_id"), of("body"), of("tags"), [list(k) if k else [] for k in of("keys")],
        [dict(p) if p else {} for p in of("properties")], of("born_timestamp"),
        of("store_timestamp"), of("born_host"), of("store_host"),
        [r or 0 for r in of("reconsume_times")], of("delivery_timestamp"), of("message_group"),
        of("transaction_id"), [t or 0 for t in of("message_type")], of("unique_key")))


_FIELD_ORDER = ("topic", "queue_id", "queue_offset", "physical_offset", "message_id", "body",
                "tags", "keys", "properties", "born_timestamp", "store_timestamp", "born_host",
                "store_host", "reconsume_times", "delivery_timestamp", "message_group",
                "transaction_id", "message_type", "unique_key")
assert tuple(f.name for f in fields(StoredMessage)) == _FIELD_ORDER, \
    "stored_messages passes StoredMessage's fields by position"


#: The message columns that are timestamps (SEGMENT_SCHEMA's).
_TIME_NAMES = frozenset(f.name for f in fmt.SEGMENT_FIELDS if pa.types.is_timestamp(f.type))


def store_tag(store_id: str) -> int:
    return zlib.crc32(store_id.encode()) & 0xFFFFFFFF


def encode_message_id(tag: int, batch_offset: int, row: int) -> str:
    """The id of row ``row`` of the batch at physical offset ``batch_offset`` of the store
    tagged ``tag``: 32 hex digits, the batch's :func:`id_prefix` then the row's 8 (the
    one home of the format; ``_ipc.row_ids`` and ``_ipc.id_ack`` write the same digits,
    as the tests hold them)."""
    return f"{id_prefix(tag, batch_offset)}{row:08X}"


def decode_message_id(message_id: str) -> tuple[int, int, int]:
    """(store tag, batch physical offset, row) of a message id."""
    if not isinstance(message_id, str) or len(message_id) != 32:
        raise InvalidMessageIdError(
            f"a message id is 32 hex digits, got {message_id!r}")
    try:
        return int(message_id[:8], 16), int(message_id[8:24], 16), int(message_id[24:], 16)
    except ValueError:
        raise InvalidMessageIdError(f"a message id is 32 hex digits, got {message_id!r}") from None


_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)

# byte -> its two upper-case hex digits, as one little-endian uint16 per byte value
_HEX_PAIRS16 = np.ascontiguousarray(
    _HEX[np.stack([np.arange(256) >> 4, np.arange(256) & 0xF], axis=1)]).view(np.uint16).ravel()


def _hex_digits(values: np.ndarray, width: int) -> np.ndarray:
    """The low ``width`` (even) upper-case hex digits of each value, as (n, width) ASCII."""
    be = np.ascontiguousarray(values, dtype=np.uint64).astype(">u8").view(np.uint8)
    pairs = be.reshape(-1, 8)[:, 8 - width // 2:].astype(np.intp)
    return _HEX_PAIRS16.take(pairs).view(np.uint8).reshape(-1, width)


_ROW_HEX_ROWS = 1 << 16
_row_hex: np.ndarray | None = None


def _row_hex8(rows: np.ndarray) -> np.ndarray:
    """The 8 hex digits of each row number, one uint64 (8 ASCII bytes) per row."""
    global _row_hex
    if len(rows) and int(rows.max()) >= _ROW_HEX_ROWS:
        return _hex_digits(rows, 8).view(np.uint64).ravel()
    if _row_hex is None:   # built once: 512 KiB, rows of up to 65,536-message batches
        _row_hex = _hex_digits(np.arange(_ROW_HEX_ROWS), 8).view(np.uint64).ravel()
    return _row_hex.take(rows)


_LOOP_IDS = 8      # ids of this many rows or fewer: a loop (numpy's fixed cost exceeds it)


def _few_ids(ids: list[str]) -> pa.Array:
    """At most ``_LOOP_IDS`` ids (32 ASCII characters each) as a string array."""
    return fixed_width_strings(ids, 32)


def id_prefix(tag: int, batch_offset: int) -> str:
    """The first 24 digits of the ids of a batch's rows (:func:`encode_message_id`'s): the
    rows' own 8 follow (``_ipc.row_ids`` and ``_ipc.id_ack`` write them)."""
    return f"{tag:08X}{batch_offset:016X}"


def row_id_data(tag: int, batch_offset: int, first: int, n: int) -> bytes | None:
    """The bytes of the ids of rows ``first..first+n-1`` of the batch at ``batch_offset``
    (32 a row: ``_ipc.row_ids``); None where the C module is not built or a row is past
    0xFFFFFFFF."""
    if _ipc is None:
        return None
    return _ipc.row_ids(id_prefix(tag, batch_offset).encode(), first, n)


def batch_message_ids(tag: int, batch_offset: int, n: int, first: int = 0) -> pa.Array:
    """The ids of rows ``first..first+n-1`` of the batch at ``batch_offset`` (a send's
    ack): the 24-digit prefix once, the row digits written by one C call
    (``_ipc.row_ids``), or without it from the table of row numbers."""
    data = row_id_data(tag, batch_offset, first, n)   # (~2.4 against ~6.3 us for 100 rows,
    if data is not None:                              # five numpy calls)
        return _id_array(data, n)
    prefix = id_prefix(tag, batch_offset)
    if n <= _LOOP_IDS:
        return _few_ids([encode_message_id(tag, batch_offset, j) for j in range(first, first + n)])
    words = np.empty((n, 4), np.uint64)
    words[:, :3] = np.frombuffer(prefix.encode(), np.uint64)
    words[:, 3] = _row_hex8(np.arange(first, first + n))
    return _id_array(words, n)


def message_id_array(tag: int | np.ndarray, batch_offsets: np.ndarray,
                     rows: np.ndarray) -> pa.Array:
    """Message ids for many rows, vectorized (32 ASCII hex digits each); ``tag`` the
    store's, or each row's (``IdTags.of``: rows of several id epochs).

    An id is tag (8 digits), batch offset (16) and row (8): the first 24 digits are
    built once per run of equal batch offsets and repeated, the last 8 come from a
    table of row numbers, so the cost is a few copies of 32 bytes per row.
    """
    n = len(batch_offsets)
    if n == 0:
        return pa.array([], pa.string())
    if n <= _LOOP_IDS:          # (a long poll's one message)
        return _few_ids(message_ids(tag, batch_offsets, rows))
    batch_offsets = np.asarray(batch_offsets, dtype=np.int64)
    cuts = np.flatnonzero(batch_offsets[1:] != batch_offsets[:-1]) + 1
    firsts = np.concatenate([[0], cuts])
    lens = np.diff(np.concatenate([firsts, [n]]))
    template = np.zeros((len(firsts), 32), dtype=np.uint8)   # one id per run, row digits later
    template[:, :8] = _hex_digits(np.array([tag], dtype=np.uint64) if np.isscalar(tag)
                                  else np.asarray(tag, np.uint64)[firsts], 8)
    template[:, 8:24] = _hex_digits(batch_offsets[firsts], 16)
    words = np.repeat(template.view(np.uint64), lens, axis=0)  # (n, 4): 32 bytes per id
    words[:, 3] = _row_hex8(np.asarray(rows, dtype=np.int64))
    return _id_array(words, n)


def message_ids(tag: int | np.ndarray, batch_offsets: np.ndarray,
                rows: np.ndarray) -> list[str]:
    """The ids of ``message_id_array`` as Python strings (what a read of messages hands
    out): formatted one by one for a few rows, else that array's values."""
    if len(batch_offsets) > _LOOP_IDS:
        return message_id_array(tag, batch_offsets, rows).to_pylist()
    tags = [tag] * len(batch_offsets) if np.isscalar(tag) else np.asarray(tag).tolist()
    return [encode_message_id(t, b, r) for t, b, r in
            zip(tags, np.asarray(batch_offsets).tolist(), np.asarray(rows).tolist())]


def _id_array(data, n: int) -> pa.Array:
    """``n`` ids, 32 ASCII bytes each (``data``: their bytes, or ``(n, 4)`` uint64 words),
    as a string array."""
    return pa.StringArray.from_buffers(n, fixed_offsets(n, 32), pa.py_buffer(data))


def _own_ids_complete(own) -> bool:
    """Whether every row of ``own`` (``unique_key``) has a producer's id (sparkmq's
    Producer sets one on every message): no null and, from a string array's offsets, no
    empty value (its least length by ``_screen.body_sizes``, ~0.9 us; by numpy ~3; two
    kernel calls ~6-11; a chunked array, as a read's table holds it, chunk by chunk)."""
    n = len(own)
    if own.null_count or not n:
        return False
    if isinstance(own, pa.ChunkedArray):
        return all(_own_ids_complete(c) for c in own.chunks if len(c))
    if own.type == pa.string():
        if _c_screen is not None:
            return _c_screen.body_sizes(own.buffers()[1], own.offset, n)[1] > 0
        o = np.frombuffer(own.buffers()[1], np.int32, n + 1, own.offset * 4)
        return bool((o[1:] > o[:-1]).all())
    return pc.min(pc.binary_length(own)).as_py() > 0


def delivered_ids(own, broker_ids: Callable[[], Any]):
    """The id each message is known by, in an ack and to consumers: the producer's own
    (``own``: ``unique_key``) where it set a non-empty one, else the broker's
    (``broker_ids()``, not called when every row has its own). Arrays or chunked arrays;
    ``own`` None: no row has one. The RocketMQ path applies the same rule to one message:
    ``unique_key or message_id``."""
    if own is None or own.null_count == len(own):     # (no row has one: no kernel call)
        return broker_ids()
    if _own_ids_complete(own):
        return own
    return pc.if_else(pc.fill_null(pc.greater(pc.binary_length(own), 0), False),
                      own, broker_ids())


def group_hashes(groups: pa.Array):
    """``crc32(message_group)`` per row as an int64 numpy array, -1 where the row has
    no group (null or empty, as ``QueueChooser.choose_one`` and the proxy read it): the
    sharding key's hash (queue = hash % writeQueueNums), computed once per distinct
    group. Every queue chooser (``Store.append``/``append_batch``, the Spark writer)
    uses this hash, so a group lands in the same queue whoever writes it."""
    enc = pc.dictionary_encode(groups.cast(pa.string()))
    hashes = np.array([zlib.crc32(v.encode()) if v else -1
                       for v in enc.dictionary.to_pylist()] + [-1], np.int64)
    return hashes[enc.indices.fill_null(len(hashes) - 1).to_numpy()]


def now_ms() -> int:
    return int(time.time() * 1000)


def messages_to_batch(messages, **kw):
    """Moved to :func:`sparkmq.log.batch.messages_to_batch` (the one batch builder)."""
    from .batch import messages_to_batch as build
    return build(messages, **kw)
