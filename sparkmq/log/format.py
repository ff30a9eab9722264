"""The on-disk format, in one place: version, file names, schemas.

This module mirrors docs/FORMAT.md. No other module builds a path inside a
store or declares a column: they ask here. Topic and group names never reach
a path; side tables refer to topics by their numeric ``topic_id``.

Layout of a store rooted at ``<root>``::

    <root>/_log/00000000000000000000.json            commit files (JSON lines)
    <root>/_log/00000000000000000010.checkpoint.json checkpoints (JSON lines)
    <root>/_log/_sidecars/<version>.<part>.<bucket>.<uuid>.json  parts of checkpoints
    <root>/_log/_last_checkpoint                     pointer to the newest checkpoint
    <root>/commitlog/00000000000000000000.arrow      broker-written segments (base offset)
    <root>/commitlog/w-<job>-<task>-<uuid>.arrow     segments written by Spark tasks
    <root>/consumequeue/<uuid>.parquet               ConsumeQueue side-table files
    <root>/index/<uuid>.parquet                      Index side-table files
    <root>/abort                                     present while a writer runs
"""
from __future__ import annotations

import re
import uuid
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FORMAT_VERSION = 2
# reader version 3: checkpoints in parts (a manifest and its sidecars, FORMAT.md section 6);
# a reader of version 2 would skip the manifest's sidecar actions and misread the state.
# Stores written by this code say so (new ones from version 0, older ones from the first
# commit this code makes: TransactionLog.commit upgrades the protocol)
MIN_READER_VERSION = 3
MIN_WRITER_VERSION = 2
# reader and writer version 4 and 3: message-id epochs (``metaData.idEpochs``, FORMAT.md
# "Message id"); an older reader would give a later epoch's messages the wrong ids, an
# older writer would append with the store's first tag. Required only by stores that have
# one (the commit that adds the first says so: ``log/idtags.py``)
ID_EPOCHS_READER_VERSION = 4
ID_EPOCHS_WRITER_VERSION = 3
# the protocol versions this code implements: it reads stores whose minReaderVersion is
# at most READER_VERSION and writes stores whose minWriterVersion is at most WRITER_VERSION
READER_VERSION = 4
WRITER_VERSION = 3

LOG_DIR = "_log"
COMMITLOG_DIR = "commitlog"
CONSUMEQUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
ABORT_FILE = "abort"
LAST_CHECKPOINT_FILE = "_last_checkpoint"
SIDECAR_DIR = f"{LOG_DIR}/_sidecars"
READERS_DIR = "_readers"            # live stream readers' markers (not part of the store)

OFFSET_DIGITS = 20
_COMMIT_RE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_RE = re.compile(r"^(\d{20})\.checkpoint\.json$")
_SIDECAR_RE = re.compile(r"^(\d{20})\.([a-z]{1,16})\.(\d{1,6})\.[0-9a-f]{32}\.json$")
_SEGMENT_RE = re.compile(r"^(\d{20})\.arrow$")

# message_type values (RocketMQ 5.x MessageType)
MESSAGE_TYPE_NORMAL = 0
MESSAGE_TYPE_FIFO = 1
MESSAGE_TYPE_DELAY = 2
MESSAGE_TYPE_TRANSACTION = 3

TS = pa.timestamp("ms", tz="UTC")


def ts_array(ms) -> pa.Array:
    """int64 milliseconds (a numpy array) as a ``TS`` column, zero copy when they are
    contiguous int64 (a ``cast`` kernel call costs ~5-25 us, more on cold caches)."""
    ms = np.ascontiguousarray(ms, np.int64)
    return pa.Array.from_buffers(TS, len(ms), [None, pa.py_buffer(ms)])


