"""The transaction log (``_log/``), modelled on Delta Lake's ``_delta_log``.

Version ``N`` is the file ``_log/<N, 20 digits>.json``: one JSON action per
line, written with put-if-absent so exactly one writer wins each version. A
snapshot is the state after replaying versions ``0..N`` (from the newest
checkpoint on). Every commit carries a ``commitInfo`` whose ``timestamp`` is
monotonic across versions, which is what time travel searches.

Actions (docs/FORMAT.md has a JSON example of each): ``protocol``,
``metaData``, ``topic``, ``add``, ``remove``, ``txn``, ``lease``,
``consumerOffset``, ``retention``, ``subscriptionGroup``, ``commitInfo``.

Writers commit with :meth:`TransactionLog.commit`, giving a function that
builds the actions from the newest snapshot; on a lost race the snapshot is
brought up to date and the function runs again (so offsets are re-assigned
from the winner's state and no data file is rewritten).

Thread-safety: ``TransactionLog`` is safe to share; ``LogState`` objects are
immutable once returned (``apply`` is used only while building them). States
of consecutive versions share their action bodies (``LogState.copy`` copies
the containers, not the actions). The state holds the typed, frozen values of
:mod:`sparkmq.log.actions`; ``dataclasses.replace`` makes a changed copy.
"""
from __future__ import annotations

import json
import logging
import time

import crc32c
from typing import Callable

from ..errors import (CommitConflictError, CorruptStoreError, InvalidConfigError,
                      StoreNotFoundError, UnsupportedFormatError, VersionNotFoundError)
from ..errors import StoreIOError
from . import format as fmt
from . import checkpoint
from .actions import (decode_actions, encode_actions, parse_actions,  # noqa: F401
                      Action, CommitInfo, Protocol, Sidecar, parse_action,
                      protocol_at_least)
from .fs import StoreFS
from .state import LogState  # noqa: F401  (re-exported: the log's state type)

log = logging.getLogger("sparkmq.txlog")

def checkpoint_checksum(body: bytes) -> str:
    """``crc32c:<8 hex>`` of a checkpoint's lines before its final commitInfo."""
    return f"crc32c:{crc32c.crc32c(body):08x}"


def check_writer_version(state: LogState, url: str) -> None:
    """Refuse to write a store whose ``protocol.minWriterVersion`` is above the
    writer version this code implements (FORMAT.md section 1): raises
    ``UnsupportedFormatError``. Reading such a store is still allowed."""
    need = int(state.protocol.min_writer_version) if state.protocol else 1
    if need > fmt.WRITER_VERSION:
        raise UnsupportedFormatError(
            f"store {url!r} needs writer version {need}; this sparkmq writes version "
            f"{fmt.WRITER_VERSION}. Open it read-only (mode='r') or upgrade sparkmq to write it.")


def _protocol_upgrade(state: LogState) -> Protocol | None:
    """The ``protocol`` this writer adds to its first commit on a store whose
    ``minReaderVersion`` is below ``format.MIN_READER_VERSION`` (its checkpoints are
    manifests, which older readers would misread: FORMAT.md section 1); else None."""
    return protocol_at_least(state.protocol, fmt.MIN_READER_VERSION)


# how long past its deletion time a tombstone stays in checkpoints: a writer deletes a
# removed file within a retention tick (10 s) of it being due; one that was down longer
# leaves the file to the next writer (tombstone still there) or to vacuum (by mtime)
TOMBSTONE_EXTRA_MS = 10 * 60_000
# log cleanup lists _log/: at most once per this long (and per tenth of the retention)
LOG_CLEANUP_INTERVAL_MS = 3_600_000


