"""Committers: how staged segment files (written by Spark tasks) join a store.

A writer task stages a sealed segment file under ``commitlog/w-<job>-...``
(:func:`sparkmq.log.format.staged_segment_file`); nothing reads it until a
committer makes it part of the store. The contract of every
:class:`Committer`:

* **Atomic**: all staged files of one ``commit`` become visible in ONE
  transaction-log version, or none do.
* **Idempotent**: with ``(app_id, app_version)``, a version already recorded
  in the log's ``txn`` actions (same app id, version at or above) is skipped
  and reported as ``skipped``; this is what makes streaming writes exactly
  once (app id = the query's writer id, version = the micro-batch id).
* **Offsets are assigned at commit**: segment files never hold queue
  offsets. Each staged segment is placed in the CommitLog's address space and
  its rows get queue offsets that continue every (topic, queue); on a lost
  race both are re-assigned from the winner's state and no data file is
  rewritten (only the small ConsumeQueue and Index side files are).

Who commits (:func:`committer_for`):

* no live writer lease -> :class:`DirectCommitter` (the driver commits through
  the transaction log with put-if-absent, re-read and retry);
* the lease advertises an admin ``endpoint`` (a broker,
  ``Store.advertise_endpoint``) -> :class:`BrokerCommitter`: ``POST
  <endpoint>/admin/adopt``; the broker answers with ``Store.adopt``;
* the lease is held by a :class:`~sparkmq.log.store.Store` open for writing
  in this process, without an endpoint -> :class:`StoreCommitter` (``Store.adopt``);
* any other live holder -> :class:`BrokerCommitter` without an endpoint, which
  refuses with :class:`~sparkmq.errors.StoreLockedError`.

A lease that was never released and whose holder is gone (a crash) makes
every committer refuse with :class:`~sparkmq.errors.UncleanWriterError`: the
crashed writer's unpublished CommitLog tail must be recovered first (open the
store for writing once), else staged segments would be placed over it.

This module imports neither pyspark nor anything network-bound except
``urllib`` for the broker hand-off. Thread-safety: every committer may be used
from several threads; concurrent commits from several processes are safe
(put-if-absent picks one winner per version, the others retry).
"""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Protocol, Sequence


from .. import errors
from ..config import DEFAULT_COMMIT_RETRIES
from ..admin_auth import auth_headers, client_ssl_context, find_token
from ..errors import InvalidConfigError, StoreLockedError, UncleanWriterError
from . import format as fmt
from .consumequeue import consumequeue_add, write_side_table
from .fs import StoreFS
from .adopt import (Placement, check_staged_topics, load_staged, new_staged_paths, place,
                    replayed)
from .dispatch import next_queue_offsets  # noqa: F401  (re-exported)
from .index import index_add
from .names import validate_group
from .actions import AddFile, Lease, Txn
from .lease import (LEASE_CRASHED, LEASE_FREE, LEASE_LIVE,  # noqa: F401  (re-exported)
                    lease_status, live_writer, local_token)
from .batch import writable_topic_conf
from .status import CommitResult
from .topics import consumer_offset_actions
from .txlog import LogState, TransactionLog, check_writer_version

log = logging.getLogger("sparkmq.committer")

SIDE_TABLE_ROW_GROUP_ROWS = 65_536
COMMIT_RETRIES = DEFAULT_COMMIT_RETRIES
BROKER_TIMEOUT_S = 120.0
#: the lease holder's admin route that adopts staged files (served by sparkmq.broker)
ADOPT_PATH = "/admin/adopt"


class Committer(Protocol):
    """Makes staged segment files part of a store (see the module docstring)."""

    def check(self) -> None:
        """Raise now if a commit would certainly be refused (locked or unclean store).

        Called on the Spark driver before any task writes, so errors come early."""

    def commit(self, staged_paths: list[str], *, app_id: str | None,
               app_version: int | None) -> CommitResult:
        """Make every staged file visible in one log version, or none of them."""


