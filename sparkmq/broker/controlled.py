"""Controller mode (``enableControllerMode=true``, ``controllerAddr``): the broker's role
is decided by the controllers' majority (``sparkmq.controller``), as in RocketMQ 5.

Every ``brokerHeartbeatInterval`` the broker heartbeats (its node id = configured
``brokerId``, endpoints, written offset). The answer, committed by a majority,
names the group's master, master epoch and SyncStateSet:

* **Lease.** The master acknowledges writes only until ``leaseMs`` after the send
  time of its last answered heartbeat (:meth:`ControlledRole.lease_valid`); past
  it every send is refused before anything is stored. The controllers elect a new
  master only ``leaseMs + grace`` after they last heard the old one, so two
  masters never acknowledge at the same time.
* **Role.** Named master while a replica: it promotes itself. Named replica (or
  another node is master) while master: it fences itself (refuses writes; restart
  it to rejoin as a replica). A replica follows the HA address of the named master.
* **SyncStateSet** (on the master). A replica joins once it acked everything the
  current members acknowledged (RocketMQ's confirm offset); while the change is
  being committed, acks wait for it too. A member that still lacks what was written
  ``haMaxTimeSlaveNotCatchup`` ago (or is not attached) leaves. Both go through the
  controllers (``alterSyncStateSet``), so a master cut from them cannot drop a member.
  A SYNC_MASTER send is acknowledged only once *every* other member acked it
  (RocketMQ's ``allAckInSyncStateSet``): whoever is elected next — only from the
  set — holds every acknowledged message.

Thread-safety: one service thread changes the fields; request threads read them.
"""
from __future__ import annotations

import logging
import time

from ..lifecycle import ServiceThread

log = logging.getLogger("sparkmq.broker.controller")


