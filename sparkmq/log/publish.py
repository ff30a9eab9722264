"""Publishing a writer's progress, and tiered compaction of side tables.

:func:`publish` commits, in one transaction-log version, what the store did
since the last publish: segment sizes (never past the dispatched and flushed
offset), new ConsumeQueue and Index side files (one per ``compact_max_rows``
entries), extra actions of the caller, and the lease renewal. :func:`compact`
merges small side files of a kind (tiered: at most ``compact_max_rows`` rows
per merge; files of half that are left alone) and drops entries below the
retention floor.

Publish on demand (freshness for stream readers): a Spark stream reader keeps a
marker ``_readers/<reader id>.json`` (:func:`touch_reader_marker`, rewritten every
``READER_TOUCH_INTERVAL_MS``, expiring ``READER_MARKER_TTL_MS`` after it is
written). The publish service's pass looks at ``_readers/`` at most every
``READER_SCAN_INTERVAL_MS``; while a live marker is there it publishes as messages
arrive (woken by the store's arrival listener), passes at least
``publish_min_gap_ms`` apart (fsyncing first under ASYNC_FLUSH: only flushed bytes
are ever published), besides every ``publish_interval_ms``. A store with no stream
reader (idle, batch-only) keeps the interval cadence and the same ``_log/`` growth.
The markers are hints, never state: they are not in the transaction log, and a
lost or stale one only changes how soon the next publish comes.

On disk: writes ``consumequeue/*.parquet`` and ``index/*.parquet`` before the
commit that adds them; a publish that fails deletes those its commit did not add
(:func:`not_committed`). After a crash: files written without their commit are
orphans (vacuum deletes them); the unpublished CommitLog tail is recovered.
Thread-safety: both hold the store's commit lock.
"""
from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa

from . import format as fmt
from .actions import Action, AddFile, RemoveFile, Retention
from .batch import pack
from .consumequeue import chunks_to_side_table, compact_side_tables, consumequeue_add, \
    write_side_table
from .index import index_add
from .txlog import LogState

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("sparkmq.store")

#: folder of stream readers' interest markers (not in the transaction log)
READERS_DIR = fmt.READERS_DIR
#: the publish pass lists ``_readers/`` at most this often
READER_SCAN_INTERVAL_MS = 1_000
#: a stream reader rewrites its marker at most this often ...
READER_TOUCH_INTERVAL_MS = 5_000
#: ... and a marker not rewritten for this long is dead
READER_MARKER_TTL_MS = 30_000
#: a dead marker (its reader stopped without removing it) is deleted this long after
#: it expired, by the publish pass
STALE_MARKER_GRACE_MS = 10 * 60_000
#: markers read per look (bounds the pass when many readers come and go)
MAX_MARKERS_READ = 64


def publish(store: "Store", *, force: bool = False, extra_actions: Sequence[dict] = (),
            operation: str = "PUBLISH", parameters: dict | None = None) -> LogState:
    """Commit progress: flushed segment sizes, new side-table files, lease renewal."""
    if not store.writable or store.closed and not force:
        return store.state
    if not force:   # the publish service's pass (every other caller forces)
        follow_readers(store)
    with store.commit_lock:
        # flushed and dispatched: an append writes its bytes before it dispatches, and
        # the flush service may flush them in between
        upto = min(store.dispatcher.dispatched_offset, store.commitlog.flushed_offset)
        taken = store.cq.take_unpersisted(upto)
        itable = store.index.take_unpersisted(upto)
        actions: list[Action] = []
        written: list[str] = []
        try:
            for ref in store.commitlog.segments():
                sealed = ref.sealed and ref.end_offset <= upto  # (a roll may be newer)
                size = ref.size if sealed else min(ref.size, max(0, upto - ref.base_offset))
                prev = store.state.segments.get(ref.path)
                if prev is not None and prev.size == size and bool(prev.sealed) == sealed:
                    continue
                if size <= 0:
                    continue
                actions.append(AddFile(path=ref.path, kind="segment",
                                       base_offset=ref.base_offset, size=size, sealed=sealed,
                                       modification_time=store.clock_ms()))
            for part in split_chunks(taken, store.config.compact_max_rows):
                # one file per compact_max_rows entries: a publish that lagged
                # builds no table bigger than a compaction would
                table = chunks_to_side_table(part)
                rel = fmt.consumequeue_file()
                size = write_side_table(store.sfs, rel, table,
                                        row_group_rows=store.config.side_table_row_group_rows)
                written.append(rel)
                actions.append(consumequeue_add(rel, table, size))
                del table
            if itable.num_rows:
                rel = fmt.index_file()
                size = write_side_table(store.sfs, rel, itable,
                                        row_group_rows=store.config.side_table_row_group_rows)
                written.append(rel)
                actions.append(index_add(rel, itable, size))
            actions.extend(extra_actions)
            if not actions and not force and not store.lease.renewal_due(store.state):
                return store.state
            actions.append(store.lease.renewal(store.state))
            frozen = list(actions)
            state = store.commit_actions(lambda s: frozen, operation, parameters)
        except BaseException:
            store.cq.restore_unpersisted(taken)
            store.index.restore_unpersisted(itable)
            store.sfs.delete_many(not_committed(store, written))
            raise
        store.cq.evict()
        store.index.settle(itable)
    if any(len(small_files(files, store.config.compact_max_rows)) >
           store.config.compact_after_files
           for files in (store.state.consumequeue_files, store.state.index_files)):
        try:
            store.compact()
        except Exception:   # best effort: the publish already committed; compaction must not fail it
            log.exception("compaction failed; will retry at the next publish")
    return state


