"""Property test: the store against a simple in-memory model (hypothesis).

Rules append (random topic, queue, bodies; row and columnar paths), force
segment rolls with a tiny segment size, remove the oldest segment
(retention), publish, reopen cleanly, crash and reopen (appends are fsynced
under SYNC_FLUSH, so a crash loses nothing), read ranges and look up ids.
The invariant: every queue reads exactly what the model holds from its first
retained offset on (which only grows; below it reads raise DataLossError),
and a published snapshot reads a contiguous part of it.
"""
from __future__ import annotations

import shutil
import tempfile
import uuid

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import pytest

from sparkmq import SYNC_FLUSH, Message, Snapshot, Store
from sparkmq.errors import DataLossError

TOPICS = {"a": 2, "b": 1}      # topic -> queues
SEGMENT_BYTES = 4096
OPTS = dict(start_services=False, flushDiskType=SYNC_FLUSH, mappedFileSizeCommitLog=SEGMENT_BYTES)

queue_keys = st.sampled_from([(t, q) for t, n in TOPICS.items() for q in range(n)])
small_bodies = st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=4)


class StoreModel(RuleBasedStateMachine):
    backend = "local"

    def __init__(self):
        super().__init__()
        if self.backend == "local":
            self.folder = tempfile.mkdtemp(prefix="sparkmq-model-")
            self.url = self.folder + "/store"
        else:
            self.folder = None
            self.url = f"memory://sparkmq-model-{uuid.uuid4().hex}"
        self.store = Store.open(self.url, **OPTS)
        for t, n in TOPICS.items():
            self.store.create_topic(t, read_queue_nums=n, write_queue_nums=n)
        self.model: dict[tuple[str, int], list[bytes]] = {k: [] for k in
                                                         ((t, q) for t, n in TOPICS.items()
                                                          for q in range(n))}
        self.ids: list[tuple[str, bytes, str, int, int]] = []
        self.published: dict[tuple[str, int], int] = {k: 0 for k in self.model}
        self.floors: dict[tuple[str, int], int] = {k: 0 for k in self.model}

    # ------------------------------------------------------------------ rules
    @rule(key=queue_keys, data=small_bodies)
    def append(self, key, data):
        topic, qid = key
        res = self.store.append([Message(topic, b, queue_id=qid) for b in data])
        expected_offsets = list(range(len(self.model[key]), len(self.model[key]) + len(data)))
        assert [r.queue_offset for r in res] == expected_offsets
        for r, b in zip(res, data):
            self.ids.append((r.message_id, b, topic, qid, r.queue_offset))
        self.model[key].extend(data)

    @rule(key=queue_keys, n=st.integers(1, 3))
    def append_large_to_roll(self, key, n):
        topic, qid = key
        before = len(self.store.commitlog.segments())
        body = b"R" * 1500
        for _ in range(n):
            self.store.append([Message(topic, body, queue_id=qid)])
            self.model[key].append(body)
        assert len(self.store.commitlog.segments()) >= before

    @rule(key=queue_keys, mixed=st.lists(queue_keys, min_size=2, max_size=5))
    def append_mixed_batch(self, key, mixed):
        msgs = [Message(t, b"x%d" % i, queue_id=q) for i, (t, q) in enumerate(mixed)]
        res = self.store.append(msgs)
        for r, (t, q), m in zip(res, mixed, msgs):
            assert r.queue_offset == len(self.model[(t, q)])
            self.model[(t, q)].append(m.body)

    @precondition(lambda self: len([s for s in self.store.commitlog.segments() if s.sealed]) >= 2)
    @rule()
    def remove_oldest_segment(self):
        first = self.store.commitlog.segments()[0]
        self.store.remove_segments([first.path])
        self.ids = [i for i in self.ids if int(i[0][8:24], 16) >= first.end_offset]
        self.published = {k: len(v) for k, v in self.model.items()}

    @rule(rows=st.lists(st.tuples(queue_keys, st.binary(max_size=30)), min_size=1, max_size=6))
    def append_columnar(self, rows):
        import pyarrow as pa
        table = pa.table({"topic": [t for (t, _q), _b in rows],
                          "queue_id": pa.array([q for (_t, q), _b in rows], pa.int32()),
                          "body": pa.array([b for _k, b in rows], pa.binary())})
        res = self.store.append_batch(table)
        for (key, body), qo in zip(rows, res.queue_offsets.tolist()):
            assert qo == len(self.model[key])
            self.model[key].append(body)

    @rule()
    def publish(self):
        self.store.flush()
        self.published = {k: len(v) for k, v in self.model.items()}

    @rule()
    def reopen_clean(self):
        self.store.close()
        self.store = Store.open(self.url, **OPTS)
        assert not self.store.recovered_from_crash
        self.published = {k: len(v) for k, v in self.model.items()}

    @rule()
    def crash_and_reopen(self):
        self.store._crash()
        self.store = Store.open(self.url, **OPTS)
        assert self.store.recovered_from_crash
        self.published = {k: len(v) for k, v in self.model.items()}

    @rule(key=queue_keys, a=st.integers(0, 60), b=st.integers(0, 60))
    def read_range(self, key, a, b):
        start, end = min(a, b), max(a, b)
        floor = self.store.min_offset(*key)
        if start < floor and start < min(end, len(self.model[key])):
            with pytest.raises(DataLossError) as exc:
                self.store.read_table(key[0], key[1], start, end)
            assert exc.value.earliest_offset == floor
            start = floor
        end = max(start, end)
        table = self.store.read_table(key[0], key[1], start, end, columns=["queue_offset", "body"])
        assert table.column("body").to_pylist() == self.model[key][start:end]
        assert table.column("queue_offset").to_pylist() == list(
            range(start, min(end, len(self.model[key]))))

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 10**6))
    def lookup(self, i):
        mid, body, topic, qid, offset = self.ids[i % len(self.ids)]
        got = self.store.lookup(mid)
        assert (got.body, got.topic, got.queue_id, got.queue_offset) == (body, topic, qid, offset)

    @rule()
    def published_snapshot_is_a_prefix(self):
        snap = Snapshot.load(self.url)
        for (t, q), n in self.published.items():
            assert snap.max_offset(t, q) >= n
            lo = snap.min_offset(t, q)
            got = snap.read_table(t, q, lo, columns=["body"]).column("body").to_pylist()
            assert got == self.model[(t, q)][lo:lo + len(got)]

    # ------------------------------------------------------------------ invariant
    @invariant()
    def queues_equal_the_model(self):
        for (t, q), expected in self.model.items():
            assert self.store.max_offset(t, q) == len(expected)
            floor = self.store.min_offset(t, q)
            assert self.floors[(t, q)] <= floor <= len(expected)
            self.floors[(t, q)] = floor
            got = self.store.read_table(t, q, 0, columns=["body"],
                                        on_removed="skip").column("body").to_pylist()
            assert got == expected[floor:]

    def teardown(self):
        try:
            self.store.close()
        finally:
            if self.folder:
                shutil.rmtree(self.folder, ignore_errors=True)


class MemoryStoreModel(StoreModel):
    backend = "memory"


_SETTINGS = settings(max_examples=25, stateful_step_count=30, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])

TestStoreModelLocal = StoreModel.TestCase
TestStoreModelLocal.settings = _SETTINGS
TestStoreModelMemory = MemoryStoreModel.TestCase
TestStoreModelMemory.settings = _SETTINGS
