"""Model-based test of the Spark writer's commit protocol, without Spark (hypothesis).

The writer classes of ``sparkmq.datasource.writer`` are driven as Spark drives them:
executor tasks call ``write(iterator of Arrow batches)`` (each under a pyspark
``TaskContext`` holding its partition id and attempt number, as Spark's Python worker sets
it) and return commit messages; the driver calls ``commit(messages[, batchId])`` or
``abort(...)``. Spark's failures are rules of their own: a task that dies while writing (its
files are discarded), a task that wrote its files and died before its message reached the
driver, a task retried (two attempts of one partition wrote, one message is committed), a
job aborted, a driver that crashed between the tasks' writes and the commit, a streaming
query that committed a batch and was restarted before recording it (the same batchId is
committed again), a lower batchId after a higher one (a new checkpoint kept the writerId).

The same store meanwhile has a broker's ``sparkmq.Store`` (appends, publishes, clean close,
abandoned without close, reopen) and ``vacuum`` (through the open store, or a read-only
one) under a manual clock. Staged files get the manual clock as their modification time
when their task finishes (the file system's clock and the store's clock agree in real life),
so vacuum's age rule is exact here.

The model predicts, after every step: the rows of the topic in each queue (exactly the
committed jobs' and the broker's rows, each once, with body, keys and tags, every commit one
contiguous run per queue in message, file and row order, offsets 0..n-1), in the newest
published version and in the live store; the ``txn`` versions of the streaming queries;
and exactly which staged files (``commitlog/w-*``) are on disk.

What the code promises and the model holds it to (``writer.py``, ``committer.py``,
``vacuum.py``): a batch job's commit or abort deletes every uncommitted staged file of the job
(dead attempts included); a streaming query's job id is stable across restarts, so its next
commit or abort deletes the files of its earlier failed or crashed batches; a batch job
whose driver crashed leaves its files to vacuum, which deletes an unreferenced staged file
once it is at least the retention old (a retention below 1 h is refused unless forced), so a
job younger than the retention always commits after a vacuum, and a job older than it fails
cleanly (nothing visible). A batchId at or below the query's recorded ``txn`` version is
skipped (no rows), whichever committer runs. A batch commit sent again after it succeeded
(a broker's reply lost and the hand-off retried) is refused and changes nothing.

Commits go through the DirectCommitter while the broker's store is closed, through
``Store.adopt`` while it is open (the in-process form of the broker's ``/admin/adopt``),
and are refused (UncleanWriterError, then Spark's abort) while it is abandoned. The named
scenarios at the end drive the same model by hand through paths a random run reaches
rarely, once per committer.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)
from pyspark import TaskContext
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, StringType, StructField,
                               StructType)

from helpers.clock import Clock
from sparkmq import SYNC_FLUSH, Message, Snapshot, Store
from sparkmq.datasource.writer import SparkMQBatchWriter, SparkMQStreamWriter
from sparkmq.errors import InvalidConfigError, UncleanWriterError, UserError
from sparkmq.log import format as fmt
from sparkmq.log.fs import StoreFS

TOPIC = "T"
QUEUES = 3
QUERIES = ("q1", "q2")
MAX_OPEN_JOBS = 2           # jobs written and not yet committed, aborted or crashed
MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
STORE_OPTS = dict(start_services=False, flushDiskType=SYNC_FLUSH,
                  mappedFileSizeCommitLog=8192)
BASE_FIELDS = [StructField("body", BinaryType()), StructField("keys", ArrayType(StringType())),
               StructField("tags", StringType())]
QUEUE_FIELD = StructField("queue_id", IntegerType())


class TaskKilled(Exception):
    """An executor task dying half way through its input."""


@dataclass(frozen=True)
class Row:
    body: bytes
    keys: tuple[str, ...]
    tags: str | None
    queue: int | None          # None: the writer (round robin) chooses


@dataclass
class Attempt:
    partition: int
    rows: list[Row]
    message: object            # the SparkMQCommitMessage
    delivered: bool            # False: the task died before the driver got its message


@dataclass
class Job:
    """One Spark write job: a batch write, or one micro-batch of a streaming query."""

    jid: int
    writer: object
    partitions: int
    explicit_queue: bool
    query: str | None = None
    batch_id: int | None = None
    attempts: dict[int, list[Attempt]] = field(default_factory=dict)


@dataclass
class Query:
    """A streaming query's driver: its writer (None until (re)started) and checkpoint."""

    app_id: str = ""
    writer: object = None
    spark_next: int = 0        # the batch id Spark runs next (its checkpoint's commits)
    inflight: int | None = None


