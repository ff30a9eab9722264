"""The committer interface without Spark: staged segments joining a store.

Real files, real threads and real processes; no mocks.
"""
from __future__ import annotations

import multiprocessing as mp
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkmq import Message, Snapshot, Store
from sparkmq.errors import (QueueNotFoundError, StoreLockedError, TopicNotFoundError,
                            UncleanWriterError, UserError)
from sparkmq.log import format as fmt
from sparkmq.log.committer import (BrokerCommitter, DirectCommitter, StoreCommitter, abort_job,
                                   commit_consumer_offsets, committer_for,
                                   uncommitted_staged_files)
from sparkmq.log.fs import StoreFS
from sparkmq.log.message import messages_to_batch
from sparkmq.log.segment import write_segment


def make_store(url, topics=(("T", 4),)):
    with Store.open(url, mode="w", start_services=False) as s:
        for name, n in topics:
            s.create_topic(name, write_queue_nums=n, read_queue_nums=n)


def stage(url, job, task, rows, *, batches=1):
    """Write one staged segment of ``rows`` = [(topic, queue_id, body, keys)] in ``batches``."""
    out = []
    per = max(1, -(-len(rows) // batches))
    for i in range(0, len(rows), per):
        part = rows[i:i + per]
        msgs = [Message(t, b, keys=k, tags="tg") for t, _, b, k in part]
        out.append(messages_to_batch(msgs, queue_ids=[q for _, q, _, _ in part],
                                     store_timestamp_ms=1_700_000_000_000,
                                     store_host="h", max_message_size_bytes=1 << 20))
    rel = fmt.staged_segment_file(job, task)
    write_segment(StoreFS(url), rel, out)
    return rel


def bodies(snap, topic, qid):
    return snap.read_table(topic, qid, 0).column("body").to_pylist()


def test_direct_commit_is_one_version_with_contiguous_offsets(store_url):
    make_store(store_url, [("T", 2), ("U", 1)])
    p1 = stage(store_url, "j1", "0", [("T", 0, b"a", ["k1"]), ("T", 1, b"b", []),
                                      ("U", 0, b"c", ["k2"])], batches=2)
    p2 = stage(store_url, "j1", "1", [("T", 0, b"d", []), ("U", 0, b"e", [])])
    before = Snapshot.load(store_url).version
    res = DirectCommitter(store_url).commit([p1, p2], app_id=None, app_version=None)
    assert res.version == before + 1 and res.num_messages == 5 and not res.skipped
    snap = Snapshot.load(store_url)
    assert bodies(snap, "T", 0) == [b"a", b"d"]
    assert bodies(snap, "T", 1) == [b"b"]
    assert bodies(snap, "U", 0) == [b"c", b"e"]
    assert snap.read_table("U", 0, 0).column("queue_offset").to_pylist() == [0, 1]
    assert [m.body for m in snap.query_by_key("T", "k1")] == [b"a"]
    # a store opened for writing continues the offsets after the adopted segments
    with Store.open(store_url, mode="w", start_services=False) as s:
        r = s.append(Message("T", b"f", queue_id=0))[0]
        assert r.queue_offset == 2
    assert bodies(Snapshot.load(store_url), "T", 0) == [b"a", b"d", b"f"]


def test_idempotent_replay_is_skipped(local_store_url):
    url = local_store_url
    make_store(url)
    p = stage(url, "s1", "0", [("T", 0, b"x", [])])
    c = DirectCommitter(url)
    first = c.commit([p], app_id="query-1", app_version=0)
    again = c.commit([p], app_id="query-1", app_version=0)
    assert again.skipped and again.version == first.version
    older = c.commit([stage(url, "s1", "1", [("T", 0, b"y", [])])], app_id="query-1",
                     app_version=0)
    assert older.skipped
    newer = c.commit([stage(url, "s1", "2", [("T", 0, b"z", [])])], app_id="query-1",
                     app_version=1)
    assert not newer.skipped
    assert bodies(Snapshot.load(url), "T", 0) == [b"x", b"z"]


def test_a_replay_whose_staged_files_are_gone_is_skipped_not_failed(local_store_url):
    """A stream batch replayed after its commit landed, whose staged files (uncommitted
    copies of a retried write) vacuum or a cleanup already removed: the log's ``txn``
    says it is done, so it is skipped before any file is read, as ``Store.adopt`` does."""
    url = local_store_url
    make_store(url)
    c = DirectCommitter(url)
    first = c.commit([stage(url, "s1", "0", [("T", 0, b"x", [])])], app_id="q", app_version=3)
    gone = stage(url, "s1", "1", [("T", 0, b"x again", [])])
    StoreFS(url).delete(gone)
    again = c.commit([gone], app_id="q", app_version=3)
    assert again.skipped and again.version == first.version
    assert bodies(Snapshot.load(url), "T", 0) == [b"x"]


def test_a_batch_commit_of_the_same_files_twice_is_refused(local_store_url):
    make_store(local_store_url)
    p = stage(local_store_url, "j", "0", [("T", 0, b"x", [])])
    DirectCommitter(local_store_url).commit([p], app_id=None, app_version=None)
    with pytest.raises(UserError, match="already committed"):
        DirectCommitter(local_store_url).commit([p], app_id=None, app_version=None)


def test_unknown_topic_and_bad_queue_are_refused_and_leave_nothing(local_store_url):
    url = local_store_url
    make_store(url)
    v = Snapshot.load(url).version
    with pytest.raises(TopicNotFoundError, match="Nope"):
        DirectCommitter(url).commit([stage(url, "j", "0", [("Nope", 0, b"x", [])])],
                                    app_id=None, app_version=None)
    with pytest.raises(QueueNotFoundError, match="out of range"):
        DirectCommitter(url).commit([stage(url, "j", "1", [("T", 9, b"x", [])])],
                                    app_id=None, app_version=None)
    assert Snapshot.load(url).version == v
    assert StoreFS(url).list_names(fmt.CONSUMEQUEUE_DIR) == []


def _race(url, job, n_files, rows_per_file):
    c = DirectCommitter(url)
    for i in range(n_files):
        rows = [("T", r % 2, f"{job}-{i}-{r}".encode(), []) for r in range(rows_per_file)]
        c.commit([stage(url, job, str(i), rows)], app_id=None, app_version=None)


def _check_race(url, jobs, n_files, rows_per_file):
    snap = Snapshot.load(url)
    seen = []
    for q in (0, 1):
        t = snap.read_table("T", q, 0)
        offs = t.column("queue_offset").to_pylist()
        assert offs == list(range(len(offs)))          # contiguous and distinct
        seen += [b.decode() for b in t.column("body").to_pylist()]
    assert len(seen) == len(set(seen)) == len(jobs) * n_files * rows_per_file
    for job in jobs:                                   # each commit landed whole
        for i in range(n_files):
            mine = [s for s in seen if s.startswith(f"{job}-{i}-")]
            assert len(mine) == rows_per_file
    segs = sorted(snap.state.segments.values(), key=lambda a: a.base_offset)
    for a, b in zip(segs, segs[1:]):                   # no overlap in the address space
        assert a.base_offset + a.size == b.base_offset
    names = set(StoreFS(url).list_names(fmt.CONSUMEQUEUE_DIR))
    assert names == {p.split("/")[-1] for p in snap.state.consumequeue_files}


def test_two_committers_racing_in_threads(local_store_url):
    make_store(local_store_url, [("T", 2)])
    threads = [threading.Thread(target=_race, args=(local_store_url, j, 6, 5))
               for j in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    _check_race(local_store_url, ["a", "b"], 6, 5)


@pytest.mark.integration
def test_two_committers_racing_in_processes(local_store_url):
    make_store(local_store_url, [("T", 2)])
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_race, args=(local_store_url, j, 5, 4)) for j in ("p", "q")]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=120)
    finally:                                # none outlives the test, even on failure
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    assert [p.exitcode for p in procs] == [0, 0]
    _check_race(local_store_url, ["p", "q"], 5, 4)


