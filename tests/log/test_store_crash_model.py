"""Property test: crash recovery under ASYNC_FLUSH with torn tails (hypothesis stateful).

The store runs with ``flushDiskType=ASYNC_FLUSH``, tiny segments (they roll) and no
services: the rules append (row path ``Store.append`` and columnar ``append_batch``,
several topics and queues, every message with a key and a unique id), fsync, publish,
commit a group's offsets, remove the oldest segment, close and reopen, and crash.

A crash is a power loss on the real files. The store object is abandoned as a killed
process would leave it (``Store._crash``: no flush, publish or lease release; its file
descriptors and maps are let go without writing). Every ``os.fsync``/``os.fdatasync`` of
the process is watched (:class:`SyncWatch`, which calls the real one and notes the file's
size), so each segment file is then cut at any byte between the size it had at its last
fsync and the size written, and a few garbage bytes or zeros up to the written size may
follow the cut (a torn write); a file never fsynced may vanish. A second crash rule zeroes
the tail from the middle of the first unflushed body (the framing stays whole: only the
batch checksum tells). Then the store is reopened and recovers.

The model knows the bytes of every batch, so it predicts exactly what survives: the
batches, in append order, up to the first one whose bytes are no longer all on disk.
Checked after every step: each queue reads exactly the model's messages (bodies, queue
offsets without gaps, message ids) and its max offset is the model's; everything the
store promised (appended before a flush returned) survives a crash; lookups by id and
by key find the surviving messages and none of the lost ones; appends after recovery
continue the queue offsets, and no id is given twice; a group's committed offsets never
point past a queue's max offset (recovery moves them back, as RocketMQ corrects a
consumer past the max offset); a segment ``add`` never claims bytes not fsynced; a
published snapshot reads a contiguous part of what the model holds and at least what was
published. After each reopen every committed segment is a whole Arrow IPC stream holding
exactly the model's batches, and every surviving message is found by id and by key.

Runs on /dev/shm where there is one (fsyncs are free; SyncWatch decides what survives).
test_crash.py covers a real SIGKILLed writer (the page cache survives it); a power loss
has to be made by cutting files, which needs no second process.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass

import hypothesis.strategies as st
import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sparkmq import ASYNC_FLUSH, Message, Snapshot, Store
from sparkmq.log import format as fmt
from sparkmq.log.message import decode_message_id, encode_message_id

TOPICS = {"a": 2, "b": 1}      # topic -> queues
SEGMENT_BYTES = 4096
GROUP = "GID_crash_model"
OPTS = dict(start_services=False, flushDiskType=ASYNC_FLUSH,
            mappedFileSizeCommitLog=SEGMENT_BYTES)

FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
QUEUES = [(t, q) for t, n in TOPICS.items() for q in range(n)]
queue_keys = st.sampled_from(QUEUES)
rows_st = st.lists(st.tuples(queue_keys, st.binary(max_size=60)), min_size=1, max_size=5)
garbage_st = st.one_of(st.just(b""), st.binary(min_size=1, max_size=24),
                       st.just(b"\xff\xff\xff\xff"), st.just(b"\x00" * 16))


class SyncWatch:
    """Notes, per file, its size at its last ``fsync``/``fdatasync`` by this process, and
    per folder the names it held at its last fsync: what a power loss cannot take.
    Installed over ``os.fsync``/``os.fdatasync`` (the real calls still run) for the life
    of one state machine."""

    def __init__(self):
        self.synced: dict[str, int] = {}
        self.names: dict[str, set[str]] = {}     # folder -> its names at its last fsync
        self._real = (os.fsync, os.fdatasync)

        def watched(real):
            def sync(fd):
                real(fd)
                try:
                    path = os.readlink(f"/proc/self/fd/{fd}")
                    if stat.S_ISDIR(os.fstat(fd).st_mode):
                        self.names[path] = set(os.listdir(path))
                    else:
                        self.synced[path] = os.fstat(fd).st_size
                except OSError:
                    pass
            return sync
        os.fsync, os.fdatasync = watched(os.fsync), watched(os.fdatasync)

    def lose_names(self, root: str) -> list[str]:
        """A power loss on the folders under ``root`` (itself kept): every file or folder
        whose name its folder's last fsync did not hold is gone, whatever was synced
        into it (POSIX: a file's fsync does not make its name durable). Returns the
        paths removed."""
        gone = []
        for folder, dirs, files in os.walk(root):
            held = self.names.get(folder, set())
            for name in files:
                if name not in held:
                    os.unlink(os.path.join(folder, name))
                    gone.append(os.path.join(folder, name))
            for name in [d for d in dirs if d not in held]:
                shutil.rmtree(os.path.join(folder, name))
                gone.append(os.path.join(folder, name))
                dirs.remove(name)
        return gone

    def remove(self) -> None:
        os.fsync, os.fdatasync = self._real


@dataclass
class Row:
    topic: str
    qid: int
    offset: int
    body: bytes
    mid: str
    key: str
    uniq: str


@dataclass
class Batch:
    path: str          # the segment file (absolute)
    start: int         # byte extent of the batch message in it
    end: int
    batch_offset: int  # physical offset
    rows: list[Row]


def _segment_files(folder: str) -> dict[int, str]:
    d = os.path.join(folder, fmt.COMMITLOG_DIR)
    out = {}
    for name in os.listdir(d) if os.path.isdir(d) else ():
        base = fmt.parse_segment_file(name)
        if base is not None:
            out[base] = os.path.join(d, name)
    return out


def _inside_body(data: bytes, b: Batch) -> int:
    """A byte in the middle of the batch's longest message body (a cut there leaves the
    framing whole: only the checksum tells the torn batch), else the batch's start."""
    body = max((r.body for r in b.rows), key=len)
    at = data.find(body, b.start, b.end) if len(body) > 8 else -1
    return at + len(body) // 2 if at >= 0 else b.start


