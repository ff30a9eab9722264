"""The store: CommitLog, ConsumeQueue, Index and transaction log joined.

``Store.open(url, mode="w")`` takes the store's writer lease (an action in the
log, with an epoch), recovers, and then appends. ``mode="r"`` reads the newest
committed version and never writes.

Lifecycle of an append (RocketMQ's putMessage -> reput -> flush):

1. the messages become one Arrow record batch, appended to the active segment
   under the append lock (its physical offset is its place in the CommitLog);
2. the dispatcher assigns queue offsets per (topic, queue) and adds entries to
   the in-memory ConsumeQueue and Index;
3. SYNC_FLUSH waits for the group-commit fsync (``FLUSH_DISK_TIMEOUT`` after
   ``sync_flush_timeout_ms``); ASYNC_FLUSH returns and the flush service
   fsyncs every ``flush_interval_ms``;
4. the publish service commits progress every ``publish_interval_ms``: new
   side-table files, segment sizes and the lease renewal, in one version.

Visibility: in this process a message is readable once flushed (SYNC_FLUSH)
or written (ASYNC_FLUSH); to other processes and Spark once published.

Crash recovery (``abort`` marker present at open): the unpublished tail of the
CommitLog is scanned from the last published size, cut at the last whole
batch, and re-dispatched; then published. The recovered last segment is then
sealed and appends go to a new one: the previous writer may only be paused
(its lease expired), and its late bytes must land where no one reads them.

Fencing: a writer whose lease was taken over learns it at its next commit
(publish, at most ``publish_interval_ms`` later) and refuses every write after
with FencedError. Thread-safety: every public method is safe to call from
several threads.
"""
from __future__ import annotations

import datetime as _dt
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..config import SYNC_FLUSH, StoreConfig
from ..errors import (FencedError, GroupNotFoundError, InvalidMessageError, PermissionDeniedError,
                      QueueNotFoundError, ReadOnlyStoreError, StoreClosedError,
                      StoreLockedError, StoreNotFoundError, TopicExistsError,
                      TopicNotFoundError, UserError, InvalidConfigError)
from . import format as fmt
from . import segment as seg
from .commitlog import CommitLog, SegmentRef
from .consumequeue import (chunks_to_side_table, consumequeue_add,
                           read_side_by_time, read_side_entries,
                           write_side_table, compact_side_tables)
from .fs import StoreFS
from .dispatch import Dispatcher
from .index import index_add, read_index
from .lease import WriterLease, register_live, unregister_live
from .batch import (MAX_BATCH_BODY_BYTES, PERM_READ, PERM_RW, PERM_WRITE,  # noqa: F401
                    BatchBuilder, split_by_size, stamp_store_time)
from .message import Message, now_ms, store_tag
from .names import validate_group, validate_topic
from .reader import MessageReader, Snapshot
from .services import CallbackService, GroupCommitService
from .status import PutMessageStatus
from .txlog import LogState, TransactionLog, check_writer_version

log = logging.getLogger("sparkmq.store")




@dataclass
class AppendResult:
    """The outcome of appending one message."""

    status: PutMessageStatus
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


@dataclass
class BatchAppendResult:
    """The outcome of a columnar append: per-row offsets as arrays."""

    status: PutMessageStatus
    batch_offset: int
    queue_offsets: np.ndarray
    queue_ids: np.ndarray
    num_rows: int


@dataclass
class CommitResult:
    """The outcome of adopting staged segment files."""

    version: int
    num_messages: int
    skipped: bool = False    # the (app id, version) was already committed