def test_refuses_while_a_store_is_open_for_writing_elsewhere(local_store_url):
    make_store(local_store_url)
    s = Store.open(local_store_url, mode="w", start_services=False)
    try:
        p = stage(local_store_url, "j", "0", [("T", 0, b"x", [])])
        with pytest.raises(StoreLockedError, match="holds the store"):
            DirectCommitter(local_store_url).commit([p], app_id=None, app_version=None)
        # in this process the lease holder adopts the files itself
        c = committer_for(local_store_url)
        assert isinstance(c, StoreCommitter)
        assert c.commit([p], app_id=None, app_version=None).num_messages == 1
        assert s.read_table("T", 0, 0).column("body").to_pylist() == [b"x"]
    finally:
        s.close()


def test_broker_without_endpoint_is_refused(local_store_url):
    make_store(local_store_url)
    lease = {"owner": "otherhost:1:tok", "epoch": 3, "expiresTime": 1 << 62, "released": False}
    c = BrokerCommitter(local_store_url, lease)
    with pytest.raises(StoreLockedError, match="broker commit path arrives with the broker"):
        c.commit(["commitlog/w-j-0-x.arrow"], app_id=None, app_version=None)


def test_unclean_writer_after_crash(local_store_url):
    make_store(local_store_url)
    s = Store.open(local_store_url, mode="w", start_services=False)
    s.append(Message("T", b"tail", queue_id=0))
    s._crash()
    p = stage(local_store_url, "j", "0", [("T", 0, b"x", [])])
    c = committer_for(local_store_url)
    assert isinstance(c, DirectCommitter)
    with pytest.raises(UncleanWriterError, match="open the store for writing once"):
        c.commit([p], app_id=None, app_version=None)
    Store.open(local_store_url, mode="w", start_services=False).close()   # recover
    DirectCommitter(local_store_url).commit([p], app_id=None, app_version=None)
    assert bodies(Snapshot.load(local_store_url), "T", 0) == [b"tail", b"x"]