class CrashModel(RuleBasedStateMachine):

    def __init__(self):
        super().__init__()
        self.watch = SyncWatch()
        # tmpfs where there is one: the fsyncs cost nothing there, and SyncWatch, not
        # the disk, decides what a power loss keeps
        self.folder = os.path.realpath(tempfile.mkdtemp(prefix="sparkmq-crash-model-",
                                                        dir=FAST_TMP))
        self.url = self.folder + "/store"
        try:
            self.store = Store.open(self.url, **OPTS)
            for t, n in TOPICS.items():
                self.store.create_topic(t, read_queue_nums=n, write_queue_nums=n)
        except BaseException:
            self.watch.remove()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.seq = 0
        self.batches: list[Batch] = []          # surviving, not removed, in append order
        self.queues: dict[tuple[str, int], list[Row]] = {k: [] for k in QUEUES}
        self.floors: dict[tuple[str, int], int] = {k: 0 for k in QUEUES}   # removed below
        self.lost: list[Row] = []
        self.promised = 0          # batches[:promised] were appended before a flush returned
        self.published: dict[tuple[str, int], int] = {k: 0 for k in QUEUES}
        self.committed: dict[tuple[str, int], int] = {}
        self.ids: set[str] = set()
        self.last_end = 0          # physical end of the newest batch appended

    # ------------------------------------------------------------------ helpers
    def _message(self, key, body) -> tuple[Message, str, str]:
        self.seq += 1
        k, u = f"k{self.seq}", f"u{self.seq}"
        return Message(key[0], body, queue_id=key[1], keys=[k], unique_key=u), k, u

    def _record(self, rows: list[tuple[tuple[str, int], bytes, str, str, str, int]]) -> None:
        """Add one appended batch: rows of (queue, body, id, key, unique key, queue offset)."""
        bo = decode_message_id(rows[0][2])[1]
        assert all(decode_message_id(r[2])[1] == bo for r in rows), "one append, one batch"
        assert bo >= self.last_end, "a batch placed over earlier bytes"
        files = _segment_files(self.folder + "/store")
        base = max(b for b in files if b <= bo)
        path = files[base]
        end = os.path.getsize(path)
        assert end > bo - base
        self.last_end = base + end
        batch = Batch(path, bo - base, end, bo, [])
        for key, body, mid, k, u, qo in rows:
            assert qo == len(self.queues[key]), f"{key}: offset {qo}, expected the next one"
            assert mid not in self.ids, f"message id {mid} given twice"
            self.ids.add(mid)
            row = Row(key[0], key[1], qo, body, mid, k, u)
            self.queues[key].append(row)
            batch.rows.append(row)
        self.batches.append(batch)

    def _reopened(self) -> None:
        """After a reopen everything that survived is on disk and published, and every
        committed segment (up to its committed size) is a whole Arrow IPC stream holding
        exactly the model's batches there: no torn bytes, garbage or copies left."""
        self.promised = len(self.batches)
        self.published = {k: len(v) for k, v in self.queues.items()}
        root = self.folder + "/store"
        segs = self.store.state.segments
        assert {os.path.join(root, p) for p in segs} >= {b.path for b in self.batches}
        for rel, add in segs.items():
            with open(os.path.join(root, rel), "rb") as f:
                data = f.read()[:add.size]
            table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
            want = [r.body for b in self.batches if b.path == os.path.join(root, rel)
                    for r in b.rows]
            assert table.column("body").to_pylist() == want, rel

    # ------------------------------------------------------------------ rules
    @rule(rows=rows_st)
    def append_rows(self, rows):
        made = [self._message(key, body) for key, body in rows]
        res = self.store.append([m for m, _k, _u in made])
        self._record([(key, body, r.message_id, k, u, r.queue_offset)
                      for (key, body), (_m, k, u), r in zip(rows, made, res)])

    @rule(rows=rows_st)
    def append_columnar(self, rows):
        made = [self._message(key, body) for key, body in rows]
        table = pa.table({
            "topic": [t for (t, _q), _b in rows],
            "queue_id": pa.array([q for (_t, q), _b in rows], pa.int32()),
            "body": pa.array([b for _k, b in rows], pa.binary()),
            "keys": pa.array([[k] for _m, k, _u in made], pa.list_(pa.string())),
            "unique_key": pa.array([u for _m, _k, u in made], pa.string())})
        res = self.store.append_batch(table)
        tag = self.store.state.id_tags.at(res.batch_offset)
        self._record([(key, body, encode_message_id(tag, res.batch_offset, i), k, u, qo)
                      for i, ((key, body), (_m, k, u), qo)
                      in enumerate(zip(rows, made, res.queue_offsets.tolist()))])

    @rule(key=queue_keys, n=st.integers(1, 2))
    def append_large_to_roll(self, key, n):
        for _ in range(n):
            m, k, u = self._message(key, b"R" * 1500)
            r = self.store.append([m])[0]
            self._record([(key, m.body, r.message_id, k, u, r.queue_offset)])

    @rule()
    def flush(self):
        self.store.commitlog.flush(sync=True)
        self.promised = len(self.batches)

    @rule()
    def publish(self):
        self.store.publish(force=True)
        for key in QUEUES:   # a publish covers at least what was flushed
            self.published[key] = max(self.published[key], sum(
                1 for b in self.batches[:self.promised] for r in b.rows
                if (r.topic, r.qid) == key))

    @rule()
    def flush_and_publish(self):
        self.store.flush()
        self.promised = len(self.batches)
        self.published = {k: len(v) for k, v in self.queues.items()}

    @rule(fracs=st.one_of(st.just([1.0] * len(QUEUES)),
                          st.lists(st.floats(0, 1), min_size=len(QUEUES), max_size=len(QUEUES))))
    def commit_offsets(self, fracs):
        """The group commits every queue (1.0: up to what was appended, flushed or not)."""
        offsets = {key: max(int(round(f * len(self.queues[key]))), self.floors[key])
                   for key, f in zip(QUEUES, fracs)}
        self.store.commit_consumer_offsets(GROUP, offsets)
        self.committed.update(offsets)

    @precondition(lambda self: len([s for s in self.store.commitlog.segments() if s.sealed]) >= 2)
    @rule()
    def remove_oldest_segment(self):
        first = self.store.commitlog.segments()[0]
        self.store.remove_segments([first.path])
        gone = [b for b in self.batches if b.batch_offset < first.end_offset]
        self.batches = self.batches[len(gone):]
        self.promised = max(0, self.promised - len(gone))
        for b in gone:
            for r in b.rows:
                key = (r.topic, r.qid)
                self.floors[key] = max(self.floors[key], r.offset + 1)

    @rule()
    def reopen_clean(self):
        self.store.close()
        self.store = Store.open(self.url, **OPTS)
        assert not self.store.recovered_from_crash
        self._reopened()

    @rule(data=st.data())
    def crash(self, data):
        """Power loss: each file cut anywhere past its fsynced size, garbage may follow."""
        def tear(path, durable, size, content):
            near = sorted({e + d for b in self.batches if b.path == path   # at, beside and
                           for e in (b.start, (b.start + b.end) // 2, b.end,   # between batch
                                     _inside_body(content, b))                 # boundaries,
                           for d in (-1, 0, 1) if durable <= e + d <= size})   # in a body
            cuts = st.integers(durable, size)
            cut = data.draw(st.one_of(cuts, st.sampled_from(near)) if near else cuts,
                            label=f"cut {os.path.basename(path)}")
            if durable == 0 and data.draw(st.booleans(), label="file lost"):
                return None
            junk = b""
            if cut < size:   # a torn write: garbage after the cut, or the file kept its
                #              size but its last blocks read as zeros
                junk = data.draw(st.one_of(garbage_st, st.just(b"\0" * (size - cut))),
                                 label="garbage")
            return content[:cut] + junk
        self._power_loss(tear)

    @precondition(lambda self: self.promised < len(self.batches))
    @rule()
    def crash_zeroed_in_a_body(self):
        """Power loss where the file kept its size but the blocks from the middle of the
        first unflushed batch's body on read as zeros: the framing is whole, only the
        batch checksum tells (recovery validates every batch after a crash)."""
        first = self.batches[self.promised]

        def tear(path, durable, size, content):
            cut = _inside_body(content, first) if path == first.path else size
            cut = max(durable, min(cut, size))
            return content[:cut] + b"\0" * (size - cut)
        self._power_loss(tear)

    def _power_loss(self, tear):
        """Abandon the store as a killed process would, then replace each segment file
        with unsynced bytes by ``tear(path, fsynced size, size, bytes)`` (None: the file
        is gone), predict what survives, reopen and check."""
        old = self.store
        old._crash()
        old.sfs.close()
        root = self.folder + "/store"
        before: dict[str, bytes] = {}
        after: dict[str, bytes | None] = {}
        segments = _segment_files(root)
        for path in segments.values():        # (for the prediction, if its name goes)
            with open(path, "rb") as f:
                before[path] = f.read()
        for path in self.watch.lose_names(root):
            if path in before:
                after[path] = None
        for _base, path in sorted(_segment_files(root).items()):
            size = os.path.getsize(path)
            durable = self.watch.synced.get(path, 0)
            assert durable <= size
            if durable == size:
                continue
            now = after[path] = tear(path, durable, size, before[path])
            if now is None:
                os.unlink(path)
                continue
            assert before[path][:durable] == now[:durable]
            with open(path, "r+b") as f:
                f.truncate(0)
                f.write(now)
            self.watch.synced[path] = len(now)      # what the disk holds now
        # the model's prediction: batches in append order, up to the first one torn
        survive = 0
        for b in self.batches:
            if b.path in after:
                now = after[b.path]
                if now is None or now[b.start:b.end] != before[b.path][b.start:b.end]:
                    break
            survive += 1
        assert survive >= self.promised, (
            f"a flushed batch is not on disk after a power loss: {self.promised} promised, "
            f"{survive} whole")
        lost = [r for b in self.batches[survive:] for r in b.rows]
        for b in self.batches[survive:]:
            for r in b.rows:
                self.lost.append(r)
                self.queues[(r.topic, r.qid)].remove(r)   # (its id stays given: never again)
        self.lost = self.lost[-30:]
        self.batches = self.batches[:survive]
        b = self.batches[-1] if self.batches else None
        self.last_end = b.batch_offset + b.end - b.start if b else 0
        self.store = Store.open(self.url, **OPTS)
        assert self.store.recovered_from_crash
        self._reopened()
        for key, off in self.committed.items():   # RocketMQ corrects past-the-end offsets
            self.committed[key] = min(off, len(self.queues[key]))
        for r in lost:                            # nothing lost can be found
            self._check_lost(r)
        self._check_all_lookups()

    # ------------------------------------------------------------------ checks
    def _check_all_lookups(self):
        for rows in self.queues.values():
            for r in rows:
                if r.offset < self.floors[(r.topic, r.qid)]:
                    continue
                got = self.store.lookup(r.mid)
                assert got is not None, f"message {r.mid} ({r.topic}/{r.qid}/{r.offset}) lost"
                assert (got.body, got.topic, got.queue_id, got.queue_offset, got.unique_key) \
                    == (r.body, r.topic, r.qid, r.offset, r.uniq)
                assert [(m.queue_id, m.queue_offset) for m in
                        self.store.query_by_key(r.topic, r.key)] == [(r.qid, r.offset)], r.key

    @invariant()
    def queues_equal_the_model(self):
        for (t, q), rows in self.queues.items():
            assert self.store.max_offset(t, q) == len(rows), (t, q)
            floor = self.floors[(t, q)]
            assert self.store.min_offset(t, q) == min(floor, len(rows)), (t, q)
            table = self.store.read_table(t, q, 0, columns=["queue_offset", "message_id", "body"],
                                          on_removed="skip")
            want = rows[floor:]
            assert table.column("queue_offset").to_pylist() == [r.offset for r in want]
            assert [r.offset for r in want] == list(range(floor, len(rows)))
            assert table.column("body").to_pylist() == [r.body for r in want]
            assert table.column("message_id").to_pylist() == [r.mid for r in want]

    @invariant()
    def index_finds_survivors_only(self):
        recent = [r for rows in self.queues.values() for r in rows[-1:]
                  if r.offset >= self.floors[(r.topic, r.qid)]]
        for r in recent:
            got = self.store.query_by_key(r.topic, r.key)
            assert [(m.body, m.queue_id, m.queue_offset) for m in got] == \
                [(r.body, r.qid, r.offset)], f"key {r.key}"
            m = self.store.lookup(r.mid)
            assert m is not None and m.body == r.body and m.queue_offset == r.offset
        for r in self.lost[-8:]:     # (their queue offsets may hold new messages now)
            self._check_lost(r)

    def _check_lost(self, r: Row) -> None:
        tid = self.store.topic_id(r.topic)
        assert self.store.index_hits(tid, r.key).num_rows == 0, f"lost key {r.key} indexed"
        assert self.store.query_by_key(r.topic, r.key) == [], f"lost key {r.key} found"
        self._lookup_lost(r)

    def _lookup_lost(self, r: Row) -> None:
        """A lost message's id names nothing: the recovery that followed the crash
        began an id epoch (``log/idtags.py``), so a message placed at its offset since
        has an id of another tag."""
        assert self.store.lookup(r.mid) is None, f"lost message {r.mid} (key {r.key}) found"

    @invariant()
    def published_bytes_are_durable(self):
        """A segment ``add`` never claims more than was fsynced (FORMAT.md 10.5)."""
        root = self.folder + "/store"
        for rel, add in self.store.state.segments.items():
            assert add.size <= self.watch.synced.get(os.path.join(root, rel), 0), rel

    @invariant()
    def committed_offsets_within_queues(self):
        got = self.store.consumer_offsets(GROUP)
        for (t, q), off in self.committed.items():
            assert got.get((t, q)) == off, (t, q, got.get((t, q)), off)
            assert off <= self.store.max_offset(t, q)

    @invariant()
    def published_snapshot_is_contiguous(self):
        snap = Snapshot.load(self.url)
        for (t, q), rows in self.queues.items():
            assert snap.max_offset(t, q) >= self.published[(t, q)], (t, q)
            lo = snap.min_offset(t, q)
            got = snap.read_table(t, q, lo, columns=["queue_offset", "body"])
            offs = got.column("queue_offset").to_pylist()
            assert offs == list(range(lo, lo + len(offs)))
            assert got.column("body").to_pylist() == [r.body for r in rows[lo:lo + len(offs)]]

    def teardown(self):
        try:
            self.store.close()
        finally:
            self.watch.remove()
            shutil.rmtree(self.folder, ignore_errors=True)


