"""Input limits on one message: the one home of the rules, with the RocketMQ 5 proxy's
names and defaults (``ProxyConfig``, ``SendMessageActivity``, ``GrpcValidator``).

A message is refused, alone, when (the proxy's status code in brackets):

- its whole size (body + topic + tag + keys + properties + message group + message id
  + born host + transaction id, UTF-8 bytes) is over ``maxMessageSize``
  [MESSAGE_BODY_TOO_LARGE];
- it has more than ``userPropertyMaxNum`` user properties, or their keys and values
  plus the tag plus the keys add up to more than ``maxUserPropertySize`` bytes
  [MESSAGE_PROPERTIES_TOO_LARGE];
- a property value is null, a property key or value holds a control character, or (a
  send through the broker) a key is one RocketMQ reserves for itself
  (``RESERVED_PROPERTY_KEYS``) [ILLEGAL_MESSAGE_PROPERTY_KEY];
- its tag is blank, holds ``|`` or a control character [ILLEGAL_MESSAGE_TAG];
- a key is null, blank or holds a control character [ILLEGAL_MESSAGE_KEY];
- its message group is blank, ``maxMessageGroupSize`` bytes or longer, or holds a
  control character [ILLEGAL_MESSAGE_GROUP];
- its message id is longer than ``maxMessageIdSize`` bytes, blank, or holds a control
  character [ILLEGAL_MESSAGE_ID];
- its born timestamp is outside 1970-01-01 .. 9999-12-31 [BAD_REQUEST], or its
  delivery timestamp is [ILLEGAL_DELIVERY_TIME];
- its stored message type is not NORMAL/FIFO/DELAY/TRANSACTION (0..3) [BAD_REQUEST].

:func:`message_violation` decides one message (the broker asks it per message before
any merge, the Store for each :class:`~sparkmq.log.message.Message`);
:func:`check_batch` applies the same rules to an Arrow batch in SEGMENT_SCHEMA: a screen
(``sparkmq._screen`` in C, or numpy) finds the rows that may break a rule and only those
are decided by :func:`message_violation`, so a rule is written once.

Before any of these, data from outside must be valid at all: :func:`check_valid_arrow`
(Arrow's full validation: UTF-8 strings, offsets in bounds) for batches, :func:`not_text`
for a ``Message`` field with no UTF-8 form.

Stateless; thread-safe.
"""
from __future__ import annotations

import functools
import numbers
import re
import struct
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..config import (DEFAULT_MAX_MESSAGE_GROUP_SIZE_BYTES, DEFAULT_MAX_MESSAGE_ID_SIZE_BYTES,
                      DEFAULT_MAX_MESSAGE_SIZE_BYTES, DEFAULT_MAX_USER_PROPERTY_SIZE_BYTES,
                      DEFAULT_USER_PROPERTY_MAX_NUM)
from ..errors import InvalidMessageError, MessageLimitError
from . import format as fmt

try:
    from .. import _screen as _c_screen      # sparkmq/_screen.c: the screen in one call
except ImportError:   # built without a compiler: numpy screens
    _c_screen = None

#: Timestamps a message may carry, in ms: protobuf's valid range from the epoch on.
MIN_TIMESTAMP_MS = 0
MAX_TIMESTAMP_MS = 253_402_300_799_999              # 9999-12-31T23:59:59.999Z

#: User property keys RocketMQ keeps for itself (``MessageConst.STRING_HASH_SET``)
#: and refuses from producers; ``DELAY`` is not among them here, since sparkmq's
#: broker accepts a delay level as that property.
RESERVED_PROPERTY_KEYS = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID",
    "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID",
    "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY",
    "MAX_RECONSUME_TIMES", "CONSUME_START_TIME",
})

_STORED_TYPES = (fmt.MESSAGE_TYPE_NORMAL, fmt.MESSAGE_TYPE_FIFO, fmt.MESSAGE_TYPE_DELAY,
                 fmt.MESSAGE_TYPE_TRANSACTION)