class Store(MessageReader):
    """One store; see the module docstring for the contract."""

    def __init__(self, sfs: StoreFS, config: StoreConfig, *, writable: bool,
                 clock_ms: Callable[[], int] | None = None):
        self.sfs = sfs
        self.url = sfs.url
        self.config = config
        self.writable = writable
        self.clock_ms = clock_ms or now_ms
        self.txlog = TransactionLog(sfs, checkpoint_interval_versions=config.checkpoint_interval_versions,
                                    clock_ms=self.clock_ms,
                                    deleted_file_retention_ms=config.deleted_file_retention_ms,
                                    log_retention_ms=config.log_retention_ms)
        self.state: LogState = LogState()
        self.commitlog = CommitLog(sfs, segment_size_bytes=config.segment_size_bytes)
        self.dispatcher = Dispatcher(lambda: self.state.topics,
                                     config.memory_consume_queue_entries)
        self._append_lock = threading.RLock()
        self._commit_lock = threading.RLock()
        self.batches = BatchBuilder(self._writable_topic,
                                    max_message_size_bytes=config.max_message_size_bytes,
                                    store_host=config.store_host, clock_ms=self.clock_ms)
        self._last_store_ts = 0
        self._services: list = []
        self._group_commit: GroupCommitService | None = None
        # removed files this writer already deleted (while their tombstones last)
        self._deleted_files: set[tuple[str, int]] = set()
        self._closed = False
        self.lease = WriterLease(self.url, self.clock_ms, config.lease_timeout_ms)
        self.recovered_from_crash = False
        self.replica = False       # a replica's copy (sparkmq.ha): see open()

    @property
    def owner(self) -> str:
        """This writer's lease owner (``host:pid:token``)."""
        return self.lease.owner

    @property
    def token(self) -> str:
        return self.lease.token

    @property
    def epoch(self) -> int:
        """The epoch of this writer's lease (0 before it is taken)."""
        return self.lease.epoch

    @property
    def lease_endpoint(self) -> str | None:
        return self.lease.endpoint

    @property
    def append_lock(self) -> threading.RLock:
        """Serializes appends to the CommitLog (and their dispatch)."""
        return self._append_lock

    @property
    def commit_lock(self) -> threading.RLock:
        """Serializes this writer's transaction-log commits."""
        return self._commit_lock

    def commit_actions(self, build: Callable[[LogState], list | None], operation: str,
                       parameters: dict | None = None) -> LogState:
        """Commit the actions ``build(state)`` returns as this (fenced) writer, in one
        log version; returns the new state (replication's REPLICATE META, TRUNCATE)."""
        return self._commit(build, operation, parameters)

    def request_flush(self, offset: int) -> None:
        """SYNC_FLUSH: ask the group-commit service to fsync up to ``offset``, without
        waiting (ASYNC_FLUSH: nothing, the flush service runs on its interval)."""
        gc = self._group_commit
        if gc is not None:
            gc.wait_for(offset, 0)

    @property
    def cq(self):
        """The in-memory ConsumeQueue (owned by the dispatcher)."""
        return self.dispatcher.cq

    @property
    def index(self):
        """The in-memory Index (owned by the dispatcher)."""
        return self.dispatcher.index

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, url: str, *, mode: str = "w", create: bool = True,
             clock_ms: Callable[[], int] | None = None, storage_options: dict | None = None,
             start_services: bool = True, replica: bool = False, **config) -> "Store":
        """Open (and with ``create`` make) the store at ``url``.

        ``config`` takes RocketMQ property names (``flushDiskType="SYNC_FLUSH"``,
        ``mappedFileSizeCommitLog=...``) or StoreConfig attribute names.
        ``replica``: the store is a replica's copy of a master's CommitLog
        (``sparkmq.ha``): after a crash its tail segment is not sealed, so the
        copy stays byte-identical and the replica goes on appending the
        master's bytes to it.
        """
        if mode not in ("r", "w"):
            raise InvalidConfigError(f"mode must be 'r' or 'w', got {mode!r}")
        sfs = StoreFS(url, storage_options)
        conf = StoreConfig.from_options(config)
        store = cls(sfs, conf, writable=(mode == "w"), clock_ms=clock_ms)
        store.replica = replica
        txlog = store.txlog
        if not txlog.exists():
            if not create or mode == "r":
                raise StoreNotFoundError(
                    f"no store at {url!r}; open it with mode='w', create=True to make one")
            store._create()
        store.state = txlog.snapshot()
        if mode == "r":
            store._load_readonly()
        if mode == "w":
            check_writer_version(store.state, url)   # before anything is written
            try:
                store._acquire_lease()
                store._recover()
            except BaseException:
                store.commitlog.close()
                raise
            if start_services:
                store._start_services()
            register_live(store.token, store)
        return store

    def _create(self) -> None:
        meta = {"storeId": uuid.uuid4().hex, "createdTime": self.clock_ms(),
                "formatVersion": fmt.FORMAT_VERSION,
                "configuration": {"brokerName": self.config.broker_name}}
        try:
            self.txlog.create([
                {"protocol": {"minReaderVersion": fmt.MIN_READER_VERSION,
                              "minWriterVersion": fmt.MIN_WRITER_VERSION}},
                {"metaData": meta}])
        except Exception:
            if not self.txlog.exists():
                raise

    # ------------------------------------------------------------------ lease
    def _acquire_lease(self) -> None:
        crashed = False

        def build(state: LogState):
            nonlocal crashed
            actions, crashed = self.lease.acquire(state)
            return actions
        self.state = self.txlog.commit(build, operation="ACQUIRE LEASE", state=self.state,
                                       retries=self.config.commit_retries)
        self.recovered_from_crash = crashed
        log.info("store %s: writer lease taken, epoch %d", self.url, self.epoch)

    def raise_epoch(self, above: int) -> int:
        """Re-take this store's writer lease with an epoch greater than ``above``
        and than its own (promotion of a replica, ``sparkmq.ha``). Returns it."""
        self._require_writable()
        with self._commit_lock:
            new_epoch = max(self.epoch, int(above)) + 1

            def build(state: LogState):
                self.lease.check(state)
                return self.lease.promotion(state, new_epoch)
            self.state = self.txlog.commit(build, operation="PROMOTE",
                                           parameters={"epoch": new_epoch}, state=self.state,
                                           retries=self.config.commit_retries)
            self.lease.epoch = new_epoch
        log.warning("store %s: writer lease re-taken with epoch %d", self.url, new_epoch)
        return new_epoch

    def fence(self, reason: str) -> None:
        """Refuse every write from now on (a newer master exists elsewhere, ``sparkmq.ha``)."""
        log.error("store %s: fenced: %s", self.url, reason)
        self.lease.fence()

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        sfs = self.sfs
        crashed = sfs.exists(fmt.abort_file()) or self.recovered_from_crash
        self.recovered_from_crash = crashed
        if crashed:
            log.warning("store %s: abort marker found, recovering from a crash", self.url)
        refs = [SegmentRef(a["path"], int(a["baseOffset"]), int(a["size"]), bool(a.get("sealed")))
                for a in self.state.segments.values()]
        self.commitlog.load(refs)
        self.dispatcher.reset_offsets(self.state)
        refs.sort(key=lambda r: r.base_offset)
        # segment files written after the last publish (rolled), named by base offset
        known = {r.path for r in refs}
        end = self.state.address_end()
        extra = []
        for name in sfs.list_names(fmt.COMMITLOG_DIR):
            base = fmt.parse_segment_file(name)
            rel = f"{fmt.COMMITLOG_DIR}/{name}"
            if base is not None and rel not in known and base >= end:
                extra.append((base, rel))
            elif base is not None and rel not in known and base < self.state.min_physical_offset() \
                    and rel not in self.state.tombstones:
                # removed by retention so long ago that checkpoints dropped the tombstone,
                # and no writer deleted the file (files with a tombstone wait for its delay)
                log.info("deleting segment file %s: below the retention floor", rel)
                sfs.delete(rel)
        extra.sort()
        tail: list[SegmentRef] = []
        if refs and not refs[-1].sealed:
            tail.append(refs[-1])
        for base, rel in extra:
            if tail and base != tail[-1].base_offset + sfs.size(tail[-1].path):
                log.warning("ignoring segment file %s: not contiguous with the CommitLog", rel)
                continue
            ref = SegmentRef(rel, base, seg.HEADER_SIZE, False)
            self.commitlog.add_segment(ref)
            tail.append(ref)
        redispatched = 0
        for i, ref in enumerate(tail):
            buf = sfs.read_buffer(ref.path)
            start = max(seg.HEADER_SIZE, ref.size)
            result = seg.scan(buf, start, validate=crashed)
            if result.valid_end == 0:
                log.warning("segment %s has no valid header; truncating it to empty", ref.path)
                sfs.truncate(ref.path, 0)
                sfs.write(ref.path, seg.SCHEMA_BYTES)
                valid_end = seg.HEADER_SIZE
            else:
                valid_end = result.valid_end + (8 if result.sealed else 0)
            if len(buf) > valid_end:
                log.warning("segment %s: cutting torn tail at byte %d (file had %d bytes)",
                            ref.path, valid_end, len(buf))
                del buf
                sfs.truncate(ref.path, valid_end)
                buf = sfs.read_buffer(ref.path)
            for pos in result.positions:
                batch = seg.read_batch_at(buf, pos)
                self.dispatcher.dispatch(batch, ref.base_offset + pos)
                redispatched += batch.num_rows
            ref.size = valid_end
            ref.sealed = result.sealed
            self.commitlog.load(self.commitlog.segments())
        # continue appending to the last unsealed segment, if it is the newest
        segs = self.commitlog.segments()
        if segs and not segs[-1].sealed and fmt.parse_segment_file(segs[-1].path) is not None:
            if crashed and not self.replica:
                self._seal_foreign_tail(segs[-1])
            else:
                self.commitlog.open_active(segs[-1])
        for s in segs[:-1]:
            s.sealed = True  # frozen: something was placed after it
        self.commitlog.flushed_offset = self.commitlog.written_offset
        self.dispatcher.dispatched_offset = self.commitlog.written_offset
        self.dispatcher.show_all()
        if redispatched:
            log.info("store %s: re-dispatched %d messages from the CommitLog tail",
                     self.url, redispatched)
        sfs.write(fmt.abort_file(), self.owner.encode())
        self.publish(force=True)
        self.delete_removed_files()   # left by a previous writer that stopped too early

    def _seal_foreign_tail(self, ref: SegmentRef) -> None:
        """After an unclean stop the previous writer may still be alive (its lease
        expired while it was paused): never append to its file. Seal it with an
        end-of-stream marker, so bytes it writes late land past the sealed end and
        are never read; the next append rolls to a new segment."""
        w = seg.SegmentWriter(self.sfs, ref.path, ref.base_offset, create=False)
        try:
            w.append(seg.EOS)
            w.flush(sync=True)
            size = w.size
        finally:
            w.close()
        ref.size = size
        ref.sealed = True
        self.commitlog.load(self.commitlog.segments())

    # ------------------------------------------------------------------ services
    def _start_services(self) -> None:
        c = self.config
        if c.flush_disk_type == SYNC_FLUSH:
            self._group_commit = GroupCommitService(lambda: self.commitlog.flush(sync=True))
            self._group_commit.start()
        else:
            flush = CallbackService("flush", c.flush_interval_ms,
                                    lambda: self.commitlog.flush(sync=True))
            flush.start()
            self._services.append(flush)
        pub = CallbackService("publish", c.publish_interval_ms, self.publish)
        pub.start()
        self._services.append(pub)
        self._publisher = pub
        ret = CallbackService("retention", c.retention_check_interval_ms, self.run_retention)
        ret.start()
        self._services.append(ret)

    def _stop_services(self) -> None:
        for s in self._services:
            s.stop()
        self._services.clear()
        if self._group_commit is not None:
            self._group_commit.stop()
            self._group_commit = None

    # ------------------------------------------------------------------ topics
    def _require_writable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.url} is closed")
        if not self.writable:
            raise ReadOnlyStoreError(f"store {self.url} was opened with mode='r'")
        if self.lease.fenced:
            raise FencedError(f"store {self.url}: a newer writer took the lease from this one "
                              f"(epoch {self.epoch}); open the store again to write")

    def _require_not_replica(self) -> None:
        if self.replica:
            raise ReadOnlyStoreError(f"store {self.url} is a replica's copy: its messages and "
                                     "topics come from its master; write to the master")

    def _commit(self, build: Callable[[LogState], list | None], operation: str,
                parameters: dict | None = None) -> LogState:
        with self._commit_lock:
            def fenced_build(state):
                self.lease.check(state)
                return build(state)
            self.state = self.txlog.commit(fenced_build, operation=operation,
                                           parameters=parameters, state=self.state,
                                           retries=self.config.commit_retries)
            return self.state

    def create_topic(self, name: str, *, read_queue_nums: int | None = None,
                     write_queue_nums: int | None = None, perm: int = PERM_RW,
                     attributes: dict | None = None, system: bool = False,
                     exist_ok: bool = False, retention_ms: int | None = None,
                     retention_bytes: int | None = None) -> dict:
        """Create a topic (committed at once). Returns its config.

        ``retention_ms`` / ``retention_bytes`` (per queue, message bodies) give the
        topic its own retention on top of the broker default (log/retention.py)."""
        self._require_writable()
        self._require_not_replica()
        validate_topic(name, system=system)
        n = self.config.default_topic_queue_nums
        rq = n if read_queue_nums is None else read_queue_nums
        wq = n if write_queue_nums is None else write_queue_nums
        _check_queue_nums(rq, wq, perm)
        retention = _retention_fields({}, retention_ms, retention_bytes)
        created: dict = {}

        def build(state: LogState):
            if name in state.topics:
                if exist_ok:
                    created.update(state.topics[name])
                    return None
                raise TopicExistsError(f"topic {name!r} already exists")
            t = {"name": name, "id": state.next_topic_id(), "readQueueNums": rq,
                 "writeQueueNums": wq, "perm": perm, "createdTime": self.clock_ms(),
                 "attributes": dict(attributes or {}), "deleted": False, **retention}
            created.clear()
            created.update(t)
            return [{"topic": t}]
        self._commit(build, "CREATE TOPIC", {"topic": name})
        return dict(created)

    def update_topic(self, name: str, *, read_queue_nums: int | None = None,
                     write_queue_nums: int | None = None, perm: int | None = None,
                     attributes: dict | None = None, retention_ms: int | None = None,
                     retention_bytes: int | None = None) -> dict:
        """Change a topic's queue counts, permission, attributes or retention
        (``retention_ms`` / ``retention_bytes``: None keeps, 0 goes back to the
        broker default)."""
        self._require_writable()
        self._require_not_replica()
        _retention_fields({}, retention_ms, retention_bytes)   # validates before the commit
        updated: dict = {}

        def build(state: LogState):
            t = state.topics.get(name)
            if t is None:
                raise TopicNotFoundError(f"topic {name!r} does not exist")
            t = dict(t)
            if read_queue_nums is not None:
                t["readQueueNums"] = read_queue_nums
            if write_queue_nums is not None:
                t["writeQueueNums"] = write_queue_nums
            if perm is not None:
                t["perm"] = perm
            if attributes is not None:
                t["attributes"] = dict(attributes)
            t = _retention_fields(t, retention_ms, retention_bytes)
            _check_queue_nums(t["readQueueNums"], t["writeQueueNums"], t["perm"])
            updated.clear()
            updated.update(t)
            return [{"topic": t}]
        self._commit(build, "UPDATE TOPIC", {"topic": name})
        return dict(updated)

    def delete_topic(self, name: str) -> None:
        """Delete a topic: its messages stay in segments until retention, unreadable."""
        self._require_writable()
        self.publish(force=True)   # persist its entries under the old id first
        tid = None

        def build(state: LogState):
            nonlocal tid
            t = state.topics.get(name)
            if t is None:
                raise TopicNotFoundError(f"topic {name!r} does not exist")
            tid = t["id"]
            return [{"topic": {**t, "deleted": True}}]
        self._commit(build, "DELETE TOPIC", {"topic": name})
        with self._append_lock:
            self.dispatcher.drop_topic(tid)

    def topics(self) -> dict[str, dict]:
        return dict(self.state.topics)

    @property
    def store_id(self) -> str:
        return self.state.store_id

    @property
    def version(self) -> int:
        return self.state.version

    def topic_names(self) -> list[str]:
        return sorted(self.state.topics)

    def _topic_conf(self, topic: str) -> dict:
        conf = self.state.topics.get(topic)
        if conf is None:
            raise TopicNotFoundError(
                f"topic {topic!r} does not exist in {self.url}; create it with "
                f"create_topic({topic!r}) (topics: {sorted(self.state.topics) or 'none'})")
        return conf

    def _topic_id(self, topic: str) -> int:
        return self._topic_conf(topic)["id"]

    # ------------------------------------------------------------------ append
    def append(self, messages: Iterable[Message] | Message) -> list[AppendResult]:
        """Append messages; one result per message, in order.

        All messages of one call are one record batch (split only past 256 MiB
        of bodies). Returns when the batch is written (ASYNC_FLUSH) or fsynced
        (SYNC_FLUSH; status FLUSH_DISK_TIMEOUT if the fsync took longer than
        ``sync_flush_timeout_ms`` — the messages are still stored).
        """
        self._require_writable()
        if isinstance(messages, Message):
            messages = [messages]
        msgs = list(messages)
        if not msgs:
            return []
        for m in msgs:
            if not isinstance(m, Message):
                raise InvalidMessageError(
                    f"append takes sparkmq.Message objects, got {type(m).__name__}")
        results: list[AppendResult] = []
        for group in split_by_size(msgs):
            results.extend(self._append_group(group))
        return results

    def _append_group(self, msgs: list[Message]) -> list[AppendResult]:
        qids = self.batches.queue_ids_for(msgs)
        with self._append_lock:
            batch = self.batches.from_messages(msgs, qids, self._store_ts())
            batch_offset, qos, updates = self._append_locked(batch)
        status = self._await_flush(batch_offset)
        self.dispatcher.after_visible(updates)
        # message id = encode_message_id(tag, batch_offset, row): the prefix is shared
        prefix = f"{store_tag(self.state.store_id):08X}{batch_offset:016X}"
        return [AppendResult(status, f"{prefix}{i:08X}", m.topic, q, qo, batch_offset + i)
                for i, (m, q, qo) in enumerate(zip(msgs, qids, qos.tolist()))]

    def append_batch(self, data: pa.RecordBatch | pa.Table) -> BatchAppendResult:
        """Columnar append: rows with at least ``topic`` and ``body`` (other
        segment columns optional; a row's ``queue_id`` is kept, range-checked,
        and where the column is missing or null it is ``crc32(message_group) %
        queues`` for a row with a message group, else chosen round robin).
        Everything is one record batch; per-row offsets come back as arrays. The fast path for bulk producers and benchmarks: a
        ``RecordBatch`` whose schema already equals ``SEGMENT_SCHEMA`` (field
        metadata aside) is validated without casting or copying any column."""
        self._require_writable()
        info = None
        if isinstance(data, pa.RecordBatch) and data.schema.equals(fmt.SEGMENT_SCHEMA):
            batch, info = self.batches.check_segment_batch(data)
        else:
            table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
            batch = self.batches.normalize(table)
        n = batch.num_rows
        with self._append_lock:
            batch, ts_ms = stamp_store_time(batch, self._store_ts())
            batch_offset, qos, updates = self._append_locked(batch, info, ts_ms)
        status = self._await_flush(batch_offset)
        self.dispatcher.after_visible(updates)
        qids = info.queue_ids if info is not None else batch.column("queue_id").to_numpy()
        return BatchAppendResult(status, batch_offset, qos, qids, n)

    def _writable_topic(self, topic: str) -> dict:
        conf = self.state.topics.get(topic)
        if conf is None:
            if not isinstance(topic, str):
                raise InvalidMessageError(f"topic must be a string, got {type(topic).__name__}")
            if self.config.auto_create_topic:
                conf = self.create_topic(topic, exist_ok=True)
            else:
                raise TopicNotFoundError(
                    f"topic {topic!r} does not exist; create it first (autoCreateTopicEnable "
                    "is off)")
        if not conf["perm"] & PERM_WRITE:
            raise PermissionDeniedError(f"topic {topic!r} is not writable (perm {conf['perm']})")
        return conf

    def _store_ts(self) -> int:
        ts = max(self.clock_ms(), self._last_store_ts)
        self._last_store_ts = ts
        return ts

    def _append_locked(self, batch: pa.RecordBatch, info: "RowInfo | None" = None,
                       store_ts_ms: np.ndarray | None = None) -> tuple[int, np.ndarray, list]:
        if self._closed:
            raise StoreClosedError(f"store {self.url} is closed")
        self._require_not_replica()
        rolls = self.commitlog.segments_created
        batch_offset = self.commitlog.append(batch)
        qos, updates = self.dispatcher.dispatch(batch, batch_offset, info, store_ts_ms)
        self.dispatcher.dispatched_offset = self.commitlog.written_offset
        if rolls != self.commitlog.segments_created:
            publisher = getattr(self, "_publisher", None)
            if publisher is not None:
                publisher.wakeup()   # publish at segment roll, not only on the interval
        return batch_offset, qos, updates

    def _await_flush(self, batch_offset: int) -> PutMessageStatus:
        gc = self._group_commit
        if gc is None:
            if self.config.flush_disk_type == SYNC_FLUSH:   # services not started
                self.commitlog.flush(sync=True)
            return PutMessageStatus.PUT_OK
        ok = gc.wait_for(self.commitlog.written_offset, self.config.sync_flush_timeout_ms)
        return PutMessageStatus.PUT_OK if ok else PutMessageStatus.FLUSH_DISK_TIMEOUT

    def add_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """Call ``fn(topic, queue_id, max_offset)`` when messages become readable
        (long polling wakes on this). ``fn`` must be quick and not block."""
        self.dispatcher.add_listener(fn)

    def remove_listener(self, fn) -> None:
        self.dispatcher.remove_listener(fn)

    # ------------------------------------------------------------------ reading
    def _visible_offset(self) -> int:
        if self.writable and self.config.flush_disk_type == SYNC_FLUSH:
            return self.commitlog.flushed_offset
        return self.commitlog.written_offset if self.writable else 1 << 62

    def min_offset(self, topic: str, queue_id: int) -> int:
        tid = self._topic_id(topic)
        mins = self.state.queue_min_offsets()
        if (tid, queue_id) in mins:
            return mins[(tid, queue_id)]
        first = self.cq.first_offset(tid, queue_id)
        if first is not None:
            return first
        return self.max_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        tid = self._topic_id(topic)
        if self.writable:
            return self.dispatcher.visible_next.get((tid, queue_id), 0)
        return self.state.queue_max_offsets().get((tid, queue_id), 0)

    def _entries(self, tid: int, qid: int, lo: int, hi: int,
                 columns: list[str] | None = None) -> pa.Table:
        first = self.cq.first_offset(tid, qid)
        if first is not None and first <= lo:
            return _select_entries(self.cq.entries(tid, qid, lo, hi), columns)
        persisted = read_side_entries(self.sfs, list(self.state.consumequeue_files.values()),
                                      tid, qid, lo, hi if first is None else min(hi, first),
                                      columns)
        if first is None or hi <= first:
            return persisted
        recent = _select_entries(self.cq.entries(tid, qid, first, hi), columns)
        return pa.concat_tables([persisted, recent], promote_options="permissive")

    def _read_batch(self, batch_offset: int) -> pa.RecordBatch:
        return self.commitlog.read_batch(batch_offset)

    def _index_hits(self, tid: int, key: str) -> pa.Table:
        persisted = read_index(self.sfs, list(self.state.index_files.values()), tid, key)
        recent = self.index.lookup(tid, key, persisted=False)
        return pa.concat_tables([persisted, recent], promote_options="permissive")

    def _time_entries(self, tid, qid, start_ms, end_ms) -> pa.Table:
        persisted = read_side_by_time(self.sfs, list(self.state.consumequeue_files.values()),
                                      tid, qid, start_ms, end_ms)
        parts = [persisted.select(["queue_id", "queue_offset", "store_timestamp"])]
        keys = [k for k in self.dispatcher.next_offsets if k[0] == tid and (qid is None or k[1] == qid)]
        for t, q in keys:
            for ch in self.cq.all_chunks(t, q):
                sel = (ch.store_ts >= start_ms) & (ch.store_ts <= end_ms)
                if sel.any():
                    offs = np.arange(ch.start, ch.end)[sel]
                    parts.append(pa.table({
                        "queue_id": pa.array(np.full(len(offs), q, np.int32)),
                        "queue_offset": pa.array(offs, pa.int64()),
                        "store_timestamp": pa.array(ch.store_ts[sel], pa.int64()).cast(fmt.TS)}))
        return pa.concat_tables(parts, promote_options="permissive")

    def refresh(self) -> None:
        """Read-only stores: move to the newest committed version."""
        if not self.writable:
            self.state = self.txlog.snapshot(base=self.state)
            self._load_readonly()

    def _load_readonly(self) -> None:
        self.commitlog.load([SegmentRef(a["path"], int(a["baseOffset"]), int(a["size"]), True)
                             for a in self.state.segments.values()])

    def snapshot(self, version: int | None = None, *,
                 timestamp_ms: int | _dt.datetime | None = None) -> Snapshot:
        """A read-only view of one committed version (default: newest)."""
        if isinstance(timestamp_ms, _dt.datetime):
            timestamp_ms = int(timestamp_ms.timestamp() * 1000)
        if version is None and timestamp_ms is None:
            state = self.txlog.snapshot(base=self.state)
        else:
            state = self.txlog.snapshot(version, timestamp_ms=timestamp_ms)
        return Snapshot(self.url, state, sfs=self.sfs)

    # ------------------------------------------------------------------ consumer offsets
    def commit_consumer_offsets(self, group: str, offsets: dict[tuple[str, int], int], *,
                                client_id: str | None = None) -> None:
        """Record a consumer group's offsets (next offset to consume) per (topic, queue)."""
        self._require_writable()
        validate_group(group)

        def build(state: LogState):
            actions = []
            for (topic, qid), off in offsets.items():
                t = state.topics.get(topic)
                if t is None:
                    raise TopicNotFoundError(f"topic {topic!r} does not exist")
                actions.append({"consumerOffset": {"group": group, "topicId": t["id"],
                                                   "queueId": int(qid), "offset": int(off),
                                                   "clientId": client_id}})
            return actions or None
        self._commit(build, "COMMIT OFFSETS", {"group": group})

    def create_group(self, group: str, *, retry_max_times: int | None = None,
                     consume_broadcast_enable: bool = True, consume_enable: bool = True,
                     ) -> dict:
        """Create or replace a consumer group's subscription group config (mqadmin
        updateSubGroup), committed at once as a ``subscriptionGroup`` action.
        ``retry_max_times`` (None: the broker's ``maxReconsumeTimes``) bounds
        redeliveries before the dead-letter queue; ``consume_enable=False`` makes the
        broker refuse receives of the group, ``consume_broadcast_enable=False`` its
        broadcasting consumers (RocketMQ's defaults: both allowed)."""
        self._require_writable()
        validate_group(group)
        if retry_max_times is not None and (isinstance(retry_max_times, bool) or not
                                            isinstance(retry_max_times, int) or
                                            not 0 <= retry_max_times <= 10_000):
            raise UserError(f"retry_max_times must be an integer in 0..10000, "
                            f"got {retry_max_times!r}")
        conf = {"groupName": group, "consumeEnable": bool(consume_enable),
                "consumeBroadcastEnable": bool(consume_broadcast_enable),
                "createdTime": self.clock_ms(), "deleted": False}
        if retry_max_times is not None:
            conf["retryMaxTimes"] = retry_max_times

        def build(state: LogState):
            prev = state.subscription_groups.get(group)
            if prev is not None:
                conf["createdTime"] = prev.get("createdTime", conf["createdTime"])
            return [{"subscriptionGroup": conf}]
        self._commit(build, "UPDATE GROUP", {"group": group})
        return dict(conf)

    def delete_group(self, group: str, *, remove_offsets: bool = True) -> None:
        """Delete a group's config and (``remove_offsets``) its committed consumer
        offsets, in one commit. A group known only by its offsets can be deleted
        too; a group unknown in both ways is an error."""
        self._require_writable()

        def build(state: LogState):
            if group not in state.subscription_groups and \
                    not any(k[0] == group for k in state.consumer_offsets):
                raise GroupNotFoundError(
                    f"consumer group {group!r} has neither a config nor offsets in {self.url}")
            return group_delete_actions(state, group, remove_offsets=remove_offsets)
        self._commit(build, "DELETE GROUP", {"group": group})

    def subscription_groups(self) -> dict[str, dict]:
        """Consumer groups created with ``create_group``: name -> config."""
        return dict(self.state.subscription_groups)

    def consumer_offsets(self, group: str, *, client_id: str | None = None
                         ) -> dict[tuple[str, int], int]:
        names = {t["id"]: t["name"] for t in self.state.topics_by_id.values()}
        return {(names.get(tid, str(tid)), qid): off
                for (g, tid, qid, cid), off in self.state.consumer_offsets.items()
                if g == group and (cid or None) == client_id}

    # ------------------------------------------------------------------ publish
    def publish(self, *, force: bool = False, extra_actions: Sequence[dict] = (),
                operation: str = "PUBLISH", parameters: dict | None = None) -> LogState:
        """Commit progress: flushed segment sizes, new side-table files, lease renewal."""
        if not self.writable or self._closed and not force:
            return self.state
        with self._commit_lock:
            # flushed and dispatched: an append writes its bytes before it dispatches, and
            # the flush service may flush them in between
            upto = min(self.dispatcher.dispatched_offset, self.commitlog.flushed_offset)
            taken = self.cq.take_unpersisted(upto)
            itable = self.index.take_unpersisted(upto)
            actions: list[dict] = []
            written: list[str] = []
            try:
                for ref in self.commitlog.segments():
                    sealed = ref.sealed and ref.end_offset <= upto  # (a roll may be newer)
                    size = ref.size if sealed else min(ref.size, max(0, upto - ref.base_offset))
                    prev = self.state.segments.get(ref.path)
                    if prev is not None and int(prev["size"]) == size and \
                            bool(prev.get("sealed")) == sealed:
                        continue
                    if size <= 0:
                        continue
                    actions.append({"add": {"path": ref.path, "kind": "segment",
                                            "baseOffset": ref.base_offset, "size": size,
                                            "sealed": sealed,
                                            "modificationTime": self.clock_ms()}})
                for part in _split_chunks(taken, self.config.compact_max_rows):
                    # one file per compact_max_rows entries: a publish that lagged
                    # builds no table bigger than a compaction would
                    table = chunks_to_side_table(part)
                    rel = fmt.consumequeue_file()
                    size = write_side_table(self.sfs, rel, table,
                                            row_group_rows=self.config.side_table_row_group_rows)
                    written.append(rel)
                    actions.append({"add": consumequeue_add(rel, table, size)})
                    del table
                if itable.num_rows:
                    rel = fmt.index_file()
                    size = write_side_table(self.sfs, rel, itable,
                                            row_group_rows=self.config.side_table_row_group_rows)
                    written.append(rel)
                    actions.append({"add": index_add(rel, itable, size)})
                actions.extend(extra_actions)
                if not actions and not force and not self.lease.renewal_due(self.state):
                    return self.state
                actions.append(self.lease.renewal(self.state))
                frozen = list(actions)
                state = self._commit(lambda s: frozen, operation, parameters)
            except BaseException:
                self.cq.restore_unpersisted(taken)
                self.index.restore_unpersisted(itable)
                self.sfs.delete_many(written)
                raise
            self.cq.evict()
        if any(len(_small_files(files, self.config.compact_max_rows)) >
               self.config.compact_after_files
               for files in (self.state.consumequeue_files, self.state.index_files)):
            try:
                self.compact()
            except Exception:
                log.exception("compaction failed; will retry at the next publish")
        return state

    def compact(self) -> None:
        """Merge small side-table files of a kind (dataChange false), dropping the
        entries below the retention floor (readers skip them anyway).

        Tiered: a merged file holds at most ``compact_max_rows`` rows, and files
        of at least half that are left alone. One merge thus reads a bounded
        number of rows (its memory does not grow with the store) and old
        entries are not rewritten at every compaction."""
        with self._commit_lock:
            for kind, files, keys, schema, make_add, new_rel in (
                    ("consumequeue", self.state.consumequeue_files,
                     ["topic_id", "queue_id", "queue_offset"], fmt.CONSUMEQUEUE_SCHEMA,
                     consumequeue_add, fmt.consumequeue_file),
                    ("index", self.state.index_files, ["topic_id", "key"], fmt.INDEX_SCHEMA,
                     index_add, fmt.index_file)):
                for adds in _compaction_groups(_small_files(files, self.config.compact_max_rows),
                                               self.config.compact_max_rows):
                    table = _above_retention_floor(
                        compact_side_tables(self.sfs, adds, keys, schema), self.state.retention)
                    now = self.clock_ms()
                    actions = [{"remove": {"path": a["path"], "deletionTimestamp": now,
                                           "dataChange": False}} for a in adds]
                    if table.num_rows:   # (all below the floor: the files just go)
                        rel = new_rel()
                        size = write_side_table(
                            self.sfs, rel, table,
                            row_group_rows=self.config.side_table_row_group_rows)
                        actions.append({"add": make_add(rel, table, size)})
                    del table
                    self._commit(lambda s, a=actions: a, "COMPACT", {"kind": kind})

    # ------------------------------------------------------------------ deletion
    def delete_removed_files(self) -> list[str]:
        """Delete the files whose ``remove`` (its persisted ``deletionTimestamp``) is
        at least ``deletedFileRetentionMs`` old, except files a live ``add`` or this
        writer's CommitLog still uses. Runs with every retention check, after
        recovery and at close; a removed file whose delay has not passed at close
        is left to the next writer (its tombstone is in the log) or to vacuum.
        Returns the paths deleted now."""
        from .vacuum import due_removed_files
        if not self.writable or self._closed:
            return []
        state = self.state
        protect = {s.path for s in self.commitlog.segments()}

        def key(p):   # a path removed again later is a new tombstone
            return p, state.tombstones[p].get("deletionTimestamp")
        due = [p for p in due_removed_files(state, self.clock_ms(),
                                            self.config.deleted_file_retention_ms, protect)
               if key(p) not in self._deleted_files]
        for rel in due:
            self.sfs.delete(rel)
        self._deleted_files = {k for k in self._deleted_files.union(map(key, due))
                               if k[0] in state.tombstones and key(k[0]) == k}
        if due:
            log.info("deleted %d files removed at least %d ms ago", len(due),
                     self.config.deleted_file_retention_ms)
        return due

    def vacuum(self, *, retention_ms: int | None = None, dry_run: bool = False,
               force: bool = False):
        """Delete files under commitlog/, consumequeue/ and index/ that no live
        ``add`` of the newest version lists and that are older than
        ``retention_ms`` (default 7 days; by the ``remove``'s deletionTimestamp
        when the log has one, else by the file's modification time): removed
        files, staged segments of failed Spark jobs, side files of lost commits.
        A retention below 1 h raises ``InvalidConfigError`` unless ``force``
        (a running Spark job's staged files are protected only by their youth).
        ``dry_run`` deletes nothing. Never deletes a referenced file, nor an
        unpublished segment of a writer. Works on a read-only store too (on its
        newest version, next to a live lease holder). A writable store holds its
        commit lock meanwhile (publishes wait for the listing). Returns a
        ``vacuum.VacuumResult``."""
        from .vacuum import DEFAULT_VACUUM_RETENTION_MS, check_vacuum_retention, plan_vacuum
        retention_ms = DEFAULT_VACUUM_RETENTION_MS if retention_ms is None else int(retention_ms)
        check_vacuum_retention(retention_ms, force)
        with self._commit_lock:
            if self.writable:
                self._require_writable()
                state = self.state
                protect = {s.path for s in self.commitlog.segments()}
            else:
                self.refresh()
                state, protect = self.state, set()
            result = plan_vacuum(self.sfs, state, retention_ms=retention_ms,
                                 now_ms=self.clock_ms(), protect=protect)
            if not self.writable:
                # another process may have committed while we listed (the lease
                # holder's commits, unlike ours, are not under this lock): re-check
                self.refresh()
                live = (set(self.state.segments) | set(self.state.consumequeue_files)
                        | set(self.state.index_files))
                result.keep_only({f for f in result.files if f not in live})
            result.dry_run = dry_run
            if not dry_run:
                for rel in result.files:
                    self.sfs.delete(rel)
                log.info("vacuum of %s deleted %d files (%d bytes) older than %d ms",
                         self.url, len(result.files), result.total_bytes, retention_ms)
        return result

    # ------------------------------------------------------------------ adopt
    def adopt(self, paths: Sequence[str], *, app_id: str | None = None,
              app_version: int | None = None) -> CommitResult:
        """Make staged segment files (written by Spark tasks) part of the store,
        atomically, in one log version. With (app_id, app_version) a replay of
        an already committed version is skipped (idempotent writers)."""
        self._require_writable()
        self._require_not_replica()
        with self._append_lock, self._commit_lock:
            if app_id is not None:
                done = self.state.txns.get(app_id)
                if done is not None and int(done["version"]) >= int(app_version):
                    return CommitResult(self.state.version, 0, skipped=True)
            staged = [_load_staged(self.sfs, p) for p in paths]
            self._check_staged_topics(staged)
            self.commitlog.seal_active()
            total = 0
            affected = []
            for rel, buf, positions in staged:
                base = self.commitlog.written_offset
                ref = SegmentRef(rel, base, len(buf), True)
                self.commitlog.add_segment(ref)
                for pos in positions:
                    batch = seg.read_batch_at(buf, pos)
                    _, updates = self.dispatcher.dispatch(batch, base + pos)
                    affected.extend(updates)
                    total += batch.num_rows
            self.commitlog.flushed_offset = self.commitlog.written_offset
            self.dispatcher.dispatched_offset = self.commitlog.written_offset
            extra = []
            if app_id is not None:
                extra.append({"txn": {"appId": app_id, "version": int(app_version),
                                      "lastUpdated": self.clock_ms()}})
            state = self.publish(force=True, extra_actions=extra, operation="ADOPT",
                                 parameters={"files": len(paths), "messages": total})
        self.dispatcher.after_visible(affected)
        return CommitResult(state.version, total)

    def _check_staged_topics(self, staged) -> None:
        for rel, buf, positions in staged:
            for pos in positions:
                batch = seg.read_batch_at(buf, pos)
                for t in pc.unique(batch.column("topic")).to_pylist():
                    conf = self._writable_topic(t)
                    qmax = pc.max(batch.column("queue_id")).as_py()
                    if qmax is not None and qmax >= conf["writeQueueNums"]:
                        raise QueueNotFoundError(
                            f"{rel}: queue_id {qmax} out of range for topic {t!r}")

    def advertise_endpoint(self, endpoint: str) -> None:
        """Record ``endpoint`` (the lease holder's admin URL, ``http://host:port``)
        in the writer lease, and keep it there on renewals, so that committers in
        other processes hand their commits to it (``BrokerCommitter``)."""
        self._require_writable()
        self.lease.endpoint = endpoint
        self._commit(lambda state: self.lease.advertising(state, endpoint), "ADVERTISE ENDPOINT",
                     {"endpoint": endpoint})

    # ------------------------------------------------------------------ retention
    def run_retention(self, *, force_hour: bool = False) -> list[str]:
        """One retention pass (log/retention.py): at ``deleteWhen`` hours (or at once
        when the disk is fuller than ``diskMaxUsedSpaceRatio``) raise the floors of
        topics with their own retention and remove the sealed segments every topic
        has passed. Consumer groups that still needed removed offsets are logged
        (WARNING) before the commit. Returns the removed segment paths."""
        if not self.writable or self._closed:
            return []
        self.delete_removed_files()
        if not self._retention_due(self.clock_ms(), force_hour)[0]:
            return []          # outside deleteWhen hours nothing is planned (no reads)
        plan = self.retention_plan(force_hour=force_hour)
        if not plan.due or not plan.changes:
            return []
        for w in plan.warnings:
            log.warning("retention: %s", w.text())
        return self.remove_segments(plan.remove_segments, queue_floors=plan.floors(),
                                    exact_floors=plan.exact)

    def retention_plan(self, *, force_hour: bool = False, now_ms: int | None = None,
                       detail: bool = False):
        """What a retention pass would do now (``retention.RetentionPlan``); changes
        nothing. ``plan.due`` says whether a pass at this moment acts at all; ``detail``
        also reports every queue of topics on the broker default (for admin)."""
        from .retention import plan_retention
        now = self.clock_ms() if now_ms is None else now_ms
        due, disk_full = self._retention_due(now, force_hour)
        return plan_retention(self, now, due=due, disk_full=disk_full, detail=detail)

    def _retention_due(self, now_ms: int, force_hour: bool) -> tuple[bool, bool]:
        """(a pass acts now, the disk is over diskMaxUsedSpaceRatio)."""
        hour = _dt.datetime.fromtimestamp(now_ms / 1000).hour
        ratio = self.sfs.disk_usage_ratio()
        disk_full = ratio is not None and ratio * 100 > self.config.disk_max_used_space_ratio
        return force_hour or disk_full or hour in self.config.delete_hours(), disk_full

    def remove_segments(self, paths: Sequence[str], *,
                        queue_floors: dict[tuple[int, int], int] | None = None,
                        exact_floors: bool = False) -> list[str]:
        """Remove the oldest segments (a prefix of the CommitLog) and everything
        that points into them; their offsets then read as removed. ``queue_floors``
        ((topic id, queue id) -> first offset kept) also raises queue floors
        (per-topic retention), with or without segments removed; a floor never
        goes down and never passes the queue's max offset. ``exact_floors``: the
        given floors already cover every queue with rows in ``paths`` (a retention
        plan), so no queue is searched here."""
        self._require_writable()
        with self._append_lock, self._commit_lock:
            segs = self.commitlog.segments()
            prefix = segs[:len(paths)]
            if [s.path for s in prefix] != list(paths) or any(
                    self.commitlog.active is not None and s.path == self.commitlog.active.rel_path
                    for s in prefix):
                raise UserError("only a prefix of sealed segments can be removed")
            floor = prefix[-1].end_offset if prefix else self.state.min_physical_offset()
            self.publish(force=True)
            queues = self._queue_floors(floor, queue_floors or {}, search=not exact_floors)
            qmin = {(q["topicId"], q["queueId"]): q["minOffset"] for q in queues}
            prev = {(q["topicId"], q["queueId"]): q["minOffset"]
                    for q in (self.state.retention or {}).get("queues", ())}
            if not paths and all(v <= prev.get(k, 0) for k, v in qmin.items()):
                return []
            now = self.clock_ms()
            actions = [{"remove": {"path": p, "deletionTimestamp": now, "dataChange": True}}
                       for p in paths]
            for add in self.state.consumequeue_files.values():
                if all(int(q.get("maxBatchOffset", 1 << 62)) < floor or
                       int(q["maxOffset"]) <= qmin.get((q["topicId"], q["queueId"]), 0)
                       for q in add["queues"]):
                    actions.append({"remove": {"path": add["path"], "deletionTimestamp": now,
                                               "dataChange": False}})
            for add in self.state.index_files.values():
                # (files written before maxBatchOffset was logged stay: compaction drops
                # their entries below the floor when it merges them)
                if "maxBatchOffset" in add and int(add["maxBatchOffset"]) < floor:
                    actions.append({"remove": {"path": add["path"], "deletionTimestamp": now,
                                               "dataChange": False}})
            actions.append({"retention": {"minPhysicalOffset": floor, "queues": queues,
                                          "time": now}})
            self._commit(lambda s: actions, "RETENTION", {"segments": len(paths)})
            self.commitlog.drop_segments(set(paths))
            log.info("retention removed %d segments below physical offset %d", len(paths), floor)
            return list(paths)

    def _queue_floors(self, floor: int, raised: dict[tuple[int, int], int], *,
                      search: bool = True) -> list[dict]:
        out = []
        prev = {(q["topicId"], q["queueId"]): q["minOffset"]
                for q in (self.state.retention or {}).get("queues", ())}
        keys = set(self.dispatcher.next_offsets) | set(prev)
        for tid, qid in sorted(keys):
            nxt = self.dispatcher.next_offsets.get((tid, qid), 0)
            lo = max(prev.get((tid, qid), 0), min(raised.get((tid, qid), 0), nxt))
            hi = nxt if search else lo
            while lo < hi:   # first offset whose batch is at or above the floor
                mid = (lo + hi) // 2
                e = self._entries(tid, qid, mid, mid + 1)
                if e.num_rows and int(e.column("batch_offset")[0].as_py()) >= floor:
                    hi = mid
                else:
                    lo = mid + 1
            out.append({"topicId": tid, "queueId": qid, "minOffset": lo})
        return out

    # ------------------------------------------------------------------ close
    def flush(self) -> None:
        """fsync everything appended so far and publish it."""
        self._require_writable()
        off = self.commitlog.flush(sync=True)
        if self._group_commit is not None:
            self._group_commit.note_flushed(off)
        self.publish(force=True)

    def close(self) -> None:
        """Flush, publish, release the lease, remove the abort marker."""
        if self._closed:
            return
        if self.writable:
            self._stop_services()
            try:
                self.commitlog.flush(sync=True)
                self.publish(force=True)
                self._commit(self.lease.release, "RELEASE LEASE")
                self.sfs.delete(fmt.abort_file())
            except FencedError:
                log.warning("store %s: fenced at close; leaving the lease to its new owner",
                            self.url)
            finally:
                self.commitlog.close()
                try:
                    self.delete_removed_files()
                except OSError:
                    log.exception("store %s: deleting removed files at close failed", self.url)
                unregister_live(self.token)
        self._closed = True
        self.sfs.close()

    def _crash(self) -> None:
        """Test hook: stop as a killed process would (no flush, publish or release)."""
        self._stop_services()
        if self.commitlog.active is not None:
            self.commitlog.active.close()
            self.commitlog.active = None
        self._closed = True
        unregister_live(self.token)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_queue_nums(rq: int, wq: int, perm: int) -> None:
    for name, v in (("read_queue_nums", rq), ("write_queue_nums", wq)):
        if not isinstance(v, int) or not 1 <= v <= 1024:
            raise UserError(f"{name} must be an integer in 1..1024, got {v!r}")
    if perm not in (0, 2, 4, 6):
        raise UserError(f"perm must be 2 (write), 4 (read) or 6 (read+write), got {perm!r}")


