"""Deletion of removed and orphan files: the delayed delete and vacuum.

Two ways a data file (under ``commitlog/``, ``consumequeue/``, ``index/``)
leaves the disk (docs/FORMAT.md section 13):

* **Delayed delete** (:func:`due_removed_files`): a ``remove`` action carries
  its ``deletionTimestamp``; the lease holder deletes the file once
  ``deletedFileRetentionMs`` has passed since then. The tombstone is in the log
  (and in checkpoints for a while after it is due), so a writer that stopped or
  crashed before the delay leaves the work to the next writer.
* **Vacuum** (:func:`plan_vacuum`): every file that no live ``add`` lists and
  that is older than a retention (by its ``remove``'s deletionTimestamp when
  the log still has one, else by the file's modification time). This also
  catches what no tombstone names: staged segments (``w-*``) of Spark jobs
  that failed without cleaning up, side files of commits that lost, files of
  tombstones already dropped from checkpoints. A retention below
  ``VACUUM_MIN_RETENTION_MS`` is refused unless forced: a Spark job still
  running has staged files that nothing references yet, only their youth
  protects them.

Never deleted: a file a live ``add`` lists, a broker-named segment at or past
the snapshot's address end (the unpublished tail that recovery re-reads), a
file the caller protects (a writer's open segments), names the store does not
make. Neither function changes anything; the caller deletes.
"""
from __future__ import annotations

from ..progress import Progress

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import InvalidConfigError
from . import format as fmt
from .fs import StoreFS
from .txlog import LogState

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("sparkmq.store")

VACUUM_MIN_RETENTION_MS = 3_600_000          # 1 h: refused below, unless forced
DEFAULT_VACUUM_RETENTION_MS = 7 * 24 * 3_600_000

_DATA_DIRS = (fmt.COMMITLOG_DIR, fmt.CONSUMEQUEUE_DIR, fmt.INDEX_DIR)
# file names the store makes under the data folders (FORMAT.md section 2), and the
# temporary files of a write that died half way
_STORE_NAME = re.compile(r"^(\d{20}\.arrow|w-[A-Za-z0-9_.]{1,64}-[A-Za-z0-9_.]{1,64}-[0-9a-f]{32}"
                         r"\.arrow|[0-9a-f]{32}\.parquet|\.tmp-[0-9a-f]{32})$")
# in ``_log/`` only the temporary files of a commit or ``_last_checkpoint`` that a
# process killed between its write and its link or rename left (never a log file)
_LOG_TEMP = re.compile(r"^\.tmp-[0-9a-f]{32}$")


@dataclass
class VacuumResult:
    """What a vacuum deleted (or, with ``dry_run``, would delete)."""

    files: list[str] = field(default_factory=list)
    total_bytes: int = 0
    retention_ms: int = 0
    dry_run: bool = False
    kept_young: int = 0       # unreferenced files left because they are younger
    sizes: dict[str, int] = field(default_factory=dict, repr=False)   # path -> bytes

    def keep_only(self, paths: set[str]) -> None:
        """Drop the files not in ``paths`` (found referenced on a re-check)."""
        self.files = [f for f in self.files if f in paths]
        self.total_bytes = sum(self.sizes[f] for f in self.files)

    def to_dict(self) -> dict:
        return {"files": self.files, "totalBytes": self.total_bytes,
                "retentionMs": self.retention_ms, "dryRun": self.dry_run,
                "keptYoung": self.kept_young}


def _live(state: LogState) -> set[str]:
    return set(state.segments) | set(state.consumequeue_files) | set(state.index_files)


def due_removed_files(state: LogState, now_ms: int, delay_ms: int,
                      protect: set[str] = frozenset()) -> list[str]:
    """Paths of ``state``'s tombstones whose ``deletionTimestamp + delay_ms`` has
    passed, that no live ``add`` lists and that are not in ``protect``."""
    live = _live(state)
    out = []
    for path, rm in state.tombstones.items():
        if int(rm.deletion_timestamp or 0) + delay_ms > now_ms:
            continue
        if path in live or path in protect or not fmt.is_relative_store_path(path):
            continue
        out.append(path)
    return out


