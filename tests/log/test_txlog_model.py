"""Model-based test of the transaction log with several writers (hypothesis stateful).

Three ``TransactionLog`` objects over one store folder play a broker (lease holder: it
prunes tombstones and cleans the log), a Spark driver and a second direct committer, each
with its own ``StoreFS``, a skewed manual clock and a state it keeps between commits
(stale when others committed). Rules: commits built from a writer's state through
``commit(build)``, also with another writer's commit forced in between attempts (a lost
race); ``try_commit`` at a taken or cleaned-up version; explicit checkpoints; log cleanup
at a moving clock, also cut short by a crash; crashes mid-commit and mid-checkpoint (temp
files, a commit without its checkpoint, sidecars without a manifest, a manifest without
``_last_checkpoint``); damaged (partial) checkpoints; fresh readers.

The model keeps, per version, the actions its winner built from the model's own state
before that version (the same client logic run on the model), its commit id and its
timestamp. Invariants after every step: the commit files hold exactly those actions (so a
commit rebuilt after a lost race was re-derived from the winner's state, and every commit
is in exactly one version); timestamps never go back; every writer's state and fresh
readers' snapshots of retained versions equal the model's; ``version_at`` answers the
newest version at or before a time; cleaned-up versions raise ``VersionNotFoundError``
naming the oldest one left; cleanup keeps a loadable checkpoint under every kept version.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from dataclasses import replace

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from helpers.clock import Clock
from sparkmq.errors import VersionNotFoundError
from sparkmq.log import checkpoint
from sparkmq.log import format as fmt
from sparkmq.log.actions import (AddFile, CommitInfo, ConsumerOffset, GroupConfig, Lease,
                                 Protocol, RemoveFile, Retention, TopicConfig, Txn,
                                 parse_actions)
from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TOMBSTONE_EXTRA_MS, TransactionLog

LOG_RETENTION_MS = 10_000
FILE_RETENTION_MS = 2_000
SIDECAR_MAX_AGE = 6          # small, so sidecar cleanup and stale rewrites happen
SKEW_MS = (0, -700, 400)     # writer clocks: broker, Spark driver, another committer
INTERVALS = (3, 3, 4)        # checkpoint_interval_versions per writer
PROTOCOL = Protocol(min_reader_version=fmt.MIN_READER_VERSION,
                    min_writer_version=fmt.MIN_WRITER_VERSION)
KINDS = ("topic_new", "topic_update", "segment", "cq", "index", "remove", "offset", "txn",
         "lease", "retention", "group")
intents = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 30)), max_size=4)
writers = st.integers(0, 2)


# ---------------------------------------------------------------- the model
class Model:
    """The state at one version, replayed by the test's own rules (FORMAT.md section 7)."""

    def __init__(self):
        self.version, self.ts = -1, 0
        self.topics_by_id, self.files, self.tombstones = {}, {}, {}
        self.txns, self.offsets, self.groups = {}, {}, {}
        self.lease = self.retention = None

    def copy(self) -> "Model":
        m = Model()
        m.__dict__.update({k: (dict(v) if isinstance(v, dict) else v)
                           for k, v in self.__dict__.items()})
        return m

    @classmethod
    def of(cls, s) -> "Model":
        """A LogState seen through the model's fields (what a writer builds from)."""
        m = cls()
        m.version, m.ts = s.version, s.timestamp_ms
        m.topics_by_id = dict(s.topics_by_id)
        m.files = {**s.segments, **s.consumequeue_files, **s.index_files}
        m.tombstones, m.txns = dict(s.tombstones), dict(s.txns)
        m.offsets, m.groups = dict(s.consumer_offsets), dict(s.subscription_groups)
        m.lease, m.retention = s.lease, s.retention
        return m

    def apply(self, a) -> None:
        if isinstance(a, TopicConfig):
            self.topics_by_id[a.id] = a
        elif isinstance(a, AddFile):
            self.files[a.path] = a
            self.tombstones.pop(a.path, None)
        elif isinstance(a, RemoveFile):
            self.files.pop(a.path, None)
            self.tombstones[a.path] = a
        elif isinstance(a, ConsumerOffset):
            if a.offset is None:
                self.offsets.pop(a.key, None)
            else:
                self.offsets[a.key] = a.offset
        elif isinstance(a, Txn):
            self.txns[a.app_id] = a
        elif isinstance(a, Lease):
            self.lease = a
        elif isinstance(a, Retention):
            self.retention = a
        elif isinstance(a, GroupConfig):
            if a.deleted:
                self.groups.pop(a.group_name, None)
            else:
                self.groups[a.group_name] = a

    def address_end(self) -> int:
        end = self.retention.min_physical_offset if self.retention else 0
        for a in self.files.values():
            if a.kind == "segment":
                end = max(end, a.base_offset + a.size)
        return end