def _retention_fields(topic: dict, retention_ms: int | None,
                      retention_bytes: int | None) -> dict:
    """``topic`` with ``retentionMs`` / ``retentionBytes`` set (None keeps, 0 removes)."""
    out = dict(topic)
    for key, v, what in (("retentionMs", retention_ms, "retention_ms (milliseconds)"),
                         ("retentionBytes", retention_bytes, "retention_bytes (bytes per queue)")):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UserError(f"{what} must be a positive integer, or 0 for the broker "
                            f"default; got {v!r}")
        if v == 0:
            out.pop(key, None)
        else:
            out[key] = v
    return out


def _load_staged(sfs: StoreFS, rel: str) -> tuple[str, pa.Buffer, list[int]]:
    if not fmt.is_relative_store_path(rel) or not rel.startswith(fmt.COMMITLOG_DIR + "/w-"):
        raise UserError(f"{rel!r} is not a staged segment path of this store")
    buf = sfs.read_buffer(rel)
    res = seg.scan(buf, validate=True)
    if res.valid_end == 0 or not res.sealed or res.valid_end + 8 != len(buf):
        raise UserError(f"staged segment {rel} is incomplete or corrupt; rewrite it")
    return rel, buf, res.positions


def group_delete_actions(state: LogState, group: str, *, remove_offsets: bool = True,
                         keep: frozenset | set = frozenset()) -> list[dict]:
    """The actions deleting ``group``'s subscription group config and (with
    ``remove_offsets``) its committed consumer offsets in ``state``, except the
    offset keys (group, topic id, queue id, client id) in ``keep``."""
    actions = [{"subscriptionGroup": {"groupName": group, "deleted": True}}]
    if remove_offsets:
        actions += [{"consumerOffset": {"group": g, "topicId": tid, "queueId": qid,
                                        "clientId": cid or None, "offset": None}}
                    for (g, tid, qid, cid) in state.consumer_offsets
                    if g == group and (g, tid, qid, cid) not in keep]
    return actions