# Java's Character.isISOControl: U+0000..U+001F and U+007F..U+009F
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class MessageLimits:
    """The limits one message is held to (see the module docstring); ``of(config)``
    takes them from a StoreConfig (broker.conf names in the comments). Immutable."""

    max_message_size_bytes: int = DEFAULT_MAX_MESSAGE_SIZE_BYTES             # maxMessageSize
    max_user_property_size_bytes: int = DEFAULT_MAX_USER_PROPERTY_SIZE_BYTES  # maxUserPropertySize
    user_property_max_num: int = DEFAULT_USER_PROPERTY_MAX_NUM               # userPropertyMaxNum
    max_message_group_size_bytes: int = DEFAULT_MAX_MESSAGE_GROUP_SIZE_BYTES  # maxMessageGroupSize
    max_message_id_size_bytes: int = DEFAULT_MAX_MESSAGE_ID_SIZE_BYTES        # maxMessageIdSize

    @classmethod
    def of(cls, config) -> "MessageLimits":
        """The limits of a :class:`~sparkmq.config.StoreConfig`."""
        return cls(config.max_message_size_bytes, config.max_user_property_size_bytes,
                   config.user_property_max_num, config.max_message_group_size_bytes,
                   config.max_message_id_size_bytes)


def _utf8_len(s: str | None) -> int:
    return len(s.encode()) if s else 0


def message_size_bytes(topic: str, body_bytes: int, tag: str | None, keys: Sequence[str],
                       properties: Mapping[str, str] | Iterable[tuple[str, str]],
                       *others: str | None) -> int:
    """The size counted against maxMessageSize: the body plus every variable-length
    field (``others``: message group, message id, born host, transaction id) in UTF-8."""
    items = properties.items() if hasattr(properties, "items") else properties
    return (body_bytes + _utf8_len(topic) + _utf8_len(tag) + sum(map(_utf8_len, keys))
            + sum(_utf8_len(k) + _utf8_len(v) for k, v in items)
            + sum(map(_utf8_len, others)))


def message_violation(limits: MessageLimits, *, topic: str, body_bytes: int,
                      tag: str | None = None, keys: Sequence[str] = (),
                      properties: Mapping[str, str] | None = None,
                      message_group: str | None = None, message_id: str | None = None,
                      born_host: str | None = None, transaction_id: str | None = None,
                      born_timestamp_ms: int | None = None,
                      delivery_timestamp_ms: int | None = None,
                      message_type: int = fmt.MESSAGE_TYPE_NORMAL,
                      reserved_keys: frozenset = frozenset()) -> MessageLimitError | None:
    """The error refusing one message (its ``status`` names the proxy's code), or None.
    ``reserved_keys``: property keys refused as the system's (the broker passes
    ``RESERVED_PROPERTY_KEYS``; the Store, which stores the broker's own, none)."""
    props = properties or {}
    keys = keys or ()
    if _surely_within(limits, topic, body_bytes, tag, keys, props, message_group, message_id,
                      born_host, transaction_id, born_timestamp_ms, delivery_timestamp_ms,
                      message_type, reserved_keys):
        return None
    bad = (_property_violation(limits, props, tag, keys, reserved_keys)
           or _text_violation("ILLEGAL_MESSAGE_TAG", "tag", tag, extra="|")
           or _keys_violation(keys)
           or _group_violation(limits, message_group)
           or _id_violation(limits, message_id)
           or _time_violation(born_timestamp_ms, delivery_timestamp_ms)
           or _type_violation(message_type))
    if bad is not None:
        return bad
    size = message_size_bytes(topic, body_bytes, tag, keys, props, message_group, message_id,
                              born_host, transaction_id)
    if size > limits.max_message_size_bytes:
        return MessageLimitError(
            "MESSAGE_BODY_TOO_LARGE",
            f"message is {size} bytes (body {body_bytes} + properties, tag, keys and ids); "
            f"maxMessageSize is {limits.max_message_size_bytes}: send a smaller message")
    return None