def _make(kind: str, n: int, m: Model, writer: int, tag: str, now: int):
    """One action of ``kind`` derived from state ``m`` (None when it does not apply)."""
    if kind == "topic_new":
        tid = max(m.topics_by_id, default=-1) + 1
        return TopicConfig(name=f"t{tid}", id=tid, read_queue_nums=1 + n % 4,
                           write_queue_nums=1 + n % 4, created_time=now)
    if kind == "topic_update":
        live = sorted(i for i, t in m.topics_by_id.items() if not t.deleted)
        if not live:
            return None
        t = m.topics_by_id[live[n % len(live)]]
        return replace(t, read_queue_nums=t.read_queue_nums + 1, deleted=n % 4 == 0)
    if kind == "segment":
        base = m.address_end()
        return AddFile(path=fmt.segment_file(base), kind="segment", size=50 + n,
                       base_offset=base, sealed=True, modification_time=now)
    if kind == "cq":
        return AddFile(path=f"consumequeue/{tag}.parquet", kind="consumequeue",
                       size=10 + n, rows=n)
    if kind == "index":
        return AddFile(path=f"index/{tag}.parquet", kind="index", size=20 + n, rows=n,
                       topic_ids=(n % 3,))
    if kind == "remove":
        live = sorted(m.files)
        if not live:
            return None
        return RemoveFile(path=live[n % len(live)], deletion_timestamp=now, data_change=True)
    if kind == "offset":
        key = dict(group=f"g{n % 2}", topic_id=n % 2, queue_id=n % 3,
                   client_id="c1" if n % 5 == 0 else None)
        cur = m.offsets.get((key["group"], key["topic_id"], key["queue_id"],
                             key["client_id"] or ""))
        if n % 7 == 6 and cur is not None:
            return ConsumerOffset(offset=None, **key)
        return ConsumerOffset(offset=(cur or 0) + 1 + n % 5, **key)
    if kind == "txn":
        app = f"app{n % 2}"
        return Txn(app_id=app, version=m.txns[app].version + 1 if app in m.txns else 0,
                   last_updated=now)
    if kind == "lease":
        return Lease(owner=f"w{writer}", epoch=(m.lease.epoch if m.lease else 0) + 1,
                     acquired_time=now, expires_time=now + 30_000)
    if kind == "retention":
        cur = m.retention.min_physical_offset if m.retention else 0
        return Retention(min_physical_offset=cur + n, time=now)
    return GroupConfig(group_name=f"g{n % 3}", retry_max_times=n % 16, deleted=n % 5 == 4)


def build_actions(spec, m: Model, writer: int, cid: str, now: int) -> list:
    """The actions a writer commits for ``spec`` on state ``m`` (each sees the ones before)."""
    m = m.copy()
    out = []
    for i, (kind, n) in enumerate(spec):
        a = _make(kind, n, m, writer, f"{cid}-{i}", now)
        if a is not None:
            out.append(a)
            m.apply(a)
    return out