rows_strategy = st.lists(st.tuples(st.sampled_from([(), ("k1",), ("k1", "k2")]),
                                   st.sampled_from([None, "a", "b"]),
                                   st.integers(0, QUEUES - 1)), min_size=0, max_size=5)
fates = st.sampled_from(["ok", "ok", "ok", "message_lost", "killed"])


class WriterModel(RuleBasedStateMachine):
    def __init__(self, folder):
        super().__init__()
        self.url = str(folder)
        self.clock = Clock(int(time.time() * 1000))
        with Store.open(self.url, clock_ms=self.clock, **STORE_OPTS) as s:
            s.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        self.store: Store | None = None
        self.abandoned = False
        self.events: list[list[Row]] = []   # committed rows, one list per commit/append
        self.published = 0                  # events[:published] are in the newest version
        self.staged: dict[str, int] = {}    # uncommitted staged file -> written at (ms)
        self.committed: set[str] = set()    # staged files now segments of the store
        self.txns: dict[str, int] = {}      # app id -> highest committed batch id
        self.jobs: dict[int, Job] = {}
        self.queries = {q: Query() for q in QUERIES}
        self.next_id = 0

    # ------------------------------------------------------------------ helpers
    def _uid(self) -> int:
        self.next_id += 1
        return self.next_id

    def _options(self, segment_bytes: int, query: str | None = None) -> dict:
        opts = {"path": self.url, "topic": TOPIC, "maxSegmentBytes": str(segment_bytes)}
        if query is not None:
            opts["writerId"] = query
        return opts

    def _schema(self, explicit_queue: bool) -> StructType:
        return StructType(BASE_FIELDS + ([QUEUE_FIELD] if explicit_queue else []))

    def _make_writer(self, make):
        """A writer's constructor on the driver; refused on an abandoned store."""
        if self.abandoned:
            with pytest.raises(UncleanWriterError):
                make()
            return None
        return make()

    def _forget_prefix(self, prefix: str) -> None:
        """The job's uncommitted staged files are deleted (commit's or abort's cleanup)."""
        self.staged = {p: t for p, t in self.staged.items() if not p.startswith(prefix)}

    def _commit_outcome(self, paths: list[str], replay: bool) -> str:
        """What the code must do with a commit now: 'commit', 'skip' or 'fail'."""
        if self.abandoned:
            return "fail"          # UncleanWriterError: recover the store first
        if replay:             # (even when vacuum took its files: txn is read first)
            return "skip"
        return "fail" if any(p not in self.staged for p in paths) else "commit"

    def _committed_rows(self, job: Job, chosen: list[Attempt]) -> None:
        self.events.append([r for a in chosen for r in a.rows])
        for a in chosen:
            for p in a.message.paths:
                self.committed.add(p)
                self.staged.pop(p)
        self.published = len(self.events)       # a commit publishes the broker's rows too

    # ------------------------------------------------------------------ Spark: jobs
    @precondition(lambda self: len(self.jobs) < MAX_OPEN_JOBS)
    @rule(tasks=st.lists(st.tuples(rows_strategy, fates), min_size=1, max_size=3),
          explicit_queue=st.booleans(), segment_bytes=st.sampled_from([1, 1 << 20]))
    def start_batch_job(self, tasks, explicit_queue, segment_bytes):
        """A batch job; its tasks' first attempts run at once."""
        partitions = len(tasks)
        schema = self._schema(explicit_queue)
        writer = self._make_writer(lambda: SparkMQBatchWriter(
            self._options(segment_bytes), schema, False))
        if writer is not None:
            jid = self._uid()
            self.jobs[jid] = job = Job(jid, writer, partitions, explicit_queue)
            self._run_tasks(job, tasks)

    @precondition(lambda self: len(self.jobs) < MAX_OPEN_JOBS)
    @rule(q=st.sampled_from(QUERIES), tasks=st.lists(st.tuples(rows_strategy, fates),
                                                      min_size=1, max_size=2),
          explicit_queue=st.booleans(), lower=st.integers(0, 3))
    def start_micro_batch(self, q, tasks, explicit_queue, lower):
        """The query's next micro-batch; ``lower`` > 0 starts a new checkpoint with the same
        writerId below the recorded batch id (its batches are skipped, as documented)."""
        query = self.queries[q]
        if query.inflight is not None:
            return                  # Spark runs a query's micro-batches one at a time
        if query.writer is None:
            query.writer = self._make_writer(lambda: SparkMQStreamWriter(
                self._options(1 << 20, q), self._schema(explicit_queue), False))
            if query.writer is None:
                return
            query.app_id = query.writer.app_id
        batch_id = query.spark_next
        recorded = self.txns.get(query.app_id, -1)
        if lower and recorded >= 1:
            batch_id = max(0, recorded - lower)
            query.spark_next = batch_id
        jid = self._uid()
        # the writer's schema is the query's; rows carry a queue only if it has the column
        explicit = "queue_id" in query.writer.columns
        self.jobs[jid] = job = Job(jid, query.writer, len(tasks), explicit, q, batch_id)
        query.inflight = jid
        self._run_tasks(job, tasks)

    def _run_tasks(self, job: Job, tasks) -> None:
        for partition, (rows, fate) in enumerate(tasks):
            self._run_task(job, partition, rows, fate)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), rows=rows_strategy, fate=fates)
    def retry_task(self, data, rows, fate):
        """Another attempt of a job's partition (Spark's retry, or a speculative copy)."""
        job = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)))]
        self._run_task(job, data.draw(st.integers(0, job.partitions - 1)), rows, fate)

    def _run_task(self, job: Job, partition: int, rows, fate: str) -> None:
        """One task attempt: ``ok``; ``message_lost`` (wrote and sealed its files, died
        before the driver got its message); ``killed`` (died while writing)."""
        attempt = len(job.attempts.setdefault(partition, []))
        tag = f"j{job.jid}p{partition}a{attempt}"
        model_rows = [Row(f"{tag}/{i}".encode(), keys, tags,
                          queue if job.explicit_queue else None)
                      for i, (keys, tags, queue) in enumerate(rows)]
        batches = [self._arrow(model_rows[i:i + 2], job.explicit_queue)
                   for i in range(0, len(model_rows), 2)]

        def task_input():
            for n, b in enumerate(batches):
                if fate == "killed" and n == len(batches) - 1:
                    raise TaskKilled(tag)
                yield b
            if fate == "killed" and not batches:
                raise TaskKilled(tag)
        TaskContext._setTaskContext(None)
        TaskContext(partitionId=partition, attemptNumber=attempt, stageId=0,
                    taskAttemptId=self._uid())
        try:
            if fate == "killed":
                with pytest.raises(TaskKilled):
                    job.writer.write(task_input())
                return                # its files are discarded by the task itself
            message = job.writer.write(task_input())
        finally:
            TaskContext._setTaskContext(None)
        assert message.num_rows == len(model_rows)
        assert len(message.paths) == len(set(message.paths))
        for p in message.paths:     # the file system's clock is the manual clock
            ns = self.clock.now_ms * 1_000_000
            os.utime(os.path.join(self.url, p), ns=(ns, ns))
            self.staged[p] = self.clock.now_ms
        job.attempts[partition].append(Attempt(partition, model_rows, message,
                                               delivered=(fate == "ok")))

    @staticmethod
    def _arrow(rows: list[Row], explicit_queue: bool) -> pa.RecordBatch:
        cols = {"body": pa.array([r.body for r in rows], pa.binary()),
                "keys": pa.array([list(r.keys) or None for r in rows], pa.list_(pa.string())),
                "tags": pa.array([r.tags for r in rows], pa.string())}
        if explicit_queue:
            cols["queue_id"] = pa.array([r.queue for r in rows], pa.int32())
        return pa.RecordBatch.from_pydict(cols)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), end=st.sampled_from(["commit", "commit", "commit", "commit",
                                               "abort", "driver_crash"]),
          record=st.booleans(), resend=st.booleans())
    def finish_job(self, data, end, record, resend=False):
        """A job ends: its commit, its abort, or its driver's crash."""
        job = self.jobs.pop(data.draw(st.sampled_from(sorted(self.jobs))))
        if end == "commit":
            self._commit_job(job, data, record, resend)
        else:
            self._job_fails(job, driver_crashed=(end == "driver_crash"))

    def _commit_job(self, job: Job, data, record: bool, resend: bool) -> None:
        """Spark reruns a partition until one attempt delivers its message, then the
        driver commits one delivered attempt's message per partition (Spark's commit
        coordinator lets one attempt of a partition commit). A stream batch that
        committed may not be recorded by Spark (``record`` False: the driver died right
        after), so the restarted query runs the same batchId again. A batch commit that
        succeeded may be sent again (``resend``: a broker's reply lost, the hand-off
        retried): it is refused and changes nothing."""
        for p in range(job.partitions):
            if not any(a.delivered for a in job.attempts.get(p, ())):
                self._run_task(job, p, data.draw(rows_strategy, label=f"retry of {p}"), "ok")
        chosen = [data.draw(st.sampled_from([a for a in job.attempts[p] if a.delivered]))
                  for p in range(job.partitions)]
        messages = [a.message for a in chosen]
        paths = [p for a in chosen for p in a.message.paths]
        query = self.queries[job.query] if job.query else None
        replay = query is not None and job.batch_id <= self.txns.get(query.app_id, -1)
        # a batch job that wrote no rows commits nothing (no log version, no lease check)
        outcome = self._commit_outcome(paths, replay) if paths or query else "nothing"
        try:
            if query is None:
                job.writer.commit(messages)
            else:
                job.writer.commit(messages, job.batch_id)
        except (UncleanWriterError, UserError) as exc:
            assert outcome == "fail", f"commit refused unexpectedly: {exc}"
            # Spark aborts a job whose commit failed (and the query stops)
            self._job_fails(job, driver_crashed=False, messages=messages)
            return
        assert outcome != "fail", "a commit that had to fail succeeded"
        if outcome == "commit":
            self._committed_rows(job, chosen)
            if query is not None:
                self.txns[query.app_id] = job.batch_id
            elif resend:
                with pytest.raises(UserError, match="already committed"):
                    job.writer.commit(messages + messages[:1])
        self._forget_prefix(fmt.staged_prefix(job.writer.job_id))
        if query is not None:
            query.inflight = None
            if record:
                query.spark_next = job.batch_id + 1
            else:
                query.writer = None        # restarted: the same batchId runs again

    def _job_fails(self, job: Job, *, driver_crashed: bool, messages=None) -> None:
        """The job failed for good: Spark aborts with the messages it got (None for the
        partitions with none). Or the driver died after the tasks wrote, before commit or
        abort: the files stay (a batch job's for vacuum, a stream's for the restarted
        query's next commit or abort). A query stops either way."""
        if job.query is not None:
            query = self.queries[job.query]
            query.inflight, query.writer = None, None
        if driver_crashed:
            return
        if messages is None:
            messages = []
            for p in range(job.partitions):
                got = [a.message for a in job.attempts.get(p, ()) if a.delivered]
                messages.append(got[-1] if got else None)
        job.writer.abort(messages, *([] if job.query is None else [job.batch_id]))
        self._forget_prefix(fmt.staged_prefix(job.writer.job_id))

    # ------------------------------------------------------------------ the broker
    @rule(data=st.data())
    def broker_lifecycle(self, data):
        """Open the store for writing (recovering an abandoned one), or close it cleanly,
        or abandon it as a killed broker process would (no flush, publish, lease release)."""
        if self.store is None:
            self.store = Store.open(self.url, clock_ms=self.clock, **STORE_OPTS)
            assert self.store.recovered_from_crash == self.abandoned
            self.abandoned = False
            self.published = len(self.events)
        elif data.draw(st.booleans(), label="abandon"):
            self.store._crash()
            self.store, self.abandoned = None, True
        else:
            self.store.close()
            self.store = None
            self.published = len(self.events)

    @precondition(lambda self: self.store is not None)
    @rule(rows=st.lists(st.tuples(st.sampled_from([(), ("k1",), ("b", "c")]),
                                  st.sampled_from([None, "a", "z"]),
                                  st.integers(0, QUEUES - 1)), min_size=1, max_size=4),
          publish=st.booleans())
    def broker_append(self, rows, publish):
        """A producer's send through the broker's store, then maybe a publish."""
        tag = f"b{self._uid()}"
        model_rows = [Row(f"{tag}/{i}".encode(), keys, tags, q)
                      for i, (keys, tags, q) in enumerate(rows)]
        self.store.append([Message(TOPIC, r.body, tags=r.tags, keys=r.keys, queue_id=r.queue)
                           for r in model_rows])
        self.events.append(model_rows)
        if publish:
            self.store.publish(force=True)
            self.published = len(self.events)

    # ------------------------------------------------------------------ time and vacuum
    @rule(minutes=st.sampled_from([0, 30, 60, 90]),
          retention_min=st.sampled_from([0, 30, 60, 120]), read_only=st.booleans())
    def vacuum(self, minutes, retention_min, read_only=False):
        """Time passes, then a vacuum: through the broker's store, or (``read_only``, or no
        broker) a read-only store of another admin next to it; a retention below 1 h is
        refused unless forced."""
        self.clock.advance(minutes * MINUTE_MS)
        retention_ms = retention_min * MINUTE_MS
        store = self.store
        if store is None or read_only:
            store = Store.open(self.url, mode="r", clock_ms=self.clock)
        try:
            if retention_ms < HOUR_MS:
                with pytest.raises(InvalidConfigError, match="below the safe minimum"):
                    store.vacuum(retention_ms=retention_ms)
            result = store.vacuum(retention_ms=retention_ms, force=True)
        finally:
            if store is not self.store:
                store.close()
        due = {p for p, t in self.staged.items() if t <= self.clock.now_ms - retention_ms}
        assert {f for f in result.files if f.startswith(fmt.COMMITLOG_DIR + "/w-")} == due
        self.staged = {p: t for p, t in self.staged.items() if p not in due}

    # ------------------------------------------------------------------ invariants
    @invariant()
    def published_version_holds_exactly_the_committed_rows(self):
        snap = Snapshot.load(self.url)
        # the broker also publishes by itself (its publish interval, on the manual clock):
        # the newest version holds a prefix of the events, at least the published ones
        total = sum(snap.max_offset(TOPIC, q) for q in range(QUEUES))
        seen = self.published
        while seen < len(self.events) and total > sum(map(len, self.events[:seen])):
            seen += 1
        self._check_rows(snap, self.events[:seen])
        self.published = seen
        assert {k: t.version for k, t in snap.state.txns.items()} == self.txns
        assert self.committed <= set(snap.state.segments)

    @invariant()
    def live_store_holds_every_row(self):
        if self.store is not None:
            self._check_rows(self.store, self.events)

    @invariant()
    def staged_files_on_disk_are_the_predicted_ones(self):
        names = StoreFS(self.url).list_names(fmt.COMMITLOG_DIR)
        on_disk = {f"{fmt.COMMITLOG_DIR}/{n}" for n in names if n.startswith("w-")}
        assert on_disk == self.committed | set(self.staged)

    def _check_rows(self, reader, events: list[list[Row]]) -> None:
        """Each row of ``events`` once, fields intact, each queue's offsets 0..n-1, and in
        each queue the rows in event order, an event's rows in its own order."""
        stored: dict[bytes, int] = {}                        # body -> queue
        fields: dict[bytes, tuple] = {}                      # body -> (keys, tags)
        per_queue: dict[int, list[bytes]] = {}
        for q in range(QUEUES):
            t = reader.read_table(TOPIC, q, 0, columns=["body", "keys", "tags",
                                                        "queue_offset"])
            assert t.column("queue_offset").to_pylist() == list(range(t.num_rows))
            assert reader.max_offset(TOPIC, q) == t.num_rows
            per_queue[q] = t.column("body").to_pylist()
            for b, k, tg in zip(per_queue[q], t.column("keys").to_pylist(),
                                t.column("tags").to_pylist()):
                assert b not in stored, f"row {b!r} stored twice"
                stored[b] = q
                fields[b] = (tuple(k or ()), tg)
        rows = [r for ev in events for r in ev]
        assert sorted(stored) == sorted(r.body for r in rows)
        for r in rows:
            assert fields[r.body] == (r.keys, r.tags)
            assert r.queue is None or stored[r.body] == r.queue
        for q in range(QUEUES):
            assert per_queue[q] == [r.body for r in rows if stored[r.body] == q]

    def teardown(self):
        if self.store is not None:
            self.store.close()
        TaskContext._setTaskContext(None)