# ---------------------------------------------------------------------- leases
def _unclean_error(url: str, lease: Lease) -> UncleanWriterError:
    return UncleanWriterError(
        f"store {url}: the last writer ({lease.owner}, epoch {lease.epoch}) "
        "stopped without releasing its lease (a crash); its unpublished CommitLog tail must "
        "be recovered first: open the store for writing once (sparkmq.Store.open(url, "
        "mode='w').close()), then retry the write")


def _locked_error(url: str, lease: Lease) -> StoreLockedError:
    return StoreLockedError(
        f"store {url}: a broker/writer holds the store ({lease.owner}, epoch "
        f"{lease.epoch}); commit through it, or stop it and retry")


# ---------------------------------------------------------------------- direct
class DirectCommitter:
    """Commits staged segments straight through the transaction log (no broker).

    Runs on the Spark driver (or any process). Refuses while a writer lease is
    live (:class:`StoreLockedError`) or was left by a crash
    (:class:`UncleanWriterError`). Safe to share between threads; any number of
    DirectCommitters in any processes may commit at once.
    """

    def __init__(self, url: str, storage_options: dict | None = None, *,
                 retries: int = COMMIT_RETRIES):
        self.url = url
        self.sfs = StoreFS(url, storage_options)
        self.txlog = TransactionLog(self.sfs)
        self.retries = retries

    def check(self) -> None:
        state = self.txlog.snapshot()
        check_writer_version(state, self.url)
        self._check_lease(state)

    def _check_lease(self, state: LogState) -> None:
        status = lease_status(state.lease, self.txlog.clock_ms())
        if status == LEASE_LIVE:
            raise _locked_error(self.url, state.lease)
        if status == LEASE_CRASHED:
            raise _unclean_error(self.url, state.lease)

    def commit(self, staged_paths: Sequence[str], *, app_id: str | None = None,
               app_version: int | None = None) -> CommitResult:
        """Commit ``staged_paths`` in one version (see the module docstring)."""
        if (app_id is None) != (app_version is None):
            raise InvalidConfigError("app_id and app_version go together (both or neither)")
        paths = new_staged_paths(staged_paths, ())
        staged: list = []                  # read once, on the first try that is no replay
        written: list[str] = []
        outcome: dict = {}

        def build(state: LogState):
            self.sfs.delete_many(written)      # a lost race: drop the loser's side files
            written.clear()
            self._check_lease(state)
            if replayed(state.txns, app_id, app_version):   # (its files may be gone)
                outcome["skipped"] = True
                return None
            new_staged_paths(paths, state.segments)
            if not staged:
                staged.extend(load_staged(self.sfs, p) for p in paths)
            check_staged_topics(staged, lambda name, path: writable_topic_conf(
                state.topics, name, where=f"{path}: ", store=self.url, then="and rerun the write"))
            now = self.txlog.clock_ms()
            placed = place(state, staged, now)
            actions = list(placed.segment_adds)
            actions.extend(self._write_side_files(placed, written))
            if app_id is not None:
                actions.append(Txn(app_id=app_id, version=int(app_version), last_updated=now))
            outcome["messages"] = placed.num_messages
            return actions

        try:
            state = self.txlog.commit(build, operation="WRITE", retries=self.retries,
                                      parameters={"files": len(paths), "appId": app_id,
                                                  "appVersion": app_version})
        except BaseException:
            if not self._committed(written):
                self.sfs.delete_many(written)
            raise
        if outcome.get("skipped"):
            log.info("store %s: %s version %s already committed; skipped", self.url, app_id,
                     app_version)
            return CommitResult(state.version, 0, skipped=True)
        return CommitResult(state.version, int(outcome.get("messages", 0)))

    def _write_side_files(self, placed: Placement, written: list[str]) -> list[AddFile]:
        actions = []
        if placed.cq_table.num_rows:
            rel = fmt.consumequeue_file()
            written.append(rel)
            size = write_side_table(self.sfs, rel, placed.cq_table,
                                    row_group_rows=SIDE_TABLE_ROW_GROUP_ROWS)
            actions.append(consumequeue_add(rel, placed.cq_table, size))
        if placed.index_table is not None:
            rel = fmt.index_file()
            written.append(rel)
            size = write_side_table(self.sfs, rel, placed.index_table,
                                    row_group_rows=SIDE_TABLE_ROW_GROUP_ROWS)
            actions.append(index_add(rel, placed.index_table, size))
        return actions

    def _committed(self, side_files: list[str]) -> bool:
        """True if a side file of ours made it into the newest version (the commit won)."""
        if not side_files:
            return False
        try:
            state = self.txlog.snapshot()
        except Exception:   # any failure to read means "cannot tell": keep the files (orphans
            #               are harmless, deleting a committed file loses data)
            log.warning("cannot tell whether a commit won; keeping its files", exc_info=True)
            return True
        return any(f in state.consumequeue_files or f in state.index_files for f in side_files)


