"""Property test: writers taking a store's lease over from paused writers (hypothesis
stateful).

Up to three writers (``Store`` objects, no services) share one local store folder, each
with a clock of its own (tests/helpers/clock.py). A writer that runs has its clock at
the world's time plus a small skew (below a tenth of the lease timeout, the margin
``WriterLease.lapsing`` allows for clocks that differ); a paused writer's clock stands
still while the world's moves, and jumps to the world's time when it resumes. The rules
open a writer (it takes the lease if it is free or expired, else StoreLockedError),
append (rows and columnar), append with a pause in the middle (between the lease check
and the write, as a GC pause would stop it; another writer may take the store over
meanwhile), flush, publish, commit consumer offsets, create a topic, pause, resume,
advance the world's time, close cleanly, crash (``Store._crash``: an abandoned writer)
and read (``Store.open(mode="r")`` or ``Snapshot``).

The model knows the lease (its epoch, its holder and the expiry the holder's clock
stamped at its last renewal) and every message sent (its place in the order of sends).
Checked: a writer is refused exactly when the model's lease is live, and gets the next
epoch otherwise; every append answered as stored is read, exactly once, in send order,
at the queue offset it was answered with, by the lease's holder at every step, by
readers once published, and after the last holder's clean close; an append refused
with FencedError is never read twice or out of order (one refused before its write
leaves every segment file as it was, and is never read); at most one writer is unfenced
with the current epoch; epochs only grow; a fenced writer's topics and consumer offsets
never appear; the store always passes ``sparkmq admin verify``'s check
(``verify_store``) after a fenced writer's close and at the end.

Found by it (regression test below): a fenced writer's late write that started a segment
created the file the new writer's next segment needed, and every append of the new writer
failed with FileExistsError; the new writer now replaces that file
(``Appender.segment_taken``).
"""
from __future__ import annotations

import os
import shutil
import tempfile

import hypothesis.strategies as st
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sparkmq import ASYNC_FLUSH, SYNC_FLUSH, PutMessageStatus, Snapshot, Store
from sparkmq.errors import FencedError, StoreLockedError
from sparkmq.log import format as fmt
from sparkmq.log.verify import verify_store

from helpers.clock import Clock
from helpers.storetools import as_segment_batch, bodies, msg, pause_before_the_write

WRITERS = 3
QUEUES = 2
TOPIC = "t"
GROUP = "GID_lease_model"
TIMEOUT_MS = 30_000                      # the default leaseTimeout
MAX_SKEW_MS = TIMEOUT_MS // 10 - 1       # below the lapse margin
STORED = (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT)
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

steps_st = st.one_of(st.sampled_from([1, 1_000, 14_000, 27_500, 29_000, 30_001, 45_000]),
                     st.integers(1, 2 * TIMEOUT_MS))
SEGMENT_BYTES = 16384
pauses_st = st.sampled_from([1_000, 29_000, 30_001, 33_000, 45_000])
rows_st = st.lists(st.integers(0, QUEUES - 1), min_size=1, max_size=3)


class Slot:
    """One writer process: its clock, its skew, its Store (None: not running)."""

    def __init__(self, skew: int, now: int):
        self.skew = skew
        self.clock = Clock(now + skew)
        self.store: Store | None = None
        self.paused = False


def check_queue(got: list[bytes], q: int, sent: dict, must: set, what: str) -> None:
    """``got`` (a queue's bodies from offset 0) holds each of ``must`` at the queue offset
    it was answered with, nothing never stored, nothing twice, in send order."""
    assert len(set(got)) == len(got), f"{what}: queue {q} reads a message twice: {got}"
    seqs = []
    for i, b in enumerate(got):
        m = sent.get(b)
        assert m is not None and m["q"] == q, f"{what}: queue {q} reads {b!r}, never sent there"
        assert m["status"] != "never", f"{what}: {b!r} was refused before its write, yet is read"
        if m["qoff"] is not None:
            assert i == m["qoff"], f"{what}: {b!r} at queue offset {i}, answered {m['qoff']}"
        seqs.append(m["seq"])
    assert seqs == sorted(seqs), f"{what}: queue {q} out of send order: {got}"
    missing = sorted(b for b in must if sent[b]["q"] == q and b not in set(got))
    assert not missing, f"{what}: queue {q} lost messages answered as stored: {missing}"