class TransactionLog:
    """Reads and commits the numbered versions under ``_log/``.

    Every ``checkpoint_interval_versions`` versions the committer writes a
    checkpoint (keeping ``remove`` tombstones for ``deleted_file_retention_ms +
    TOMBSTONE_EXTRA_MS`` after their deletion time) and then cleans up the log:
    commit files and checkpoints below the newest checkpoint that is older than
    ``log_retention_ms`` are deleted (:meth:`cleanup_log`). Both settings are the
    lease holder's (``Store`` passes its config); left None (other committers,
    e.g. a Spark driver, which do not know them), checkpoints keep every tombstone
    and the log is not cleaned."""

    def __init__(self, sfs: StoreFS, *, checkpoint_interval_versions: int = 10,
                 clock_ms: Callable[[], int] | None = None,
                 deleted_file_retention_ms: int | None = None,
                 log_retention_ms: int | None = None,
                 sidecar_max_age_versions: int = checkpoint.SIDECAR_MAX_AGE_VERSIONS):
        self.sfs = sfs
        self.sidecar_max_age_versions = sidecar_max_age_versions
        self.checkpoint_interval_versions = checkpoint_interval_versions
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.deleted_file_retention_ms = deleted_file_retention_ms
        self.log_retention_ms = log_retention_ms
        self._last_cleanup_ms: int | None = None

    # -- reading -----------------------------------------------------------
    def exists(self) -> bool:
        """A store is here: version 0, or (after log cleanup) any commit file."""
        return self.sfs.exists(fmt.commit_file(0)) or bool(self.versions())

    def versions(self) -> list[int]:
        names = self.sfs.list_names(fmt.LOG_DIR)
        return sorted(v for v in (fmt.parse_commit_file(n) for n in names) if v is not None)

    def latest_version(self) -> int:
        versions = self.versions()
        return versions[-1] if versions else -1

    def oldest_version(self) -> int:
        """The oldest version that can still be built: 0, or after log cleanup the
        oldest checkpoint that loads and from which every later commit file is still
        there (-1 for no store). A damaged checkpoint (section 6) is passed over: a
        version only it could build is gone."""
        return self._oldest()[0]

    def _oldest(self) -> tuple[int, LogState | None]:
        """(:meth:`oldest_version`, the state of the checkpoint it is when it is one that
        loads, else None): the checkpoint is read once for both."""
        names = self.sfs.list_names(fmt.LOG_DIR)
        commits = sorted(v for v in (fmt.parse_commit_file(n) for n in names) if v is not None)
        if not commits:
            return -1, None
        if commits[0] == 0:
            return 0, None
        cps = sorted(c for c in (fmt.parse_checkpoint_file(n) for n in names)
                     if c is not None and commits[0] - 1 <= c <= commits[-1])
        for c in cps:
            state = self._load_checkpoint(c)
            if state is not None:
                return c, state
        return (cps[0] if cps else commits[0]), None

    def _cleaned_up_error(self, version: int, oldest: int | None = None
                          ) -> VersionNotFoundError:
        oldest = self.oldest_version() if oldest is None else oldest
        return VersionNotFoundError(
            f"version {version} is no longer in the log: versions older than logRetentionMs "
            f"are cleaned up; the oldest version available is {oldest}: read that version "
            "or a newer one (a longer logRetentionMs keeps more history)")

    def read_version(self, version: int) -> list[dict]:
        """The raw JSON actions of ``version`` as written (see :meth:`read_actions`)."""
        return decode_actions(self._read_commit(version), fmt.commit_file(version))

    def read_actions(self, version: int) -> list[Action]:
        """The typed actions of ``version``; ``VersionNotFoundError`` if it is not there."""
        return parse_actions(self._read_commit(version), fmt.commit_file(version))

    def _read_commit(self, version: int) -> bytes:
        try:
            return self.sfs.read_bytes(fmt.commit_file(version))
        except FileNotFoundError:
            raise VersionNotFoundError(f"version {version} is not in the log") from None

    def _last_checkpoint(self) -> int | None:
        try:
            data = json.loads(self.sfs.read_bytes(fmt.last_checkpoint_file()))
            return int(data["version"])
        except (FileNotFoundError, ValueError, KeyError, json.JSONDecodeError):
            return None

    def _load_checkpoint(self, version: int) -> LogState | None:
        """The state in checkpoint ``version``; None when it is missing or damaged (a
        WARNING names it): not JSON, a malformed action, not ending with its
        ``commitInfo`` CHECKPOINT line (a checkpoint cut at a line boundary), a checksum
        mismatch, or (a manifest) a sidecar missing or not matching its line."""
        rel = fmt.checkpoint_file(version)
        try:
            data = self.sfs.read_bytes(rel)
            actions = parse_actions(data, rel)
            last = actions[-1] if actions else None
            if not isinstance(last, CommitInfo) or last.operation != "CHECKPOINT":
                raise CorruptStoreError(f"{rel} does not end with its CHECKPOINT commitInfo "
                                        "(truncated)")
            want = (last.operation_parameters or {}).get("checksum")
            body = data[:data.rstrip(b"\n").rfind(b"\n") + 1]
            if want is not None and want != checkpoint_checksum(body):
                raise CorruptStoreError(f"{rel}: checksum mismatch (the file was changed "
                                        "after it was written)")
            state = LogState()
            sidecars = [a for a in actions if isinstance(a, Sidecar)]
            for a in actions[:-1]:
                if not isinstance(a, Sidecar):
                    state.apply(a)      # protocol first: an unknown reader version stops here
            if sidecars or (last.operation_parameters or {}).get("parts") is not None:
                checkpoint.load_parts(self.sfs, sidecars, state, rel)
                state.dirty = set()
            state.apply(last)
        except FileNotFoundError:
            return None
        except CorruptStoreError as exc:
            log.warning("store %s: checkpoint %s is damaged (%s); building the state from "
                        "an older checkpoint and the commits after it", self.sfs.url, rel, exc)
            return None
        state.version = version
        return state

    def _checkpoint_state(self, version: int) -> LogState | None:
        """The newest checkpoint at or before ``version`` that loads; None: replay from
        version 0."""
        tried = set()
        last = self._last_checkpoint()
        if last is not None and last <= version:
            tried.add(last)
            state = self._load_checkpoint(last)
            if state is not None:
                return state
        names = self.sfs.list_names(fmt.LOG_DIR)
        for cp in sorted((c for c in (fmt.parse_checkpoint_file(n) for n in names)
                          if c is not None and c <= version and c not in tried), reverse=True):
            state = self._load_checkpoint(cp)
            if state is not None:
                return state
        return None

    def snapshot(self, version: int | None = None, *, timestamp_ms: int | None = None,
                 base: LogState | None = None) -> LogState:
        """The state at ``version`` (default: newest), or the newest at or before
        ``timestamp_ms``. ``base`` (an older state) is brought forward instead of
        starting from a checkpoint."""
        if timestamp_ms is not None:
            version = self.version_at(timestamp_ms)
        latest = self._latest_from(base) if version is None else self.latest_version()
        if latest < 0:
            raise StoreNotFoundError(
                f"no store at {self.sfs.url!r} (no {fmt.LOG_DIR}/ commit 0); "
                "create it with Store.open(url, create=True)")
        if version is None:
            version = latest
        if version < 0 or version > latest:
            raise VersionNotFoundError(
                f"version {version} does not exist; the log has versions up to {latest}")
        if base is not None and base.version == version and version >= 0:
            return base          # immutable once returned: nothing to replay
        state = None
        from_base = False
        if base is not None and base.version <= version:
            state = base.copy()
            from_base = state.version >= 0
        if state is None or state.version < 0:
            state = self._checkpoint_state(version) or LogState()
        v, restarted = state.version + 1, False
        while v <= version:
            try:
                actions = self.read_actions(v)
            except VersionNotFoundError:
                if from_base:   # log cleanup went past the base: start from a checkpoint
                    return self.snapshot(version)
                oldest, newer = self._oldest()
                # a cleanup took the commits after the checkpoint read: start again once
                # from the oldest one left (``_last_checkpoint`` may name one it removes)
                if v < oldest <= version and newer is not None and not restarted:
                    state, v, restarted = newer, oldest + 1, True
                    continue
                if v < oldest:
                    raise self._cleaned_up_error(version, oldest) from None
                raise VersionNotFoundError(
                    f"version {v} is missing from the log (needed to build version {version}); "
                    "it may have been cleaned up: read a newer version") from None
            for a in actions:
                state.apply(a)
            state.version = v
            v += 1
        return state

    def _latest_from(self, base: LogState | None) -> int:
        """The newest version, probed forward (versions are contiguous) from ``base`` or,
        without one, from the ``_last_checkpoint`` pointer: one existence check per
        version past it instead of listing ``_log/``, which grows by a file per commit
        (Delta's way). Lists only when neither start exists."""
        start = base.version if base is not None and base.version >= 0 \
            else self._last_checkpoint()
        if start is None or not self.sfs.exists(fmt.commit_file(start)):
            return self.latest_version()
        latest = start
        while self.sfs.exists(fmt.commit_file(latest + 1)):
            latest += 1
        return latest

    def commit_timestamp(self, version: int) -> int:
        for a in self.read_actions(version):
            if isinstance(a, CommitInfo):
                return int(a.timestamp)
        return 0

    def _version_timestamp(self, version: int) -> int:
        """The commit timestamp of ``version``: from its commit file or, when log cleanup
        deleted that (a checkpoint is the oldest version left), from its checkpoint."""
        try:
            return self.commit_timestamp(version)
        except VersionNotFoundError:
            state = self._load_checkpoint(version)
            if state is None:
                raise
            return state.timestamp_ms

    def version_at(self, timestamp_ms: int) -> int:
        """The newest version committed at or before ``timestamp_ms``."""
        versions = self.versions()
        if not versions:
            raise StoreNotFoundError(f"no store at {self.sfs.url!r}")
        if versions[0] != 0:      # log cleanup: search only versions that can be built
            oldest = self.oldest_version()
            versions = sorted({oldest, *(v for v in versions if v >= oldest)})
        lo, hi = 0, len(versions) - 1
        first_ts = self._version_timestamp(versions[0])
        if first_ts > timestamp_ms:
            if versions[0] != 0:
                raise VersionNotFoundError(
                    f"no version at or before timestamp {timestamp_ms} is left: older versions "
                    f"were cleaned up (logRetentionMs); the oldest version available is "
                    f"{versions[0]}, committed at {first_ts}: read at that time or later "
                    "(a longer logRetentionMs keeps more history)")
            raise VersionNotFoundError(
                f"no version at or before timestamp {timestamp_ms}; the first version was "
                f"committed at {first_ts}: read at that time or later")
        while lo < hi:  # commit timestamps are monotonic
            mid = (lo + hi + 1) // 2
            if self._version_timestamp(versions[mid]) <= timestamp_ms:
                lo = mid
            else:
                hi = mid - 1
        return versions[lo]

    # -- writing -----------------------------------------------------------
    def try_commit(self, version: int, actions: list[Action], *, previous_ts: int,
                   operation: str, parameters: dict | None = None) -> int | None:
        """Write ``version`` if no one has; its commit timestamp, or None if another
        writer won it, or log cleanup deleted it long ago (the file this writer then
        made is deleted again: a version below the oldest is never read, so keeping it
        would lose the commit)."""
        ts = max(self.clock_ms(), previous_ts)
        info = CommitInfo(timestamp=ts, operation=operation,
                          operation_parameters=parameters or {})
        rel = fmt.commit_file(version)
        if not self.sfs.put_if_absent(rel, encode_actions([*actions, info])):
            return None
        if self._cleaned_up_below(version):
            log.warning("store %s: version %d had been cleaned up from the log; the commit "
                        "written there is withdrawn", self.sfs.url, version)
            self.sfs.delete(rel)
            return None
        return ts

    def _cleaned_up_below(self, version: int) -> bool:
        """True when ``version``, just written, is below what log cleanup left: the
        version before it is gone (cleanup deletes oldest first and never the commit
        file of the checkpoint it keeps, so a fresh commit's predecessor is there) or,
        for version 0, a checkpoint was already written (only an older log has one)."""
        if version == 0:
            return any(fmt.parse_checkpoint_file(n) is not None
                       for n in self.sfs.list_names(fmt.LOG_DIR))
        return not self.sfs.exists(fmt.commit_file(version - 1))

    def commit(self, build: Callable[[LogState], list[Action] | None], *,
               operation: str, parameters: dict | None = None,
               state: LogState | None = None, retries: int = 50) -> LogState:
        """Commit the actions ``build(state)`` returns at the next version.

        ``build`` sees the newest snapshot and may raise to refuse; it returns
        None to commit nothing. A store whose ``minWriterVersion`` is above
        ``format.WRITER_VERSION`` is refused (``UnsupportedFormatError``). On a lost race the snapshot is refreshed and
        ``build`` runs again, up to ``retries`` times. Returns the state after
        the commit (or the fresh state if nothing was committed).
        """
        state = self.snapshot(base=state)
        for attempt in range(retries + 1):
            check_writer_version(state, self.sfs.url)
            actions = build(state)
            if actions is None:
                return state
            actions = [parse_action(a, operation) if type(a) is dict else a for a in actions]
            upgrade = _protocol_upgrade(state)
            if upgrade is not None:
                actions = [upgrade, *actions]
            version = state.version + 1
            ts = self.try_commit(version, actions, previous_ts=state.timestamp_ms,
                                 operation=operation, parameters=parameters)
            if ts is not None:
                new = state.copy()
                for a in actions:
                    new.apply(a)
                new.version = version
                new.timestamp_ms = ts
                self._maybe_checkpoint(new)
                return new
            log.debug("lost the race for version %d (attempt %d); refreshing", version, attempt)
            state = self.snapshot(base=state)
            if attempt > 3:
                time.sleep(min(0.2, 0.002 * (2 ** min(attempt, 7))))
        raise CommitConflictError(
            f"{operation}: other writers won {retries + 1} versions in a row; try again")

    def create(self, actions: list[Action]) -> LogState:
        """Write version 0 (a new store); raises if one exists."""
        if self.try_commit(0, actions, previous_ts=0, operation="CREATE STORE") is None:
            raise CommitConflictError("another writer created this store at the same time")
        return self.snapshot(0)

    def _maybe_checkpoint(self, state: LogState) -> None:
        """At every checkpoint interval: drop old tombstones from ``state`` (just
        built by commit, not yet returned), write the checkpoint, clean up the log.

        The commit has landed when this runs, so a checkpoint that cannot be written
        (a full disk, EIO) is logged, not raised: the caller would take its committed
        version for a failed one (and, like publish, delete the files it adds).
        Checkpoints are an optimization (FORMAT.md section 6); ``state`` keeps its
        base parts and changed keys, so the next one writes what this one did not."""
        if state.version == 0 or state.version % self.checkpoint_every(state):
            return
        if self.deleted_file_retention_ms is not None:
            state.prune_tombstones(state.timestamp_ms - self.deleted_file_retention_ms
                                   - TOMBSTONE_EXTRA_MS)
        try:
            self.write_checkpoint(state)
        except StoreIOError:   # the commit stands; the next checkpoint interval retries
            log.exception("store %s: checkpoint %d not written; version %d is committed "
                          "and readers replay it from an older checkpoint", self.sfs.url,
                          state.version, state.version)
            return
        if self.log_retention_ms is None:
            return
        now = self.clock_ms()
        interval = min(LOG_CLEANUP_INTERVAL_MS, max(1, self.log_retention_ms // 10))
        if self._last_cleanup_ms is None or now - self._last_cleanup_ms >= interval:
            self._last_cleanup_ms = now
            try:
                self.cleanup_log(now)
            except StoreIOError:   # best effort: the next checkpoint tries again
                log.exception("log cleanup of %s failed", self.sfs.url)

    def cleanup_log(self, now_ms: int | None = None) -> list[str]:
        """Delete commit files and checkpoints older than ``log_retention_ms``, but
        only below the newest checkpoint that is itself older than that, so every
        version kept can be built from a kept checkpoint. Commit files go oldest
        first (what remains is always contiguous). Sidecars go when no kept checkpoint
        can name them: written for a version ``sidecar_max_age_versions`` or more
        below that checkpoint (checkpoint.py). Returns the deleted names."""
        if self.log_retention_ms is None:
            raise InvalidConfigError("cleanup_log needs log_retention_ms (logRetentionMs)")
        now = self.clock_ms() if now_ms is None else now_ms
        cutoff = now - self.log_retention_ms
        names = self.sfs.list_names(fmt.LOG_DIR)
        commits = sorted(v for v in (fmt.parse_commit_file(n) for n in names) if v is not None)
        all_cps = sorted(c for c in (fmt.parse_checkpoint_file(n) for n in names)
                         if c is not None)
        have = set(commits)
        cps = [c for c in all_cps if c in have]    # (its commit file has its timestamp)
        lo, hi, newest = 0, len(cps) - 1, -1
        while lo <= hi:   # commit timestamps are monotonic: binary search
            mid = (lo + hi) // 2
            if self.commit_timestamp(cps[mid]) <= cutoff:
                newest, lo = mid, mid + 1
            else:
                hi = mid - 1
        # the newest old-enough checkpoint that loads: a damaged one (section 6) builds
        # nothing, so the files below it are still needed
        keep_from = next((c for c in reversed(cps[:newest + 1])
                          if self._load_checkpoint(c) is not None), None)
        if keep_from is None:
            return []
        deleted = []
        # checkpoints first: a crash part way then leaves every commit file, and once a
        # commit file is gone no checkpoint below keep_from is left for a reader (or a
        # stale _last_checkpoint) to start from and then miss a commit after it
        for c in all_cps:
            if c < keep_from:
                self.sfs.delete(fmt.checkpoint_file(c))
                deleted.append(fmt.checkpoint_file(c))
        for v in commits:
            if v >= keep_from:
                break
            self.sfs.delete(fmt.commit_file(v))
            deleted.append(fmt.commit_file(v))
        # sidecars no kept checkpoint can name (written max-age versions before it)
        for name in checkpoint.unreferenced(self.sfs.list_names(fmt.SIDECAR_DIR), keep_from,
                                            self.sidecar_max_age_versions):
            self.sfs.delete(f"{fmt.SIDECAR_DIR}/{name}")
            deleted.append(f"{fmt.SIDECAR_DIR}/{name}")
        if deleted:
            log.info("log cleanup of %s: deleted %d files below version %d", self.sfs.url,
                     len(deleted), keep_from)
        return deleted

    def checkpoint_every(self, state: LogState) -> int:
        """Versions between checkpoints: ``checkpointInterval``, whatever the state's size
        (a checkpoint rewrites only the parts changed since the previous one)."""
        return self.checkpoint_interval_versions

    def write_checkpoint(self, state: LogState) -> dict:
        """Write checkpoint ``state.version`` (FORMAT.md section 6): the changed parts'
        sidecars, then the manifest (protocol, metaData, lease, a ``sidecar`` line per
        part, a CHECKPOINT commitInfo with the CRC32C of the lines before it); then point
        ``_last_checkpoint`` at it. ``state`` (not yet returned to anyone) takes the new
        parts as its base. Returns what was written ({"written", "bytes", "entries"})."""
        lines, parts, stats = checkpoint.write_parts(self.sfs, state,
                                                     self.sidecar_max_age_versions)
        head = [a for a in (state.protocol, state.metadata, state.lease) if a]
        body = encode_actions([*head, *lines])
        info = CommitInfo(timestamp=state.timestamp_ms, operation="CHECKPOINT",
                          operation_parameters={"checksum": checkpoint_checksum(body),
                                                "parts": len(lines)})
        data = body + encode_actions([info])
        self.sfs.put_if_absent(fmt.checkpoint_file(state.version), data)
        state.parts, state.dirty = parts, set()
        stats["bytes"] += len(data)
        last = self._last_checkpoint()
        if last is None or last < state.version:
            self.sfs.replace(fmt.last_checkpoint_file(),
                             json.dumps({"version": state.version}).encode())
        return stats
