"""Replication (sparkmq.ha): a replica tailing a master's CommitLog over the HA port.

In-process tests use a master ``Store`` with an ``HAService`` and a replica
``Store`` with an ``HAClient`` on 127.0.0.1 (real sockets, real files); the
fault tests further down start real broker processes and kill them with SIGKILL.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from helpers.brokers import sends_on_the_loop
from helpers.net import free_port
from helpers.storetools import inline_replica_log
from helpers.daemons import get_json, kill9, post_json, spawn, stop_process
from helpers.waiting import wait_until
from sparkmq import Message, Store
from sparkmq.ha import epochs
from sparkmq.ha.master import HAService
from sparkmq.ha.replica import HAClient, ReplicaLog, promote
from sparkmq.log.status import PutMessageStatus

pytestmark = [pytest.mark.integration]

SECRET = "s3cret-for-tests"
WAIT_S = 60


def segment_files(url: str) -> dict[str, bytes]:
    folder = os.path.join(url, "commitlog")
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


class Pair:
    """A master store with its HA service and a replica store following it."""

    def __init__(self, tmp_path, *, secret=SECRET, replica_secret=None, segment_bytes=64 << 10,
                 ack_loop=None, **store_opts):
        self.master_url = str(tmp_path / "master")
        self.replica_url = str(tmp_path / "replica")
        self.opts = dict(mappedFileSizeCommitLog=segment_bytes, **store_opts)
        self.master = Store.open(self.master_url, **self.opts)
        self.ha = HAService(self.master, broker_name="broker-a", secret=secret,
                            ack_loop=ack_loop).start()
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
        """The replica has the master's bytes, dispatched, and serves them: every
        queue's max offset is the master's (the replica writes and acks, then its reput
        thread dispatches and makes the new offsets visible)."""
        end = self.master.commitlog.written_offset
        if self.client is None or self.rlog.offset != end or self.rlog.dispatched_offset != end:
            return False
        mine = self.replica.topics()
        return all(name in mine and self.replica.max_offset(name, q) ==
                   self.master.max_offset(name, q)
                   for name, cfg in self.master.topics().items()
                   for q in range(cfg["readQueueNums"]))

    def close(self):
        self.stop_replica()
        self.ha.stop()
        self.master.close()


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


@pytest.mark.spark
def test_spark_reads_the_replica_store(pair, spark):
    p = pair()
    p.master.create_topic("T", read_queue_nums=2, write_queue_nums=2)
    send(p.master, 1500)
    p.start_replica()
    wait_until(p.caught_up, "catch-up")
    p.replica.flush()                          # publish: Spark reads committed versions
    df = spark.read.format("sparkmq").option("topic", "T").load(p.replica_url)
    rows = df.select("queue_id", "queue_offset", "body").collect()
    assert len(rows) == 1500
    want = {(m.queue_id, m.queue_offset, m.body) for q in (0, 1)
            for m in p.master.read("T", q, 0, 10_000)}
    assert {(r.queue_id, r.queue_offset, bytes(r.body)) for r in rows} == want


def test_replica_from_empty_after_master_retention_keeps_queue_offsets(pair):
    p = pair()
    p.master.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    send(p.master, 3000)
    segs = [s.path for s in p.master.commitlog.segments()]
    p.master.remove_segments(segs[:2])            # retention took the oldest two
    lo = p.master.min_offset("T", 0)
    assert lo > 0
    p.start_replica()
    send(p.master, 100, start=3000)
    wait_until(p.caught_up, "catch-up past the retention floor")
    assert p.replica.min_offset("T", 0) == lo
    assert p.replica.max_offset("T", 0) == p.master.max_offset("T", 0) == 3100
    assert [m.body for m in p.replica.read("T", 0, lo, 3)] == \
        [m.body for m in p.master.read("T", 0, lo, 3)]
    p.master.flush()
    master_files = segment_files(p.master_url)
    replica_files = segment_files(p.replica_url)
    assert replica_files == {k: v for k, v in master_files.items() if k in replica_files}
    assert set(replica_files) == {s.path.split("/")[1] for s in p.master.commitlog.segments()}


def test_admin_promote_a_stopped_replica_store(pair, capsys):
    from sparkmq import admin
    p = pair()
    p.master.create_topic("T")
    p.start_replica()
    send(p.master, 100)
    wait_until(p.caught_up, "catch-up")
    master_epoch = p.master.epoch
    p.stop_replica()
    assert admin.main(["--store", p.replica_url, "--json", "promote"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epoch"] > master_epoch
    assert epochs.load(p.master.sfs)[-1]["epoch"] < out["epoch"]
    with Store.open(p.replica_url) as s:          # now a master's store: it takes writes
        assert s.append(Message("T", b"x"))[0].ok
        assert s.epoch > out["epoch"]


def test_rejoin_truncation_then_same_segment_path_again_survives_close(pair):
    """A rejoining store drops its segment at base B (truncation to B), then the new
    master begins its own segment at B: same file name. Closing the store must not
    delete the new file as the dropped one (its delete was pending)."""
    p = pair()
    p.master.create_topic("T")
    send(p.master, 1500)
    assert len(p.master.commitlog.segments()) > 2
    p.start_replica()
    wait_until(p.caught_up, "catch-up")
    p.client.stop()
    p.client = None
    p.master.flush()
    last = p.master.commitlog.segments()[-1]
    data = open(os.path.join(p.master_url, last.path), "rb").read()
    before = [m for q in range(4) for m in p.replica.read("T", q, 0, 10_000)]
    assert p.rlog.truncate_to(last.base_offset) > 0
    # the ids this store gave messages at or past the cut name nothing now: an id epoch
    # begins there (what it receives there next may not be what it dropped)
    assert p.replica.state.metadata.id_epochs[-1].start_offset == last.base_offset
    p.rlog.begin_segment(last.path, last.base_offset)
    p.rlog.write(last.path, 0, data)
    assert p.rlog.offset == p.master.commitlog.written_offset
    p.stop_replica()                             # close: pending deletes run here
    again = Store.open(p.replica_url, mode="r")
    assert sum(len(again.read("T", q, 0, 10_000)) for q in range(4)) == 1500
    assert os.path.exists(os.path.join(p.replica_url, last.path))
    kept = [m for m in before if m.physical_offset < last.base_offset]
    cut = [m for m in before if m.physical_offset >= last.base_offset]
    assert kept and cut
    assert all(again.lookup(m.message_id).body == m.body for m in kept[-20:])
    assert all(again.lookup(m.message_id) is None for m in cut[:20])
    again_cut = {m.physical_offset: m for q in range(4) for m in again.read("T", q, 0, 10_000)
                 if m.physical_offset >= last.base_offset}
    assert sorted(again_cut) == sorted(m.physical_offset for m in cut)
    assert not {m.message_id for m in cut} & {m.message_id for m in again_cut.values()}


def test_subscription_groups_are_mirrored_and_their_deletion_too(pair):
    p = pair()
    p.master.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    p.master.create_group("GID_a", retry_max_times=3)
    p.master.create_group("GID_b", consume_broadcast_enable=False)
    p.master.commit_consumer_offsets("GID_a", {("T", 0): 0})
    send(p.master, 10)
    p.start_replica()
    wait_until(p.caught_up, "catch-up")
    wait_until(lambda: p.replica.subscription_groups().keys() == {"GID_a", "GID_b"},
               "the group configs on the replica")
    assert p.replica.subscription_groups() == p.master.subscription_groups()
    p.replica.commit_consumer_offsets("GID_local", {("T", 0): 4})   # the replica's own
    p.master.delete_group("GID_a")
    p.master.create_group("GID_b", retry_max_times=1)               # replaced whole
    wait_until(lambda: "GID_a" not in p.replica.subscription_groups(), "the delete")
    wait_until(lambda: p.replica.subscription_groups() == p.master.subscription_groups(),
               "the replaced config")
    assert p.replica.consumer_offsets("GID_a") == {}
    assert p.replica.consumer_offsets("GID_local") == {("T", 0): 4}


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


def test_wrong_secret_and_garbage_are_refused_the_service_keeps_serving(pair):
    import socket
    p = pair(replica_secret="not-the-secret")
    p.master.create_topic("T")
    send(p.master, 10)
    p.start_replica()
    wait_until(lambda: p.client.last_error is not None, "the refusal")
    assert "AUTH_FAILED" in p.client.last_error
    assert p.rlog.offset == 0 and not p.client.connected
    assert p.ha.replicas() == []
    p.stop_replica()
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 12 + b"{}", b"\xff" * 64):
        with socket.create_connection(("127.0.0.1", p.ha.port), timeout=10) as s:
            s.sendall(junk)
            s.settimeout(10)
            try:
                while s.recv(4096):     # the challenge, maybe an error, then the close
                    pass
            except ConnectionResetError:
                pass
    p.replica_secret = SECRET                    # the real replica still gets in
    p.start_replica()
    wait_until(p.caught_up, "the replica with the right secret")


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


def test_an_awaited_replica_wait_answers_as_the_blocking_one(pair):
    """``replicated_async`` (the gRPC loop's SYNC_MASTER sends) gives ``wait_replicated``'s
    answers: no replica, acked, never acked (timeout), the replica leaving while awaited,
    the service stopping while awaited; no waiter is left behind."""
    import asyncio
    p = pair()
    p.master.create_topic("T")
    end = p.master.commitlog.written_offset

    def awaited(offset, timeout_ms, during=None):
        async def go():
            task = asyncio.ensure_future(p.ha.replicated_async(offset, timeout_ms))
            if during is not None:
                await asyncio.sleep(0)                    # the waiter is registered
                await asyncio.get_running_loop().run_in_executor(None, during)
            return await task
        out = {}          # a loop of its own on a thread of its own (another test's running
        t = threading.Thread(target=lambda: out.setdefault("r", asyncio.run(go())))
        t.start()         # loop may be left set on this one)
        t.join(60)
        return out["r"]
    assert awaited(end + 1, 1000) is PutMessageStatus.SLAVE_NOT_AVAILABLE
    p.start_replica()
    wait_until(lambda: p.ha.replicas(), "the replica to attach")
    send(p.master, 10)
    end = p.master.commitlog.written_offset
    assert awaited(end, 30_000) is PutMessageStatus.PUT_OK and p.rlog.offset >= end
    assert awaited(end + 10**9, 200) is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    assert awaited(end + 10**9, 30_000, during=p.stop_replica) \
        is PutMessageStatus.SLAVE_NOT_AVAILABLE
    p.start_replica()
    wait_until(lambda: p.ha.replicas(), "the replica to attach again")
    assert awaited(end + 10**9, 30_000, during=p.ha.stop) \
        is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    assert len(p.ha._waiters) == 0


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
    assert p.replica.state.lease.epoch == epoch
    r = p.replica.append(Message("T", b"after-promotion"))[0]
    assert r.ok
    hist = epochs.load(p.replica.sfs)
    assert hist[-1]["epoch"] == epoch and hist[-1]["startOffset"] == r.physical_offset
    # the old master's history and the new one's agree only up to the promotion point
    old = epochs.load(p.master.sfs)
    assert epochs.consistent_end(hist, old, p.master.commitlog.written_offset) \
        == r.physical_offset
    # the old master rejoins as a replica of the new one: it cuts its 50 unreplicated
    # messages (kept aside), then copies what the new master wrote since
    send(p.replica, 20, start=1000)
    new_ha = HAService(p.replica, broker_name="broker-a", secret=SECRET).start()
    p.ha.stop()
    p.master.close()
    old_store = Store.open(p.master_url, replica=True, **p.opts)
    old_log = ReplicaLog(old_store)
    client = HAClient(old_log, broker_name="broker-a", broker_id=2, secret=SECRET,
                      master_address=lambda: f"127.0.0.1:{new_ha.port}").start()
    try:
        wait_until(lambda: old_log.offset == p.replica.commitlog.written_offset, "rejoin")
        assert client.diverged_at == r.physical_offset
        p.replica.flush()
        old_store.flush()
        live = {r.path.split("/")[1] for r in old_store.commitlog.segments()}
        assert segment_files(p.replica_url) == \
            {k: v for k, v in segment_files(p.master_url).items() if k in live}
        bodies = [m.body for q in range(4) for m in old_store.read("T", q, 0, 10_000)]
        assert b"after-promotion" in bodies and len(bodies) == 300 + 1 + 20
        assert not set(bodies) & {(b"m%d" % (300 + i)) * 20 for i in range(50)}
        # the dropped messages were kept as a readable segment
        kept = os.listdir(client.diverged_kept)
        assert kept
        import pyarrow.ipc as ipc
        n = sum(ipc.open_stream(os.path.join(client.diverged_kept, k)).read_all().num_rows
                for k in kept)
        assert n == 50
    finally:
        client.stop()
        old_store.close()
        new_ha.stop()


# ---------------------------------------------------------------- real processes
class Cluster:
    """A NameServer, a master broker process and a replica process of broker-a."""

    def __init__(self, tmp_path, procs, *, role: str):
        self.tmp, self.procs, self.role = tmp_path, procs, role
        self.ns_port = free_port()
        spawn(["sparkmq.namesrv", "-p", str(self.ns_port)],
              f"http://127.0.0.1:{self.ns_port}/health", procs)
        self.m = self._ports()
        self.r = self._ports()
        self.master_store = str(tmp_path / "master")
        self.replica_store = str(tmp_path / "replica")

    @staticmethod
    def _ports() -> dict:
        # bound late: a replica's HA port when it is promoted, an old master's ports when
        # it is started again after its kill (see free_port)
        return {"grpc": free_port(), "admin": free_port(), "ha": free_port()}

    def conf(self, name: str, *, role: str, broker_id: int, ports: dict, store: str,
             master_ha: int | None = None, extra: str = "") -> str:
        path = self.tmp / f"{name}.properties"
        path.write_text(
            f"brokerClusterName=C\nbrokerName=broker-a\nbrokerId={broker_id}\n"
            f"brokerRole={role}\nstorePathRootDir={store}\nflushDiskType=ASYNC_FLUSH\n"
            f"namesrvAddr=127.0.0.1:{self.ns_port}\nlistenPort={ports['grpc']}\n"
            f"adminPort={ports['admin']}\nhaListenPort={ports['ha']}\nhaSecret={SECRET}\n"
            f"mappedFileSizeCommitLog=65536\nregisterBrokerIntervalMs=1000\n"
            f"autoCreateTopicEnable=true\nsyncFlushTimeout=5000\n"
            + (f"haMasterAddress=127.0.0.1:{master_ha}\n" if master_ha else "") + extra)
        return str(path)

    def start_master(self, *, store: str | None = None) -> subprocess.Popen:
        conf = self.conf("master", role=self.role, broker_id=0, ports=self.m,
                         store=store or self.master_store)
        return spawn(["sparkmq.broker", "-c", conf], self.url(self.m, "/health"), self.procs)

    def start_replica(self, *, name="replica", broker_id=1, ports=None, store=None,
                      master_ha=None, extra="") -> subprocess.Popen:
        ports = ports or self.r
        conf = self.conf(name, role="SLAVE", broker_id=broker_id, ports=ports,
                         store=store or self.replica_store,
                         master_ha=master_ha or self.m["ha"], extra=extra)
        return spawn(["sparkmq.cli", "replica", "-c", conf], self.url(ports, "/health"),
                     self.procs)

    @staticmethod
    def url(ports: dict, path: str) -> str:
        return f"http://127.0.0.1:{ports['admin']}{path}"


class Sender:
    """Sends numbered messages one by one to one broker (no retries) until stopped;
    ``acked`` lists the numbers answered OK, in order."""

    def __init__(self, endpoint: str, topic: str = "T"):
        from sparkmq.client import Producer
        self.producer = Producer(endpoint, max_retries=0, request_timeout_s=10)
        self.topic = topic
        self.acked: list[int] = []
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        from sparkmq.client import Message as CMessage
        i = 0
        while not self.stop.is_set():
            try:
                self.producer.send(CMessage(self.topic, b"%08d" % i))
                self.acked.append(i)
            except Exception:
                self.failed += 1
                time.sleep(0.01)       # the point: back off between retries, not a wait
            i += 1

    def close(self):
        self.stop.set()
        self.thread.join(60)
        self.producer.shutdown()


def stored_numbers(store_path: str, topic: str = "T", *, recover: bool = False) -> list[int]:
    """Message numbers of queue 0; ``recover``: open for writing first (a killed writer's
    unpublished tail is recovered from its segments)."""
    s = Store.open(store_path, mode="w" if recover else "r", start_services=False)
    out = [int(m.body) for m in s.read(topic, 0, 0, 10**6)]
    s.close()
    return out


def kill9_and_promote(c: Cluster, master, sender: Sender, *, acked_before_kill: int,
                      replica=None):
    """Kill -9 the master once ``acked_before_kill`` sends were acked; with ``replica``
    (its process) the replica is paused (SIGSTOP) for the last 200 of them, so it lags.
    The replica drains what reached its socket, sees the link die, and is promoted."""
    if replica is not None:
        wait_until(lambda: len(sender.acked) >= acked_before_kill - 200, "acked sends")
        replica.send_signal(signal.SIGSTOP)
    wait_until(lambda: len(sender.acked) >= acked_before_kill, "acked sends before the kill")
    lag = get_json(c.url(c.m, "/status"))["ha"]["replicas"][0]["lagBytes"]
    kill9(master)
    if replica is not None:
        replica.send_signal(signal.SIGCONT)
    acked = list(sender.acked)
    sender.close()
    wait_until(lambda: not get_json(c.url(c.r, "/status"))["ha"]["connected"], "the link to drop")
    answer = post_json(c.url(c.r, "/admin/promote"), {})
    return acked, lag, answer


def check_acked_on_new_master(acked: list[int], got: list[int]) -> list[int]:
    """Every message on the new master once, in send order; returns acked ones missing."""
    assert len(got) == len(set(got)), "duplicates on the new master"
    assert got == sorted(got), "order changed on the new master"
    present = set(got)
    return [i for i in acked if i not in present]


@pytest.mark.slow
def test_sync_master_kill9_promote_fence_and_rejoin(tmp_path, procs):
    c = Cluster(tmp_path, procs, role="SYNC_MASTER")
    master = c.start_master()
    post_json(c.url(c.m, "/admin/topics"), {"name": "T", "queueNums": 1})
    c.start_replica()
    wait_until(lambda: get_json(c.url(c.m, "/status"))["ha"]["replicas"], "the replica to attach")
    sender = Sender(f"127.0.0.1:{c.m['grpc']}")
    acked, lag, answer = kill9_and_promote(c, master, sender, acked_before_kill=300)
    assert answer["brokerId"] == 0 and answer["epoch"] >= 2
    # SYNC_MASTER: no acked message is lost, none duplicated, order kept
    from sparkmq.client import Message as CMessage, Producer
    with Producer(f"127.0.0.1:{c.r['grpc']}", max_retries=0) as p:
        p.send(CMessage("T", b"%08d" % 10**7))           # the new master takes writes
    wait_until(lambda: get_json(c.url(c.r, "/status"))["storeVersion"] > 0, "status")
    # the old master comes back: the NameServer knows the newer master, it refuses writes
    c.start_master()
    st = get_json(c.url(c.m, "/status"))
    assert st["fenced"] and "fenced" in st["fenced"]
    with Producer(f"127.0.0.1:{c.m['grpc']}", max_retries=0) as p:
        with pytest.raises(Exception, match="FORBIDDEN|fenced"):
            p.send(CMessage("T", b"split-brain"))
    old = procs[-1]
    stop_process(old)
    # ... and rejoins as a replica of the new master (truncating what the new one lacks)
    rejoin_ports = Cluster._ports()
    c.start_replica(name="rejoin", broker_id=2, ports=rejoin_ports, store=c.master_store,
                    master_ha=c.r["ha"])
    def rejoined():
        ha = get_json(c.url(rejoin_ports, "/status"))["ha"]
        return ha["connected"] and ha["offset"] == get_json(c.url(c.r, "/status"))["ha"]["offset"]
    try:
        wait_until(rejoined, "the old master to rejoin")
    except AssertionError:
        print(get_json(c.url(rejoin_ports, "/status"))["ha"],
              get_json(c.url(c.r, "/status"))["ha"])
        raise
    for p in procs[1:]:
        stop_process(p)
    got = stored_numbers(c.replica_store)
    missing = check_acked_on_new_master(acked, got)
    assert missing == [], f"SYNC_MASTER lost acked messages {missing[:10]}"
    assert got[-1] == 10**7
    assert stored_numbers(c.master_store) == got      # the rejoined copy agrees
    print(f"\nSYNC_MASTER: {len(acked)} acked before kill -9, 0 lost; replica lag at the "
          f"kill {lag} bytes")


@pytest.mark.slow
def test_async_master_kill9_reports_lost_acked_messages(tmp_path, procs):
    c = Cluster(tmp_path, procs, role="ASYNC_MASTER")
    master = c.start_master()
    post_json(c.url(c.m, "/admin/topics"), {"name": "T", "queueNums": 1})
    replica = c.start_replica()
    wait_until(lambda: get_json(c.url(c.m, "/status"))["ha"]["replicas"], "the replica to attach")
    sender = Sender(f"127.0.0.1:{c.m['grpc']}")
    acked, lag, answer = kill9_and_promote(c, master, sender, acked_before_kill=500,
                                           replica=replica)
    stop_process(procs[-1])
    got = stored_numbers(c.replica_store)
    missing = check_acked_on_new_master(acked, got)
    # replication is in order: what is lost is a suffix of the acked sends
    assert missing == acked[len(acked) - len(missing):]
    old = stored_numbers(c.master_store, recover=True)
    assert [i for i in acked if i not in set(old)] == []     # the old master had them all
    # exactly the acked messages past the replica's end (its lag at the kill) were lost
    s = Store.open(c.master_store, mode="r")
    past = {int(m.body) for m in s.read("T", 0, 0, 10**6)
            if m.physical_offset >= answer["offset"]}
    s.close()
    assert len(missing) == len(past & set(acked)) > 0
    print(f"\nASYNC_MASTER: {len(acked)} acked before kill -9, {len(missing)} lost = the "
          f"acked messages past the replica's end at the kill (offset {answer['offset']}; "
          f"lag at the last status before the kill {lag} bytes)")


@pytest.mark.slow
def test_replica_process_stopped_then_restarted_catches_up_byte_identical(tmp_path, procs):
    c = Cluster(tmp_path, procs, role="ASYNC_MASTER")
    c.start_master()
    post_json(c.url(c.m, "/admin/topics"), {"name": "T", "queueNums": 1})
    from sparkmq.client import Message as CMessage, Producer
    with Producer(f"127.0.0.1:{c.m['grpc']}") as p:
        for i in range(0, 3000, 100):       # several 64 KiB segments before any replica
            p.send_batch([CMessage("T", b"%08d" % j * 8) for j in range(i, i + 100)])
        replica = c.start_replica()
        wait_until(lambda: get_json(c.url(c.r, "/status"))["ha"]["connected"], "attach")
        kill9(replica)                        # the link is cut hard
        for i in range(3000, 4000, 100):
            p.send_batch([CMessage("T", b"%08d" % j * 8) for j in range(i, i + 100)])
    c.start_replica()
    end = get_json(c.url(c.m, "/status"))["ha"]["offset"]
    wait_until(lambda: get_json(c.url(c.r, "/status"))["ha"]["offset"] == end, "catch-up")
    # acked once written; readable once its reput thread dispatched them
    wait_until(lambda: get_json(c.url(c.r, "/status"))["ha"]["dispatchedOffset"] == end, "dispatch")
    st = get_json(c.url(c.r, "/status"))
    assert st["topics"]["T"]["messages"] == 4000
    for p in procs[1:]:
        stop_process(p)
    assert segment_files(c.master_store) == segment_files(c.replica_store)
    assert len(segment_files(c.master_store)) > 3


@pytest.mark.slow
def test_consumers_fail_over_to_the_replica_which_promotes_itself(tmp_path, procs):
    from sparkmq.client import Message as CMessage, Producer, SimpleConsumer
    ns_conf = tmp_path / "namesrv.properties"
    ns_conf.write_text("brokerExpiryMs=3000\n")
    c = Cluster.__new__(Cluster)
    c.tmp, c.procs, c.role = tmp_path, procs, "ASYNC_MASTER"
    c.ns_port = free_port()
    spawn(["sparkmq.namesrv", "-c", str(ns_conf), "-p", str(c.ns_port)],
          f"http://127.0.0.1:{c.ns_port}/health", procs)
    c.m, c.r = Cluster._ports(), Cluster._ports()
    c.master_store, c.replica_store = str(tmp_path / "master"), str(tmp_path / "replica")
    master = c.start_master()
    post_json(c.url(c.m, "/admin/topics"), {"name": "T", "queueNums": 2})
    c.start_replica(extra="enableAutoFailover=true\nautoFailoverSilenceMs=3000\n")
    endpoints = f"127.0.0.1:{c.m['grpc']};127.0.0.1:{c.r['grpc']}"
    with Producer(endpoints) as p:
        p.send_batch([CMessage("T", b"m%d" % i) for i in range(100)])
    end = get_json(c.url(c.m, "/status"))["ha"]["offset"]
    wait_until(lambda: get_json(c.url(c.r, "/status"))["ha"]["offset"] == end, "catch-up")
    brokers = get_json(f"http://127.0.0.1:{c.ns_port}/brokers")["brokers"]
    assert {(b["brokerId"], b["role"]) for b in brokers} == {(0, "ASYNC_MASTER"), (1, "SLAVE")}
    kill9(master)
    consumer = SimpleConsumer(endpoints, "G", {"T": "*"})
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 100 and time.monotonic() < deadline:
            for m in consumer.receive(max_messages=32, wait_s=1):
                got.append(m.body)
                consumer.ack(m)
        assert sorted(got) == sorted(b"m%d" % i for i in range(100))   # read from the replica
        wait_until(lambda: get_json(c.url(c.r, "/status"))["brokerId"] == 0, "automatic promotion")
        assert get_json(c.url(c.r, "/status"))["role"] == "ASYNC_MASTER"
        with Producer(endpoints, isolation_s=60) as p:
            p.send(CMessage("T", b"after-failover"))
        deadline = time.monotonic() + WAIT_S
        later: list[bytes] = []
        while not later and time.monotonic() < deadline:
            later = [m.body for m in consumer.receive(max_messages=8, wait_s=1)]
        assert later == [b"after-failover"]
    finally:
        consumer.close()


# ---------------------------------------------------------------- brokers in this process
def broker_pair(tmp_path, *, role="SYNC_MASTER", timeout_ms=1000):
    from sparkmq.broker import Broker, BrokerConfig
    common = {"brokerClusterName": "C", "brokerName": "broker-a", "listenPort": "0",
              "adminPort": "0", "haSecret": SECRET, "flushDiskType": "ASYNC_FLUSH",
              "syncFlushTimeout": str(timeout_ms), "autoCreateTopicEnable": "true"}
    master = Broker(BrokerConfig.from_properties({
        **common, "brokerRole": role, "brokerId": "0", "haListenPort": str(free_port()),
        "storePathRootDir": str(tmp_path / "bm")})).start()

    def replica():
        return Broker(BrokerConfig.from_properties({
            **common, "brokerRole": "SLAVE", "brokerId": "1",
            "haMasterAddress": f"127.0.0.1:{master.ha_service.port}",
            "haListenPort": str(free_port()),      # bound when promoted
            "storePathRootDir": str(tmp_path / "br")})).start()
    return master, replica


def test_broker_sync_master_statuses_replica_refuses_sends_admin_promote(tmp_path, capsys):
    from sparkmq import admin
    from sparkmq.client import ClientError, Message as CMessage, Producer
    from sparkmq.client.core import Code
    from sparkmq.errors import BrokerUnavailableError
    master, make_replica = broker_pair(tmp_path)
    replica = None
    try:
        master.store.create_topic("T")
        with Producer(master.endpoint, max_retries=0) as p:
            # HA_NOT_AVAILABLE (nothing stored: the client may retry elsewhere; here it has
            # no retries left)
            with pytest.raises(BrokerUnavailableError, match="HA_NOT_AVAILABLE"):
                p.send(CMessage("T", b"no-replica-yet"))
            # refused before storing (RocketMQ 5's in-sync replica check): nothing to cut later
            assert master.store.commitlog.written_offset == 0 or not any(
                m.body == b"no-replica-yet" for q in range(4)
                for m in master.store.read("T", q, 0, 10))
            replica = make_replica()
            wait_until(lambda: master.ha_service.replicas(), "the replica to attach")
            p.send(CMessage("T", b"replicated"))
            # SYNC_MASTER answered OK: the replica has its bytes already (written; readable
            # once dispatched, just after)
            assert replica.replica_log.offset >= master.store.commitlog.written_offset
            wait_until(lambda: any(m.body == b"replicated" for q in range(4)
                                   for m in replica.store.read("T", q, 0, 10)), "dispatch")
            # a replica that does not ack in time (its writer is blocked): the send is
            # stored on the master and answered SLAVE_PERSISTENCE_TIMEOUT
            with replica.store.append_lock:
                with pytest.raises(ClientError) as e:
                    p.send(CMessage("T", b"slow-replica"))
            assert e.value.status_code == Code.SLAVE_PERSISTENCE_TIMEOUT
            # stored once: a stored message is not sent again by another path
            assert [m.body for q in range(4) for m in master.store.read("T", q, 0, 10)
                    ].count(b"slow-replica") == 1
        # the replica serves reads but refuses sends
        with Producer(replica.endpoint, max_retries=0) as p:
            with pytest.raises(ClientError) as e:
                p.send(CMessage("T", b"to-the-replica"))
            assert e.value.status_code == Code.FORBIDDEN
        base = f"http://127.0.0.1:{master.admin_port}"
        assert admin.main(["--broker", base, "--json", "broker", "ha"]) == 0
        ha = json.loads(capsys.readouterr().out)
        assert ha["role"] == "master" and ha["replicas"][0]["brokerId"] == 1
        text = master.admin.metrics_text()
        assert 'sparkmq_ha_replica_lag_bytes{replica="1"}' in text
        master_epoch = master.store.epoch
        rbase = f"http://127.0.0.1:{replica.admin_port}"
        assert admin.main(["--broker", rbase, "--json", "promote"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["brokerId"] == 0 and out["epoch"] > master_epoch
        with Producer(replica.endpoint, max_retries=0) as p:
            p.send(CMessage("T", b"on-the-new-master"))
        # a second promotion is refused with a clear error
        assert admin.main(["--broker", rbase, "promote"]) == 1
        assert "not a replica" in capsys.readouterr().err
    finally:
        if replica is not None:
            replica.stop()
        master.stop()


def _sync_failures(broker) -> int:
    import re
    return sum(int(float(n)) for n in re.findall(
        r"^sparkmq_ha_sync_failures_total\{[^}]*\} (\S+)$", broker.admin.metrics_text(), re.M))


def test_grpc_sends_that_wait_only_for_the_replica_await_it_on_the_loop(tmp_path, monkeypatch):
    """ASYNC_FLUSH + SYNC_MASTER: a RocketMQ send (a plain one, a rich one, a batch) is
    appended on the gRPC loop and awaits its replica's ack as a future
    (``HAService.replicated_async``): no thread blocks in ``wait_replicated``. A replica
    that does not ack in time: each send stored once on the master, answered
    SLAVE_PERSISTENCE_TIMEOUT (as the blocking wait answers it) and counted."""
    from sparkmq.client import ClientError, Message as CMessage, Producer
    from sparkmq.client.core import Code
    master, make_replica = broker_pair(tmp_path)
    replica = make_replica()
    try:
        master.store.create_topic("T")
        wait_until(lambda: master.ha_service.replicas(), "the replica to attach")
        # the replica's acks are read on the broker's gRPC loop (ha/loopacks.py)
        assert master.ha_service.ack_loop is master.event_loop is not None
        assert not [t for t in threading.enumerate() if t.name.startswith("sparkmq-ha-ack")]

        with Producer(master.endpoint, max_retries=0, transport="grpc") as p:
            sends_on_the_loop(master, monkeypatch, p, "wait_replicated")
            # answered OK: the replica has the bytes already
            assert replica.replica_log.offset >= master.store.commitlog.written_offset
            before = _sync_failures(master)
            with replica.store.append_lock:          # its writer blocked: no acks
                for m in (CMessage("T", b"slow-plain"), CMessage("T", b"slow-rich", tag="A")):
                    with pytest.raises(ClientError) as e:
                        p.send(m)
                    assert e.value.status_code == Code.SLAVE_PERSISTENCE_TIMEOUT
                with pytest.raises(ClientError) as e:
                    p.send_batch([CMessage("T", b"slow-batch") for _ in range(3)])
                assert e.value.status_code == Code.SLAVE_PERSISTENCE_TIMEOUT
            bodies = [m.body for q in range(4) for m in master.store.read("T", q, 0, 30)]
            assert bodies.count(b"slow-plain") == 1 and bodies.count(b"slow-rich") == 1
            assert bodies.count(b"slow-batch") == 3
            assert _sync_failures(master) == before + 3
    finally:
        replica.stop()
        master.stop()


# ---------------------------------------------------------------- dispatch lag
def test_replica_acks_once_written_and_serves_only_dispatched_messages(pair):
    """The replica acks bytes once written; its reput thread dispatches them later
    (held back here): until then SYNC_MASTER sends complete but readers of the
    replica see only dispatched messages; then everything becomes readable."""
    p = pair()
    p.master.create_topic("T", read_queue_nums=2, write_queue_nums=2)
    p.replica = Store.open(p.replica_url, replica=True, **p.opts)
    p.rlog = ReplicaLog(p.replica)
    gate = threading.Event()
    real_step = p.rlog.dispatch_step

    def held_step(*args, **kwargs):          # the reput thread waits for the gate
        gate.wait(WAIT_S)
        return real_step(*args, **kwargs)
    p.rlog.dispatch_step = held_step
    try:
        p.client = HAClient(p.rlog, broker_name="broker-a", broker_id=1, secret=SECRET,
                            master_address=lambda: f"127.0.0.1:{p.ha.port}").start()
        send(p.master, 2000)                  # several 64 KiB segments
        end = p.master.commitlog.written_offset
        assert p.ha.wait_replicated(end, 30_000) is PutMessageStatus.PUT_OK
        assert p.rlog.whole_offset == p.rlog.offset == end
        assert p.rlog.dispatched_offset < end
        assert [p.replica.max_offset("T", q) for q in (0, 1)] == [0, 0]
        assert p.replica.read("T", 0, 0, max_messages=10) == []
        assert p.replica.query_by_key("T", "k5") == []
    finally:
        gate.set()
    wait_until(p.caught_up, "the replica to dispatch")
    for q in (0, 1):
        assert p.replica.max_offset("T", q) == p.master.max_offset("T", q)
    assert sum(len(p.replica.read("T", q, 0, 10_000)) for q in (0, 1)) == 2000
    assert p.replica.query_by_key("T", "k1999")[0].body == b"m1999" * 20


REPLICA_CHILD = """
import sys, time
from sparkmq import Store
from sparkmq.ha.replica import HAClient, ReplicaLog
url, port, limit, secret = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = Store.open(url, replica=True, mappedFileSizeCommitLog=65536)
rlog = ReplicaLog(store)
real_step = rlog.dispatch_step
def lagging_step(max_bytes=0):      # dispatch lags: small steps, and only up to `limit`
    return real_step(4096) if store.dispatcher.dispatched_offset < limit else 0
rlog.dispatch_step = lagging_step
HAClient(rlog, broker_name="broker-a", broker_id=1, secret=secret,
         master_address=lambda: "127.0.0.1:%d" % port).start()
while True:
    print(rlog.offset, rlog.dispatched_offset, flush=True)
    time.sleep(0.02)   # the point: pace the progress lines until the test kills us
"""


def test_replica_killed_while_dispatch_lags_recovers_consistent(pair, procs):
    """SIGKILL a replica process whose CommitLog is written (and acked) but only
    partly dispatched: reopened, its recovery dispatches the rest from the
    CommitLog (byte-identical to the master's), and it follows on."""
    import sys
    p = pair(segment_bytes=65536)
    p.master.create_topic("T", read_queue_nums=2, write_queue_nums=2)
    send(p.master, 3000)
    end = p.master.commitlog.written_offset
    limit = end // 2
    child = subprocess.Popen([sys.executable, "-c", REPLICA_CHILD, p.replica_url,
                              str(p.ha.port), str(limit), SECRET],
                             stdout=subprocess.PIPE, text=True)
    procs.append(child)
    deadline = time.monotonic() + WAIT_S
    while True:
        line = child.stdout.readline()
        assert line and time.monotonic() < deadline, "the replica child never caught up"
        written, dispatched = map(int, line.split())
        if written == end and dispatched >= limit:
            break
    assert dispatched < end                    # acked and written, not all dispatched
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    p.master.flush()
    assert segment_files(p.master_url) == segment_files(p.replica_url)
    send(p.master, 500, start=3000)
    p.start_replica()                          # recovery dispatches the written rest
    wait_until(p.caught_up, "catch-up after the kill")
    p.master.flush()
    assert segment_files(p.master_url) == segment_files(p.replica_url)
    for q in (0, 1):
        assert p.replica.max_offset("T", q) == p.master.max_offset("T", q)
    got = sorted(m.body for q in (0, 1) for m in p.replica.read("T", q, 0, 10_000))
    assert got == sorted(b"m%d" % i * 20 for i in range(3500))
    assert p.replica.query_by_key("T", "k3499")[0].body == b"m3499" * 20


def test_replica_finds_whole_batches_across_any_frame_cuts(tmp_path):
    """Frames cut anywhere (inside the schema, inside a batch header, a frame holding
    only the tail of a batch): the replica acks exactly the end of the last whole
    batch written, dispatches them, and ends byte-identical."""
    from sparkmq.log import segment as seg
    master = Store.open(str(tmp_path / "m"))
    master.create_topic("T")
    send(master, 200, batch=40)
    master.flush()
    ref = master.commitlog.segments()[0]
    data = master.sfs.read_range(ref.path, 0, ref.size)
    ends = [p + n for p, n in zip(*(lambda r: (r.positions, r.lengths))(
        seg.scan(master.sfs.read_buffer(ref.path))))]
    hdr = seg.HEADER_SIZE
    b1, b2 = ends[0], ends[1]
    cuts = [100, hdr + 3, b1 + 5, b2, b2 + 1, ends[3] - 1, len(data)]
    replica = Store.open(str(tmp_path / "r"), replica=True)
    try:
        rlog = inline_replica_log(replica, master, ref)
        acks: list[int] = []
        pos = 0
        for cut in cuts:
            rlog.write(ref.path, pos, data[pos:cut], acks.append)
            pos = cut
            whole = max([e for e in [hdr] + ends if e <= cut], default=0)
            assert rlog.whole_offset == ref.base_offset + whole, f"after a frame ending at {cut}"
            assert rlog.dispatched_offset == rlog.whole_offset
        assert acks == sorted(set(acks)) and acks[-1] == ref.base_offset + len(data)
        assert replica.max_offset("T", 0) + replica.max_offset("T", 1) + \
            replica.max_offset("T", 2) + replica.max_offset("T", 3) == 200
        with pytest.raises(Exception, match="at byte"):
            rlog.write(ref.path, 0, data[:10])      # not where the copy continues
    finally:
        replica.close()
        master.close()
    assert open(tmp_path / "m" / ref.path, "rb").read() == \
        open(tmp_path / "r" / ref.path, "rb").read()


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "recv_into"])
def test_socket_payload_lands_in_the_segment_file(tmp_path, splice):
    """A data frame's payload moves from the socket into the segment file, spliced in
    the kernel or (where splice is refused) through a reused buffer, with progress
    reported along the way."""
    import socket as socketlib
    from sparkmq.ha import replica as replica_mod
    from sparkmq.log import segment as seg
    from sparkmq.log.fs import StoreFS
    if splice and not hasattr(os, "splice"):
        pytest.skip("os.splice needs Linux and Python 3.10+")
    payload = os.urandom(3 * replica_mod.PROGRESS_BYTES + 12345)
    a_sock, b_sock = socketlib.socketpair()
    sfs = StoreFS(str(tmp_path))
    writer = seg.SegmentWriter(sfs, "commitlog/00000000000000000000.arrow", 0, create=True)
    source = replica_mod._SocketSource(b_sock)
    try:
        if not splice:
            source.close()                     # as after the kernel refused a splice
        sender = threading.Thread(target=a_sock.sendall, args=(payload,))
        sender.start()
        calls = []
        source.copy_into(writer, len(payload), lambda: calls.append(writer.size))
        sender.join()
        assert (source.pipe is not None) == splice     # spliced all the way, no fallback
        assert writer.size == seg.HEADER_SIZE + len(payload)
        assert calls and all(x < writer.size for x in calls)
    finally:
        source.close()
        writer.close()
        a_sock.close()
        b_sock.close()
    data = open(tmp_path / "commitlog" / "00000000000000000000.arrow", "rb").read()
    assert data == seg.SCHEMA_BYTES + payload
