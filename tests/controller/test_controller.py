"""Controller mode (issue 19): three controller nodes on a real Raft log (pysyncobj) own
each broker group's master, epoch and SyncStateSet; a master acknowledges only under
a lease the majority renews; a new master is elected only from the SyncStateSet and
only once the old lease has surely run out."""
from __future__ import annotations

import time

import pytest

from helpers.brokers import broker_config, sends_on_the_loop
from helpers.clock import Clock
from helpers.net import free_port
from helpers.waiting import wait_until
from sparkmq.broker import Broker
from sparkmq.client import Message, Producer
from sparkmq.controller.client import ControllerClient
from sparkmq.controller.server import Controller
from sparkmq.errors import BrokerUnavailableError, ClientError

pytestmark = pytest.mark.integration

SECRET = "controller-test-secret-0123456789"
LEASE_MS, GRACE_MS = 2_000, 1_000
HOUR_MS = 3_600_000


@pytest.fixture
def controllers(tmp_path):
    raft = [free_port() for _ in range(3)]
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(raft))
    nodes = [Controller(self_id=f"n{i}", peers=peers, store_path=str(tmp_path / f"c{i}"),
                        cluster_secret=SECRET, lease_ms=LEASE_MS, grace_ms=GRACE_MS).start()
             for i in range(3)]
    yield nodes
    for c in nodes:
        c.stop()


def _addr(nodes) -> str:
    return ";".join(c.address for c in nodes)


@pytest.fixture
def group(tmp_path, controllers):
    started = []

    def start(node_id: int, **props):
        role = "SYNC_MASTER" if node_id == 0 else "SLAVE"
        b = Broker(broker_config(
            tmp_path, name="broker-a", brokerId=node_id, brokerRole=role,
            storePathRootDir=str(tmp_path / f"b{node_id}"), haListenPort=free_port(),
            haSecret=SECRET, clusterSecret=SECRET, enableControllerMode="true",
            controllerAddr=_addr(controllers), brokerHeartbeatInterval=300,
            haMaxTimeSlaveNotCatchup=2000, syncFlushTimeout=3000, **props)).start()
        started.append(b)
        return b
    yield start
    for b in reversed(started):
        b.stop()


def _view(controllers) -> dict:
    return ControllerClient(_addr(controllers), cluster_secret=SECRET).sync_state_set(
        "broker-a") or {}


def test_the_first_master_registers_and_replicas_join_the_sync_state_set(controllers, group):
    master = group(0)
    master.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    wait_until(lambda: _view(controllers).get("masterId") == 0, "master 0 at the controllers")
    r1, r2 = group(1), group(2)
    wait_until(lambda: _view(controllers).get("syncStateSet") == [0, 1, 2],
               "both replicas in the SyncStateSet", timeout_s=30)
    with Producer(master.endpoint, max_retries=0) as p:
        for i in range(10):              # acknowledged only once both replicas have it
            p.send(Message("T", f"m{i}".encode()))
    end = master.store.commitlog.written_offset
    assert r1.replica_log.offset >= end and r2.replica_log.offset >= end


def test_a_dead_master_is_replaced_by_the_sync_state_set_member_with_most_data(
        controllers, group):
    master = group(0)
    master.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    r1 = group(1)
    wait_until(lambda: _view(controllers).get("syncStateSet") == [0, 1], "r1 in sync",
               timeout_s=30)
    with Producer(master.endpoint, max_retries=0) as p:
        for i in range(20):
            p.send(Message("T", f"acked-{i}".encode()))
    stopped_at = time.monotonic()
    master.stop()                                 # heartbeats and HA link gone
    wait_until(lambda: _view(controllers).get("masterId") == 1, "node 1 elected",
               timeout_s=30)
    # never before the old lease (+ grace) ran out
    assert time.monotonic() - stopped_at >= (LEASE_MS + GRACE_MS) / 1000 - 0.5
    wait_until(lambda: r1.ha.is_master and r1.controlled.lease_valid(), "r1 promoted")
    bodies = [m.body for m in r1.store.read("T", 0, 0, 100)]
    assert [f"acked-{i}".encode() for i in range(20)] == bodies[:20]   # every acked one
    with Producer(r1.endpoint, max_retries=0) as p:
        p.send(Message("T", b"on-the-new-master"))