MODEL_SETTINGS = settings(max_examples=20, stateful_step_count=40, deadline=None,
                          suppress_health_check=list(HealthCheck))


def test_writer_commit_protocol_against_the_model(tmp_path):
    runs = iter(range(10**6))
    run_state_machine_as_test(lambda: WriterModel(tmp_path / f"run{next(runs)}"),
                              settings=MODEL_SETTINGS)


# ---------------------------------------------------------------------- named scenarios
# The same model driven by hand through the paths a random run reaches rarely, with the
# broker's store closed (DirectCommitter) and open (Store.adopt).

class Draws:
    """Stands in for hypothesis' ``data`` in a named scenario: the given values, in order."""

    def __init__(self, *values):
        self.values = list(values)

    def draw(self, strategy, label=None):
        return self.values.pop(0)


class Scenario:
    """A WriterModel driven step by step; every invariant is checked after every step."""

    def __init__(self, folder, broker_open: bool):
        self.m = WriterModel(folder)
        if broker_open:
            self.step("broker_lifecycle", data=Draws())

    def step(self, name: str, **kw):
        getattr(self.m, name)(**kw)
        self.m.published_version_holds_exactly_the_committed_rows()
        self.m.live_store_holds_every_row()
        self.m.staged_files_on_disk_are_the_predicted_ones()

    def newest_job(self) -> Job:
        return self.m.jobs[max(self.m.jobs)]

    def finish(self, job: Job, end: str = "commit", record: bool = True,
               attempts: list[int] | None = None, resend: bool = False):
        """End ``job``; a commit takes each partition's ``attempts[p]``-th delivered attempt."""
        chosen = []
        if end == "commit":
            for p in range(job.partitions):
                delivered = [a for a in job.attempts[p] if a.delivered]
                chosen.append(delivered[attempts[p] if attempts else 0])
        self.step("finish_job", data=Draws(job.jid, *chosen), end=end, record=record,
                  resend=resend)

    def reopen_both_ways(self):
        """Abandon the broker's store (or open and abandon it), reopen it, close it
        cleanly, reopen it: the invariants hold after each."""
        if self.m.store is None:
            self.step("broker_lifecycle", data=Draws())
        self.step("broker_append", rows=_rows(2, 1), publish=False)
        self.step("broker_lifecycle", data=Draws(True))        # abandoned
        self.step("broker_lifecycle", data=Draws())            # recovered
        self.step("broker_append", rows=_rows(1, 2), publish=True)
        self.step("broker_lifecycle", data=Draws(False))       # closed cleanly
        self.step("broker_lifecycle", data=Draws())

    def close(self):
        self.m.teardown()