def _surely_within(limits, topic, body_bytes, tag, keys, props, group, message_id, born_host,
                   transaction_id, born_ms, delivery_ms, message_type, reserved) -> bool:
    """True only if the message breaks no rule below, decided with a few C-level string
    tests (the usual message: printable ASCII text, so no control character and as many
    bytes as characters, where blank means only spaces); False: decide rule by rule."""
    try:
        blob = "".join([tag or "", *keys, *props.keys(), *props.values()])
    except TypeError:      # a null key or property value: the rules name it
        return False
    ids = (group or "") + (message_id or "")
    if not (blob.isascii() and blob.isprintable() and ids.isascii() and ids.isprintable()):
        return False
    if (len(props) > limits.user_property_max_num
            or len(blob) > limits.max_user_property_size_bytes
            or (tag and ("|" in tag or tag.isspace()))
            or any([k.isspace() for k in keys])
            or (group and (len(group) >= limits.max_message_group_size_bytes
                           or group.isspace()))
            or (message_id and (len(message_id) > limits.max_message_id_size_bytes
                                or message_id.isspace()))
            or (reserved and not reserved.isdisjoint(props.keys()))
            or message_type not in _STORED_TYPES):
        return False
    if not all(t is None or (isinstance(t, int) and MIN_TIMESTAMP_MS <= t <= MAX_TIMESTAMP_MS)
               for t in (born_ms, delivery_ms)):
        return False
    size = (body_bytes + _utf8_len(topic) + len(blob) + len(ids) + _utf8_len(born_host)
            + _utf8_len(transaction_id))
    return size <= limits.max_message_size_bytes


def _property_violation(limits, props, tag, keys, reserved) -> MessageLimitError | None:
    if len(props) > limits.user_property_max_num:
        return MessageLimitError(
            "MESSAGE_PROPERTIES_TOO_LARGE",
            f"{len(props)} user properties; userPropertyMaxNum is {limits.user_property_max_num}")
    size = _utf8_len(tag) + sum(map(_utf8_len, keys))
    for k, v in props.items():
        if k in reserved:
            return MessageLimitError("ILLEGAL_MESSAGE_PROPERTY_KEY",
                                     f"property {k!r} is reserved for the system; rename it")
        if v is None:
            return MessageLimitError("ILLEGAL_MESSAGE_PROPERTY_KEY",
                                     f"property {k[:64]!r} has no value (null): a property's "
                                     "value is a string; send '' or leave the property out")
        if _CONTROL.search(k) or (v and _CONTROL.search(v)):
            return MessageLimitError("ILLEGAL_MESSAGE_PROPERTY_KEY",
                                     f"property {k[:64]!r} has a control character in its "
                                     "key or value")
        size += _utf8_len(k) + _utf8_len(v)
    if size > limits.max_user_property_size_bytes:
        return MessageLimitError(
            "MESSAGE_PROPERTIES_TOO_LARGE",
            f"user properties, tag and keys are {size} bytes; maxUserPropertySize is "
            f"{limits.max_user_property_size_bytes}")
    return None


def _text_violation(status: str, what: str, value: str | None,
                    extra: str = "") -> MessageLimitError | None:
    """A non-empty ``value`` (empty is as good as absent, as in the proxy) must not be
    blank nor hold a control character or ``extra``."""
    if not value:
        return None
    if not value.strip():
        return MessageLimitError(status, f"{what} {value[:64]!r} is blank")
    if _CONTROL.search(value) or (extra and extra in value):
        also = f" or {extra!r}" if extra else ""
        return MessageLimitError(status,
                                 f"{what} {value[:64]!r} contains a control character{also}")
    return None


def _keys_violation(keys: Sequence[str]) -> MessageLimitError | None:
    for i, k in enumerate(keys):
        if k is None:
            return MessageLimitError("ILLEGAL_MESSAGE_KEY",
                                     f"key {i} is null: a key is a string; leave it out")
        bad = _text_violation("ILLEGAL_MESSAGE_KEY", "key", k)
        if bad is not None:
            return bad
    return None


def _group_violation(limits: MessageLimits, group: str | None) -> MessageLimitError | None:
    if group is not None and _utf8_len(group) >= limits.max_message_group_size_bytes:
        return MessageLimitError(
            "ILLEGAL_MESSAGE_GROUP",
            f"message group is {_utf8_len(group)} bytes; it must be under maxMessageGroupSize "
            f"({limits.max_message_group_size_bytes})")
    return _text_violation("ILLEGAL_MESSAGE_GROUP", "message group", group)