# ---------------------------------------------------------------------- in-process store
class StoreCommitter:
    """Hands the commit to a Store open for writing in this process (``Store.adopt``)."""

    def __init__(self, store):
        self.store = store
        self.url = store.url

    def check(self) -> None:
        self.store.require_writable()

    def commit(self, staged_paths: Sequence[str], *, app_id: str | None = None,
               app_version: int | None = None) -> CommitResult:
        return self.store.adopt(list(staged_paths), app_id=app_id, app_version=app_version)


# ---------------------------------------------------------------------- broker
class BrokerCommitter:
    """Hands the commit to the broker holding the store's writer lease.

    The broker records its admin endpoint (``http://host:port``) as
    ``endpoint`` in its lease action. The hand-off is one HTTP request::

        POST <endpoint>/admin/adopt
        {"url": ..., "paths": [...], "appId": ... | null, "appVersion": ... | null}
        -> 200 {"version": N, "numMessages": M, "skipped": false}
        -> 4xx/5xx {"code": "SPARKMQ_...", "message": "..."}  (raised as that error class)

    with the broker's admin token as ``Authorization: Bearer`` (``SPARKMQ_ADMIN_TOKEN``,
    else ``admin.token`` in a local store's folder: ``sparkmq.admin_auth``),
    and the broker answers it with ``Store.adopt`` (same atomicity and
    idempotence). Without an endpoint (a broker that predates it, or a plain
    ``Store`` in another process) the commit is refused with StoreLockedError.
    """

    def __init__(self, url: str, lease: Lease | dict, *, timeout_s: float = BROKER_TIMEOUT_S):
        self.url = url
        # a lease action's body as JSON is parsed at this boundary
        self.lease = lease = Lease.from_body(lease) if isinstance(lease, dict) else lease
        self.endpoint = lease.endpoint
        self.timeout_s = timeout_s

    def check(self) -> None:
        if not self.endpoint:
            raise StoreLockedError(
                f"store {self.url}: a broker/writer holds the store ({self.lease.owner}, "
                f"epoch {self.lease.epoch}) and publishes no admin endpoint; commit "
                "through it (the broker commit path arrives with the broker), or stop it "
                "and retry")

    def commit(self, staged_paths: Sequence[str], *, app_id: str | None = None,
               app_version: int | None = None) -> CommitResult:
        self.check()
        body = json.dumps({"url": self.url, "paths": list(staged_paths), "appId": app_id,
                           "appVersion": app_version}).encode()
        token = find_token(store_url=self.url)
        req = urllib.request.Request(self.endpoint.rstrip("/") + ADOPT_PATH, data=body,
                                     headers={"Content-Type": "application/json",
                                              **auth_headers(token)},
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s,
                                        context=client_ssl_context()) as resp:
                out = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise _broker_error(self.endpoint, exc.code, exc.read()) from None
        except (urllib.error.URLError, OSError) as exc:
            raise StoreLockedError(f"broker at {self.endpoint} did not answer the commit: "
                                   f"{exc}; the staged files are kept, retry") from None
        return CommitResult(int(out["version"]), int(out.get("numMessages", 0)),
                            skipped=bool(out.get("skipped")))