def test_a_master_cut_from_the_controllers_stops_acknowledging(controllers, group):
    master = group(0)
    master.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    wait_until(lambda: master.controlled.lease_valid(), "the first lease")
    with Producer(master.endpoint, max_retries=0) as p:
        p.send(Message("T", b"under-the-lease"))
        for c in controllers:
            c.stop()
        wait_until(lambda: not master.controlled.lease_valid(), "the lease to run out",
                   timeout_s=LEASE_MS / 1000 + 5)
        before = master.store.commitlog.written_offset
        with pytest.raises((ClientError, BrokerUnavailableError), match="lease"):
            p.send(Message("T", b"refused"))
    assert master.store.commitlog.written_offset == before           # nothing stored


def test_grpc_sends_await_every_sync_state_set_member_on_the_loop(controllers, group,
                                                                  monkeypatch):
    """A controller-mode SYNC_MASTER's RocketMQ sends (plain, rich, a batch) are appended
    on the gRPC loop and await every other SyncStateSet member's ack as a future
    (``HAService.replicated_by_async``): no thread blocks in ``wait_replicated_by``. A
    member that stops acking, or a lease that runs out meanwhile: the send is stored
    once, answered SLAVE_PERSISTENCE_TIMEOUT."""
    from sparkmq.client.core import Code
    master = group(0)
    master.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    r1, r2 = group(1), group(2)
    wait_until(lambda: _view(controllers).get("syncStateSet") == [0, 1, 2],
               "both replicas in the SyncStateSet", timeout_s=30)

    with Producer(master.endpoint, max_retries=0, transport="grpc") as p:
        sends_on_the_loop(master, monkeypatch, p, "wait_replicated_by")
        end = master.store.commitlog.written_offset
        assert r1.replica_log.offset >= end and r2.replica_log.offset >= end
        with r2.store.append_lock:            # its writer blocked: r2 acks nothing
            with pytest.raises(ClientError) as e:
                p.send(Message("T", b"slow"))
            assert e.value.status_code == Code.SLAVE_PERSISTENCE_TIMEOUT
        # the lease runs out while a send awaits its acks: acked, yet not acknowledged
        ran_out, awaited = [], master.ha_service.replicated_by_async

        async def lease_runs_out(*args):
            ran_out.append(True)
            return await awaited(*args)
        monkeypatch.setattr(master.ha_service, "replicated_by_async", lease_runs_out)
        monkeypatch.setattr(master.controlled, "lease_valid", lambda: not ran_out)
        with pytest.raises(ClientError) as e:
            p.send(Message("T", b"late-lease"))
        assert e.value.status_code == Code.SLAVE_PERSISTENCE_TIMEOUT
    bodies = [m.body for m in master.store.read("T", 0, 0, 30)]
    assert bodies.count(b"slow") == 1 and bodies.count(b"late-lease") == 1


def test_admin_controller_commands(controllers, group, capsys, monkeypatch):
    import json
    from sparkmq.admin import main as admin_main
    monkeypatch.setenv("SPARKMQ_CLUSTER_SECRET", SECRET)
    master = group(0)
    group(1)
    wait_until(lambda: _view(controllers).get("syncStateSet") == [0, 1], "r1 in sync",
               timeout_s=30)
    addr = _addr(controllers)
    assert admin_main(["--json", "controller", "--controller", addr, "metadata"]) == 0
    meta = json.loads(capsys.readouterr().out)["groups"]["broker-a"]
    assert meta["masterId"] == 0 and sorted(meta["nodes"]) == ["0", "1"]
    assert admin_main(["--json", "controller", "--controller", addr, "sync-state-set",
                       "--broker-name", "broker-a"]) == 0
    assert json.loads(capsys.readouterr().out)["syncStateSet"] == [0, 1]
    # an operator may not elect a node outside the SyncStateSet
    assert admin_main(["controller", "--controller", addr, "elect-master",
                       "--broker-name", "broker-a", "--node-id", "7"]) == 1
    assert "not in the SyncStateSet" in capsys.readouterr().err
    assert master.ha.is_master