def _id_violation(limits: MessageLimits, message_id: str | None) -> MessageLimitError | None:
    if message_id is not None and _utf8_len(message_id) > limits.max_message_id_size_bytes:
        return MessageLimitError(
            "ILLEGAL_MESSAGE_ID",
            f"message id is {_utf8_len(message_id)} bytes; maxMessageIdSize is "
            f"{limits.max_message_id_size_bytes}")
    return _text_violation("ILLEGAL_MESSAGE_ID", "message id", message_id)


def timestamp_violation(ms: int | None, what: str,
                        status: str = "BAD_REQUEST") -> MessageLimitError | None:
    """The error refusing timestamp ``ms`` (named ``what``) outside
    MIN_TIMESTAMP_MS..MAX_TIMESTAMP_MS, or None (also for None)."""
    if ms is None or (isinstance(ms, numbers.Integral)
                      and MIN_TIMESTAMP_MS <= ms <= MAX_TIMESTAMP_MS):
        return None
    return MessageLimitError(status, f"{what} {ms!r} ms is not a time within "
                                     "1970-01-01..9999-12-31 (ms since the epoch)")


def _time_violation(born_ms: int | None, delivery_ms: int | None) -> MessageLimitError | None:
    return (timestamp_violation(born_ms, "born timestamp")
            or timestamp_violation(delivery_ms, "delivery timestamp", "ILLEGAL_DELIVERY_TIME"))


def _type_violation(message_type: int) -> MessageLimitError | None:
    if message_type not in _STORED_TYPES:
        return MessageLimitError(
            "BAD_REQUEST", f"message type {message_type} is not one of 0..3 "
                           "(NORMAL, FIFO, DELAY, TRANSACTION)")
    return None


def check_message(limits: MessageLimits, **fields) -> None:
    """Raise :func:`message_violation`'s error, if any."""
    bad = message_violation(limits, **fields)
    if bad is not None:
        raise bad


# ---------------------------------------------------------------- Arrow batches
SCREEN_MIN_ROWS = 4     # without sparkmq._screen, check_batch screens this many rows or more
def check_batch(batch: pa.RecordBatch, limits: MessageLimits,
                reserved_keys: frozenset = frozenset(), *, first_row: int = 0,
                c_array: tuple | None = None) -> None:
    """Apply :func:`message_violation` to every row of ``batch`` (SEGMENT_SCHEMA, or
    BuiltRows: made a batch only for flagged rows); raise the first row's error (naming
    the row, counted from ``first_row``, for a caller whose rows come in several batches).
    Rows no screen flags are not converted to Python: plain messages cost one C call
    (``sparkmq._screen``, a few us; ``c_array``: the batch's ``__arrow_c_array__()`` if
    the caller has it), or without it a few numpy calls (~50-120 us; a batch of fewer
    than ``SCREEN_MIN_ROWS`` rows is decided by the rule alone, ~16-18 us a row)."""
    for r in _flagged(batch, limits, reserved_keys, c_array):
        bad = message_violation(limits, **_row_fields(fmt.record_batch(batch), r),
                                reserved_keys=reserved_keys)
        if bad is not None:
            raise MessageLimitError(bad.status, f"row {first_row + r}: {bad.message}")


def _flagged(batch: pa.RecordBatch, limits: MessageLimits, reserved_keys: frozenset,
             c_array: tuple | None) -> Iterable[int]:
    """The rows of ``batch`` that may break a rule (a superset of those that do)."""
    if _c_screen is not None:
        rows = _c_screen.screen(*(c_array or batch.__arrow_c_array__()), (
            limits.max_message_size_bytes, limits.max_user_property_size_bytes,
            limits.user_property_max_num, limits.max_message_group_size_bytes,
            limits.max_message_id_size_bytes), _encoded(reserved_keys))
        if rows is not None:
            return rows
    n = batch.num_rows
    return range(n) if n < SCREEN_MIN_ROWS else \
        np.flatnonzero(_screen(fmt.record_batch(batch), limits, reserved_keys)).tolist()


@functools.lru_cache(maxsize=8)
def _encoded(keys: frozenset) -> tuple[bytes, ...]:
    return tuple(k.encode() for k in sorted(keys))


def _present(col: pa.Array) -> bool:
    return col.null_count < len(col)