def _rows(n: int, queue: int = 0) -> list:
    keys = [(), ("k1",), ("k1", "k2")]
    return [(keys[i % 3], [None, "a"][i % 2], queue) for i in range(n)]


@pytest.fixture(params=["direct", "broker"])
def scenario(request, tmp_path):
    s = Scenario(tmp_path / "store", broker_open=(request.param == "broker"))
    yield s
    s.close()


def test_a_replayed_or_lower_stream_batch_id_is_stored_once(scenario):
    s = scenario
    s.step("start_micro_batch", q="q1", tasks=[(_rows(3), "ok"), (_rows(2, 1), "ok")],
           explicit_queue=True, lower=0)
    s.finish(s.newest_job(), record=False)        # committed; the driver died before recording
    s.step("start_micro_batch", q="q1", tasks=[(_rows(2), "ok")], explicit_queue=True, lower=0)
    assert s.newest_job().batch_id == 0           # the restarted query replays batch 0
    s.finish(s.newest_job())                       # skipped
    for _ in (1, 2):
        s.step("start_micro_batch", q="q1", tasks=[(_rows(2), "ok")], explicit_queue=True,
               lower=0)
        s.finish(s.newest_job())
    s.step("start_micro_batch", q="q1", tasks=[(_rows(2), "ok")], explicit_queue=True, lower=2)
    assert s.newest_job().batch_id == 0           # a new checkpoint, the same writerId
    s.finish(s.newest_job())                       # at or below txn version 2: skipped
    assert s.m.txns == {"spark-stream:q1": 2}
    assert len([e for e in s.m.events if e]) == 3 and not s.m.staged
    s.reopen_both_ways()