def _error_classes(root: type = errors.SparkMQError) -> dict[str, type]:
    out = {root.code: root}
    for sub in root.__subclasses__():
        out.update(_error_classes(sub))
    return out


def _broker_error(endpoint: str, status: int, body: bytes) -> errors.SparkMQError:
    """The sparkmq error a broker's JSON reply names (``{"code", "message"}``)."""
    try:
        reply = json.loads(body)
        code, message = reply["code"], reply["message"]
    except (ValueError, KeyError, TypeError):
        code, message = None, body.decode(errors="replace")[:500]
    cls = _error_classes().get(code)
    if cls is None or cls is errors.DataLossError:
        cls = errors.RetriableError if status in (409, 503) else errors.StoreError
    return cls(f"broker at {endpoint} refused the commit ({status}): {message}")


def committer_for(url: str, storage_options: dict | None = None) -> Committer:
    """The committer for the store's current lease holder (see the module docstring).

    A crashed holder yields a DirectCommitter, which refuses with UncleanWriterError.
    """
    direct = DirectCommitter(url, storage_options)
    state = direct.txlog.snapshot()
    check_writer_version(state, url)
    lease = state.lease
    if lease_status(lease, direct.txlog.clock_ms()) != LEASE_LIVE:
        return direct
    if lease.endpoint:
        return BrokerCommitter(url, lease)
    token = local_token(lease)
    store = live_writer(token) if token is not None else None
    if store is not None:
        return StoreCommitter(store)
    return BrokerCommitter(url, lease)


# ---------------------------------------------------------------------- offsets, cleanup
def commit_consumer_offsets(url: str, group: str, offsets: dict[tuple[str, int], int],
                            storage_options: dict | None = None, *,
                            client_id: str | None = None) -> int:
    """Record ``group``'s next offsets per (topic, queue_id) in one log version.

    Allowed while a broker holds the lease: consumerOffset actions do not
    conflict with its commits (it re-reads the log on its next commit).
    Returns the committed version (or the current one if ``offsets`` is empty).
    """
    validate_group(group)
    txlog = TransactionLog(StoreFS(url, storage_options))

    def build(state: LogState):
        return consumer_offset_actions(state, group, offsets, client_id, where=f" in {url}")
    return txlog.commit(build, operation="COMMIT OFFSETS", parameters={"group": group},
                        retries=COMMIT_RETRIES).version


def uncommitted_staged_files(url: str, job_id: str, *,
                             storage_options: dict | None = None) -> list[str]:
    """Staged files of ``job_id`` that no committed version of the newest state lists."""
    sfs = StoreFS(url, storage_options)
    prefix = fmt.staged_prefix(job_id)
    folder, _, name_prefix = prefix.rpartition("/")
    names = [n for n in sfs.list_names(folder) if n.startswith(name_prefix)]
    if not names:
        return []
    state = TransactionLog(sfs).snapshot()
    return [f"{folder}/{n}" for n in names if f"{folder}/{n}" not in state.segments]


def abort_job(url: str, job_id: str, *, storage_options: dict | None = None,
              paths: Sequence[str] = ()) -> list[str]:
    """Delete the job's staged files (its prefix, plus ``paths``) that are not committed.

    Files a committed version lists are never deleted, so calling this after a
    commit that did succeed is harmless. Returns the deleted paths.
    """
    sfs = StoreFS(url, storage_options)
    doomed = set(uncommitted_staged_files(url, job_id, storage_options=storage_options))
    extra = [p for p in paths if p and fmt.is_relative_store_path(p)
             and p.startswith(fmt.COMMITLOG_DIR + "/w-")]
    if extra:
        state = TransactionLog(sfs).snapshot()
        doomed.update(p for p in extra if p not in state.segments)
    sfs.delete_many(sorted(doomed))
    return sorted(doomed)
