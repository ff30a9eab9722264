"""Parked delayed messages as rows of the store: the schedule topic's names, the recall
handles naming a parked message, and the reads and writes the schedule service makes of
them (its queues' due times, the real-topic rows a delivery appends, the copies already
delivered, the stored recalls).

Every function is a stateless read or build over a ``Store``; thread-safe as the store is.
"""

from __future__ import annotations

import base64
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..log import format as fmt
from ..errors import UserError
from ..log.batch import build_segment_batch

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_GROUP = "SCHEDULE_CONSUMER_GROUP"
RECALL_TOPIC = "rmq_sys_SCHEDULE_RECALL"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_DELAY_LEVEL = "DELAY"                  # RocketMQ MessageConst.PROPERTY_DELAY_TIME_LEVEL
PROP_SOURCE = "SCHEDULE_SOURCE"
RECALL_HANDLE_VERSION = "v1"
PARKED_COLUMNS = ["queue_offset", "body", "tags", "keys", "properties", "born_timestamp",
                  "born_host", "delivery_timestamp", "unique_key"]
#: rows read per step when scanning a queue (bounds the memory of one step)
SCAN_CHUNK = 4096


def make_recall_handle(topic: str, broker_name: str, qid: int, offset: int,
                       message_id: str) -> str:
    """An opaque handle naming a parked message: ``v1 topic broker queue offset id``,
    base64url (RocketMQ's handles are base64 text of the same kind)."""
    text = f"{RECALL_HANDLE_VERSION} {topic} {broker_name} {qid} {offset} {message_id}"
    return base64.urlsafe_b64encode(text.encode()).decode()


def parse_recall_handle(handle: str) -> tuple[str, str, int, int, str]:
    """(topic, broker name, schedule queue, offset, message id); raises UserError."""
    try:
        parts = base64.urlsafe_b64decode(handle.encode()).decode().split(" ")
        if len(parts) != 6 or parts[0] != RECALL_HANDLE_VERSION:
            raise ValueError(parts[:1])
        return parts[1], parts[2], int(parts[3]), int(parts[4]), parts[5]
    except (ValueError, UnicodeError) as e:
        raise UserError(f"recall handle {handle[:40]!r} is malformed ({e}); use the "
                        "recall_handle returned by the send of a delayed message") from None


class RecallStatus:
    RECALLED = "RECALLED"
    NOT_FOUND = "NOT_FOUND"          # delivered already, recalled already, or never parked