def not_committed(store: "Store", written: list[str]) -> list[str]:
    """The side files of a failed publish that no committed version adds, to delete.
    A commit can fail after its version was written (an error past the put-if-absent),
    and deleting a file a version adds would make the store refuse to open (readers
    check every file at open). If the log cannot be read, none: vacuum deletes orphans.
    The entries are handed back either way; written again, a reader keeps one copy."""
    if not written:
        return []
    try:
        latest = store.txlog.snapshot(base=store.state)
    except Exception:   # the log is unreadable too (the same fault): keep the files
        log.warning("could not read %s/ after a failed publish; keeping its side files %s "
                    "(vacuum deletes them if no version adds them)", fmt.LOG_DIR, written)
        return []
    live = latest.consumequeue_files.keys() | latest.index_files.keys()
    return [rel for rel in written if rel not in live]


def follow_readers(store: "Store") -> None:
    """Switch the publish service to publishing at arrivals (``publish_min_gap_ms``
    apart) while a stream reader's marker is live, back to ``publish_interval_ms``
    only when none is (looking at most
    every ``READER_SCAN_INTERVAL_MS``). In the fast cadence under ASYNC_FLUSH, fsync
    what was written, so the publish that follows covers it (a publish never goes
    past the flushed offset: data handed to a stream must survive a crash)."""
    services = store.services
    now_s = time.monotonic()
    last = services.readers_checked_s
    if last is None or now_s - last >= READER_SCAN_INTERVAL_MS / 1000.0:
        services.readers_checked_s = now_s
        try:
            live = live_readers(store.sfs, store.clock_ms(), clean=True)
        except Exception:   # a hint only: an unreadable _readers/ must not stop publishing
            log.warning("could not read %s/; publishing at the interval", READERS_DIR,
                        exc_info=True)
            live = 0
        gap = store.config.publish_min_gap_ms
        fast = bool(live) and gap < store.config.publish_interval_ms
        if fast and not services.arrival_listener_added:
            store.add_listener(services.on_arrival)
            services.arrival_listener_added = True
        services.set_publish_gap(gap if fast else None)
    if services.publish_gap_ms is not None and services.group_commit is None:
        cl = store.commitlog
        if cl.written_offset > cl.flushed_offset:
            cl.flush(sync=True)


def reader_marker(reader_id: str) -> str:
    """Path of a stream reader's interest marker."""
    return f"{READERS_DIR}/{reader_id}.json"


def touch_reader_marker(sfs, reader_id: str, now_ms: int,
                        ttl_ms: int = READER_MARKER_TTL_MS) -> None:
    """Write (atomically replace) a stream reader's marker, live for ``ttl_ms``."""
    body = {"reader": reader_id, "writtenMs": int(now_ms), "expiresMs": int(now_ms + ttl_ms)}
    sfs.replace(reader_marker(reader_id), json.dumps(body).encode())


def remove_reader_marker(sfs, reader_id: str) -> None:
    sfs.delete(reader_marker(reader_id))


