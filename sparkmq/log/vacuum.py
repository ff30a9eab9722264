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

import re
from dataclasses import dataclass, field

from ..errors import InvalidConfigError
from . import format as fmt
from .fs import StoreFS
from .txlog import LogState

VACUUM_MIN_RETENTION_MS = 3_600_000          # 1 h: refused below, unless forced
DEFAULT_VACUUM_RETENTION_MS = 7 * 24 * 3_600_000

_DATA_DIRS = (fmt.COMMITLOG_DIR, fmt.CONSUMEQUEUE_DIR, fmt.INDEX_DIR)
# file names the store makes under the data folders (FORMAT.md section 2), and the
# temporary files of a write that died half way
_STORE_NAME = re.compile(r"^(\d{20}\.arrow|w-[A-Za-z0-9_.]{1,64}-[A-Za-z0-9_.]{1,64}-[0-9a-f]{32}"
                         r"\.arrow|[0-9a-f]{32}\.parquet|\.tmp-[0-9a-f]{32})$")


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
        if int(rm.get("deletionTimestamp", 0)) + delay_ms > now_ms:
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
    Lists the three data folders and asks each unreferenced file its age."""
    live = _live(state)
    end = state.address_end()
    cutoff = now_ms - retention_ms
    result = VacuumResult(retention_ms=retention_ms)
    for folder in _DATA_DIRS:
        for name in sfs.list_names(folder):
            rel = f"{folder}/{name}"
            if rel in live or rel in protect or not _STORE_NAME.match(name):
                continue
            base = fmt.parse_segment_file(name) if folder == fmt.COMMITLOG_DIR else None
            if base is not None and base >= end:
                continue           # a writer's unpublished tail: recovery reads it
            rm = state.tombstones.get(rel)
            try:
                when_ms = (int(rm.get("deletionTimestamp", 0)) if rm is not None
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