class ControlledRole:
    """The controller-mode state of one broker (``broker``: the Broker)."""

    def __init__(self, broker):
        from ..controller.client import ControllerClient
        cfg = broker.config
        self.broker = broker
        self.node_id = cfg.broker_id
        self.client = ControllerClient(cfg.controller_addr,
                                       cluster_secret=cfg.cluster_secret or None,
                                       cluster_secret_file=cfg.cluster_secret_file or None,
                                       timeout_s=max(0.5, cfg.broker_heartbeat_interval_ms / 1000))
        self.view: dict | None = None
        self.lease_until = 0.0               # time.monotonic() until which it may ack
        self._written: list[tuple[float, int]] = []   # (monotonic s, written offset) samples
        self._joining: set[int] = set()              # acks wait for these too, meanwhile

    # ------------------------------------------------------------ reads
    def lease_valid(self) -> bool:
        return time.monotonic() < self.lease_until

    def write_refusal(self) -> str | None:
        if not self.lease_valid():
            return ("this master's lease from the controllers has run out (no majority of "
                    "controllerAddr answered its heartbeats): it acknowledges nothing until "
                    "a heartbeat is answered; nothing was stored")
        return None

    def sync_replica_ids(self) -> list[int]:
        """The other SyncStateSet members every SYNC_MASTER ack waits for."""
        view = self.view or {}
        members = set(view.get("syncStateSet") or ()) | self._joining
        return sorted(i for i in members if i != self.node_id)

    def master_ha_address(self) -> str | None:
        view = self.view or {}
        return view.get("masterHaEndpoint") if view.get("masterId") != self.node_id else None

    # ------------------------------------------------------------ one heartbeat
    def tick(self) -> None:
        broker, ha = self.broker, self.broker.ha
        cfg = broker.config
        sent = time.monotonic()
        ha_endpoint = (f"{cfg.host}:{ha.ha_service.port}" if ha.ha_service is not None
                       else (f"{cfg.host}:{cfg.ha_listen_port}" if cfg.ha_listen_port else ""))
        view = self.client.heartbeat(cfg.broker_name, self.node_id, broker.endpoint,
                                     ha_endpoint, broker.store.commitlog.written_offset,
                                     claims_master=ha.is_master and ha.fenced_reason is None)
        if view is None:
            return                                   # not renewed: the lease runs out
        self.view = view
        if view.get("masterId") == self.node_id:
            if ha.is_replica:
                log.warning("controllers elected this broker (node %d) master of %s at epoch "
                            "%s: promoting", self.node_id, cfg.broker_name,
                            view.get("masterEpoch"))
                ha.promote({"role": cfg.controller_master_role})
            if ha.is_master and ha.fenced_reason is None:
                self.lease_until = sent + int(view.get("leaseMs") or 0) / 1000.0
                self._keep_sync_state_set(view)
            return
        self.lease_until = 0.0
        if ha.is_master and ha.fenced_reason is None:
            ha.fence(f"broker {ha.name} is fenced: the controllers elected node "
                     f"{view.get('masterId')} master of {cfg.broker_name} (epoch "
                     f"{view.get('masterEpoch')}); restart this broker to rejoin as a replica")

    def _caught_up(self, service, others: set[int], members: set[int]) -> set[int]:
        """Attached non-members holding everything acknowledged so far. Acks start
        waiting for them (``_joining``) before the final check, so a send acknowledged
        meanwhile is counted in the confirm offset they are checked against."""
        written = self.broker.store.commitlog.written_offset
        acked = service.acked_by_replica()
        confirm = _confirm_offset(acked, others, written)
        self._joining = {r for r, off in acked.items() if r not in members and off >= confirm}
        if not self._joining:
            return set()
        acked = service.acked_by_replica()      # after: nothing is acked without them
        confirm = _confirm_offset(acked, others, self.broker.store.commitlog.written_offset)
        return {r for r in self._joining if acked.get(r, -1) >= confirm}

    def _keep_sync_state_set(self, view: dict) -> None:
        service = self.broker.ha.ha_service
        if service is None:
            return
        members = set(view.get("syncStateSet") or ())
        now = time.monotonic()
        written = self.broker.store.commitlog.written_offset
        limit_s = self.broker.config.ha_max_time_slave_not_catchup_ms / 1000.0
        self._written = [x for x in self._written if now - x[0] <= 2 * limit_s]
        self._written.append((now, written))
        others = members - {self.node_id}
        joiners = self._caught_up(service, others, members)
        acked = service.acked_by_replica()
        due = [off for t, off in self._written if now - t >= limit_s]
        stale = due[-1] if due else None        # written haMaxTimeSlaveNotCatchup ago
        wanted = set(members) | joiners
        if stale is not None:
            wanted -= {rid for rid in others if acked.get(rid, -1) < stale}
        if wanted == members:
            self._joining = set()
            return
        self._joining = joiners
        try:
            out = self.client.alter_sync_state_set(
                view["brokerName"], self.node_id, int(view["masterEpoch"]),
                int(view["syncStateSetEpoch"]), sorted(wanted))
            if out is not None and out.get("ok"):
                log.info("SyncStateSet of %s: %s -> %s", view["brokerName"], sorted(members),
                         out.get("syncStateSet"))
                self.view = {**view, **{k: out[k] for k in ("syncStateSet",
                                                              "syncStateSetEpoch")}}
        finally:
            self._joining = set()


def _confirm_offset(acked: dict[int, int], others: set[int], written: int) -> int:
    """Everything acknowledged so far: what every other member acked (alone, the master
    acknowledges on its own write: everything written)."""
    return min((acked.get(i, -1) for i in others), default=written)


class ControllerHeartbeatService(ServiceThread):
    """Runs :meth:`ControlledRole.tick` every ``brokerHeartbeatInterval``."""

    name = "controller-heartbeat"

    def __init__(self, role: ControlledRole, interval_ms: int):
        super().__init__(interval_ms)
        self.role = role

    def run_once(self) -> None:
        self.role.tick()