TestStoreCrashModel = CrashModel.TestCase
TestStoreCrashModel.settings = settings(max_examples=25, stateful_step_count=30, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------- regressions
BIG = dict(OPTS, mappedFileSizeCommitLog=1 << 20)     # no roll in the regressions


def _crashed(store: Store) -> None:
    store._crash()
    store.sfs.close()


def test_crash_moves_committed_offsets_back_to_the_max_offset(tmp_path):
    """A group committed an offset past messages written but not flushed (ASYNC_FLUSH);
    a power loss took them. Recovery moves the offset back to the queue's max offset
    (RocketMQ corrects a consumer past the max offset to it), so the messages appended
    next at those offsets are consumed, not skipped."""
    url = str(tmp_path / "store")
    store = Store.open(url, **BIG)
    store.create_topic("a", read_queue_nums=1, write_queue_nums=1)
    store.append([Message("a", b"kept")])
    store.commitlog.flush(sync=True)
    path = store.sfs.local_path(store.commitlog.active.rel_path)
    durable = os.path.getsize(path)
    store.append([Message("a", b"lost-1"), Message("a", b"lost-2")])
    store.commit_consumer_offsets(GROUP, {("a", 0): 3})
    store.commit_consumer_offsets(GROUP, {("a", 0): 2}, client_id="client-1")
    _crashed(store)
    os.truncate(path, durable)                 # the power loss: the unflushed batch is gone
    store = Store.open(url, **BIG)
    try:
        assert store.max_offset("a", 0) == 1
        assert store.consumer_offsets(GROUP) == {("a", 0): 1}
        assert store.consumer_offsets(GROUP, client_id="client-1") == {("a", 0): 1}
        assert store.append([Message("a", b"new")])[0].queue_offset == 1
        assert [m.body for m in store.read("a", 0, store.consumer_offsets(GROUP)[("a", 0)])] \
            == [b"new"]
    finally:
        store.close()
    assert Snapshot.load(url).consumer_offsets(GROUP) == {("a", 0): 1}


def test_lost_message_id_is_not_given_again(tmp_path):
    """The first segment was never fsynced and a power loss took the file itself: the
    message appended to it was acknowledged (ASYNC_FLUSH) with an id that, after
    recovery, must not name another message."""
    url = str(tmp_path / "store")
    store = Store.open(url, **BIG)
    store.create_topic("a", read_queue_nums=1, write_queue_nums=1)
    lost = store.append([Message("a", b"lost")])[0].message_id
    path = store.sfs.local_path(store.commitlog.active.rel_path)
    _crashed(store)
    os.unlink(path)
    store = Store.open(url, **BIG)
    try:
        assert store.max_offset("a", 0) == 0 and store.lookup(lost) is None
        new = store.append([Message("a", b"new")])[0].message_id
        assert new != lost
    finally:
        store.close()