def check_vacuum_retention(retention_ms: int, force: bool) -> None:
    if retention_ms < 0:
        raise InvalidConfigError(f"vacuum retention must be 0 or more, got {retention_ms} ms")
    if retention_ms < VACUUM_MIN_RETENTION_MS and not force:
        raise InvalidConfigError(
            f"vacuum retention of {retention_ms / 3_600_000:g} h is below the safe minimum of "
            f"{VACUUM_MIN_RETENTION_MS / 3_600_000:g} h: files staged by a Spark job still "
            "running could be deleted. Use a retention longer than any job, or force it "
            "(--force) if no job writes to this store.")


def plan_vacuum(sfs: StoreFS, state: LogState, *, retention_ms: int, now_ms: int,
                protect: set[str] = frozenset()) -> VacuumResult:
    """The files a vacuum of ``state``'s store deletes (see the module docstring).
    Lists the three data folders (and ``_log/``'s temporary files) and asks each
    unreferenced file its age."""
    live = _live(state)
    end = state.address_end()
    cutoff = now_ms - retention_ms
    result = VacuumResult(retention_ms=retention_ms)
    for folder, names in ((fmt.LOG_DIR, _LOG_TEMP), *((d, _STORE_NAME) for d in _DATA_DIRS)):
        for name in sfs.list_names(folder):
            rel = f"{folder}/{name}"
            if rel in live or rel in protect or not names.fullmatch(name):
                continue
            base = fmt.parse_segment_file(name) if folder == fmt.COMMITLOG_DIR else None
            if base is not None and base >= end:
                continue           # a writer's unpublished tail: recovery reads it
            rm = state.tombstones.get(rel)
            try:
                when_ms = (int(rm.deletion_timestamp or 0) if rm is not None
                           else sfs.modified_ms(rel))
                size = sfs.size(rel)
            except FileNotFoundError:
                continue           # deleted meanwhile
            if when_ms > cutoff:
                result.kept_young += 1
                continue
            result.files.append(rel)
            result.sizes[rel] = size
            result.total_bytes += size
    return result


# ---------------------------------------------------------------------- a store's deletions
def delete_removed_files(store: "Store") -> list[str]:
    """Delete the files whose ``remove`` (its persisted ``deletionTimestamp``) is
    at least ``deletedFileRetentionMs`` old, except files a live ``add`` or this
    writer's CommitLog still uses. Runs with every retention check, after
    recovery and at close; a removed file whose delay has not passed at close
    is left to the next writer (its tombstone is in the log) or to vacuum.
    Returns the paths deleted now."""
    if not store.writable or store.closed:
        return []
    state = store.state
    protect = {s.path for s in store.commitlog.segments()}

    def key(p):   # a path removed again later is a new tombstone
        return p, state.tombstones[p].deletion_timestamp
    due = [p for p in due_removed_files(state, store.clock_ms(),
                                        store.config.deleted_file_retention_ms, protect)
           if key(p) not in store.deleted_files]
    for rel in due:
        store.sfs.delete(rel)
    store.deleted_files = {k for k in store.deleted_files.union(map(key, due))
                           if k[0] in state.tombstones and key(k[0]) == k}
    if due:
        log.info("deleted %d files removed at least %d ms ago", len(due),
                 store.config.deleted_file_retention_ms)
    return due


def vacuum(store: "Store", *, retention_ms: int | None = None, dry_run: bool = False,
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
    retention_ms = DEFAULT_VACUUM_RETENTION_MS if retention_ms is None else int(retention_ms)
    check_vacuum_retention(retention_ms, force)
    with store.commit_lock:
        if store.writable:
            store.require_writable()
            state = store.state
            protect = {s.path for s in store.commitlog.segments()}
        else:
            store.refresh()
            state, protect = store.state, set()
        result = plan_vacuum(store.sfs, state, retention_ms=retention_ms,
                             now_ms=store.clock_ms(), protect=protect)
        if not store.writable:
            # another process may have committed while we listed (the lease
            # holder's commits, unlike ours, are not under this lock): re-check
            store.refresh()
            live = (set(store.state.segments) | set(store.state.consumequeue_files)
                    | set(store.state.index_files))
            result.keep_only({f for f in result.files if f not in live})
        result.dry_run = dry_run
        if not dry_run:
            with Progress(len(result.files), f"vacuum {store.url}", unit="files") as p:
                for rel in result.files:
                    store.sfs.delete(rel)
                    p.advance()
            log.info("vacuum of %s deleted %d files (%d bytes) older than %d ms",
                     store.url, len(result.files), result.total_bytes, retention_ms)
    return result
