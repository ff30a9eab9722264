"""Replication (sparkmq.ha): a replica tailing a master's CommitLog over the HA port.

In-process tests use a master ``Store`` with an ``HAService`` and a replica
``Store`` with an ``HAClient`` on 127.0.0.1 (real sockets, real files); the
fault tests further down start real broker processes and kill them with SIGKILL.
"""
from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest

from sparkmq import Message, Store
from sparkmq.errors import FencedError
from sparkmq.ha import epochs
from sparkmq.ha.master import HAService
from sparkmq.ha.replica import HAClient, ReplicaLog, promote
from sparkmq.log.status import PutMessageStatus

pytestmark = [pytest.mark.integration]

SECRET = "s3cret-for-tests"
WAIT_S = 60


def wait_until(pred, what: str, timeout_s: float = WAIT_S):
    """Poll ``pred`` (bounded); fail naming ``what`` if it never holds."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def segment_files(url: str) -> dict[str, bytes]:
    folder = os.path.join(url, "commitlog")
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


class Pair:
    """A master store with its HA service and a replica store following it."""

    def __init__(self, tmp_path, *, secret=SECRET, replica_secret=None, segment_bytes=64 << 10,
                 **store_opts):
        self.master_url = str(tmp_path / "master")
        self.replica_url = str(tmp_path / "replica")
        self.opts = dict(mappedFileSizeCommitLog=segment_bytes, **store_opts)
        self.master = Store.open(self.master_url, **self.opts)
        self.ha = HAService(self.master, broker_name="broker-a", secret=secret).start()
        self.replica_secret = secret if replica_secret is None else replica_secret
        self.replica = None
        self.client = None

    def start_replica(self):
        self.replica = Store.open(self.replica_url, replica=True, **self.opts)
        self.rlog = ReplicaLog(self.replica)
        self.client = HAClient(self.rlog, broker_name="broker-a", broker_id=1,
                               secret=self.replica_secret,
                               master_address=lambda: f"127.0.0.1:{self.ha.port}").start()
        return self

    def stop_replica(self):
        if self.client is not None:
            self.client.stop()
            self.client = None
        if self.replica is not None:
            self.replica.close()
            self.replica = None

    def caught_up(self) -> bool:
        return self.client is not None and \
            self.rlog.offset == self.master.commitlog.written_offset

    def close(self):
        self.stop_replica()
        self.ha.stop()
        self.master.close()


@pytest.fixture
def pair(tmp_path):
    made = []

    def make(**kw):
        p = Pair(tmp_path, **kw)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


def send(store: Store, n: int, topic: str = "T", start: int = 0, batch: int = 50):
    for i in range(start, start + n, batch):
        store.append([Message(topic, f"m{j}".encode() * 20, keys=[f"k{j}"])
                      for j in range(i, min(i + batch, start + n))])


def test_replica_from_empty_is_byte_identical_across_rolls(pair):
    p = pair()
    p.master.create_topic("T", read_queue_nums=2, write_queue_nums=2)
    send(p.master, 3000)                       # several 64 KiB segments before the replica
    assert len(p.master.commitlog.segments()) > 3
    p.start_replica()
    send(p.master, 1000, start=3000)           # and more while it follows
    wait_until(p.caught_up, "replica to catch up")
    p.master.flush()
    assert segment_files(p.master_url) == segment_files(p.replica_url)
    # its own ConsumeQueue and Index: reads and key lookups work on the replica
    for q in (0, 1):
        assert p.replica.max_offset("T", q) == p.master.max_offset("T", q)
    got = p.replica.read("T", 0, 0, max_messages=5)
    want = p.master.read("T", 0, 0, max_messages=5)
    assert [m.body for m in got] == [m.body for m in want]
    assert [m.message_id for m in got] != []
    assert p.replica.query_by_key("T", "k3999")[0].body == b"m3999" * 20
    p.replica.flush()                           # and a Spark reader of the replica's store
    snap = Store.open(p.replica_url, mode="r")
    assert sum(hi - lo for lo, hi in snap.queue_ranges("T").values()) == 4000


def test_replica_catches_up_after_a_gap_and_restart(pair):
    p = pair()
    p.master.create_topic("T")
    p.start_replica()
    send(p.master, 500)
    wait_until(p.caught_up, "first catch-up")
    p.stop_replica()                           # link cut: the replica process is gone
    send(p.master, 2000, start=500)
    p.start_replica()                          # reopens its store, resumes from its offset
    wait_until(p.caught_up, "catch-up after the gap")
    p.master.flush()
    assert segment_files(p.master_url) == segment_files(p.replica_url)
    assert sum(len(p.replica.read("T", q, 0, 10_000)) for q in range(4)) == 2500


def test_replica_copies_adopted_spark_segments(pair, tmp_path):
    from sparkmq.log import segment as seg
    from sparkmq.log.message import messages_to_batch
    p = pair()
    p.master.create_topic("T")
    p.start_replica()
    send(p.master, 100)
    batch = messages_to_batch([Message("T", b"spark-%d" % i) for i in range(10)],
                              queue_ids=[0] * 10, store_timestamp_ms=1, store_host="spark",
                              max_message_size_bytes=1 << 20)
    rel = "commitlog/w-job1-0-" + "a" * 32 + ".arrow"
    seg.write_segment(p.master.sfs, rel, [batch])
    p.master.adopt([rel])
    send(p.master, 100, start=100)
    wait_until(p.caught_up, "replica to copy the adopted segment")
    p.master.flush()
    assert segment_files(p.master_url) == segment_files(p.replica_url)
    assert [m.body for m in p.replica.read("T", 0, 25, 100) if m.body.startswith(b"spark")] \
        == [b"spark-%d" % i for i in range(10)]


def test_wrong_secret_is_refused(pair):
    p = pair(replica_secret="not-the-secret")
    p.master.create_topic("T")
    send(p.master, 10)
    p.start_replica()
    wait_until(lambda: p.client.last_error is not None, "the refusal")
    assert "AUTH_FAILED" in p.client.last_error
    assert p.rlog.offset == 0 and not p.client.connected
    assert p.ha.replicas() == []


def test_sync_master_waits_for_the_replica(pair):
    p = pair()
    p.master.create_topic("T")
    end = p.master.commitlog.written_offset
    # no replica attached: SLAVE_NOT_AVAILABLE at once (the message is stored here)
    assert p.ha.wait_replicated(end + 1, 1000) is PutMessageStatus.SLAVE_NOT_AVAILABLE
    p.start_replica()
    wait_until(lambda: p.ha.replicas(), "the replica to attach")
    send(p.master, 10)
    end = p.master.commitlog.written_offset
    assert p.ha.wait_replicated(end, 30_000) is PutMessageStatus.PUT_OK
    assert p.rlog.offset >= end
    # an offset no one will ever write: the wait ends with FLUSH_SLAVE_TIMEOUT
    assert p.ha.wait_replicated(end + 10**9, 200) is PutMessageStatus.FLUSH_SLAVE_TIMEOUT


def test_promotion_raises_the_epoch_and_old_master_diverges(pair, tmp_path):
    p = pair()
    p.master.create_topic("T")
    p.start_replica()
    send(p.master, 300)
    wait_until(p.caught_up, "catch-up")
    master_epoch = p.master.epoch
    p.client.stop()
    send(p.master, 50, start=300)          # acked by no one: will be lost at promotion
    epoch = promote(p.replica, p.rlog, p.client.master_epoch)
    assert epoch > master_epoch
    assert p.replica.state.lease["epoch"] == epoch
    r = p.replica.append(Message("T", b"after-promotion"))[0]
    assert r.ok
    hist = epochs.load(p.replica.sfs)
    assert hist[-1]["epoch"] == epoch and hist[-1]["startOffset"] == r.physical_offset
    # the old master's history and the new one's agree only up to the promotion point
    old = epochs.load(p.master.sfs)
    assert epochs.consistent_end(hist, old, p.master.commitlog.written_offset) \
        == r.physical_offset