def assert_same(s, m: Model, where: str) -> None:
    """A LogState equals the model's state (tombstones: checkpoints may drop old ones)."""
    assert (s.version, s.timestamp_ms) == (m.version, m.ts), where
    assert s.protocol == PROTOCOL and s.metadata.store_id == "model", where
    assert s.topics_by_id == m.topics_by_id, where
    assert s.topics == {t.name: t for t in m.topics_by_id.values() if not t.deleted}, where
    for kind, files in (("segment", s.segments), ("consumequeue", s.consumequeue_files),
                        ("index", s.index_files)):
        assert files == {p: a for p, a in m.files.items() if a.kind == kind}, (where, kind)
    assert s.txns == m.txns and s.consumer_offsets == m.offsets, where
    assert s.subscription_groups == m.groups, where
    assert (s.lease, s.retention) == (m.lease, m.retention), where
    assert all(m.tombstones.get(p) == rm for p, rm in s.tombstones.items()), where
    keep_from = m.ts - FILE_RETENTION_MS - TOMBSTONE_EXTRA_MS
    missing = [p for p, rm in m.tombstones.items()
               if rm.deletion_timestamp >= keep_from and p not in s.tombstones]
    assert not missing, (where, "young tombstones lost", missing)


# ---------------------------------------------------------------- files on disk
def _listing(sfs: StoreFS) -> tuple[list[int], list[int]]:
    names = sfs.list_names(fmt.LOG_DIR)
    return (sorted(v for v in map(fmt.parse_commit_file, names) if v is not None),
            sorted(c for c in map(fmt.parse_checkpoint_file, names) if c is not None))


def _manifest_sidecars(sfs: StoreFS, c: int) -> list[dict] | None:
    """The sidecar lines of manifest ``c`` (None: not whole JSON lines)."""
    try:
        lines = [json.loads(x) for x in sfs.read_bytes(fmt.checkpoint_file(c)).splitlines()]
    except (ValueError, FileNotFoundError):
        return None
    if not lines or "commitInfo" not in lines[-1]:
        return None
    return [x["sidecar"] for x in lines if "sidecar" in x]


class Crash(BaseException):
    """The process dies here."""


class Crashing(StoreFS):
    """A StoreFS whose process dies (an exception) at its ``deletes_left``-th delete."""

    def __init__(self, url, deletes_left: int):
        super().__init__(url)
        self.deletes_left = deletes_left

    def delete(self, rel):
        if self.deletes_left == 0:
            raise Crash()
        self.deletes_left -= 1
        super().delete(rel)