class LeaseModel(RuleBasedStateMachine):
    FLUSH = SYNC_FLUSH

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="sparkmq-lease-model-", dir=FAST_TMP)
        self.url = os.path.join(self.dir, "store")
        self.opts = dict(start_services=False, flushDiskType=self.FLUSH,
                         mappedFileSizeCommitLog=SEGMENT_BYTES)
        self.world = Clock().now_ms
        self.slots: list[Slot] = []
        self.holder: int | None = None       # slot of the lease's live holder
        self.epoch = 0
        self.expires = 0                     # the holder's last renewal's expiry
        self.seq = 0
        self.sent: dict[bytes, dict] = {}    # body -> seq, queue, status, queue offset
        self.published: set[bytes] = set()   # acked and surely published
        self.topics = {TOPIC}
        self.offsets: dict[tuple[str, int], int] = {}
        self.seen_epoch = 0
        with Store.open(self.url, clock_ms=Clock(self.world), **self.opts) as s:
            s.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
            self.epoch = s.epoch
            bs = self._send(0, [0])
            self._answered(bs, *self._append(s, [0], bs, False))
            self.published |= set(bs)

    # ------------------------------------------------------------------ helpers
    @initialize(skews=st.lists(st.one_of(st.just(0), st.integers(0, MAX_SKEW_MS)),
                               min_size=WRITERS, max_size=WRITERS))
    def make_slots(self, skews):
        self.slots = [Slot(k, self.world) for k in skews]

    def _running(self, *, paused_ok: bool = False) -> list[int]:
        return [i for i, s in enumerate(self.slots)
                if s.store is not None and (paused_ok or not s.paused)]

    def _empty(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.store is None]

    def _stale(self, i: int) -> bool:
        return i != self.holder

    def _acked(self) -> set[bytes]:
        return {b for b, m in self.sent.items() if m["status"] == "acked"}

    def _lapsing(self, i: int) -> bool:
        return self.slots[i].clock.now_ms >= self.expires - TIMEOUT_MS // 10

    def _renewed(self, i: int) -> None:
        self.expires = self.slots[i].clock.now_ms + TIMEOUT_MS

    def _segment_sizes(self) -> dict[str, int]:
        folder = os.path.join(self.url, fmt.COMMITLOG_DIR)
        if not os.path.isdir(folder):
            return {}
        return {n: os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)}

    def _set_world(self, now: int) -> None:
        self.world = now
        for s in self.slots:
            if not s.paused:
                s.clock.now_ms = now + s.skew

    def _open(self, i: int) -> None:
        """Writer ``i`` opens the store: refused exactly while the model's lease is live."""
        slot = self.slots[i]
        live = self.holder is not None and slot.clock.now_ms <= self.expires
        if live:
            with pytest.raises(StoreLockedError):
                Store.open(self.url, clock_ms=slot.clock, **self.opts)
            event("open refused: the lease is live")
            return
        event("open: took over a live writer's lease" if self.holder is not None else
              "open: the lease was free")
        slot.store = Store.open(self.url, clock_ms=slot.clock, **self.opts)
        assert slot.store.epoch == self.epoch + 1, "a new writer takes the next epoch"
        self.epoch = slot.store.epoch
        self.holder = i
        self._renewed(i)
        self.published |= self._acked()      # recovery ends with a publish

    def _send(self, i: int, queues: list[int]) -> list[bytes]:
        out = []
        for q in queues:
            b = f"w{i}-{self.seq}".encode()
            self.sent[b] = dict(seq=self.seq, q=q, status="maybe", qoff=None)
            self.seq += 1
            out.append(b)
        return out

    def _append(self, store: Store, queues: list[int], bs: list[bytes], columnar: bool):
        """(status, queue offsets) of one append of ``bs`` to ``queues``."""
        if columnar:
            table = pa.table({"topic": [TOPIC] * len(bs),
                              "queue_id": pa.array(queues, pa.int32()), "body": bs})
            r = store.append_batch(as_segment_batch(table))
            return r.status, [int(x) for x in r.queue_offsets]
        rs = store.append([msg(TOPIC, b, q) for q, b in zip(queues, bs)])
        assert len({r.status for r in rs}) == 1
        return rs[0].status, [r.queue_offset for r in rs]

    def _answered(self, bs, status, qoffs) -> None:
        assert status in STORED, status
        for b, qo in zip(bs, qoffs):
            self.sent[b].update(status="acked", qoff=qo)

    def _check_reader(self, reader, must: set, what: str) -> None:
        for q in range(QUEUES):
            check_queue(bodies(reader, TOPIC, q), q, self.sent, must, what)
        assert set(reader.topic_names()) == self.topics, f"{what}: topics"
        assert reader.consumer_offsets(GROUP) == self.offsets, f"{what}: consumer offsets"

    def _verify(self, what: str) -> None:
        report = verify_store(self.url)
        assert report.ok, f"{what}: {report.problems}"

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: self.slots and self._empty())
    @rule(data=st.data())
    def open_writer(self, data):
        i = data.draw(st.sampled_from(self._empty()))
        self.slots[i].paused = False
        self.slots[i].clock.now_ms = self.world + self.slots[i].skew
        self._open(i)

    @precondition(lambda self: self.slots and self._running())
    @rule(data=st.data(), queues=rows_st, columnar=st.booleans())
    def append(self, data, queues, columnar):
        i = data.draw(st.sampled_from(self._running()))
        store = self.slots[i].store
        bs = self._send(i, queues)
        if self._stale(i):
            before = self._segment_sizes()
            try:
                result = self._append(store, queues, bs, columnar)
            except FencedError:
                assert self._segment_sizes() == before, "a fenced writer wrote before it refused"
                event("append refused: fenced")
                for b in bs:
                    self.sent[b]["status"] = "never"
            else:           # answered as stored: the holder's reads must then find it
                self._answered(bs, *result)
            return
        lapsing = self._lapsing(i)
        self._answered(bs, *self._append(store, queues, bs, columnar))
        if lapsing:
            self._renewed(i)

    @precondition(lambda self: self.slots and self._running() and self._empty())
    @rule(data=st.data(), queues=rows_st, columnar=st.booleans(), pause=pauses_st,
          take_over=st.booleans())
    def append_paused_in_the_middle(self, data, queues, columnar, pause, take_over):
        """Writer i stops between its lease check and its write for ``pause`` ms (its
        clock stands still); meanwhile writer j may try to open the store."""
        i = data.draw(st.sampled_from(self._running()))
        j = data.draw(st.sampled_from(self._empty()))
        store, slot = self.slots[i].store, self.slots[i]
        stamp = store.appender._store_ts
        ran = []

        def paused() -> int:
            if not ran:
                ran.append(self.holder)
                slot.paused = True
                self._set_world(self.world + pause)
                if take_over:
                    self.open_slot(j)
                slot.paused = False
                slot.clock.now_ms = self.world + slot.skew
            return stamp()
        store.appender._store_ts = paused
        bs = self._send(i, queues)
        try:
            if self._stale(i):
                with pytest.raises(FencedError):
                    self._append(store, queues, bs, columnar)
                assert not ran, "a fenced writer went on to write"
                for b in bs:
                    self.sent[b]["status"] = "never"
                return
            if self._lapsing(i):
                self._renewed(i)                   # renewed before the write
            if take_over and self._would_take(j, pause):
                try:
                    result = self._append(store, queues, bs, columnar)
                except FencedError as exc:
                    if "may not be stored" in str(exc):   # fenced after its write: maybe
                        event("append in a pause: taken over, may not be stored")
                    else:   # fenced before it: its roll met the new holder's segment
                        for b in bs:
                            self.sent[b]["status"] = "never"
                        event("append in a pause: taken over, refused before its write")
                else:       # answered as stored: the new holder's reads must then find it
                    self._answered(bs, *result)
                assert ran and self.holder == j
                return
            result = self._append(store, queues, bs, columnar)
            lapsing_after = self._lapsing(i)
            assert ran and self.holder == i
            self._answered(bs, *result)
            if lapsing_after:
                self._renewed(i)
        finally:
            del store.appender._store_ts

    def _would_take(self, j: int, pause: int) -> bool:
        """Whether j, opening after the world moved ``pause`` ms, finds the lease expired."""
        return self.world + pause + self.slots[j].skew > self.expires

    def open_slot(self, j: int) -> None:
        self.slots[j].paused = False
        self.slots[j].clock.now_ms = self.world + self.slots[j].skew
        self._open(j)

    @precondition(lambda self: self.holder is not None and self._empty())
    @rule(data=st.data(), extra=st.sampled_from([0, 1, 2_000, 20_000]), resume=st.booleans())
    def pause_and_take_over(self, data, extra, resume):
        """The holder pauses until its lease expired for writer j, which opens."""
        i = self.holder
        j = data.draw(st.sampled_from(self._empty()))
        self.slots[i].paused = True
        self._set_world(max(self.world, self.expires - self.slots[j].skew + 1 + extra))
        self.open_slot(j)
        assert self.holder == j
        if resume:
            self.slots[i].paused = False
            self.slots[i].clock.now_ms = self.world + self.slots[i].skew

    @precondition(lambda self: self.slots and self._running())
    @rule(data=st.data(), only_publish=st.booleans())
    def flush(self, data, only_publish):
        i = data.draw(st.sampled_from(self._running()))
        store = self.slots[i].store

        def do():
            if only_publish:
                store.publish(force=True)
            else:
                store.flush()
        if self._stale(i):
            with pytest.raises(FencedError):
                do()
            return
        do()
        self._renewed(i)
        if not only_publish or self.FLUSH == SYNC_FLUSH:
            self.published |= self._acked()

    @precondition(lambda self: self.slots and self._running())
    @rule(data=st.data(), q=st.integers(0, QUEUES - 1), want=st.integers(0, 4))
    def commit_offsets(self, data, q, want):
        i = data.draw(st.sampled_from(self._running()))
        store = self.slots[i].store
        if self._stale(i):
            with pytest.raises(FencedError):
                store.commit_consumer_offsets(GROUP, {(TOPIC, q): 1000 + want})
            return
        off = min(want, store.max_offset(TOPIC, q))
        store.commit_consumer_offsets(GROUP, {(TOPIC, q): off})
        self.offsets[(TOPIC, q)] = off

    @precondition(lambda self: self.slots and self._running())
    @rule(data=st.data(), name=st.sampled_from(["u0", "u1", "u2"]))
    def create_topic(self, data, name):
        i = data.draw(st.sampled_from(self._running()))
        store = self.slots[i].store
        if self._stale(i):
            with pytest.raises(FencedError):
                store.create_topic(name, read_queue_nums=1, write_queue_nums=1, exist_ok=True)
            return
        store.create_topic(name, read_queue_nums=1, write_queue_nums=1, exist_ok=True)
        self.topics.add(name)

    @precondition(lambda self: self.slots and self._running())
    @rule(data=st.data())
    def pause(self, data):
        self.slots[data.draw(st.sampled_from(self._running()))].paused = True

    @precondition(lambda self: any(s.paused for s in self.slots))
    @rule(data=st.data())
    def resume(self, data):
        slot = self.slots[data.draw(st.sampled_from(
            [i for i, s in enumerate(self.slots) if s.paused]))]
        slot.paused = False
        slot.clock.now_ms = self.world + slot.skew

    @rule(ms=steps_st)
    def advance(self, ms):
        self._set_world(self.world + ms)

    @precondition(lambda self: self.slots and self._running())
    @rule(data=st.data())
    def close(self, data):
        i = data.draw(st.sampled_from(self._running()))
        self._close(i)

    def _close(self, i: int) -> None:
        slot = self.slots[i]
        slot.store.close()
        slot.store = None
        if self.holder == i:
            self.holder = None
            self.published |= self._acked()
        else:
            self._verify("after a fenced writer's close")

    @precondition(lambda self: self.slots and self._running(paused_ok=True))
    @rule(data=st.data())
    def crash(self, data):
        i = data.draw(st.sampled_from(self._running(paused_ok=True)))
        slot = self.slots[i]
        slot.store._crash()
        slot.store = None
        slot.paused = False
        if self.holder == i:
            self.holder = None

    @rule(snapshot=st.booleans())
    def read(self, snapshot):
        reader = Snapshot.load(self.url) if snapshot else Store.open(self.url, mode="r")
        lease = reader.state.lease
        try:
            self._check_reader(reader, self.published, "a reader")
            assert lease.epoch == self.epoch and lease.epoch >= self.seen_epoch
            self.seen_epoch = lease.epoch
        finally:
            if not snapshot:
                reader.close()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def one_unfenced_writer_of_the_epoch(self):
        current = [i for i in self._running(paused_ok=True)
                   if self.slots[i].store.epoch == self.epoch
                   and not self.slots[i].store.lease.fenced]
        assert current == ([] if self.holder is None else [self.holder]), current
        for i in self._running(paused_ok=True):
            assert self.slots[i].store.epoch <= self.epoch

    @invariant()
    def the_holder_reads_every_stored_message(self):
        if self.holder is None or self.slots[self.holder].paused:
            return
        store = self.slots[self.holder].store
        assert store.state.lease.expires_time == self.expires, "the model's lease expiry"
        self._check_reader(store, self._acked(), "the lease's holder")

    def teardown(self):
        try:
            if self.slots:
                self._finish()
        finally:
            for s in self.slots:
                if s.store is not None and not s.store.closed:
                    s.store._crash()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _finish(self):
        """Every writer stops (the fenced ones, then the last holder, cleanly); a read-only
        open reads every message answered as stored; a new writer opens, at the next epoch."""
        for s in self.slots:
            if s.paused:
                s.paused = False
                s.clock.now_ms = self.world + s.skew
        for i in sorted(self._running(), key=lambda i: i == self.holder):
            self._close(i)
        if self.holder is None:
            i = 0
            self.open_slot(i)
            self._close(i)
        acked = self._acked()
        with Store.open(self.url, mode="r") as r:
            self._check_reader(r, acked, "a reader after the last clean close")
            assert r.state.lease.released and r.state.lease.epoch == self.epoch
        self._verify("at the end")
        self.open_slot(0)
        self._check_reader(self.slots[0].store, acked, "the next writer")
        self._close(0)