def test_one_attempt_per_partition_lands_in_file_and_row_order(scenario):
    s = scenario
    s.step("start_batch_job", tasks=[(_rows(5), "killed"), (_rows(5), "ok")],
           explicit_queue=True, segment_bytes=1)     # a file per Arrow batch (2 rows)
    job = s.newest_job()
    s.step("retry_task", data=Draws(job.jid, 0), rows=_rows(5), fate="message_lost")
    s.step("retry_task", data=Draws(job.jid, 0), rows=_rows(4), fate="ok")
    s.step("retry_task", data=Draws(job.jid, 1), rows=_rows(3), fate="ok")   # speculative
    if s.m.store is not None:
        s.step("broker_append", rows=_rows(2), publish=False)
    s.finish(job, attempts=[0, 1], resend=True)   # sent again: refused, nothing changes
    assert [len(e) for e in s.m.events] == ([2] if s.m.store else []) + [4 + 3]
    assert not s.m.staged
    s.reopen_both_ways()


def test_vacuum_takes_only_staged_files_older_than_its_retention(scenario):
    s = scenario
    s.step("start_batch_job", tasks=[(_rows(3), "ok")], explicit_queue=False,
           segment_bytes=1 << 20)
    old = s.newest_job()
    s.step("vacuum", minutes=90, retention_min=120)          # 90 min old: kept
    s.step("start_batch_job", tasks=[(_rows(2, 2), "ok")], explicit_queue=True,
           segment_bytes=1)
    young = s.newest_job()
    s.step("vacuum", minutes=30, retention_min=60)           # 120 min old: deleted
    assert all(p not in s.m.staged for a in old.attempts[0] for p in a.message.paths)
    s.finish(young)                                          # 30 min old: commits
    s.finish(old)                                            # its files are gone: refused
    assert [len(e) for e in s.m.events] == [2]
    s.step("start_batch_job", tasks=[(_rows(1), "ok")], explicit_queue=False,
           segment_bytes=1 << 20)
    s.finish(s.newest_job(), end="driver_crash")            # left for vacuum
    s.step("vacuum", minutes=60, retention_min=60)           # exactly as old: deleted
    assert not s.m.staged
    s.reopen_both_ways()