def read_dues(store, qid: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(queue offsets, due ms) of the parked rows of schedule queue ``qid`` in [lo, hi)
    that retention left (a missing due time counts as 0: due at once)."""
    t = store.read_table(SCHEDULE_TOPIC, qid, lo, hi,
                         columns=["queue_offset", "delivery_timestamp"], on_removed="skip")
    offs = t.column("queue_offset").to_numpy().astype(np.int64)
    dues = t.column("delivery_timestamp").cast(pa.int64()).fill_null(0).to_numpy()
    return offs, dues.astype(np.int64)


def store_time_at(store, qid: int, offset: int) -> int | None:
    """Store time (ms) of the parked row at ``offset`` (or the first one after it left)."""
    t = store.read_table(SCHEDULE_TOPIC, qid, offset, offset + 1,
                         columns=["store_timestamp"], on_removed="skip")
    if t.num_rows == 0:
        return None
    return int(t.column("store_timestamp").cast(pa.int64())[0].as_py())


def stored_recalls(store) -> dict[int, set[int]]:
    """Recalled parked messages, schedule queue -> offsets (rows of RECALL_TOPIC)."""
    out: dict[int, set[int]] = {}
    hi = store.max_offset(RECALL_TOPIC, 0)
    lo = store.min_offset(RECALL_TOPIC, 0)
    while lo < hi:
        t = store.read_table(RECALL_TOPIC, 0, lo, min(hi, lo + SCAN_CHUNK), columns=["body"],
                             on_removed="skip")
        if t.num_rows == 0:
            break
        for body in t.column("body").to_pylist():
            a, b = body.decode().split(":")
            out.setdefault(int(a), set()).add(int(b))
        lo += SCAN_CHUNK
    return out


def delivered_sources(store, since_ms: int, floors: dict[int, int]) -> dict[tuple[int, int], int]:
    """(schedule queue, offset) -> due ms of parked messages whose copy a real topic holds,
    stored at or after ``since_ms``, limited to queues in ``floors`` at offsets from their
    floor. Reads two columns of the messages stored since ``since_ms``, in steps, of the
    queues whose stats say they hold any (not every queue of every topic)."""
    found: dict[tuple[int, int], int] = {}
    if not floors:
        return found
    for topic, q in store.queues_stored_since(max(0, since_ms)):
        if topic in (SCHEDULE_TOPIC, RECALL_TOPIC):
            continue
        lo = store.offset_for_time(topic, q, max(0, since_ms))
        hi = store.max_offset(topic, q)
        while lo < hi:
            t = store.read_table(topic, q, lo, min(hi, lo + SCAN_CHUNK),
                                 columns=["properties", "delivery_timestamp"],
                                 on_removed="skip")
            lo += SCAN_CHUNK
            if t.num_rows == 0:
                continue
            src = pc.map_lookup(t.column("properties"), pa.scalar(PROP_SOURCE), "first")
            t = t.filter(pc.is_valid(src))
            dues = t.column("delivery_timestamp").cast(pa.int64()).fill_null(0)
            for text, due in zip(src.drop_null().to_pylist(), dues.to_pylist()):
                a, b = text.split(":")
                qid, off = int(a), int(b)
                if qid in floors and off >= floors[qid]:
                    found[(qid, off)] = due
    return found


def real_table(store, due: list[tuple[int, int, int]], now_ms: int):
    """The due parked messages ``(due ms, queue, offset)`` as their real-topic rows, one
    record batch in SEGMENT_SCHEMA (columnar: no per-message Python objects but the
    properties), or None. Parked messages removed by retention meanwhile, or whose topic is
    gone (logged), are left out."""
    wanted: dict[int, list[int]] = {}
    for _, qid, off in due:
        wanted.setdefault(qid, []).append(off)
    live = set(store.topics())
    tables = []
    for qid, offs in wanted.items():
        lo, hi = min(offs), max(offs)
        t = store.read_table(SCHEDULE_TOPIC, qid, lo, hi + 1, columns=PARKED_COLUMNS,
                             on_removed="skip")
        if len(offs) != hi - lo + 1:
            t = t.filter(pc.is_in(t.column("queue_offset"), pa.array(offs, pa.int64())))
        props_out, topics, keep = [], [], []
        for i, (off, props) in enumerate(zip(t.column("queue_offset").to_pylist(),
                                             t.column("properties").to_pylist())):
            d = dict(props or [])
            real = d.pop(PROP_REAL_TOPIC, None)
            if real not in live:
                log.error("schedule service: dropping parked message %s:%d, its topic %r "
                          "no longer exists", qid, off, real)
                continue
            d[PROP_SOURCE] = f"{qid}:{off}"
            keep.append(i)
            topics.append(real)
            props_out.append(list(d.items()))
        if not keep:
            continue
        if len(keep) != t.num_rows:
            t = t.take(pa.array(keep, pa.int64()))
        tables.append(pa.table({
            "topic": pa.array(topics, pa.string()), "body": t.column("body"),
            "tags": t.column("tags"), "keys": t.column("keys"),
            "properties": pa.array(props_out, pa.map_(pa.string(), pa.string())),
            "born_timestamp": t.column("born_timestamp"), "born_host": t.column("born_host"),
            "delivery_timestamp": t.column("delivery_timestamp"),
            "unique_key": t.column("unique_key"),
        }))
    if not tables:
        return None
    t = (tables[0] if len(tables) == 1 else pa.concat_tables(tables)).combine_chunks()
    return _segment_batch(t, store.config.store_host, now_ms)


def _segment_batch(t: pa.Table, store_host: str, now_ms: int) -> pa.RecordBatch:
    """Delivered rows as one batch in SEGMENT_SCHEMA, built by the log's one builder so
    ``Store.append_batch`` takes its no-cast path (queue ids null: the store's queue
    chooser places them; store time stamped by the store)."""
    cols = {name: t.column(name) for name in (
        "topic", "body", "tags", "keys", "properties", "born_timestamp", "born_host",
        "delivery_timestamp", "unique_key")}
    cols["store_timestamp"] = t.column("born_timestamp")
    cols["message_type"] = pa.repeat(pa.scalar(fmt.MESSAGE_TYPE_DELAY, pa.int8()), t.num_rows)
    return build_segment_batch(cols, t.num_rows, store_host=store_host, now_ms=now_ms)
