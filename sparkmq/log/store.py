"""The store: CommitLog, ConsumeQueue, Index and transaction log joined.

``Store.open(url, mode="w")`` takes the store's writer lease (an action in the log, with
an epoch), recovers, and then appends. ``mode="r"`` reads the newest committed version.

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

Crash recovery (``abort`` marker present at open): the unpublished tail of the CommitLog
is scanned from the last published size, cut at the last whole batch, and re-dispatched;
then published. The recovered last segment is then sealed and appends go to a new one:
the previous writer may only be paused (its lease expired), and its late bytes must land
where no one reads them.

Fencing: a writer whose lease was taken over learns it at its next commit (publish, at
most ``publish_interval_ms`` later), or at its next append once its lease may have
lapsed (the append renews it first: ``Appender.hold_lease``), and refuses every write
after with FencedError. Thread-safety: every public method is safe to call from several
threads.

``Store`` is a facade; each concern is an object or module of its own: ``lease``
(:class:`~sparkmq.log.lease.WriterLease`), ``appender`` (:mod:`.append`, building
batches with :mod:`.batch`), ``dispatcher`` (:mod:`.dispatch`), ``commitlog``, ``cq``
(read through :mod:`.queueview`), ``services`` (:mod:`.services`), recovery
(:mod:`.recovery`), publish and compaction (:mod:`.publish`), topics and groups
(:mod:`.topics`), retention (:mod:`.retention`), deletion and vacuum (:mod:`.vacuum`),
adoption (:mod:`.adopt`); a replica drives it through :mod:`.replication`.
"""
from __future__ import annotations

import datetime as _dt
import logging
import threading
from typing import Callable, Iterable, Sequence

import pyarrow as pa

from ..config import SYNC_FLUSH, StoreConfig
from ..errors import (FencedError, InvalidConfigError, InvalidMessageError, PermissionDeniedError,
                      ReadOnlyStoreError, StoreClosedError, StoreNotFoundError,
                      TopicNotFoundError)
from ..errors import StoreIOError
from . import adopt as _adopt
from .append import Appender
from . import format as fmt
from . import publish as _publish
from . import retention as _retention
from . import topics as _topics
from . import vacuum as _vacuum
from .integrity import check_files
from .batch import MAX_BATCH_BODY_BYTES, PERM_READ, PERM_RW, PERM_WRITE  # noqa: F401
from .actions import Action, GroupConfig, TopicConfig
from .commitlog import CommitLog, SegmentRef
from .queueview import live_entries, live_entry_arrays, live_time_entries, queues_stored_since
from .dispatch import Dispatcher
from .fs import StoreFS
from .index import live_index_hits
from .lease import WriterLease, register_live, unregister_live
from .message import Message, now_ms
from .reader import MessageReader, Snapshot
from .recovery import recover
from .retention import RetentionCache
from .services import StoreServices
from .status import AppendResult, BatchAppendResult, CommitResult, PutMessageStatus  # noqa: F401
from .topics import group_delete_actions  # noqa: F401  (re-exported)
from .txlog import LogState, TransactionLog, check_writer_version