def test_an_abandoned_broker_refuses_commits_until_its_store_is_reopened(tmp_path):
    s = Scenario(tmp_path / "store", broker_open=True)
    try:
        s.step("broker_append", rows=_rows(2), publish=False)
        s.step("start_batch_job", tasks=[(_rows(2), "ok")], explicit_queue=False,
               segment_bytes=1 << 20)
        s.step("start_micro_batch", q="q2", tasks=[(_rows(1), "ok")], explicit_queue=False,
               lower=0)
        s.step("broker_lifecycle", data=Draws(True))             # abandoned
        s.finish(s.m.jobs[min(s.m.jobs)])                         # UncleanWriterError, abort
        s.finish(s.newest_job())
        s.step("start_batch_job", tasks=[(_rows(1), "ok")], explicit_queue=False,
               segment_bytes=1)                                   # refused at planning
        assert not s.m.jobs
        s.step("broker_lifecycle", data=Draws())                  # recovered
        s.step("start_micro_batch", q="q2", tasks=[(_rows(2), "ok")], explicit_queue=False,
               lower=0)
        s.finish(s.newest_job())
        s.step("broker_lifecycle", data=Draws(False))             # closed cleanly
        assert [len(e) for e in s.m.events] == [2, 2] and s.m.txns == {"spark-stream:q2": 0}
    finally:
        s.close()