class TxLogModel(RuleBasedStateMachine):
    backend = "local"

    def __init__(self):
        super().__init__()
        self._entries = checkpoint.ENTRIES_PER_PART
        checkpoint.ENTRIES_PER_PART = 2            # several buckets per part, resized often
        if self.backend == "local":
            self.folder = tempfile.mkdtemp(prefix="sparkmq-txmodel-")
            self.url = self.folder + "/store"
        else:
            self.folder, self.url = None, f"memory://sparkmq-txmodel-{uuid.uuid4().hex}"
        self.clock = Clock()
        self.writers = [self._open(w) for w in range(3)]
        self.writers[0].create([PROTOCOL, {"metaData": {"storeId": "model"}}])
        m = Model()
        m.version, m.ts = 0, self.clock()
        self.states = {0: m}                     # version -> model state after it
        self.commits = {0: ("create", [])}       # version -> (commit id, actions)
        self.cached = [None, None, None]         # each writer's state between commits
        self.truncated: set[int] = set()         # checkpoints cut by the test
        self.n = 0

    def _open(self, w: int, sfs: StoreFS | None = None) -> TransactionLog:
        broker = w == 0
        return TransactionLog(sfs or StoreFS(self.url), clock_ms=lambda: self.now(w),
                              checkpoint_interval_versions=INTERVALS[w],
                              deleted_file_retention_ms=FILE_RETENTION_MS if broker else None,
                              log_retention_ms=LOG_RETENTION_MS if broker else None,
                              sidecar_max_age_versions=SIDECAR_MAX_AGE)

    def now(self, w: int) -> int:
        return self.clock() + SKEW_MS[w]

    def teardown(self):
        checkpoint.ENTRIES_PER_PART = self._entries
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            sfs = self.writers[0].sfs
            if sfs.fs.exists(sfs.root):
                sfs.fs.rm(sfs.root, recursive=True)

    @property
    def latest(self) -> int:
        return max(self.states)

    def _cid(self) -> str:
        self.n += 1
        return f"c{self.n}"

    def _record(self, version: int, cid: str, actions: list, ts: int) -> None:
        assert version == self.latest + 1, f"commit {cid} landed at {version}"
        m = self.states[version - 1].copy()
        for a in actions:
            m.apply(a)
        m.version, m.ts = version, ts
        self.states[version] = m
        self.commits[version] = (cid, actions)

    def _expect_ts(self, w: int) -> int:
        return max(self.now(w), self.states[self.latest].ts)

    def _build(self, w, spec, cid):
        seen = []

        def build(state):
            seen.append(state.version)
            return build_actions(spec, Model.of(state), w, cid, self.now(w))
        return build, seen

    # ---------------------------------------------------------------- rules
    @rule(w=writers, spec=intents)
    def commit(self, w, spec):
        cid = self._cid()
        expected = build_actions(spec, self.states[self.latest], w, cid, self.now(w))
        ts = self._expect_ts(w)
        build, _ = self._build(w, spec, cid)
        new = self.writers[w].commit(build, operation="MODEL", parameters={"cid": cid},
                                     state=self.cached[w])
        self._record(new.version, cid, expected, ts)
        self.cached[w] = new

    @rule(a=writers, b=writers, spec_a=intents, spec_b=intents, races=st.integers(1, 2))
    def commit_losing_races(self, a, b, spec_a, spec_b, races):
        """Writer ``a`` loses ``races`` versions to writer ``b`` (b commits while a builds)."""
        cid = self._cid()
        build_a, seen = self._build(a, spec_a, cid)

        def racing_build(state):
            actions = build_a(state)
            if len(seen) <= races:
                self.commit(b, spec_b)
            return actions
        new = self.writers[a].commit(racing_build, operation="MODEL",
                                     parameters={"cid": cid}, state=self.cached[a])
        assert len(seen) == races + 1 and seen[-1] == self.latest, seen
        expected = build_actions(spec_a, self.states[self.latest], a, cid, self.now(a))
        self._record(new.version, cid, expected, self._expect_ts(a))
        self.cached[a] = new

    @rule(w=writers, back=st.integers(0, 40))
    def try_commit_stale(self, w, back):
        """A commit at a version that is taken (or cleaned up) loses and changes nothing."""
        version = max(0, self.latest - back)
        path = fmt.commit_file(version)
        before = self.writers[w].sfs.read_bytes(path) if self.writers[w].sfs.exists(path) \
            else None
        got = self.writers[w].try_commit(version, [Txn(app_id="stale", version=version)],
                                         previous_ts=0, operation="STALE")
        assert got is None, f"try_commit won version {version} (latest {self.latest})"
        after = self.writers[w].sfs.read_bytes(path) if self.writers[w].sfs.exists(path) \
            else None
        assert after == before

    @rule(w=writers, fresh=st.booleans())
    def write_checkpoint(self, w, fresh):
        tl = self.writers[w]
        state = tl.snapshot() if fresh or self.cached[w] is None else self.cached[w]
        if state.version < self._listing()[0][0]:
            return                              # a state older than log cleanup
        tl.write_checkpoint(state.copy())

    @rule(ms=st.sampled_from([0, 1, 500, 3_000, 11_000]))
    def advance_clock(self, ms):
        self.clock.advance(ms)

    @rule(ms=st.sampled_from([0, 2_000, 11_000]))
    def cleanup(self, ms):
        self.clock.advance(ms)
        now = self.now(0)
        commits, cps = self._listing()
        eligible = [c for c in cps if c in commits and self._loadable(c)
                    and self.states[c].ts <= now - LOG_RETENTION_MS]
        self.writers[0].cleanup_log(now)
        after_commits, after_cps = self._listing()
        if eligible:
            keep = max(eligible)
            assert after_commits == list(range(keep, self.latest + 1))
            assert after_cps == [c for c in cps if c >= keep]
        else:
            assert (after_commits, after_cps) == (commits, cps), "cleanup without a checkpoint"

    @rule(deletes=st.integers(0, 6))
    def crash_mid_cleanup(self, deletes):
        tl = self._open(0, Crashing(self.url, deletes))
        try:
            tl.cleanup_log(self.now(0) + 11_000)
        except Crash:
            pass

    @rule(w=writers, spec=intents)
    def crash_after_commit(self, w, spec):
        """A commit file written, then the writer dies (no checkpoint, state gone)."""
        tl = self.writers[w]
        state = tl.snapshot()
        cid = self._cid()
        actions = build_actions(spec, Model.of(state), w, cid, self.now(w))
        expected_ts = self._expect_ts(w)
        ts = tl.try_commit(state.version + 1, actions, previous_ts=state.timestamp_ms,
                           operation="MODEL", parameters={"cid": cid})
        assert ts == expected_ts
        self._record(state.version + 1, cid, actions, ts)
        self.writers[w], self.cached[w] = self._open(w), None

    @rule(w=writers, part=st.sampled_from(["sidecars", "manifest", "tmp"]))
    def crash_mid_checkpoint(self, w, part):
        tl = self.writers[w]
        state = tl.snapshot()
        if part == "sidecars":          # the sidecars are written, then the process dies
            checkpoint.write_parts(tl.sfs, state.copy(), SIDECAR_MAX_AGE)
        elif part == "manifest":        # the manifest too, but not _last_checkpoint
            pointer = fmt.last_checkpoint_file()
            old = tl.sfs.read_bytes(pointer) if tl.sfs.exists(pointer) else None
            tl.write_checkpoint(state.copy())
            if old is None:
                tl.sfs.delete(pointer)
            else:
                tl.sfs.replace(pointer, old)
        elif tl.sfs.is_local:           # a put-if-absent or replace cut before its link
            for folder in (fmt.LOG_DIR, fmt.SIDECAR_DIR):
                tl.sfs.write(f"{folder}/.tmp-{uuid.uuid4().hex}", b'{"add":{"pa')
        self.writers[w], self.cached[w] = self._open(w), None

    @rule(pick=st.integers(0, 1000), how=st.sampled_from(["line", "cut", "sidecar"]))
    def damage_checkpoint(self, pick, how):
        """A checkpoint left partial (cut at or inside a line) or missing a sidecar."""
        commits, cps = self._listing()
        # not the checkpoint the oldest kept commits need (nothing else could build them)
        sfs = self.writers[0].sfs
        needed: set = set()
        base = min((c for c in cps if c >= commits[0] - 1 and self._loadable(c)), default=None)
        if commits[0] > 0 and base is not None:
            cps.remove(base)
            needed = {sc["path"] for sc in _manifest_sidecars(sfs, base) or ()}
        if not cps:
            return
        c = cps[pick % len(cps)]
        data = sfs.read_bytes(fmt.checkpoint_file(c))
        sidecars = [sc for sc in _manifest_sidecars(sfs, c) or () if sc["path"] not in needed]
        if how == "sidecar" and sidecars:
            sfs.delete(sidecars[pick % len(sidecars)]["path"])
            return
        cut = data.rstrip(b"\n").rfind(b"\n") + 1 if how == "line" else len(data) // 2
        sfs.delete(fmt.checkpoint_file(c))
        sfs.write(fmt.checkpoint_file(c), data[:cut])
        self.truncated.add(c)

    @rule(w=writers)
    def restart_writer(self, w):
        self.writers[w], self.cached[w] = self._open(w), None

    @rule(w=writers)
    def refresh(self, w):
        self.cached[w] = self.writers[w].snapshot(base=self.cached[w])
        assert_same(self.cached[w], self.states[self.latest], f"refresh w{w}")

    # ---------------------------------------------------------------- invariants
    def _listing(self):
        return _listing(self.writers[0].sfs)

    def _loadable(self, c: int) -> bool:
        """Checkpoint ``c`` is whole and every sidecar it names is there (test's own view)."""
        sidecars = _manifest_sidecars(self.writers[0].sfs, c)
        return c not in self.truncated and sidecars is not None and all(
            self.writers[0].sfs.exists(sc["path"]) for sc in sidecars)

    @invariant()
    def commit_files_hold_the_winners_actions(self):
        sfs = self.writers[0].sfs
        commits, _ = self._listing()
        assert commits and commits[-1] == self.latest, (commits, self.latest)
        assert commits == list(range(commits[0], self.latest + 1)), "versions not contiguous"
        seen, prev_ts = set(), None
        for v in commits:
            actions = parse_actions(sfs.read_bytes(fmt.commit_file(v)), f"v{v}")
            info = actions[-1]
            assert isinstance(info, CommitInfo) and info.timestamp == self.states[v].ts, v
            assert prev_ts is None or info.timestamp >= prev_ts, f"timestamp of {v} went back"
            prev_ts = info.timestamp
            if v == 0:
                continue
            cid, expected = self.commits[v]
            assert info.operation_parameters["cid"] == cid, v
            assert actions[:-1] == expected, f"version {v}: not what its winner built"
            assert cid not in seen
            seen.add(cid)

    @invariant()
    def snapshots_equal_the_model(self):
        fresh = TransactionLog(StoreFS(self.url))
        latest = fresh.snapshot()
        assert_same(latest, self.states[self.latest], "fresh latest")
        oldest = fresh.oldest_version()
        assert_same(fresh.snapshot(oldest), self.states[oldest], f"fresh oldest {oldest}")
        for k in (1, 2):    # a moving sample of the versions in between
            v = oldest + (self.n * 7 + k * 3) % (self.latest - oldest + 1)
            assert_same(fresh.snapshot(v), self.states[v], f"fresh {v}")
        for w, tl in enumerate(self.writers):
            cached = self.cached[w]
            if cached is not None:
                assert_same(cached, self.states[cached.version], f"w{w} kept state")
            assert_same(tl.snapshot(base=cached), self.states[self.latest], f"w{w} latest")
        if oldest > 0:
            with pytest.raises(VersionNotFoundError,
                               match=f"oldest version available is {oldest}"):
                fresh.snapshot(oldest - 1)

    @invariant()
    def time_travel(self):
        fresh = TransactionLog(StoreFS(self.url))
        oldest = fresh.oldest_version()
        kept = [v for v in self.states if v >= oldest]
        for t in {self.states[v].ts + d for v in (oldest, self.latest,
                                                  kept[self.n % len(kept)]) for d in (-1, 0)}:
            want = [v for v in kept if self.states[v].ts <= t]
            if want:
                assert fresh.version_at(t) == max(want), t
            else:
                with pytest.raises(VersionNotFoundError, match=f"oldest version available is "
                                   f"{oldest}" if oldest else "first version"):
                    fresh.version_at(t)

    @invariant()
    def oldest_version_is_a_loadable_checkpoint(self):
        oldest = TransactionLog(StoreFS(self.url)).oldest_version()
        commits, cps = self._listing()
        assert oldest == 0 or (oldest in cps and self._loadable(oldest)), (oldest, cps)


