"""The controller's replicated state: RocketMQ 5's controller metadata on a Raft log.

Per broker group (``brokerName``): the master (its node id, gRPC and HA address),
the master epoch, the SyncStateSet (the node ids whose copy holds every message the
master acknowledged) with its own epoch, and every node's last heartbeat (time,
addresses, written offset). Node ids are the brokers' configured ``brokerId`` (> 0,
unique in the group).

Every change is a Raft command applied in the same order on every controller
(``pysyncobj``, a maintained Python Raft library: leader election, log
replication, persistence of the log, the majority rule; its journal is the
controller's own, fsynced where pysyncobj's is not: ``journal.py``); a command that
cannot reach a majority is not applied anywhere. Rules the commands keep:

* ``heartbeat`` records a node; the first node of a group with no master that
  starts as a master (its configured role) becomes its master (epoch 1,
  SyncStateSet ``{it}``).
* ``alter_sync_state_set`` is accepted only from the current master at the current
  master epoch and SyncStateSet epoch, and the set must contain the master.
* ``elect`` makes a node master only if it is in the SyncStateSet; the epoch goes
  up by one and the SyncStateSet becomes ``{new master}`` (replicas rejoin it once
  they have caught up with the new master).

When to elect is decided by :meth:`ControllerState.election_due` on the leader
(``server.ElectionService``): only after the master's lease has surely run out. That is
judged on the node's own monotonic clock: each node notes when it applied each node's
last heartbeat (local, not replicated), so no controller compares its clock with the
wall clock of the one that took the heartbeat (a skew beyond the grace would elect a
second master while the first still renews its lease, as RocketMQ's controller keeps its
heartbeat table in the leader's memory for the same reason). ``lastSeenMs`` in the
replicated state is the receiving node's wall clock, for operators only.

Thread-safety: pysyncobj applies commands on its own thread; reads take a copy.
"""
from __future__ import annotations

import copy
import threading
import time
from typing import Callable

import pysyncobj.syncobj
from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, replicated

from .journal import create_journal

# pysyncobj builds each SyncObj's journal with its module's ``createJournal``: the
# controller's is durable (journal.py: entries, term and vote fsynced before Raft uses them)
if not callable(getattr(pysyncobj.syncobj, "createJournal", None)):
    raise ImportError("this pysyncobj builds its journal another way: the controller needs "
                      "pysyncobj 0.3.x (pip install 'pysyncobj>=0.3.14,<0.4')")
pysyncobj.syncobj.createJournal = create_journal


_STOP_S = 5.0      # how long ``ControllerState.destroy`` waits for the tick thread


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class _Groups(SyncObjConsumer):
    """The replicated groups, as a pysyncobj consumer: what it gets after its own
    ``__init__`` goes into the dump that log compaction writes (and a lagging follower is
    sent), and comes back from it. (pysyncobj leaves out of the dump whatever a SyncObj
    had before its ``__init__`` ran: the groups once sat there, so a controller restarted
    after a compaction had lost every group's master, epochs and SyncStateSet.)"""

    def __init__(self):
        super().__init__()
        self.groups: dict[str, dict] = {}