def _small_files(files: dict[str, dict], max_rows: int) -> list[dict]:
    """Side-table adds with fewer than ``max_rows // 2`` rows, in commit order."""
    return [a for a in files.values() if int(a.get("rows", 0)) < max_rows // 2]


def _pack(items: list, max_rows: int, rows_of: Callable[[object], int]) -> list[list]:
    """Consecutive parts of ``items`` with at most ``max_rows`` rows each, greedy in
    order (an item bigger than that is a part of its own)."""
    parts: list[list] = []
    cur: list = []
    rows = 0
    for item in items:
        n = rows_of(item)
        if cur and rows + n > max_rows:
            parts.append(cur)
            cur, rows = [], 0
        cur.append(item)
        rows += n
    if cur:
        parts.append(cur)
    return parts


def _compaction_groups(adds: list[dict], max_rows: int) -> list[list[dict]]:
    """Split small files into merges of two or more files and at most ``max_rows``
    rows (greedy in commit order). Each file has under half of ``max_rows``, so
    every group but the last ends with more than half: it leaves the small tier."""
    return [g for g in _pack(adds, max_rows, lambda a: int(a.get("rows", 0))) if len(g) > 1]


def _split_chunks(taken: list, max_rows: int) -> list[list]:
    """Consecutive parts of (tid, qid, chunk) with at most ``max_rows`` entries each
    (a single chunk bigger than that is a part of its own)."""
    return _pack(taken, max_rows, lambda item: len(item[2].rows))


def _above_retention_floor(table: pa.Table, retention: dict | None) -> pa.Table:
    """The rows of a ConsumeQueue or Index table that retention has not removed: batch
    at or past ``minPhysicalOffset`` and queue offset at or past its queue's
    ``minOffset`` (FORMAT.md section 13). Order is kept."""
    if not retention or table.num_rows == 0:
        return table
    keep = np.asarray(table.column("batch_offset").to_numpy()) >= \
        int(retention.get("minPhysicalOffset", 0))
    floors = sorted(((int(q["topicId"]) << 32) | int(q["queueId"]), int(q["minOffset"]))
                    for q in retention.get("queues", ()))
    if floors:
        keys = np.array([k for k, _ in floors], np.int64)
        mins = np.array([m for _, m in floors], np.int64)
        row_keys = (np.asarray(table.column("topic_id").to_numpy(), np.int64) << 32) | \
            np.asarray(table.column("queue_id").to_numpy(), np.int64)
        pos = np.minimum(np.searchsorted(keys, row_keys), len(keys) - 1)
        floor = np.where(keys[pos] == row_keys, mins[pos], 0)
        keep &= np.asarray(table.column("queue_offset").to_numpy()) >= floor
    return table if keep.all() else table.filter(pa.array(keep))


def _select_entries(entries: pa.Table, columns: list[str] | None) -> pa.Table:
    """In-memory entries cut to the columns a persisted read of ``columns`` returns."""
    if columns is None:
        return entries
    return entries.select([c for c in entries.column_names if c in columns
                           or c == "queue_offset"])