SETTINGS = settings(max_examples=30, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.filter_too_much])


class TxLogModelMemory(TxLogModel):
    backend = "memory"


TestTxLogModelLocal = TxLogModel.TestCase
TestTxLogModelLocal.settings = SETTINGS
TestTxLogModelMemory = TxLogModelMemory.TestCase
TestTxLogModelMemory.settings = settings(SETTINGS, max_examples=12)


# ---------------------------------------------------------------- regressions found by the model
def _small_log(url, clock, interval=3):
    tl = TransactionLog(StoreFS(url), checkpoint_interval_versions=interval, clock_ms=clock,
                        log_retention_ms=LOG_RETENTION_MS)
    tl.create([PROTOCOL, {"metaData": {"storeId": "model"}}])
    return tl


def _commit_txns(tl, clock, n):
    for _ in range(n):
        clock.advance(1)
        tl.commit(lambda s: [Txn(app_id="a", version=s.version)], operation="T")


def test_try_commit_at_a_cleaned_up_version_loses(store_url):
    clock = Clock()
    tl = _small_log(store_url, clock)
    _commit_txns(tl, clock, 3)                   # checkpoint 3
    tl.cleanup_log(clock() + LOG_RETENTION_MS)   # commits 0..2 go
    assert tl.versions() == [3]
    for v in (0, 1):
        assert tl.try_commit(v, [Txn(app_id="late", version=v)], previous_ts=0,
                             operation="LATE") is None
    assert tl.versions() == [3] and "late" not in tl.snapshot().txns