log = logging.getLogger("sparkmq.store")


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
                                     config.memory_consume_queue_entries,
                                     cq_bytes=config.memory_consume_queue_bytes)
        self._append_lock = threading.RLock()
        self._commit_lock = threading.RLock()
        self.appender = Appender(self)
        self.commitlog.segment_taken = self.appender.segment_taken
        self.services = StoreServices()
        # removed files this writer already deleted (while their tombstones last)
        self.deleted_files: set[tuple[str, int]] = set()
        self._closed = False
        self.lease = WriterLease(self.url, self.clock_ms, config.lease_timeout_ms)
        self.recovered_from_crash = False
        self.replica = False       # a replica's copy (sparkmq.ha): see open()
        #: disk usage (percent) while over diskSpaceWarningLevelRatio, else None: appends
        #: are refused meanwhile (set by each retention pass, disk.note_disk_usage)
        self.disk_full_percent: float | None = None
        self.retention_cache = RetentionCache()

    @property
    def closed(self) -> bool:
        return self._closed

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
        gc = self.services.group_commit
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
        check_files(sfs, store.state)       # one listing per folder: named, not found late
        if mode == "r":
            store._load_readonly()
        if mode == "w":
            check_writer_version(store.state, url)   # before anything is written
            try:
                store._acquire_lease()
                recover(store)
            except BaseException:
                store.commitlog.close()
                raise
            if start_services:
                store._start_services()
            register_live(store.token, store)
        return store

    def _create(self) -> None:
        from .autocreate import identity_actions
        try:
            self.txlog.create(identity_actions(self.clock_ms(), self.config.broker_name))
        except Exception:   # a concurrent opener created the store first: that is success;
            if not self.txlog.exists():   # anything else re-raises
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
        self.require_writable()
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
    # ------------------------------------------------------------------ services
    def _start_services(self) -> None:
        c = self.config
        self.services.start(
            sync_flush=c.flush_disk_type == SYNC_FLUSH,
            flush=lambda: self.commitlog.flush(sync=True), flush_interval_ms=c.flush_interval_ms,
            publish=self.publish, publish_interval_ms=c.publish_interval_ms,
            retention=self.run_retention, retention_interval_ms=c.retention_check_interval_ms)

    def _stop_services(self) -> None:
        self.services.stop()

    # ------------------------------------------------------------------ topics
    def require_writable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.url} is closed")
        if not self.writable:
            raise ReadOnlyStoreError(f"store {self.url} was opened with mode='r'")
        if self.lease.fenced:
            raise FencedError(f"store {self.url}: a newer writer took the lease from this one "
                              f"(epoch {self.epoch}); open the store again to write")

    def require_not_replica(self) -> None:
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

    def topics(self) -> dict[str, TopicConfig]:
        return dict(self.state.topics)

    @property
    def store_id(self) -> str:
        return self.state.store_id

    @property
    def version(self) -> int:
        return self.state.version

    def topic_names(self) -> list[str]:
        return sorted(self.state.topics)

    def _topic_conf(self, topic: str) -> TopicConfig:
        conf = self.state.topics.get(topic)
        if conf is None:
            raise TopicNotFoundError(
                f"topic {topic!r} does not exist in {self.url}; create it with "
                f"create_topic({topic!r}) (topics: {sorted(self.state.topics) or 'none'})")
        return conf

    def _topic_id(self, topic: str) -> int:
        return self._topic_conf(topic).id

    # ------------------------------------------------------------------ append
    def append(self, messages: Iterable[Message] | Message, *,
               limits_checked: bool = False) -> list[AppendResult]:
        """Append messages; one result per message, in order (see :meth:`Appender.append`)."""
        return self.appender.append(messages, limits_checked=limits_checked)

    def append_batch(self, data: pa.RecordBatch | pa.Table, *, limits_checked: bool = False,
                     later: list | None = None) -> BatchAppendResult:
        """Columnar append, one record batch (see :meth:`Appender.append_batch`)."""
        return self.appender.append_batch(data, limits_checked=limits_checked, later=later)

    async def flushed_async(self, offset: int) -> PutMessageStatus:
        """Await the flush an ``append_batch(later=...)`` left to its caller."""
        return await self.appender.flushed_async(offset)

    def make_visible(self, later: list) -> None:
        self.appender.make_visible(later)

    def writable_topic(self, topic: str) -> TopicConfig:
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
        if not conf.writable:
            raise PermissionDeniedError(f"topic {topic!r} is not writable (perm {conf.perm})")
        return conf

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
        return first if first is not None else self.max_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        tid = self._topic_id(topic)
        if self.writable:
            return self.dispatcher.visible_next.get((tid, queue_id), 0)
        return self.state.queue_max_offsets().get((tid, queue_id), 0)

    def _entries(self, tid, qid, lo, hi, columns=None) -> pa.Table:
        return live_entries(self.sfs, self.state, self.cq, tid, qid, lo, hi, columns)

    def _entry_arrays(self, tid, qid, lo, hi, sizes=False):
        return live_entry_arrays(self.sfs, self.state, self.cq, tid, qid, lo, hi, sizes)

    def _read_batch(self, batch_offset: int) -> pa.RecordBatch:
        return self.commitlog.read_batch(batch_offset)

    def _cached_rows(self, batch_offset: int):
        return self.commitlog.cached_rows(batch_offset)

    def _index_hits(self, tid: int, key: str) -> pa.Table:
        return live_index_hits(self.sfs, lambda: self.state, self.index, tid, key)

    def _time_entries(self, tid, qid, start_ms, end_ms) -> pa.Table:
        keys = [k for k in self.dispatcher.queue_keys()
                if k[0] == tid and (qid is None or k[1] == qid)]
        return live_time_entries(self.sfs, self.state, self.cq, keys, tid, qid, start_ms, end_ms)

    def queues_stored_since(self, since_ms: int) -> list[tuple[str, int]]:
        """(topic, queue) of the queues holding a message stored at or after ``since_ms``
        (per-queue stats; no queue is read)."""
        names = {t.id: t.name for t in self.state.topics_by_id.values()}
        hit = queues_stored_since(self.state, self.cq, self.dispatcher.queue_keys(), since_ms)
        return sorted((names[t], q) for t, q in hit if t in names)

    def refresh(self) -> None:
        """Read-only stores: move to the newest committed version."""
        if not self.writable:
            self.state = self.txlog.snapshot(base=self.state)
            self._load_readonly()

    def _load_readonly(self) -> None:
        self.commitlog.load([SegmentRef(a.path, int(a.base_offset), a.size, True)
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
    def subscription_groups(self) -> dict[str, GroupConfig]:
        """Consumer groups created with ``create_group``: name -> config."""
        return dict(self.state.subscription_groups)

    def consumer_offsets(self, group: str, *, client_id: str | None = None
                         ) -> dict[tuple[str, int], int]:
        names = {t.id: t.name for t in self.state.topics_by_id.values()}
        return {(names.get(tid, str(tid)), qid): off
                for (g, tid, qid, cid), off in self.state.consumer_offsets.items()
                if g == group and (cid or None) == client_id}

    # ------------------------------------------------------------------ publish
    # ------------------------------------------------------------------ deletion
    # ------------------------------------------------------------------ adopt
    def advertise_endpoint(self, endpoint: str) -> None:
        """Record ``endpoint`` (the lease holder's admin URL, ``http://host:port``)
        in the writer lease, and keep it there on renewals, so that committers in
        other processes hand their commits to it (``BrokerCommitter``)."""
        self.require_writable()
        self.lease.endpoint = endpoint
        self._commit(lambda state: self.lease.advertising(state, endpoint), "ADVERTISE ENDPOINT",
                     {"endpoint": endpoint})

    # ------------------------------------------------------------------ retention
    # ------------------------------------------------------------------ topics, groups
    def create_topic(self, name: str, *, read_queue_nums: int | None = None,
                     write_queue_nums: int | None = None, perm: int = PERM_RW,
                     attributes: dict | None = None, system: bool = False,
                     exist_ok: bool = False, retention_ms: int | None = None,
                     retention_bytes: int | None = None) -> TopicConfig:
        """Create a topic (committed at once); see :func:`topics.create_topic`."""
        return _topics.create_topic(
            self, name, read_queue_nums=read_queue_nums, write_queue_nums=write_queue_nums,
            perm=perm, attributes=attributes, system=system, exist_ok=exist_ok,
            retention_ms=retention_ms, retention_bytes=retention_bytes)

    def update_topic(self, name: str, *, read_queue_nums: int | None = None,
                     write_queue_nums: int | None = None, perm: int | None = None,
                     attributes: dict | None = None, retention_ms: int | None = None,
                     retention_bytes: int | None = None) -> TopicConfig:
        """Change a topic's config; see :func:`topics.update_topic`."""
        return _topics.update_topic(
            self, name, read_queue_nums=read_queue_nums, write_queue_nums=write_queue_nums,
            perm=perm, attributes=attributes, retention_ms=retention_ms,
            retention_bytes=retention_bytes)

    def delete_topic(self, name: str) -> None:
        """Delete a topic: its messages stay in segments until retention, unreadable."""
        _topics.delete_topic(self, name)

    def commit_consumer_offsets(self, group: str, offsets: dict[tuple[str, int], int], *,
                                client_id: str | None = None) -> None:
        """Record a consumer group's offsets (next offset to consume) per (topic, queue)."""
        _topics.commit_consumer_offsets(self, group, offsets, client_id=client_id)

    def create_group(self, group: str, *, retry_max_times: int | None = None,
                     consume_broadcast_enable: bool = True, consume_enable: bool = True,
                     consume_message_orderly: bool = False,
                     retry_policy: dict | None = None) -> GroupConfig:
        """Create or replace a subscription group config; see :func:`topics.create_group`."""
        return _topics.create_group(self, group, retry_max_times=retry_max_times,
                                    consume_broadcast_enable=consume_broadcast_enable,
                                    consume_enable=consume_enable,
                                    consume_message_orderly=consume_message_orderly,
                                    retry_policy=retry_policy)

    def delete_group(self, group: str, *, remove_offsets: bool = True) -> None:
        """Delete a group's config and (``remove_offsets``) its offsets, in one commit."""
        _topics.delete_group(self, group, remove_offsets=remove_offsets)

    # ------------------------------------------------------------------ publish, retention
    def publish(self, *, force: bool = False, extra_actions: Sequence[Action] = (),
                operation: str = "PUBLISH", parameters: dict | None = None) -> LogState:
        """Commit progress: flushed segment sizes, new side-table files, lease renewal."""
        return _publish.publish(self, force=force, extra_actions=extra_actions,
                                operation=operation, parameters=parameters)

    def compact(self) -> None:
        """Merge small side-table files (see :func:`publish.compact`)."""
        _publish.compact(self)

    def run_retention(self, *, force_hour: bool = False) -> list[str]:
        """One retention pass (:func:`retention.run_retention`); returns removed paths."""
        return _retention.run_retention(self, force_hour=force_hour)

    def retention_plan(self, *, force_hour: bool = False, now_ms: int | None = None,
                       detail: bool = False):
        """What a retention pass would do now (:func:`retention.retention_plan`)."""
        return _retention.retention_plan(self, force_hour=force_hour, now_ms=now_ms,
                                         detail=detail)

    def remove_segments(self, paths: Sequence[str], *,
                        queue_floors: dict[tuple[int, int], int] | None = None,
                        exact_floors: bool = False) -> list[str]:
        """Remove the oldest segments (see :func:`retention.remove_segments`)."""
        return _retention.remove_segments(self, paths, queue_floors=queue_floors,
                                          exact_floors=exact_floors)

    def delete_removed_files(self) -> list[str]:
        """Delete removed files whose delay passed (:func:`vacuum.delete_removed_files`)."""
        return _vacuum.delete_removed_files(self)

    def vacuum(self, *, retention_ms: int | None = None, dry_run: bool = False,
               force: bool = False):
        """Delete unreferenced old files (:func:`vacuum.vacuum`); a ``VacuumResult``."""
        return _vacuum.vacuum(self, retention_ms=retention_ms, dry_run=dry_run, force=force)

    def adopt(self, paths: Sequence[str], *, app_id: str | None = None,
              app_version: int | None = None) -> CommitResult:
        """Make staged Spark segments part of the store in one version (:func:`adopt.adopt`)."""
        return _adopt.adopt(self, paths, app_id=app_id, app_version=app_version)

    # ------------------------------------------------------------------ close
    def flush(self) -> None:
        """fsync everything appended so far and publish it."""
        self.require_writable()
        off = self.commitlog.flush(sync=True)
        if self.services.group_commit is not None:
            self.services.group_commit.note_flushed(off)
        self.publish(force=True)

    def close(self) -> None:
        """Flush, publish, release the lease, remove the abort marker. Closed even if one
        fails (EIO): the caller gets the error, the next writer recovers as after a crash."""
        if self._closed:
            return
        try:
            if self.writable:
                self._close_writer()
        finally:
            self._closed = True
            self.sfs.close()

    def _close_writer(self) -> None:
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
            try:
                self.commitlog.close()
            except StoreIOError:    # (its flush failing again: the caller gets the first)
                log.exception("store %s: closing the CommitLog failed", self.url)
            try:
                self.delete_removed_files()
            except StoreIOError:
                log.exception("store %s: deleting removed files at close failed", self.url)
            unregister_live(self.token)

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