def live_readers(sfs, now_ms: int, *, clean: bool = False) -> int:
    """How many stream readers' markers are live at ``now_ms`` (of the first
    ``MAX_MARKERS_READ``). With ``clean``, markers dead for ``STALE_MARKER_GRACE_MS``
    are deleted. Clocks: the expiry is the reader's clock, compared with the
    writer's; a skew only moves when the fast cadence starts or ends."""
    live = 0
    names = [n for n in sfs.list_names(READERS_DIR) if n.endswith(".json")]
    for name in names[:MAX_MARKERS_READ]:
        rel = f"{READERS_DIR}/{name}"
        try:
            expires = int(json.loads(sfs.read_bytes(rel))["expiresMs"])
        except FileNotFoundError:   # its reader stopped (and removed it) between list and read
            continue
        except (ValueError, KeyError, TypeError):   # not ours or torn: not a live reader
            expires = 0
        if expires > now_ms:
            live += 1
        elif clean and now_ms - expires > STALE_MARKER_GRACE_MS:
            sfs.delete(rel)
    return live


def compact(store: "Store") -> None:
    """Merge small side-table files of a kind (dataChange false), dropping the
    entries below the retention floor (readers skip them anyway).

    Tiered: a merged file holds at most ``compact_max_rows`` rows, and files
    of at least half that are left alone. One merge thus reads a bounded
    number of rows (its memory does not grow with the store) and old
    entries are not rewritten at every compaction."""
    with store.commit_lock:
        for kind, files, keys, schema, make_add, new_rel in (
                ("consumequeue", store.state.consumequeue_files,
                 ["topic_id", "queue_id", "queue_offset"], fmt.CONSUMEQUEUE_SCHEMA,
                 consumequeue_add, fmt.consumequeue_file),
                ("index", store.state.index_files, ["topic_id", "key"], fmt.INDEX_SCHEMA,
                 index_add, fmt.index_file)):
            for adds in compaction_groups(small_files(files, store.config.compact_max_rows),
                                           store.config.compact_max_rows):
                table = above_retention_floor(
                    compact_side_tables(store.sfs, adds, keys, schema), store.state.retention)
                now = store.clock_ms()
                actions = [RemoveFile(path=a.path, deletion_timestamp=now, data_change=False)
                           for a in adds]
                if table.num_rows:   # (all below the floor: the files just go)
                    rel = new_rel()
                    size = write_side_table(
                        store.sfs, rel, table,
                        row_group_rows=store.config.side_table_row_group_rows)
                    actions.append(make_add(rel, table, size))
                del table
                store.commit_actions(lambda s, a=actions: a, "COMPACT", {"kind": kind})


def small_files(files: dict[str, AddFile], max_rows: int) -> list[AddFile]:
    """Side-table adds with fewer than ``max_rows // 2`` rows, in commit order."""
    return [a for a in files.values() if int(a.rows or 0) < max_rows // 2]


def compaction_groups(adds: list[AddFile], max_rows: int) -> list[list[AddFile]]:
    """Split small files into merges of two or more files and at most ``max_rows``
    rows (greedy in commit order). Each file has under half of ``max_rows``, so
    every group but the last ends with more than half: it leaves the small tier."""
    return [g for g in pack(adds, max_rows, lambda a: int(a.rows or 0)) if len(g) > 1]


def split_chunks(taken: list, max_rows: int) -> list[list]:
    """Consecutive parts of (tid, qid, chunk) with at most ``max_rows`` entries each
    (a single chunk bigger than that is a part of its own)."""
    return pack(taken, max_rows, lambda item: len(item[2].rows))


def above_retention_floor(table: pa.Table, retention: Retention | None) -> pa.Table:
    """The rows of a ConsumeQueue or Index table that retention has not removed: batch
    at or past ``minPhysicalOffset`` and queue offset at or past its queue's
    ``minOffset`` (FORMAT.md section 13). Order is kept."""
    if not retention or table.num_rows == 0:
        return table
    keep = np.asarray(table.column("batch_offset").to_numpy()) >= \
        int(retention.min_physical_offset)
    floors = sorted(((int(q.topic_id) << 32) | int(q.queue_id), int(q.min_offset))
                    for q in retention.queues)
    if floors:
        keys = np.array([k for k, _ in floors], np.int64)
        mins = np.array([m for _, m in floors], np.int64)
        row_keys = (np.asarray(table.column("topic_id").to_numpy(), np.int64) << 32) | \
            np.asarray(table.column("queue_id").to_numpy(), np.int64)
        pos = np.minimum(np.searchsorted(keys, row_keys), len(keys) - 1)
        floor = np.where(keys[pos] == row_keys, mins[pos], 0)
        keep &= np.asarray(table.column("queue_offset").to_numpy()) >= floor
    return table if keep.all() else table.filter(pa.array(keep))