class ControllerState(SyncObj):
    """One controller node: ``self_addr`` ``host:port`` of its Raft port, ``peers`` the
    others'. ``secret`` encrypts and authenticates the Raft traffic (pysyncobj's
    ``password``); ``journal_path`` keeps the log across restarts (None: memory);
    ``local_ms`` this node's own clock for leases (monotonic ms)."""

    def __init__(self, self_addr: str, peers: list[str], *, secret: str,
                 journal_path: str | None = None,
                 local_ms: Callable[[], int] = monotonic_ms):
        conf = SyncObjConf(password=secret, journalFile=journal_path,
                           fullDumpFile=f"{journal_path}.dump" if journal_path else None,
                           dynamicMembershipChange=False, commandsWaitLeader=True,
                           raftMinTimeout=0.4, raftMaxTimeout=1.2, appendEntriesPeriod=0.05,
                           leaderFallbackTimeout=2.0, connectionRetryTime=1.0)
        self._store = _Groups()
        self._local_ms = local_ms
        # (group, node) -> local_ms() when this node applied its last heartbeat (a log
        # replayed at start counts as heard then: an election waits a lease longer)
        self._heard: dict[tuple[str, int], int] = {}
        self._read_lock = threading.Lock()
        super().__init__(self_addr, peers, conf, consumers=[self._store])

    @property
    def _groups(self) -> dict[str, dict]:
        return self._store.groups

    def destroy(self) -> None:
        """Stop this node, and return once its tick thread has ended. pysyncobj's own
        ``destroy`` only asks the thread to stop: its last tick could still save the
        journal's term and vote after the caller went on (a test that restored the
        controllers' files found a file of that save gone from under it). Bounded: a
        thread that has not ended in ``_STOP_S`` is left to end on its own."""
        super().destroy()
        deadline = time.monotonic() + _STOP_S
        while self.tick_thread_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    # ------------------------------------------------------------ commands
    @replicated
    def heartbeat(self, broker_name: str, node_id: int, endpoint: str, ha_endpoint: str,
                  offset: int, now_ms: int, claims_master: bool = False) -> dict:
        g = self._groups.setdefault(broker_name, {
            "masterId": None, "masterEpoch": 0, "syncStateSet": [], "syncStateSetEpoch": 0,
            "nodes": {}})
        g["nodes"][node_id] = {"endpoint": endpoint, "haEndpoint": ha_endpoint,
                               "offset": int(offset), "lastSeenMs": int(now_ms)}
        self._heard[(broker_name, node_id)] = self._local_ms()
        if g["masterId"] is None and claims_master:
            g["masterId"], g["masterEpoch"] = node_id, g["masterEpoch"] + 1
            g["syncStateSet"], g["syncStateSetEpoch"] = [node_id], g["syncStateSetEpoch"] + 1
        return self._view(broker_name)

    @replicated
    def alter_sync_state_set(self, broker_name: str, master_id: int, master_epoch: int,
                             sss_epoch: int, new_set: list) -> dict:
        g = self._groups.get(broker_name)
        if g is None or g["masterId"] != master_id or g["masterEpoch"] != master_epoch:
            return {"ok": False, "error": "not the current master of this broker group",
                    **self._view(broker_name)}
        if g["syncStateSetEpoch"] != sss_epoch:
            return {"ok": False, "error": "stale SyncStateSet epoch", **self._view(broker_name)}
        members = sorted({int(i) for i in new_set})
        if master_id not in members or any(i not in g["nodes"] for i in members):
            return {"ok": False, "error": "the set must hold the master and known nodes only",
                    **self._view(broker_name)}
        g["syncStateSet"], g["syncStateSetEpoch"] = members, g["syncStateSetEpoch"] + 1
        return {"ok": True, **self._view(broker_name)}

    @replicated
    def elect(self, broker_name: str, node_id: int, expected_epoch: int) -> dict:
        g = self._groups.get(broker_name)
        if g is None or g["masterEpoch"] != expected_epoch:
            return {"ok": False, "error": "the master epoch moved on"}
        if node_id not in g["syncStateSet"]:
            return {"ok": False, "error": f"node {node_id} is not in the SyncStateSet "
                                          f"{g['syncStateSet']}: electing it could lose "
                                          "acknowledged messages"}
        g["masterId"], g["masterEpoch"] = node_id, g["masterEpoch"] + 1
        g["syncStateSet"], g["syncStateSetEpoch"] = [node_id], g["syncStateSetEpoch"] + 1
        return {"ok": True, **self._view(broker_name)}

    # ------------------------------------------------------------ reads
    def _view(self, broker_name: str) -> dict:
        g = self._groups.get(broker_name)
        if g is None:
            return {"brokerName": broker_name, "masterId": None}
        master = g["nodes"].get(g["masterId"], {})
        return {"brokerName": broker_name, "masterId": g["masterId"],
                "masterEpoch": g["masterEpoch"], "masterEndpoint": master.get("endpoint"),
                "masterHaEndpoint": master.get("haEndpoint"),
                "syncStateSet": list(g["syncStateSet"]),
                "syncStateSetEpoch": g["syncStateSetEpoch"]}

    def view(self, broker_name: str) -> dict:
        """The group's master and SyncStateSet as this node has applied them."""
        return copy.deepcopy(self._view(broker_name))

    def metadata(self) -> dict:
        """Every group, with its nodes (a copy)."""
        return {name: {**self._view(name), "nodes": copy.deepcopy(g["nodes"])}
                for name, g in list(self._groups.items())}

    def election_due(self, lease_ms: int, grace_ms: int) -> list[tuple]:
        """(broker name, candidate node id, expected epoch) for each group whose master
        this node has not heard for ``lease_ms + grace_ms`` by its own clock (its lease
        has surely run out: it stopped acknowledging ``grace_ms`` ago at the latest) and
        has a candidate: the SyncStateSet member, heard within ``lease_ms``, with the
        most data. (A node never heard here, as after a restore from a dump, counts as
        heard now.)"""
        now, out = self._local_ms(), []
        for name, g in list(self._groups.items()):
            nodes = dict(g["nodes"])     # (a copy: commands apply on pysyncobj's thread)
            for i in nodes:
                self._heard.setdefault((name, i), now)
            if g["masterId"] not in nodes or \
                    now - self._heard[(name, g["masterId"])] <= lease_ms + grace_ms:
                continue
            alive = [(n["offset"], -i, i) for i, n in nodes.items()
                     if i != g["masterId"] and i in g["syncStateSet"]
                     and now - self._heard[(name, i)] <= lease_ms]
            if alive:
                out.append((name, max(alive)[2], g["masterEpoch"]))
        return out