def test_abort_removes_only_uncommitted_staged_files(store_url):
    make_store(store_url)
    kept = stage(store_url, "job1", "0", [("T", 0, b"x", [])])
    DirectCommitter(store_url).commit([kept], app_id=None, app_version=None)
    doomed = [stage(store_url, "job1", "1", [("T", 0, b"y", [])]),
              stage(store_url, "job1", "2", [("T", 0, b"z", [])])]
    other = stage(store_url, "job2", "0", [("T", 0, b"w", [])])
    assert sorted(uncommitted_staged_files(store_url, "job1")) == sorted(doomed)
    assert sorted(abort_job(store_url, "job1")) == sorted(doomed)
    sfs = StoreFS(store_url)
    assert all(not sfs.exists(p) for p in doomed)
    assert sfs.exists(kept) and sfs.exists(other)
    assert bodies(Snapshot.load(store_url), "T", 0) == [b"x"]


def test_consumer_offsets_commit_even_while_a_store_holds_the_lease(local_store_url):
    make_store(local_store_url)
    with Store.open(local_store_url, mode="w", start_services=False) as s:
        commit_consumer_offsets(local_store_url, "spark-group", {("T", 0): 5, ("T", 1): 2})
        s.create_topic("U")      # the store's next commit re-reads the log: nothing lost
        assert s.consumer_offsets("spark-group") == {("T", 0): 5, ("T", 1): 2}
    assert Snapshot.load(local_store_url).consumer_offsets("spark-group") == {
        ("T", 0): 5, ("T", 1): 2}


def test_an_advertised_endpoint_routes_commits_to_the_broker(local_store_url):
    make_store(local_store_url)
    with Store.open(local_store_url, mode="w", start_services=False) as s:
        s.advertise_endpoint("http://127.0.0.1:9")
        c = committer_for(local_store_url)
        assert isinstance(c, BrokerCommitter) and c.endpoint == "http://127.0.0.1:9"


def test_broker_replies_become_sparkmq_errors():
    from sparkmq.errors import RetriableError, TopicNotFoundError as TNF
    from sparkmq.log.committer import _broker_error
    e = _broker_error("http://b", 400, b'{"code": "SPARKMQ_TOPIC_NOT_FOUND", "message": "no X"}')
    assert isinstance(e, TNF) and "no X" in str(e)
    assert isinstance(_broker_error("http://b", 503, b"not json"), RetriableError)


# ---------------------------------------------------------------------- property

_ROW = st.tuples(st.sampled_from(["T", "U"]), st.integers(0, 1))
_OP = st.one_of(
    st.tuples(st.just("commit"), st.lists(st.lists(_ROW, min_size=1, max_size=4),
                                          min_size=1, max_size=3)),
    st.tuples(st.just("append"), st.lists(_ROW, min_size=1, max_size=4)),
    st.tuples(st.just("replay"), st.just(None)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_OP, min_size=1, max_size=6))
def test_commits_and_appends_match_a_model(tmp_path_factory, ops):
    """Direct commits (several files, idempotent replays) interleaved with a
    Store's own appends read back exactly as a list-per-queue model says."""
    url = str(tmp_path_factory.mktemp("prop") / "store")
    make_store(url, [("T", 2), ("U", 2)])
    model: dict[tuple[str, int], list[bytes]] = {}
    n = 0
    version = -1
    for kind, arg in ops:
        if kind == "commit":
            paths = []
            for f, rows in enumerate(arg):
                data = [(t, q, f"m{n + i}".encode(), [f"k{n + i}"]) for i, (t, q) in
                        enumerate(rows)]
                n += len(rows)
                paths.append(stage(url, "prop", f"{n}_{f}", data))
                for t, q, b, _ in data:
                    model.setdefault((t, q), []).append(b)
            version += 1
            res = DirectCommitter(url).commit(paths, app_id="app", app_version=version)
            assert not res.skipped
        elif kind == "append":
            with Store.open(url, mode="w", start_services=False) as s:
                for t, q in arg:
                    s.append(Message(t, f"m{n}".encode(), queue_id=q))
                    model.setdefault((t, q), []).append(f"m{n}".encode())
                    n += 1
        elif version >= 0:
            p = stage(url, "prop", f"r{n}", [("T", 0, b"never", [])])
            assert DirectCommitter(url).commit([p], app_id="app", app_version=version).skipped
    snap = Snapshot.load(url)
    for t in ("T", "U"):
        for q in (0, 1):
            table = snap.read_table(t, q, 0)
            assert table.column("body").to_pylist() == model.get((t, q), [])
            assert table.column("queue_offset").to_pylist() == list(range(table.num_rows))