def test_controllers_inside_three_nameservers_elect_a_leader_and_register_a_master(
        tmp_path, procs):
    """enableControllerInNamesrv=true (RocketMQ 5): each NameServer process runs a
    controller node too; a broker in controller mode gets its lease from them."""
    from helpers.daemons import spawn
    raft = [free_port() for _ in range(3)]
    api = [free_port() for _ in range(3)]
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(raft))
    for i in range(3):
        conf = tmp_path / f"namesrv{i}.properties"
        conf.write_text("\n".join([
            f"listenPort={free_port()}", "enableControllerInNamesrv=true",
            f"controllerDLegerPeers={peers}", f"controllerDLegerSelfId=n{i}",
            f"controllerListenPort={api[i]}", f"controllerStorePath={tmp_path}/c{i}",
            f"clusterSecret={SECRET}", ""]))
        spawn(["sparkmq.cli", "namesrv", "-c", str(conf)],
              f"http://127.0.0.1:{api[i]}/controller/status", procs)
    addr = ";".join(f"127.0.0.1:{p}" for p in api)
    b = Broker(broker_config(tmp_path, brokerId=0, brokerRole="SYNC_MASTER",
                             enableControllerMode="true", controllerAddr=addr,
                             clusterSecret=SECRET, brokerHeartbeatInterval=300)).start()
    try:
        wait_until(lambda: b.controlled.lease_valid(), "a lease from the NameServers'"
                   " controllers", timeout_s=30)
        client = ControllerClient(addr, cluster_secret=SECRET)
        # reads are served by whichever controller answers: it may apply a moment later
        wait_until(lambda: (client.sync_state_set("broker-a") or {}).get("syncStateSet")
                   == [0], "the committed master on the controller that answers reads")
        assert client.sync_state_set("broker-a")["masterId"] == 0
    finally:
        b.stop()


def test_unsigned_or_wrongly_signed_controller_writes_are_refused(controllers):
    import json
    import urllib.error
    import urllib.request
    body = json.dumps({"brokerName": "evil", "nodeId": 0, "claimsMaster": True}).encode()
    req = urllib.request.Request(f"http://{controllers[0].address}/controller/heartbeat",
                                 data=body, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401
    wrong = ControllerClient(_addr(controllers), cluster_secret="another-secret-0123456789")
    assert wrong.heartbeat("evil", 0, "", "", 0, claims_master=True) is None
    right = ControllerClient(_addr(controllers), cluster_secret=SECRET)
    assert right.sync_state_set("evil").get("masterId") is None     # nothing registered


def test_a_lagging_wall_clock_does_not_get_a_live_master_replaced(tmp_path):
    """Leases are judged on the leader's own clock. The master's heartbeats go to a
    controller whose wall clock is a minute behind (its ``lastSeenMs`` reads a minute
    old on the leader's wall clock), the replica's to the leader: the live master is
    kept; once it stops heartbeating it is replaced when the leader's clock has run past
    its lease and grace, and not before. Each controller's clocks are manual
    (``clock_ms`` its wall clock, ``local_ms`` its monotonic one), and the test steps
    the election service itself (``judge_leases``): on its timer, it could judge between
    the clocks' step and the heartbeat that follows it."""
    raft = [free_port() for _ in range(3)]
    peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(raft))
    walls, locals_ = [Clock() for _ in range(3)], [Clock(0) for _ in range(3)]
    nodes = [Controller(self_id=f"n{i}", peers=peers, cluster_secret=SECRET,
                        lease_ms=LEASE_MS, grace_ms=GRACE_MS, clock_ms=walls[i],
                        local_ms=locals_[i], election_interval_ms=HOUR_MS).start()
             for i in range(3)]
    try:
        wait_until(lambda: any(c.state._isLeader() for c in nodes), "a Raft leader")
        leader = next(c for c in nodes if c.state._isLeader())
        leader.judge_leases()                            # its lease clock starts now
        lagging = next(i for i, c in enumerate(nodes) if c is not leader)
        walls[lagging].advance(-60_000)                  # its wall clock a minute behind
        via = {1: ControllerClient(nodes[lagging].address, cluster_secret=SECRET),
               2: ControllerClient(leader.address, cluster_secret=SECRET)}

        def beat(node: int, offset: int, **kw) -> None:
            assert via[node].heartbeat("g", node, f"e{node}", f"h{node}", offset, **kw)
            wait_until(lambda: leader.state.metadata().get("g", {}).get("nodes", {})
                       .get(node, {}).get("offset") == offset, "the leader applied it")

        def elapse(ms: int) -> None:
            for clock in locals_ + walls:
                clock.advance(ms)
        beat(1, 10, claims_master=True)
        beat(2, 10)
        assert via[1].alter_sync_state_set("g", 1, 1, 1, [1, 2])["ok"]
        for offset in (20, 30):                          # the master keeps renewing
            elapse(LEASE_MS + GRACE_MS + 1)
            beat(1, offset)
            beat(2, offset)
            assert leader.state.election_due(LEASE_MS, GRACE_MS) == [], "a live master"
            leader.judge_leases()
        assert leader.state.view("g")["masterId"] == 1
        elapse(LEASE_MS)                                 # the master goes quiet
        beat(2, 40)
        assert leader.state.election_due(LEASE_MS, GRACE_MS) == [], "inside the grace"
        leader.judge_leases()
        assert leader.state.view("g")["masterId"] == 1
        elapse(GRACE_MS + 1)
        beat(2, 41)
        assert leader.state.election_due(LEASE_MS, GRACE_MS) == [("g", 2, 1)]
        leader.judge_leases()
        assert leader.state.view("g")["masterId"] == 2
    finally:
        for c in nodes:
            c.stop()