#: The schema of every CommitLog segment (Arrow IPC stream format).
SEGMENT_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("queue_id", pa.int32(), nullable=False),
    pa.field("body", pa.binary(), nullable=False),
    pa.field("tags", pa.string()),
    pa.field("keys", pa.list_(pa.string())),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("born_timestamp", TS, nullable=False),
    pa.field("store_timestamp", TS, nullable=False),
    pa.field("born_host", pa.string()),
    pa.field("store_host", pa.string()),
    pa.field("reconsume_times", pa.int32(), nullable=False),
    pa.field("delivery_timestamp", TS),
    pa.field("message_group", pa.string()),
    pa.field("transaction_id", pa.string()),
    pa.field("message_type", pa.int8(), nullable=False),
    pa.field("unique_key", pa.string()),
], metadata={b"sparkmq.format": str(FORMAT_VERSION).encode()})
#: SEGMENT_SCHEMA's fields as a tuple, for loops on the append path: iterating a pyarrow
#: Schema raises and formats a TypeError inside pyarrow for each field (~3 us a loop).
SEGMENT_FIELDS = tuple(SEGMENT_SCHEMA)

# the columns declared not null whose nulls a writer may leave to their defaults
FILLED_COLUMNS = frozenset({"born_timestamp", "reconsume_times", "message_type"})
_FILLED = tuple((i, f.name) for i, f in enumerate(SEGMENT_FIELDS)
                if f.name in FILLED_COLUMNS)


def record_batch(rows) -> pa.RecordBatch:
    """``rows`` as a record batch in SEGMENT_SCHEMA: itself, or a BuiltRows' batch
    (``log/built.py``; a composed one's is made when first asked for)."""
    return rows if isinstance(rows, pa.RecordBatch) else rows.batch


def fill_required(batch: pa.RecordBatch, clock_ms: Callable[[], int]) -> pa.RecordBatch:
    """``batch`` (SEGMENT_SCHEMA) with the nulls of the columns FORMAT.md declares not
    null and a writer may leave to their defaults filled in: ``born_timestamp`` now
    (``clock_ms()``), ``reconsume_times`` 0, ``message_type`` NORMAL. (``topic`` and
    ``body`` nulls are refused, ``queue_id`` nulls chosen, ``store_timestamp`` stamped.)"""
    for i, name in _FILLED:
        col = batch.column(i)
        if col.null_count:
            f = SEGMENT_SCHEMA.field(i)
            value = pa.scalar(clock_ms(), pa.int64()).cast(f.type) \
                if name == "born_timestamp" else pa.scalar(0, f.type)
            batch = batch.set_column(i, f, pc.fill_null(col, value))
    return batch


#: Columns a reader adds to segment columns (they live in the log and side tables).
QUEUE_OFFSET = pa.field("queue_offset", pa.int64(), nullable=False)
PHYSICAL_OFFSET = pa.field("physical_offset", pa.int64(), nullable=False)
MESSAGE_ID = pa.field("message_id", pa.string(), nullable=False)

#: Columns of ConsumeQueue side-table files, sorted by (topic_id, queue_id, queue_offset).
CONSUMEQUEUE_SCHEMA = pa.schema([
    pa.field("topic_id", pa.int32(), nullable=False),
    pa.field("queue_id", pa.int32(), nullable=False),
    pa.field("queue_offset", pa.int64(), nullable=False),
    pa.field("batch_offset", pa.int64(), nullable=False),   # physical offset of the record batch
    pa.field("row", pa.int32(), nullable=False),            # row of the message in the batch
    pa.field("size", pa.int32(), nullable=False),           # body size in bytes
    pa.field("tags_code", pa.int64(), nullable=False),      # tags_code(tags); 0 when no tags
    pa.field("store_timestamp", TS, nullable=False),
])

