"""Writing a DataFrame to a store: ``df.write`` and ``df.writeStream`` with ``format("sparkmq")``.

Input columns (anything else is refused, so a typo never drops data):

==================  ==============================  ===========================================
column              Spark type                      meaning
==================  ==============================  ===========================================
``body``            binary or string (required)     the message body (strings as UTF-8)
``topic``           string                          the topic of the row (or option ``topic``)
``tags``            string                          RocketMQ tags
``keys``            array<string> or string         message keys (indexed for lookup by key)
``properties``      map<string,string>              user properties
``queue_id``        byte/short/int/long             an explicit queue
``message_group``   string                          sharding key: queue = crc32(group) %
                                                    writeQueueNums, so equal groups keep order
``born_timestamp``  timestamp or long (ms)          when the producer made it (default: now)
==================  ==============================  ===========================================

Like Spark's Kafka sink, option ``topic`` overrides a ``topic`` column. A DataFrame
with Kafka's sink columns (``value``, ``key``, ``topic``, ``partition``, ``headers``)
is written as that sink would (``kafka.py``: ``kafka.to_sparkmq``). Rows
without ``queue_id`` or ``message_group`` are spread over the topic's write
queues round robin by contiguous block (each Arrow batch is cut into one block
per queue; the first queue rotates per batch, starting at the task's partition
id), so every queue's rows of a batch are one run that readers slice, zero copy.

Where things run and what pickles:

* the writer's constructor runs on the driver (in Spark's Python planner
  worker): it validates the schema, the options and the topics, and asks the
  committer whether a commit could succeed, so errors come before any task
  writes. The writer (plain options, topic configs, a job id) is pickled to
  executors and back to the driver's commit worker.
* ``write`` runs on executors: each task turns its Arrow record batches into
  CommitLog segment batches and writes staged segment files (rolled every
  ``maxSegmentBytes``), never touching the transaction log; it returns a
  :class:`SparkMQCommitMessage` with the paths.
* ``commit`` runs on the driver: ONE commit of all tasks' files through
  :func:`sparkmq.log.committer.committer_for` — all rows visible in one log
  version or none. ``abort`` deletes the job's uncommitted staged files.

Streaming (``df.writeStream.format("sparkmq")``) is exactly once: each
micro-batch commits with ``app_id`` = the query's writer id and
``app_version`` = the batch id; a batch replayed after a restart finds its id
in the log's ``txn`` actions and is skipped (its staged files are deleted).
Spark hands a Python sink no query id (only, as an option, the checkpoint
location), so the writer id is: option ``writerId`` if set (keep it with the checkpoint:
a new checkpoint needs a new ``writerId``), else the query id Spark stores in
``<checkpointLocation>/metadata`` (stable across restarts, new with a new
checkpoint), else the store URL plus the topic option (when Spark passes no
``checkpointLocation`` option). Two concurrent streaming queries into one
store must have different writer ids.

Options: ``topic``, ``writerId``, ``maxSegmentBytes`` (default 64 MiB),
``maxMessageSize`` (default 4 MiB), ``storageOptions`` (a JSON object of fsspec
storage options, as for reads) or ``storage.<name>`` options one by one,
``autoCreateTopic`` (default true) and ``queues`` (queues of a created topic,
default ``defaultTopicQueueNums``, 4). Any other option is refused, naming the
closest known one (their parsing: ``write_options.py``).

The first write to a URL with no store creates the store (with the ``topic``
option's topic in the same commit), as Delta creates a table on its first write;
a missing topic is created on first use (a Kafka broker's auto-create), whether
named by the option or by the ``topic`` column, unless ``autoCreateTopic=false``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import socket
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)
from pyspark.sql.types import (ArrayType, BinaryType, ByteType, IntegerType, LongType,
                               MapType, ShortType, StringType, StructType, TimestampNTZType,
                               TimestampType)

from ..config import DEFAULT_MAX_MESSAGE_SIZE_BYTES, StoreConfig
from ..errors import InvalidConfigError, InvalidMessageError, MessageLimitError, UserError
from ..log import format as fmt
from ..log.autocreate import create_store, ensure_topic
from . import kafka
from .options import bool_option
from .write_options import (_int_option, _limits, _refuse_memory_url, _storage_options,
                            check_write_options, lower_options)
from ..log.committer import abort_job, committer_for
from ..log.fs import StoreFS
from ..log.actions import TopicConfig
from ..log.batch import (QueueChooser, check_bodies, group_message_types, none_if_empty,
                         writable_topic_conf)
from ..log.limits import check_batch, check_valid_arrow, repeated_names
from ..log import segment as seg
from ..log.txlog import TransactionLog

log = logging.getLogger("sparkmq.datasource.writer")

DEFAULT_MAX_SEGMENT_BYTES = 64 << 20
DEFAULT_TOPIC_QUEUE_NUMS = StoreConfig.default_topic_queue_nums   # defaultTopicQueueNums
#: a staged file's bytes are handed to the disk (writeback started, not awaited) every
#: this many bytes, so the fsync that seals it finds little left to write
WRITEBACK_CHUNK_BYTES = 8 << 20

_INTS = (ByteType, ShortType, IntegerType, LongType)
#: column -> (accepted Spark types, what to tell the user)
INPUT_COLUMNS = {
    "body": ((BinaryType, StringType), "binary or string"),
    "topic": ((StringType,), "string"),
    "tags": ((StringType,), "string"),
    "keys": ((ArrayType, StringType), "array<string> or string"),
    "properties": ((MapType,), "map<string,string>"),
    "queue_id": (_INTS, "an integer type"),
    "message_group": ((StringType,), "string"),
    "born_timestamp": ((TimestampType, TimestampNTZType, LongType), "timestamp or long (ms)"),
}


@dataclass
class SparkMQCommitMessage(WriterCommitMessage):
    """What one task wrote: staged segment paths (relative to the store) and row count."""

    paths: list[str] = field(default_factory=list)
    num_rows: int = 0


def validate_schema(schema: StructType, *, topic_option: str | None) -> None:
    """Raise InvalidMessageError naming every wrong, missing, unknown or repeated column."""
    problems = []
    names = {f.name for f in schema.fields}
    for name, count in repeated_names([f.name for f in schema.fields]).items():
        problems.append(f"column {name!r} appears {count} times (select or rename "
                        "so that each column is named once)")
    for f in schema.fields:
        spec = INPUT_COLUMNS.get(f.name)
        if spec is None:
            problems.append(f"unknown column {f.name!r}")
            continue
        types, want = spec
        ok = isinstance(f.dataType, types)
        if isinstance(f.dataType, ArrayType):
            ok = ok and isinstance(f.dataType.elementType, StringType)
        if isinstance(f.dataType, MapType):
            ok = ok and isinstance(f.dataType.keyType, StringType) and \
                isinstance(f.dataType.valueType, StringType)
        if not ok:
            problems.append(f"column {f.name!r} has type {f.dataType.simpleString()}, "
                            f"expected {want}")
    if "body" not in names:
        problems.append("the required column 'body' (binary or string) is missing (or, "
                        "for Kafka's sink columns, 'value')")
    if "topic" not in names and not topic_option:
        problems.append("no 'topic' column and no topic option: say where rows go with "
                        ".option('topic', ...) or a 'topic' column")
    if problems:
        accepted = ", ".join(f"{k} ({v[1]})" for k, v in INPUT_COLUMNS.items())
        raise InvalidMessageError("cannot write this DataFrame to sparkmq: " +
                                  "; ".join(problems) + f". Accepted columns: {accepted}")


class _SegmentWriterBase:
    """Shared by the batch and the streaming writer (see the module docstring)."""

    job_id: str

    def __init__(self, options, schema: StructType, overwrite: bool):
        options = lower_options(options)
        check_write_options(options)
        self.url = options.get("path")
        if not self.url:
            raise InvalidConfigError("sparkmq needs the store URL: .save(url) / "
                                     ".option('path', url)")
        _refuse_memory_url(self.url)
        if overwrite:
            raise UserError("sparkmq stores are append-only: use mode('append'), not "
                            "'overwrite' (delete a topic to drop its messages)")
        self.storage_options = _storage_options(options)
        self.topic_option = options.get("topic") or None
        self.max_segment_bytes = _int_option(options, "maxSegmentBytes",
                                             DEFAULT_MAX_SEGMENT_BYTES)
        self.max_message_size = _int_option(options, "maxMessageSize",
                                            DEFAULT_MAX_MESSAGE_SIZE_BYTES)
        self.limits = _limits(options, self.max_message_size)
        self.kafka_columns = kafka.is_kafka_write(schema)     # Kafka's sink columns
        (kafka.validate_write if self.kafka_columns else validate_schema)(
            schema, topic_option=self.topic_option)
        self.columns = [f.name for f in schema.fields]
        self.auto_create = bool_option(options, "autoCreateTopic", True)
        self.new_topic_queues = _int_option(options, "queues", DEFAULT_TOPIC_QUEUE_NUMS)
        # the first write makes the store (with the option's topic: one commit)
        create_store(self.url, self.storage_options,
                     {self.topic_option: self.new_topic_queues}
                     if self.topic_option and self.auto_create else {})
        state = TransactionLog(StoreFS(self.url, self.storage_options)).snapshot()
        self.topics = dict(state.topics)     # (typed configs pickle to the tasks)
        if self.topic_option:
            self.topic_conf(self.topic_option)
        committer_for(self.url, self.storage_options).check()

    # -- executors ---------------------------------------------------------
    def topic_conf(self, name: str) -> TopicConfig:
        """The writable config of ``name``; a missing topic is created (with option
        ``queues`` queues) unless ``autoCreateTopic=false``."""
        if name not in self.topics and self.auto_create:
            self.topics[name] = ensure_topic(self.url, self.storage_options, name,
                                             self.new_topic_queues)
        return writable_topic_conf(self.topics, name, store=self.url,
                                   then="first, or leave autoCreateTopic on")

    def _write_task(self, iterator: Iterator[pa.RecordBatch]) -> SparkMQCommitMessage:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        task = f"{partition}_{ctx.attemptNumber() if ctx else 0}"
        sfs = StoreFS(self.url, self.storage_options)
        converter = _BatchConverter(self, partition)
        staged = _StagedFiles(sfs, self.job_id, task, self.max_segment_bytes)
        rows = 0
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                out = converter.convert(batch)
                staged.append(out)
                rows += out.num_rows
            paths = staged.finish()
        except BaseException:
            staged.discard()
            raise
        return SparkMQCommitMessage(paths=paths, num_rows=rows)

    # -- driver ------------------------------------------------------------
    def _commit(self, messages, *, app_id: str | None, app_version: int | None):
        paths = [p for m in messages if m is not None for p in m.paths]
        result = None
        if paths or app_id is not None:
            result = committer_for(self.url, self.storage_options).commit(
                paths, app_id=app_id, app_version=app_version)
        # files of failed task attempts, or of a skipped replay, are not committed
        abort_job(self.url, self.job_id, storage_options=self.storage_options)
        return result

    def _abort(self, messages) -> None:
        paths = [p for m in messages if m is not None for p in m.paths]
        abort_job(self.url, self.job_id, storage_options=self.storage_options, paths=paths)


class SparkMQBatchWriter(_SegmentWriterBase, DataSourceArrowWriter):
    """``df.write.format("sparkmq")``: one atomic commit for the whole job."""

    def __init__(self, options, schema: StructType, overwrite: bool):
        self.job_id = uuid.uuid4().hex[:16]
        super().__init__(options, schema, overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SparkMQCommitMessage:
        """Executor: stage this task's rows as segment files."""
        return self._write_task(iterator)

    def commit(self, messages) -> None:
        """Driver: all tasks' files in one log version."""
        res = self._commit(messages, app_id=None, app_version=None)
        if res is not None:
            log.info("sparkmq write to %s: %d messages committed as version %d",
                     self.url, res.num_messages, res.version)

    def abort(self, messages) -> None:
        """Driver: delete the job's staged files; nothing became visible."""
        self._abort(messages)


