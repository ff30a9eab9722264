"""Adoption of staged Spark segments: load, check, place at the address end, dispatch.

A Spark task stages a sealed segment file under ``commitlog/w-<job>-...``;
adoption makes it part of the CommitLog: it is placed at the end of the
address space (its base offset is recorded in its ``add``) and its rows get
queue offsets continuing every (topic, queue). Two adopters share this module:

* :func:`adopt` -- a store open for writing (``Store.adopt``): places after its
  CommitLog's written end and dispatches with the store's Dispatcher;
* :class:`~sparkmq.log.committer.DirectCommitter` -- no writer: :func:`place`
  builds the segment adds and side tables from a log state.

On disk: nothing of its own (the staged files become segments as they are).
After a crash: a staged file not yet in a committed ``add`` is not part of the
store (vacuum or ``abort_job`` deletes it). Thread-safety: :func:`adopt` holds
the store's append and commit locks; the rest is pure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import QueueNotFoundError, UserError
from . import format as fmt
from . import segment as seg
from .actions import AddFile, TopicConfig, Txn
from .commitlog import SegmentRef
from .dispatch import assign_entries, next_queue_offsets
from .fs import StoreFS
from .index import index_entries
from .status import CommitResult
from .txlog import LogState

if TYPE_CHECKING:
    from .store import Store


@dataclass
class StagedSegment:
    """One staged segment file, read once: its size and (position, batch) pairs."""

    path: str
    size: int
    batches: list[tuple[int, pa.RecordBatch]]

    @property
    def num_rows(self) -> int:
        return sum(b.num_rows for _, b in self.batches)


def load_staged(sfs: StoreFS, rel: str) -> StagedSegment:
    """Read and validate the staged segment ``rel`` (UserError if it is not one,
    is missing, or is not a whole sealed segment)."""
    if not fmt.is_relative_store_path(rel) or not rel.startswith(fmt.COMMITLOG_DIR + "/w-"):
        raise UserError(f"{rel!r} is not a staged segment path of this store")
    try:
        buf = sfs.read_buffer(rel)
    except FileNotFoundError:
        raise UserError(f"staged segment {rel} does not exist (aborted or cleaned up?); "
                        "rerun the write") from None
    res = seg.scan(buf, validate=True)
    if res.valid_end == 0 or not res.sealed or res.valid_end + 8 != len(buf):
        raise UserError(f"staged segment {rel} is incomplete or corrupt; rerun the write")
    batches = [(p, seg.read_batch_at(buf, p, rel)) for p in res.positions]
    return StagedSegment(rel, len(buf), batches)


def replayed(txns: dict, app_id: str | None, app_version: int | None) -> bool:
    """True if (``app_id``, ``app_version``) is at or below the version the log's ``txn``
    actions (``txns``) record for that app: a replay an idempotent writer skips."""
    if app_id is None:
        return False
    done = txns.get(app_id)
    return done is not None and done.version >= int(app_version)


def new_staged_paths(paths: Sequence[str], committed) -> list[str]:
    """``paths`` without repeats (first occurrence kept), refused with UserError if any
    is a segment of the store already (``committed``: the live segment paths): adopting
    a file twice would place it at two addresses, and the log keeps one ``add`` per path,
    so the first placement's rows would point at no segment."""
    paths = list(dict.fromkeys(paths))
    already = [p for p in paths if p in committed]
    if already:
        raise UserError(f"staged segments already committed: {already[:3]} (a commit "
                        "that succeeded is not repeated; rerun the write for new files)")
    return paths


def check_staged_topics(staged: list[StagedSegment],
                        topic_conf: Callable[[str, str], TopicConfig]) -> None:
    """Every row's topic is writable (``topic_conf(name, path)`` returns its config or
    raises) and its queue id is in range (QueueNotFoundError)."""
    for st in staged:
        for _, batch in st.batches:
            topics = batch.column("topic")
            qids = batch.column("queue_id")
            for name in pc.unique(topics).to_pylist():
                conf = topic_conf(name, st.path)
                mine = qids.filter(pc.equal(topics, name))
                lo, hi = pc.min(mine).as_py(), pc.max(mine).as_py()
                n = conf.write_queue_nums
                if lo is not None and (lo < 0 or hi >= n):
                    raise QueueNotFoundError(
                        f"{st.path}: queue_id {hi if hi >= n else lo} is "
                        f"out of range for topic {name!r} (0..{n - 1})")


@dataclass
class Placement:
    """What one placement decided: segment adds and side tables."""

    segment_adds: list[AddFile]
    cq_table: pa.Table
    index_table: pa.Table | None
    num_messages: int


def place(state: LogState, staged: list[StagedSegment], now_ms: int) -> Placement:
    """Place staged segments at the end of ``state``'s address space; assign queue
    offsets per (topic, queue) in file, batch, row order."""
    base = state.address_end()
    nxt = next_queue_offsets(state)
    cq_parts: list[pa.Table] = []
    index_parts: list[pa.Table] = []
    adds = []
    total = 0
    for st in staged:
        for pos, batch in st.batches:
            entries, qos, tids = assign_entries(state, batch, base + pos, nxt)
            cq_parts.append(entries)
            it = index_entries(batch, tids, qos, base + pos)
            if it is not None and it.num_rows:
                index_parts.append(it)
            total += batch.num_rows
        adds.append(AddFile(path=st.path, kind="segment", base_offset=base, size=st.size,
                            sealed=True, modification_time=now_ms))
        base += st.size
    cq = fmt.CONSUMEQUEUE_SCHEMA.empty_table()
    if cq_parts:
        cq = pa.concat_tables(cq_parts).sort_by([("topic_id", "ascending"),
                                                 ("queue_id", "ascending"),
                                                 ("queue_offset", "ascending")])
    index = None
    if index_parts:
        index = pa.concat_tables(index_parts).sort_by([("topic_id", "ascending"),
                                                       ("key", "ascending")])
    return Placement(adds, cq, index, total)


def adopt(store: "Store", paths: Sequence[str], *, app_id: str | None = None,
          app_version: int | None = None) -> CommitResult:
    """Make staged segment files (written by Spark tasks) part of the store,
    atomically, in one log version. With (app_id, app_version) a replay of
    an already committed version is skipped (idempotent writers). A path given
    twice is adopted once; a path already committed is refused (UserError), as
    the DirectCommitter does."""
    store.require_writable()
    store.require_not_replica()
    with store.append_lock, store.commit_lock:
        if replayed(store.state.txns, app_id, app_version):
            return CommitResult(store.state.version, 0, skipped=True)
        paths = new_staged_paths(paths, store.state.segments)
        staged = [load_staged(store.sfs, p) for p in paths]
        check_staged_topics(staged, lambda name, path: store.writable_topic(name))
        store.commitlog.seal_active()
        total = 0
        affected = []
        for st in staged:
            base = store.commitlog.written_offset
            store.commitlog.add_segment(SegmentRef(st.path, base, st.size, True))
            for pos, batch in st.batches:
                _, updates = store.dispatcher.dispatch(batch, base + pos)
                affected.extend(updates)
                total += batch.num_rows
        store.commitlog.flushed_offset = store.commitlog.written_offset
        store.dispatcher.dispatched_offset = store.commitlog.written_offset
        extra = []
        if app_id is not None:
            extra.append(Txn(app_id=app_id, version=int(app_version),
                             last_updated=store.clock_ms()))
        state = store.publish(force=True, extra_actions=extra, operation="ADOPT",
                             parameters={"files": len(paths), "messages": total})
    store.dispatcher.after_visible(affected)
    return CommitResult(state.version, total)