#: Columns of Index side-table files, sorted by (topic_id, key).
INDEX_SCHEMA = pa.schema([
    pa.field("topic_id", pa.int32(), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field("queue_id", pa.int32(), nullable=False),
    pa.field("queue_offset", pa.int64(), nullable=False),
    pa.field("batch_offset", pa.int64(), nullable=False),
    pa.field("row", pa.int32(), nullable=False),
    pa.field("store_timestamp", TS, nullable=False),
])


def tags_code(tags: str | None) -> int:
    """RocketMQ's tag hash: Java's String.hashCode of the tags, as a signed 64-bit value."""
    if not tags:
        return 0
    h = 0
    data = tags.encode("utf-16-be")
    for i in range(0, len(data), 2):          # Java hashes UTF-16 code units
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def join(root: str, *parts: str) -> str:
    """Join a store root and relative parts with '/' (fsspec paths)."""
    root = root.rstrip("/")
    return "/".join([root, *[p.strip("/") for p in parts]])


def commit_file(version: int) -> str:
    return f"{LOG_DIR}/{version:0{OFFSET_DIGITS}d}.json"


def checkpoint_file(version: int) -> str:
    return f"{LOG_DIR}/{version:0{OFFSET_DIGITS}d}.checkpoint.json"


def last_checkpoint_file() -> str:
    return f"{LOG_DIR}/{LAST_CHECKPOINT_FILE}"


def parse_commit_file(name: str) -> int | None:
    m = _COMMIT_RE.fullmatch(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def parse_checkpoint_file(name: str) -> int | None:
    m = _CHECKPOINT_RE.fullmatch(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def sidecar_file(version: int, part: str, bucket: int) -> str:
    """A new sidecar of checkpoint ``version``: one part (``part``, ``bucket``) of its
    state. Random, so two writers of one version never collide."""
    return f"{SIDECAR_DIR}/{version:0{OFFSET_DIGITS}d}.{part}.{bucket}.{uuid.uuid4().hex}.json"


def parse_sidecar_file(name: str) -> int | None:
    """The checkpoint version a sidecar was written for (None: not a sidecar name)."""
    m = _SIDECAR_RE.fullmatch(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def is_sidecar_path(path: str) -> bool:
    """True for a path a manifest may name: ``_log/_sidecars/<sidecar name>``."""
    head, _, name = path.rpartition("/")
    return head == SIDECAR_DIR and parse_sidecar_file(name) is not None


def segment_file(base_offset: int) -> str:
    """Relative path of a broker-written segment whose first byte has this physical offset."""
    return f"{COMMITLOG_DIR}/{base_offset:0{OFFSET_DIGITS}d}.arrow"


def parse_segment_file(name: str) -> int | None:
    m = _SEGMENT_RE.fullmatch(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def staged_segment_file(job_id: str, task_id: str) -> str:
    """Relative path of a segment written by a writer task, adopted at commit."""
    _check_token(job_id)
    _check_token(task_id)
    return f"{COMMITLOG_DIR}/w-{job_id}-{task_id}-{uuid.uuid4().hex}.arrow"


def staged_prefix(job_id: str) -> str:
    _check_token(job_id)
    return f"{COMMITLOG_DIR}/w-{job_id}-"


def consumequeue_file() -> str:
    return f"{CONSUMEQUEUE_DIR}/{uuid.uuid4().hex}.parquet"


def index_file() -> str:
    return f"{INDEX_DIR}/{uuid.uuid4().hex}.parquet"


def abort_file() -> str:
    return ABORT_FILE


HA_EPOCHS_FILE = "ha-epochs.json"


def ha_epochs_file() -> str:
    """The CommitLog's epoch history for replication (not part of the table)."""
    return HA_EPOCHS_FILE


_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.]{1,64}$")


def _check_token(token: str) -> None:
    if not _TOKEN_RE.fullmatch(token):
        raise ValueError(f"file name token must match {_TOKEN_RE.pattern}, got {token!r}")


def is_relative_store_path(path: str) -> bool:
    """True if ``path`` is a path this format could have produced (no escapes)."""
    if path.startswith("/") or "\\" in path or ".." in path.split("/"):
        return False
    return path.split("/", 1)[0] in (COMMITLOG_DIR, CONSUMEQUEUE_DIR, INDEX_DIR)