class SparkMQStreamWriter(_SegmentWriterBase, DataSourceStreamArrowWriter):
    """``df.writeStream.format("sparkmq")``: exactly once per micro-batch."""

    def __init__(self, options, schema: StructType, overwrite: bool):
        self.app_id = streaming_writer_id(options)
        self.job_id = "s" + hashlib.sha1(self.app_id.encode()).hexdigest()[:20]
        super().__init__(options, schema, overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SparkMQCommitMessage:
        """Executor: stage this task's rows of the micro-batch."""
        return self._write_task(iterator)

    def commit(self, messages, batchId: int) -> None:
        """Driver: commit the micro-batch as (writer id, batch id); a replay is skipped."""
        res = self._commit(messages, app_id=self.app_id, app_version=int(batchId))
        if res is not None and res.skipped:
            log.warning("sparkmq stream %s: batch %d was already committed; replay skipped",
                        self.app_id, batchId)

    def abort(self, messages, batchId: int) -> None:
        """Driver: delete the micro-batch's staged files."""
        self._abort(messages)


class _StagedFiles:
    """One task's staged segment files: batches are appended as they come (no
    buffering of the task's data), a file is sealed (end-of-stream marker,
    fsync, close) when it reaches ``max_bytes`` and at the end.

    Sealing a full file runs on one background thread, so the task keeps
    converting and writing the next file while the disk syncs; at most one seal
    is in flight (the next one waits for it), and ``finish`` returns only when
    every file is sealed (a failed seal raises there). Every
    ``WRITEBACK_CHUNK_BYTES`` the same thread starts the disk writing the active
    file's new bytes (not waited for, no durability meaning), so the seal's
    fsync finds little left to write. Executor-side; not thread-safe.
    """

    def __init__(self, sfs: StoreFS, job_id: str, task: str, max_bytes: int):
        self.sfs, self.job_id, self.task, self.max_bytes = sfs, job_id, task, max_bytes
        self.paths: list[str] = []
        self.active: seg.SegmentWriter | None = None
        self._sealer: ThreadPoolExecutor | None = None
        self._sealing: Future | None = None
        self._writeback_from = 0

    def append(self, batch: pa.RecordBatch) -> None:
        if self.active is None:
            rel = fmt.staged_segment_file(self.job_id, self.task)
            self.paths.append(rel)
            self.active = seg.SegmentWriter(self.sfs, rel, 0, create=True)
            self._writeback_from = self.active.size
        self.active.append(seg.serialize_batch(batch))
        if self.active.size >= self.max_bytes:
            full, self.active = self.active, None
            self._wait_sealed()
            self._sealing = self._background().submit(_seal, full)
        elif self.active.size - self._writeback_from >= WRITEBACK_CHUNK_BYTES:
            # on the sealer thread, before any later seal (one thread, in order), so the
            # task never blocks on the disk queue; the file stays open until its seal
            self._background().submit(self.active.start_writeback_range,
                                      self._writeback_from, self.active.size)
            self._writeback_from = self.active.size

    def _background(self) -> ThreadPoolExecutor:
        if self._sealer is None:
            self._sealer = ThreadPoolExecutor(1, thread_name_prefix="sparkmq-seal")
        return self._sealer

    def _wait_sealed(self) -> None:
        sealing, self._sealing = self._sealing, None
        if sealing is not None:
            sealing.result()      # re-raises a failed seal

    def _stop_sealer(self) -> None:
        if self._sealer is not None:
            self._sealer.shutdown(wait=True)
            self._sealer = None

    def finish(self) -> list[str]:
        try:
            if self.active is not None:
                last, self.active = self.active, None
                if self._sealer is None:
                    _seal(last)
                else:   # after the writeback hints queued for it (they need it open)
                    self._wait_sealed()
                    self._sealing = self._sealer.submit(_seal, last)
            self._wait_sealed()
        finally:
            self._stop_sealer()
        return list(self.paths)

    def discard(self) -> None:
        try:
            self._wait_sealed()
        except Exception:   # the files are deleted next anyway
            pass
        self._stop_sealer()   # no writeback hint still queued for the active file
        if self.active is not None:
            self.active.close()
            self.active = None
        self.sfs.delete_many(self.paths)


def _seal(writer: seg.SegmentWriter) -> None:
    try:
        writer.append(seg.EOS)
        writer.flush(sync=True)
    finally:
        writer.close()


def streaming_writer_id(options) -> str:
    """The stable id under which a streaming query's batches are recorded (``txn`` appId).

    In order: option ``writerId``; the query id Spark keeps in
    ``<checkpointLocation>/metadata`` (stable across restarts from that
    checkpoint, new for a new checkpoint); the checkpoint path; the store URL
    plus topic (only when Spark passes no checkpointLocation option).
    """
    options = lower_options(options)
    explicit = options.get("writerid")
    if explicit:
        return f"spark-stream:{explicit}"
    checkpoint = options.get("checkpointlocation")
    if checkpoint:
        query_id = _checkpoint_query_id(checkpoint)
        if query_id:
            return f"spark-query:{query_id}"
        return f"spark-stream:checkpoint:{checkpoint}"
    return f"spark-stream:{options.get('path')}:{options.get('topic') or '*'}"


def _checkpoint_query_id(checkpoint: str) -> str | None:
    """The query id in Spark's ``<checkpoint>/metadata`` file, or None if it is absent."""
    import fsspec
    try:
        fs, root = fsspec.core.url_to_fs(checkpoint)
        with fs.open(root.rstrip("/") + "/metadata", "rb") as f:
            first = f.read(4096).decode().splitlines()[0]
        return str(json.loads(first)["id"])
    except (FileNotFoundError, ImportError, ValueError):
        return None
    except (OSError, KeyError, IndexError) as exc:
        raise InvalidConfigError(
            f"cannot read the streaming query id from {checkpoint}/metadata ({exc}); set "
            ".option('writerId', ...) to a name that stays with this checkpoint") from None


class _BatchConverter:
    """Turns Spark's Arrow batches into SEGMENT_SCHEMA batches (runs on executors)."""

    def __init__(self, writer: _SegmentWriterBase, partition: int):
        self.w = writer
        self.partition = partition
        self.rows = 0                 # this task's rows converted so far
        self.queues = QueueChooser(start=partition, by_block=True)
        self.host = socket.gethostname()
        self.host_scalar = pa.scalar(self.host, pa.string())

    def convert(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        shard = None                  # Kafka's key: the queue of a row with no partition
        if self.w.kafka_columns:
            batch, shard = kafka.to_sparkmq(batch)
        names = batch.schema.names
        col = {name: batch.column(i) for i, name in enumerate(names)}
        now_ms = int(time.time() * 1000)
        topics = self._topics(col, n)
        body = self._body(col["body"])
        group = none_if_empty(_cast(col, "message_group", pa.string(), n))  # '': none
        qids = self._queues(topics, col.get("queue_id"),
                            group if "message_group" in col else shard, n)
        out = {
            "topic": topics, "queue_id": qids, "body": body,
            "tags": none_if_empty(_cast(col, "tags", pa.string(), n)),
            "keys": self._keys(col.get("keys"), n),
            "properties": _cast(col, "properties", pa.map_(pa.string(), pa.string()), n),
            "born_timestamp": _born(col.get("born_timestamp"), n, now_ms),
            "store_timestamp": pa.array(np.full(n, now_ms, np.int64)).cast(fmt.TS),
            "born_host": pa.repeat(self.host_scalar, n),
            "store_host": pa.nulls(n, pa.string()),
            "reconsume_times": pa.array(np.zeros(n, np.int32)),
            "delivery_timestamp": pa.nulls(n, fmt.TS),
            "message_group": group,
            "transaction_id": pa.nulls(n, pa.string()),
            "message_type": group_message_types(group),
            "unique_key": pa.nulls(n, pa.string()),
        }
        segment_batch = pa.RecordBatch.from_arrays([out[f.name] for f in fmt.SEGMENT_FIELDS],
                                                   schema=fmt.SEGMENT_SCHEMA)
        # a Spark string is bytes (a binary cast to string is never checked): held to UTF-8
        check_valid_arrow(segment_batch, "a row batch of this write")
        try:
            check_batch(segment_batch, self.w.limits,      # as Store.append_batch does
                        first_row=self.rows)
        except MessageLimitError as e:    # the row as a Spark user finds it: partition, row
            raise MessageLimitError(e.status, f"Spark partition {self.partition}, {e.message}"
                                    ) from None
        self.rows += segment_batch.num_rows
        return segment_batch

    def _topics(self, col: dict, n: int) -> pa.Array:
        if self.w.topic_option:
            return pa.repeat(pa.scalar(self.w.topic_option, pa.string()), n)
        topics = col["topic"].cast(pa.string())
        if topics.null_count:
            raise InvalidMessageError("a row has a null topic and no topic option is set; "
                                      "fill the topic column or set .option('topic', ...)")
        for t in pc.unique(topics).to_pylist():
            self.w.topic_conf(t)
        return topics

    def _body(self, body: pa.Array) -> pa.Array:
        if not pa.types.is_binary(body.type):
            body = body.cast(pa.binary())
        check_bodies(body, self.w.max_message_size,
                     hint="; raise the option maxMessageSize or split the message")
        return body

    def _queues(self, topics: pa.Array, queue_id, group, n: int) -> pa.Array:
        """Explicit queue_id, else crc32(message_group) % queues, else round robin by
        block (the store's one chooser, :class:`sparkmq.log.batch.QueueChooser`)."""
        if queue_id is None and group is None and self.w.topic_option:
            # one topic, every row round robin: no per-row topic lookup
            name = self.w.topic_option
            nq = self.w.topic_conf(name).write_queue_nums
            return pa.array(self.queues.round_robin(name, n, nq).astype(np.int32))
        enc_t = pc.dictionary_encode(topics)
        tnames = enc_t.dictionary.to_pylist()
        idx = enc_t.indices.to_numpy() if len(tnames) > 1 else None
        if group is not None:
            group = group.cast(pa.string())
        return pa.array(self.queues.choose(
            queue_id, tnames, idx, [self.w.topic_conf(t).write_queue_nums for t in tnames],
            n, group))

    def _keys(self, keys, n: int) -> pa.Array:
        if keys is None:
            return pa.nulls(n, pa.list_(pa.string()))
        if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
            s = keys.cast(pa.string())
            offsets = np.arange(n + 1, dtype=np.int32)
            arr = pa.ListArray.from_arrays(pa.array(offsets), s)
            return pc.if_else(pc.is_valid(s), arr, pa.nulls(n, arr.type))
        return keys.cast(pa.list_(pa.string()))


def _cast(col: dict, name: str, typ: pa.DataType, n: int) -> pa.Array:
    arr = col.get(name)
    if arr is None:
        return pa.nulls(n, typ)
    return arr.cast(typ)


def _born(arr, n: int, now_ms: int) -> pa.Array:
    if arr is None:
        return pa.array(np.full(n, now_ms, np.int64)).cast(fmt.TS)
    if pa.types.is_timestamp(arr.type):
        ms = pc.cast(arr, pa.timestamp("ms", tz=arr.type.tz), safe=False).cast(pa.int64())
    else:
        ms = arr.cast(pa.int64())
    return ms.fill_null(now_ms).cast(fmt.TS)