def test_cleanup_keeps_the_log_below_a_damaged_checkpoint(store_url):
    clock = Clock()
    tl = _small_log(store_url, clock)
    _commit_txns(tl, clock, 6)                   # checkpoints 3 and 6
    rel = fmt.checkpoint_file(6)
    data = tl.sfs.read_bytes(rel)
    tl.sfs.delete(rel)
    tl.sfs.write(rel, data[:data.rstrip(b"\n").rfind(b"\n") + 1])   # its last line lost
    tl.cleanup_log(clock() + LOG_RETENTION_MS)
    assert tl.versions() == list(range(3, 7))    # kept from 3, the newest that loads
    assert tl.oldest_version() == 3
    assert TransactionLog(StoreFS(store_url)).snapshot().txns["a"].version == 5


def test_a_crash_mid_cleanup_leaves_no_checkpoint_below_a_missing_commit(local_store_url):
    clock = Clock()
    tl = _small_log(local_store_url, clock)
    _commit_txns(tl, clock, 3)                   # checkpoint 3, _last_checkpoint -> 3
    pointer = tl.sfs.read_bytes(fmt.last_checkpoint_file())
    _commit_txns(tl, clock, 3)                   # checkpoint 6 ...
    tl.sfs.replace(fmt.last_checkpoint_file(), pointer)   # ... whose pointer a crash lost
    cleaner = TransactionLog(Crashing(local_store_url, 5), log_retention_ms=LOG_RETENTION_MS)
    with pytest.raises(Crash):
        cleaner.cleanup_log(clock() + LOG_RETENTION_MS)   # dies after 5 deletes
    fresh = TransactionLog(StoreFS(local_store_url))
    assert fresh.snapshot().txns["a"].version == 5
    assert fresh.oldest_version() == 6


def test_a_reader_led_to_a_checkpoint_a_cleanup_is_removing_starts_again_from_a_newer_one(
        local_store_url):
    """A reader loads the checkpoint ``_last_checkpoint`` names (3); a cleanup running at
    that moment deletes the commits after it (a newer checkpoint, 6, is kept). The reader
    builds the newest version from checkpoint 6 instead of failing."""
    clock = Clock()
    tl = _small_log(local_store_url, clock)
    _commit_txns(tl, clock, 3)                   # checkpoint 3, _last_checkpoint -> 3
    pointer = tl.sfs.read_bytes(fmt.last_checkpoint_file())
    _commit_txns(tl, clock, 4)                   # checkpoint 6; version 7
    tl.sfs.replace(fmt.last_checkpoint_file(), pointer)   # (stale: the reader saw 3)
    for v in range(6):                           # the cleanup, part way: checkpoint 3 read
        tl.sfs.delete(fmt.commit_file(v))
    fresh = TransactionLog(StoreFS(local_store_url))
    assert fresh.snapshot().version == 7
    assert fresh.snapshot().txns["a"].version == 6
    assert fresh.snapshot(6).version == 6