def _byte_table(chars: bytes, c1: bool = True) -> np.ndarray:
    """A 256-entry table: True for ASCII control bytes, ``chars``, and (``c1``) the
    lead byte 0xC2 of U+0080..U+009F (the screen may flag more than the rule)."""
    t = np.zeros(256, bool)
    t[:0x20] = True
    t[0x7F] = True
    t[0xC2] = c1
    t[list(chars)] = True
    return t


_BAD_TAG_BYTES = _byte_table(b"|")
_BAD_TEXT_BYTES = _byte_table(b"")
# a value that may be blank starts with ASCII whitespace or a non-ASCII character
_MAYBE_BLANK_FIRST = np.zeros(256, bool)
_MAYBE_BLANK_FIRST[[0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20]] = True
_MAYBE_BLANK_FIRST[0x80:] = True


def _screen(batch: pa.RecordBatch, limits: MessageLimits,
            reserved_keys: frozenset = frozenset()) -> np.ndarray:
    """Rows that may break a rule (a superset of those that do). Reads the columns'
    buffers with numpy; a limit that no row can reach, judged from a whole column's
    bytes (no value is longer than all of them), costs no per-row pass."""
    n = batch.num_rows
    flag = np.zeros(n, bool)
    text = {name: batch.column(name) for name in _TEXT_COLUMNS
            if _present(batch.column(name))}
    keys, props = batch.column("keys"), batch.column("properties")
    keys, props = (keys if _present(keys) else None), (props if _present(props) else None)
    listed = (_span(keys.values) if keys is not None else 0) + \
        (_span(props.keys) + _span(props.items) if props is not None else 0)
    in_props = listed + (_span(text["tags"]) if "tags" in text else 0)
    whole = listed + _span(batch.column("body")) + _span(batch.column("topic")) + \
        sum(_span(col) for col in text.values())
    size = (_Strings(batch.column("body")).lengths() + _Strings(batch.column("topic")).lengths()
            if whole > limits.max_message_size_bytes else None)
    prop_bytes = np.zeros(n, np.int64) if in_props > limits.max_user_property_size_bytes \
        else None
    for name, col in text.items():
        if name in ("born_host", "transaction_id"):     # counted in the size only
            if size is not None:
                size += _Strings(col).lengths()
            continue
        s = _Strings(col)
        lengths = s.lengths()
        if size is not None:
            size += lengths
        s.mark_bytes(flag, _BAD_TAG_BYTES if name == "tags" else _BAD_TEXT_BYTES)
        s.mark_blank(flag)
        if name == "tags":
            if prop_bytes is not None:
                prop_bytes += lengths
        elif name == "message_group":
            if _span(col) >= limits.max_message_group_size_bytes:
                flag |= lengths >= limits.max_message_group_size_bytes
        elif _span(col) > limits.max_message_id_size_bytes:
            flag |= lengths > limits.max_message_id_size_bytes
    if keys is not None:
        s = _Strings(_children(keys, keys.values), _parents(keys), n)
        if size is not None or prop_bytes is not None:
            key_bytes = s.row_sums()
            for acc in (size, prop_bytes):
                if acc is not None:
                    acc += key_bytes
        s.mark_bytes(flag, _BAD_TEXT_BYTES)
        s.mark_blank(flag)
        s.mark_null(flag)
    if props is not None:
        parents = _parents(props)
        pbytes = np.zeros(n, np.int64)
        for child in (props.keys, props.items):
            s = _Strings(_children(props, child), parents, n)
            if size is not None or prop_bytes is not None:
                pbytes += s.row_sums()
            s.mark_bytes(flag, _BAD_TEXT_BYTES)
            s.mark_null(flag)
        if reserved_keys:
            hits = pc.is_in(_children(props, props.keys), value_set=pa.array(
                sorted(reserved_keys), pa.string())).to_numpy(zero_copy_only=False)
            flag[parents[hits]] = True
        for acc in (size, prop_bytes):
            if acc is not None:
                acc += pbytes
        if len(parents) > limits.user_property_max_num:
            flag |= np.bincount(parents, minlength=n) > limits.user_property_max_num
    if prop_bytes is not None:
        flag |= prop_bytes > limits.max_user_property_size_bytes
    if size is not None:
        flag |= size > limits.max_message_size_bytes
    _mark_out_of_range(flag, batch.column("born_timestamp"))
    _mark_out_of_range(flag, batch.column("delivery_timestamp"))
    types = _values(batch.column("message_type"), np.int8)
    if n and (types.min() < 0 or types.max() > fmt.MESSAGE_TYPE_TRANSACTION):
        flag |= (types < 0) | (types > fmt.MESSAGE_TYPE_TRANSACTION)
    return flag


