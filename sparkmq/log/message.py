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
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pyarrow as pa

from ..errors import InvalidMessageIdError
from . import format as fmt


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


def store_tag(store_id: str) -> int:
    return zlib.crc32(store_id.encode()) & 0xFFFFFFFF


def encode_message_id(tag: int, batch_offset: int, row: int) -> str:
    return f"{tag:08X}{batch_offset:016X}{row:08X}"


def decode_message_id(message_id: str) -> tuple[int, int, int]:
    """(store tag, batch physical offset, row) of a message id."""
    if not isinstance(message_id, str) or len(message_id) != 32:
        raise InvalidMessageIdError(
            f"a message id is 32 hex digits, got {message_id!r}")
    try:
        return int(message_id[:8], 16), int(message_id[8:24], 16), int(message_id[24:], 16)
    except ValueError:
        raise InvalidMessageIdError(f"a message id is 32 hex digits, got {message_id!r}") from None


def message_ids(tag: int, batch_offsets: pa.Array, rows: pa.Array) -> pa.Array:
    """Vectorized :func:`encode_message_id` (one Python format call per row: ids are
    built only for rows a caller asked to see)."""
    bo = batch_offsets.to_pylist()
    rw = rows.to_pylist()
    return pa.array([f"{tag:08X}{b:016X}{r:08X}" for b, r in zip(bo, rw)], pa.string())


def group_hashes(groups: pa.Array):
    """``crc32(message_group)`` per row as an int64 numpy array, -1 where the row has
    no group: the sharding key's hash (queue = hash % writeQueueNums), computed once
    per distinct group. Every queue chooser (``Store.append``/``append_batch``, the
    Spark writer) uses this hash, so a group lands in the same queue whoever writes it."""
    import numpy as np
    import pyarrow.compute as pc
    enc = pc.dictionary_encode(groups.cast(pa.string()))
    hashes = np.array([zlib.crc32(v.encode()) for v in enc.dictionary.to_pylist()] + [-1],
                      np.int64)
    return hashes[enc.indices.fill_null(len(hashes) - 1).to_numpy()]


def now_ms() -> int:
    return int(time.time() * 1000)


def messages_to_batch(messages, **kw):
    """Moved to :func:`sparkmq.log.batch.messages_to_batch` (the one batch builder)."""
    from .batch import messages_to_batch as build
    return build(messages, **kw)