class AsyncLeaseModel(LeaseModel):
    FLUSH = ASYNC_FLUSH


# ---------------------------------------------------------------- regression (found by the model)
OPTS = dict(start_services=False, flushDiskType=SYNC_FLUSH, mappedFileSizeCommitLog=4096)


@pytest.mark.parametrize("starts", ["the first segment", "a roll"])
def test_a_fenced_writers_late_segment_does_not_block_the_new_writer(store_url, starts):
    """Writer A stops between its lease check and a write that starts a new segment (the
    store's first, or a roll past a full one); B takes the store over meanwhile (sealing
    A's last segment). A's write then creates the segment file at the offset where B's
    next segment starts, and A answers FencedError ("may not be stored"). B must still
    append (it used to fail with FileExistsError at every append until reopened)."""
    clock = Clock()
    a = Store.open(store_url, clock_ms=clock, **OPTS)
    a.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    kept = []
    if starts == "a roll":
        while a.commitlog.active is None or not a.commitlog.needs_roll(2000):
            kept.append(b"a%d" % len(kept))
            a.append([msg("t", kept[-1] + b"." * 200)])
    def take_over() -> Store:
        clock.advance(a.config.lease_timeout_ms + 1)
        return Store.open(store_url, clock_ms=Clock(clock.now_ms), **OPTS)
    taken = pause_before_the_write(a, take_over)
    with pytest.raises(FencedError, match="may not be stored"):
        a.append([msg("t", b"late" + b"." * 1500)])
    b = taken[0]
    try:
        b.append([msg("t", b"b1")])
        assert bodies(b, "t", 0) == [k + b"." * 200 for k in kept] + [b"b1"]
    finally:
        a.close()
        b.close()


_SETTINGS = settings(max_examples=80, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.filter_too_much])
TestLeaseModelSync = LeaseModel.TestCase
TestLeaseModelSync.settings = _SETTINGS
TestLeaseModelAsync = AsyncLeaseModel.TestCase
TestLeaseModelAsync.settings = _SETTINGS