_TEXT_COLUMNS = ("tags", "message_group", "unique_key", "born_host", "transaction_id")
_OFFSET = struct.Struct("<i")


def _span(col: pa.Array) -> int:
    """The bytes a string or binary array's values span, nulls' spans included: no one
    value is longer (an array read from its offsets, no kernel call)."""
    if not len(col):
        return 0
    offsets, at = col.buffers()[1], col.offset * 4
    return _OFFSET.unpack_from(offsets, at + 4 * len(col))[0] - \
        _OFFSET.unpack_from(offsets, at)[0]


class _Strings:
    """A string or binary array read from its buffers: per value its byte length, and
    the rows whose values hit a byte table. ``parents``: the row of each value (a
    list's values), None when values are rows; ``rows``: the batch's row count. Null
    values count as empty and are never flagged."""

    def __init__(self, col: pa.Array, parents: np.ndarray | None = None, rows: int = 0):
        n = len(col)
        bufs = col.buffers()
        offsets = np.frombuffer(bufs[1], np.int32, n + 1, col.offset * 4).astype(np.int64)
        base = int(offsets[0])
        self.data = (np.frombuffer(bufs[2], np.uint8)[base:int(offsets[-1])]
                     if bufs[2] is not None else np.zeros(0, np.uint8))
        self.offsets = offsets - base
        self.valid = (np.ones(n, bool) if not col.null_count
                      else col.is_valid().to_numpy(zero_copy_only=False))
        self.parents = parents
        self.rows = n if parents is None else rows

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row_sums(self) -> np.ndarray:
        """Per row: the byte lengths of its values added up."""
        return np.bincount(self.parents, weights=self.lengths(),
                           minlength=self.rows).astype(np.int64)

    def mark_bytes(self, flag: np.ndarray, table: np.ndarray) -> None:
        """Flag the rows with a value that has a byte ``table`` flags."""
        hit = table[self.data]
        if not hit.any():
            return
        values = np.searchsorted(self.offsets, np.flatnonzero(hit), "right") - 1
        self._mark(flag, values[self.valid[values]])

    def mark_blank(self, flag: np.ndarray) -> None:
        """Flag the rows with a value that may be blank (empty, or its first byte
        whitespace or non-ASCII)."""
        lengths = self.lengths()
        some = lengths > 0
        first = np.zeros(len(lengths), bool)
        first[some] = _MAYBE_BLANK_FIRST[self.data[self.offsets[:-1][some]]]
        maybe = self.valid & (first | ~some)
        if maybe.any():
            self._mark(flag, np.flatnonzero(maybe))

    def mark_null(self, flag: np.ndarray) -> None:
        """Flag the rows with a null value (a key, a property value: the rules refuse it)."""
        if not self.valid.all():
            self._mark(flag, np.flatnonzero(~self.valid))

    def _mark(self, flag: np.ndarray, values: np.ndarray) -> None:
        flag[values if self.parents is None else self.parents[values]] = True


def _children(col: pa.Array, child: pa.Array) -> pa.Array:
    """The values of list or map ``col`` that its rows use (``child``: ``col.values``,
    or a map's ``keys`` / ``items``, which are not sliced with ``col``)."""
    offsets = col.offsets.to_numpy()
    return child.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _parents(col: pa.Array) -> np.ndarray:
    """For each value of list or map ``col`` (see ``_children``), its row."""
    return np.repeat(np.arange(len(col)), np.diff(col.offsets.to_numpy()))


def _values(col: pa.Array, dtype) -> np.ndarray:
    """A fixed-width column's values (garbage under nulls: the screen may over-flag)."""
    return np.frombuffer(col.buffers()[1], dtype, len(col), col.offset * np.dtype(dtype).itemsize)


