"""Partition tests of controller mode (issue 19 item 6), Jepsen style: three controllers,
a master and its replicas, and two writers, each process in its own network
namespace; partitions drop packets with iptables. Writer A sends to the master's
endpoint, writer B to the first replica's (refused until it is elected); each
records the numbers acknowledged and when. At the end everything is read back from
the store of the master the controllers name.

Each scenario prints ``acked / lost / duplicated / seconds with two masters acking``
and must reach 0 lost and 0 s with two masters acking. Skipped, with the reason,
where network namespaces cannot be made (not root, no iptables).
"""
from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

import pytest

from netlab import NetLab, available

# one worker runs them in turn: each lab's processes judge leases on timers
pytestmark = [pytest.mark.integration, pytest.mark.partition,
              pytest.mark.xdist_group("netlab")]

REASON = available()
if REASON is not None:
    pytest.skip(f"partition tests need network namespaces: {REASON}", allow_module_level=True)

SECRET = "partition-test-secret-0123456789"
LEASE_MS, GRACE_MS = 3_000, 1_000
HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS: list[dict] = []


def _props(path: str, props: dict) -> str:
    with open(path, "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in props.items())
    return path


class Cluster:
    """Three controllers, a master (node 0) and ``replicas`` replicas, two writers."""

    def __init__(self, lab: NetLab, tmp: str, replicas: int = 1):
        self.lab, self.tmp = lab, tmp
        self.ctl = [lab.node(f"c{i}") for i in range(3)]
        peers = ";".join(f"n{i}-{n.ip}:9878" for i, n in enumerate(self.ctl))
        for i, n in enumerate(self.ctl):
            cfg = _props(f"{tmp}/c{i}.properties", {
                "controllerDLegerPeers": peers, "controllerDLegerSelfId": f"n{i}",
                "controllerListenPort": 9877, "controllerStorePath": f"{tmp}/c{i}",
                "clusterSecret": SECRET, "controllerLeaseMs": LEASE_MS,
                "controllerLeaseGraceMs": GRACE_MS})
            lab.spawn(n, ["-m", "sparkmq.cli", "controller", "-c", cfg, "--host", n.ip])
        self.controller_addr = ";".join(f"{n.ip}:9877" for n in self.ctl)
        self.brokers = [lab.node(f"b{i}") for i in range(replicas + 1)]
        for i, n in enumerate(self.brokers):
            cfg = _props(f"{tmp}/b{i}.properties", {
                "brokerClusterName": "C", "brokerName": "broker-a", "brokerId": i,
                "brokerRole": "SYNC_MASTER" if i == 0 else "SLAVE", "brokerIP1": n.ip,
                "allowAnonymousNetworkAccess": "true",      # a lab network of namespaces
                "listenPort": 8081, "adminPort": 8082, "adminListenAddress": n.ip,
                "haListenPort": 10912, "haSecret": SECRET, "clusterSecret": SECRET,
                "storePathRootDir": f"{tmp}/store-b{i}", "flushDiskType": "SYNC_FLUSH",
                "syncFlushTimeout": 2000, "enableControllerMode": "true",
                "controllerAddr": self.controller_addr, "brokerHeartbeatInterval": 300,
                "haMaxTimeSlaveNotCatchup": 3000, "autoCreateTopicEnable": "false"})
            lab.spawn(n, ["-m", "sparkmq.cli", "broker" if i == 0 else "replica", "-c", cfg])
        self.writers = [lab.node("wa"), lab.node("wb")]

    # ------------------------------------------------------------ observing
    def view(self, via=None) -> dict:
        for n in ([via] if via is not None else self.ctl):
            try:
                with urllib.request.urlopen(f"http://{n.ip}:9877/controller/syncStateSet?"
                                            "brokerName=broker-a", timeout=2) as r:
                    return json.loads(r.read())
            except OSError:
                continue
        return {}

    def healthy(self, n) -> bool:
        try:
            with urllib.request.urlopen(f"http://{n.ip}:8082/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def start(self) -> None:
        lab = self.lab
        lab.wait(lambda: all(self.healthy(b) for b in self.brokers), "brokers up", 90)
        _create_topic(self.brokers[0])
        members = list(range(len(self.brokers)))
        lab.wait(lambda: self.view().get("syncStateSet") == members,
                 f"SyncStateSet {members}", 60)
        for w, target, prefix in ((self.writers[0], self.brokers[0], "A"),
                                  (self.writers[1], self.brokers[1], "B")):
            lab.spawn(w, [f"{HERE}/writer.py", f"{target.ip}:8081", "J", prefix,
                          f"{self.tmp}/acks-{prefix}", f"{self.tmp}/stop"])

    def acks(self, prefix: str) -> list[tuple[int, int]]:
        path = f"{self.tmp}/acks-{prefix}"
        if not os.path.exists(path):
            return []
        return [tuple(map(int, line.split())) for line in open(path) if line.strip()]

    def finish(self, name: str) -> dict:
        """Stop writers and daemons, read back from the final master's store."""
        open(f"{self.tmp}/stop", "w").close()
        time.sleep(1.0)
        master = self.view().get("masterId")
        for n in self.writers + self.brokers:
            self.lab.kill(n, signal.SIGTERM)
        for n in self.ctl:
            self.lab.kill(n, signal.SIGTERM)
        from sparkmq import Store
        with Store.open(f"{self.tmp}/store-b{master}", mode="r") as s:
            stored = [m.body.decode() for q in range(s.topics()["J"].read_queue_nums)
                      for m in _read_all(s, "J", q)]
        a, b = self.acks("A"), self.acks("B")
        acked = {f"A-{i}" for i, _ in a} | {f"B-{i}" for i, _ in b}
        counts: dict[str, int] = {}
        for body in stored:
            counts[body] = counts.get(body, 0) + 1
        two_masters_s = 0.0
        if a and b:
            two_masters_s = max(0.0, (a[-1][1] - b[0][1]) / 1000)
        row = {"scenario": name, "acked": len(acked),
               "lost": len(acked - counts.keys()),
               "duplicated": sum(1 for c in counts.values() if c > 1),
               "two_masters_s": round(two_masters_s, 2), "final_master": master,
               "acked_by_old_master": len(a), "acked_by_new_master": len(b)}
        RESULTS.append(row)
        print(f"\n{name}: {json.dumps(row)}")
        return row


def _read_all(store, topic: str, queue: int):
    offset, out = 0, []
    while True:
        got = store.read(topic, queue, offset, 1000)
        if not got:
            return out
        out += got
        offset = got[-1].queue_offset + 1


def _create_topic(broker) -> None:
    req = urllib.request.Request(
        f"http://{broker.ip}:8082/admin/topics", method="POST",
        data=json.dumps({"name": "J", "readQueueNums": 1, "writeQueueNums": 1}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": f"Bearer {os.environ['SPARKMQ_ADMIN_TOKEN']}"})
    deadline = time.monotonic() + 30
    while True:     # the master accepts writes once its first lease is granted
        try:
            with urllib.request.urlopen(req, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture
def lab(tmp_path):
    lab = NetLab(str(tmp_path))
    yield lab
    lab.close()


def _check(row: dict) -> None:
    assert row["lost"] == 0, row
    assert row["two_masters_s"] == 0, row
    assert row["duplicated"] == 0, row
    assert row["acked"] > 0, row


@pytest.mark.parametrize("replicas", [1, 2])
def test_master_side_minority_partition(lab, tmp_path, replicas):
    """{M, c2, writer A, (R2)} | {R, c0, c1, writer B}: R is elected, M stops acking."""
    c = Cluster(lab, str(tmp_path), replicas=replicas)
    c.start()
    time.sleep(3)
    m_side = [c.brokers[0], c.ctl[2], c.writers[0]] + c.brokers[2:]
    r_side = [c.brokers[1], c.ctl[0], c.ctl[1], c.writers[1]]
    lab.partition(m_side, r_side)
    lab.wait(lambda: c.view(c.ctl[0]).get("masterId") == 1, "R elected", 40)
    time.sleep(6)                          # both sides keep writing
    lab.heal()
    time.sleep(3)
    row = c.finish(f"minority master, {replicas} replica(s)")
    _check(row)
    assert row["acked_by_new_master"] > 0


def test_master_cut_from_every_controller(lab, tmp_path):
    c = Cluster(lab, str(tmp_path))
    c.start()
    time.sleep(3)
    lab.partition([c.brokers[0]], c.ctl)
    lab.wait(lambda: c.view().get("masterId") == 1, "R elected", 40)
    time.sleep(6)
    lab.heal()
    time.sleep(3)
    row = c.finish("master cut from every controller")
    _check(row)
    assert row["acked_by_new_master"] > 0


def test_master_replica_link_cut_and_flapping(lab, tmp_path):
    c = Cluster(lab, str(tmp_path))
    c.start()
    for _ in range(4):                    # flapping: 4 s cut, 2 s joined
        lab.cut(c.brokers[0], c.brokers[1])
        time.sleep(4)
        lab.heal()
        time.sleep(2)
    time.sleep(4)
    row = c.finish("master-replica link cut and flapping")
    _check(row)
    assert row["final_master"] == 0        # no election: the master kept its lease


def test_controller_leader_killed(lab, tmp_path):
    c = Cluster(lab, str(tmp_path))
    c.start()
    time.sleep(2)
    leader = None
    for n in c.ctl:
        try:
            with urllib.request.urlopen(f"http://{n.ip}:9877/controller/status",
                                        timeout=2) as r:
                if json.loads(r.read()).get("isLeader"):
                    leader = n
        except OSError:
            pass
    assert leader is not None
    before = len(c.acks("A"))
    lab.kill(leader, signal.SIGKILL)
    time.sleep(8)
    assert len(c.acks("A")) > before       # the master kept acknowledging
    row = c.finish("controller leader killed")
    _check(row)
    assert row["final_master"] == 0


def test_clean_stop_of_the_master(lab, tmp_path):
    c = Cluster(lab, str(tmp_path))
    c.start()
    time.sleep(3)
    stopped = time.monotonic()
    lab.kill(c.brokers[0], signal.SIGTERM)
    lab.wait(lambda: c.view().get("masterId") == 1, "R elected", 40)
    assert time.monotonic() - stopped >= (LEASE_MS + GRACE_MS) / 1000 - 1.0
    time.sleep(5)
    row = c.finish("clean stop of the master")
    _check(row)
    assert row["acked_by_new_master"] > 0


def teardown_module(module):
    if RESULTS:
        print("\npartition suite:")
        print(f"{'scenario':42} {'acked':>6} {'lost':>5} {'dup':>4} {'2-master s':>10}")
        for r in RESULTS:
            print(f"{r['scenario']:42} {r['acked']:>6} {r['lost']:>5} {r['duplicated']:>4} "
                  f"{r['two_masters_s']:>10}")