def test_signed_writes_with_malformed_numbers_are_refused_naming_the_field(controllers):
    """A node id, epoch or offset is a whole number >= 0 (as the NameServer's fields:
    ``properties.whole``): 1.5 was read as 1, true as 1, and 1e999 answered 503 (an
    OverflowError taken for a lost majority). Each is a 400 naming the field; nothing
    is registered."""
    client = ControllerClient(_addr(controllers), cluster_secret=SECRET)
    cases = [({"nodeId": 1.5}, "nodeId"), ({"nodeId": True}, "nodeId"),
             ({"nodeId": -1}, "nodeId"), ({"nodeId": "1"}, "nodeId"),
             ({"nodeId": 1, "offset": float("inf")}, "offset")]
    for bad, field in cases:
        code, body = client.request("/controller/heartbeat", {"brokerName": "bad", **bad})
        assert code == 400 and f"'{field}'" in body["error"], (bad, body)
    code, body = client.request("/controller/alterSyncStateSet", {
        "brokerName": "bad", "masterId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1,
        "syncStateSet": "1,2"})
    assert code == 400 and "syncStateSet" in body["error"]
    assert client.sync_state_set("bad").get("masterId") is None
    assert "bad" not in client.metadata()["groups"]


def test_a_controller_restarted_after_log_compaction_keeps_every_group(tmp_path):
    """pysyncobj compacts its log into a dump (after logCompactionMinEntries entries or
    logCompactionMinTime), and a restarted controller, or a follower sent the snapshot,
    starts from it. The dump held no group (pysyncobj leaves out what a SyncObj had
    before its own ``__init__``): after a compaction and a restart every group's master,
    epochs and SyncStateSet were gone, and the next master claim started again at epoch
    1. Now the groups live in a pysyncobj consumer whose state the dump holds."""
    from sparkmq.controller.state import ControllerState
    addr, journal = f"127.0.0.1:{free_port()}", str(tmp_path / "raft.journal")
    state = ControllerState(addr, [], secret=SECRET, journal_path=journal)
    try:
        wait_until(state.isReady, "a one-node Raft ready")
        state.heartbeat("g", 1, "e1", "h1", 10, 1, True, sync=True, timeout=5)
        state.heartbeat("g", 2, "e2", "h2", 10, 1, sync=True, timeout=5)
        assert state.alter_sync_state_set("g", 1, 1, 1, [1, 2], sync=True, timeout=5)["ok"]
        assert state.elect("g", 2, 1, sync=True, timeout=5)["ok"]
        before = state.view("g")
        assert (before["masterId"], before["masterEpoch"], before["syncStateSetEpoch"]) \
            == (2, 2, 3)
        state.forceLogCompaction()
        wait_until(lambda: state.getStatus()["log_len"] <= 2, "the log compacted into a dump")
    finally:
        state.destroy()
    again = ControllerState(addr, [], secret=SECRET, journal_path=journal)
    try:
        wait_until(again.isReady, "the restarted node ready")
        assert again.view("g") == before
        assert again.metadata()["g"]["nodes"].keys() == {1, 2}
        # a claim from the old master does not restart the group at epoch 1
        view = again.heartbeat("g", 1, "e1", "h1", 10, 2, True, sync=True, timeout=5)
        assert (view["masterId"], view["masterEpoch"]) == (2, 2)
    finally:
        again.destroy()