def _mark_out_of_range(flag: np.ndarray, col: pa.Array) -> None:
    """Flag the rows of timestamp ``col`` outside 1970..9999 (or null: may be anything)."""
    if not _present(col):
        return
    ms = _values(col, np.int64)
    if ms.min() < MIN_TIMESTAMP_MS or ms.max() > MAX_TIMESTAMP_MS:
        flag |= (ms < MIN_TIMESTAMP_MS) | (ms > MAX_TIMESTAMP_MS)


_FIELD = {name: i for i, name in enumerate(fmt.SEGMENT_SCHEMA.names)}


def _row_fields(batch: pa.RecordBatch, r: int) -> dict:
    """Row ``r`` as :func:`message_violation`'s keyword arguments, scalar by scalar (a
    column with no value in any row is None at once; the body is measured, not copied)."""
    def scalar(name: str):
        col = batch.column(_FIELD[name])
        return None if col.null_count == len(col) else col[r]

    def value(name: str):
        s = scalar(name)
        return None if s is None else s.as_py()

    def ms(name: str):
        s = scalar(name)
        return s.value if s is not None and s.is_valid else None
    body = batch.column(_FIELD["body"])[r]
    return dict(topic=value("topic"), body_bytes=len(body.as_buffer()) if body.is_valid else 0,
                tag=value("tags"), keys=value("keys") or (),
                properties=dict(value("properties") or ()),
                message_group=value("message_group"), message_id=value("unique_key"),
                born_host=value("born_host"), transaction_id=value("transaction_id"),
                born_timestamp_ms=ms("born_timestamp"),
                delivery_timestamp_ms=ms("delivery_timestamp"),
                message_type=value("message_type") or fmt.MESSAGE_TYPE_NORMAL)   # null: NORMAL


# ---------------------------------------------------------------- valid data
def repeated_names(names: Sequence[str]) -> dict[str, int]:
    """The column names that come more than once in ``names``, with their counts (in name
    order; empty for the usual batch): every writer takes a message's columns by name, so
    each must be named once (Arrow and Spark both allow a name twice)."""
    if len(set(names)) == len(names):
        return {}
    return {n: names.count(n) for n in sorted(set(names)) if names.count(n) > 1}


def check_valid_arrow(data: pa.RecordBatch | pa.Table, what: str) -> None:
    """Refuse (InvalidMessageError) ``data`` that is not valid Arrow through and through:
    every offset in bounds and in order, every string valid UTF-8 (Arrow's own full
    validation, ``validate(full=True)``: ~1-5 us for a batch of 1-100 rows).

    Arrow's IPC reader checks only a batch's outline, and an array made from buffers is not
    checked at all: a batch off the network (Flight), built from raw bytes, or from a Spark
    string that was never UTF-8, may hold a string that readers of the topic fail on (a
    consumer's decode raises, DuckDB refuses the table, Polars 1.x panics showing it), or
    an offset past its buffer. Such data is refused before anything reads or stores it. So
    is a batch that names a column twice (Arrow allows it; a message has one topic, one
    body, ...)."""
    names = () if data.schema.equals(fmt.SEGMENT_SCHEMA) else data.schema.names   # (~2 us)
    twice = repeated_names(names)
    if twice:
        raise InvalidMessageError(f"{what} names each column once; {sorted(twice)} come more "
                                  "than once. Nothing was stored")
    try:
        data.validate(full=True)
    except pa.ArrowInvalid as e:
        where = next((f"column {name!r}" for name, col in zip(data.schema.names, data.columns)
                      if not _valid(col)), "a column")
        raise InvalidMessageError(
            f"{what} is not valid Arrow data: {where}: {e}. Nothing was stored. Every string "
            "must be UTF-8 text (bytes go in the binary body column), every offset within its "
            "buffer") from None


def _valid(col: pa.Array | pa.ChunkedArray) -> bool:
    try:
        col.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def not_text(exc: UnicodeEncodeError) -> InvalidMessageError:
    """The refusal of a message field (a Python str) that has no UTF-8 form: a lone
    surrogate, as ``os.fsdecode`` or ``surrogateescape`` leave for undecodable bytes."""
    return InvalidMessageError(
        f"message field is not valid text ({exc}); nothing was stored. Decode bytes to "
        "str before sending, or send them in the binary body")
