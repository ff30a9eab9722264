"""The broker's HA role: master or replica, fencing, promotion, automatic failover.

A master (``brokerId`` 0, role ASYNC_MASTER or SYNC_MASTER) appends its writer
epoch to the epoch history at start and, with ``haListenPort``, runs an
``HAService`` that replicas follow. A replica (``brokerRole=SLAVE``,
``brokerId > 0``) follows its master's CommitLog with an ``HAClient`` and refuses
sends. ``promote`` (``POST /admin/promote``, or ``AutoFailoverService`` with
``enableAutoFailover``) makes a replica the master under a higher writer epoch;
``fence`` (a NameServer knows a newer master) makes a master refuse every write.

Thread-safety: ``promote`` is serialised by a lock; the fields are read without
one by request threads (a send sees the role before or after a promotion, and
the store refuses the writes of a fenced or replica store itself).
"""
from __future__ import annotations

import logging
import threading

from ..errors import UserError
from ..lifecycle import ServiceThread

log = logging.getLogger("sparkmq.broker")


class AutoFailoverService(ServiceThread):
    """Replica with ``enableAutoFailover``: promotes itself when its HA link is down
    and no NameServer has heard from its master for ``autoFailoverSilenceMs``
    (RocketMQ 5.x controller mode, with the NameServers' view as the judge)."""

    name = "auto-failover"

    def __init__(self, role: "HARole", interval_ms: int = 1000):
        super().__init__(interval_ms)
        self.role = role

    def run_once(self) -> None:
        self.role.check_failover()


class HARole:
    """The role of one broker (see the module docstring). ``broker`` is the
    :class:`sparkmq.broker.Broker`: its store, config, NameServer client, master
    services (``start_master_services`` / ``stop_master_services``) and registration."""

    def __init__(self, broker):
        self.broker = broker
        config = broker.config
        self.role = config.broker_role          # changes at promotion
        self.broker_id = config.broker_id       # a promoted replica registers as 0
        self.ha_service = None                  # sparkmq.ha.master.HAService (masters)
        self.ha_client = None                   # sparkmq.ha.replica.HAClient (replicas)
        self.replica_log = None
        self.fenced_reason: str | None = None
        self._promote_lock = threading.Lock()

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0 and self.role != "SLAVE"

    @property
    def is_replica(self) -> bool:
        return self.role == "SLAVE"

    @property
    def name(self) -> str:
        return f"{self.broker.config.broker_name}#{self.broker_id}"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """A replica starts following its master; a master records its epoch and
        starts its HAService (with ``haListenPort``). The store is open."""
        from ..ha import epochs as epoch_history
        store, cfg = self.broker.store, self.broker.config
        if self.is_replica:
            from ..ha.replica import HAClient, ReplicaLog
            self.replica_log = ReplicaLog(store)
            self.ha_client = HAClient(self.replica_log, broker_name=cfg.broker_name,
                                      broker_id=self.broker_id, secret=cfg.resolved_ha_secret(),
                                      master_address=self._master_ha_address,
                                      ssl_context=_ha_client_tls(cfg)).start()
            return
        epoch_history.append(store.sfs, store.epoch, store.store_id,
                             store.commitlog.written_offset)
        if cfg.ha_listen_port:
            self._start_ha_service()

    def _start_ha_service(self) -> None:
        from ..ha.master import HAService
        cfg = self.broker.config
        self.ha_service = HAService(self.broker.store, broker_name=cfg.broker_name,
                                    secret=cfg.resolved_ha_secret(), host=cfg.host,
                                    port=cfg.ha_listen_port,
                                    ssl_context=_ha_server_tls(cfg),
                                    ack_loop=self.broker.event_loop).start()

    def stop(self) -> None:
        if self.ha_client is not None:
            self.ha_client.stop()
        if self.ha_service is not None:
            self.ha_service.stop()

    def _master_ha_address(self) -> str | None:
        cfg, namesrv = self.broker.config, self.broker.namesrv
        if self.broker.controlled is not None:      # controller mode: the elected master
            return self.broker.controlled.master_ha_address()
        if cfg.ha_master_address:
            return cfg.ha_master_address
        for b in (namesrv.brokers() or []) if namesrv is not None else []:
            if b.get("brokerName") == cfg.broker_name and b.get("brokerId") == 0:
                return b.get("haEndpoint")
        return None

    # ------------------------------------------------------------ writes
    def write_refusal(self) -> str | None:
        """Why this broker refuses sends now (None: it accepts them)."""
        if self.is_replica:
            return (f"broker {self.name} is a replica (brokerRole=SLAVE); send to its master")
        if self.fenced_reason is not None:
            return self.fenced_reason
        if self.broker.controlled is not None:
            return self.broker.controlled.write_refusal()
        return None

    def fence(self, reason: str) -> None:
        """Refuse every write from now on (the store too); stop the master services and
        the HAService (a fenced store serves no replica either). Idempotent."""
        if self.fenced_reason is None:
            self.fenced_reason = reason
            self.broker.store.fence(reason)
            self.broker.stop_master_services()
            if self.ha_service is not None:
                self.ha_service.stop()
                self.ha_service = None

    def fenced_by_newer_master(self, addr: str) -> None:
        """A NameServer at ``addr`` answered a registration: a newer master exists."""
        self.fence(f"broker {self.name} is fenced: NameServer {addr} knows a newer master "
                   "of this broker group; this store refuses writes. Rejoin as a replica "
                   "(brokerRole=SLAVE, brokerId>0)")

    # ------------------------------------------------------------ promotion
    def promote(self, request: dict | None = None) -> dict:
        """``POST /admin/promote`` ``{"role": "ASYNC_MASTER"|"SYNC_MASTER"}``: make this
        replica the master of its broker group (see ``sparkmq.ha.replica.promote``)."""
        from ..ha.replica import promote
        role = (request or {}).get("role") or "ASYNC_MASTER"
        if role not in ("ASYNC_MASTER", "SYNC_MASTER"):
            raise UserError(f"role must be ASYNC_MASTER or SYNC_MASTER, got {role!r}")
        broker, cfg = self.broker, self.broker.config
        store = broker.store
        with self._promote_lock:
            if not self.is_replica:
                raise UserError(f"broker {self.name} is not a replica; only a replica can "
                                "be promoted")
            client = self.ha_client
            seen = 0
            if client is not None:
                client.stop()
                seen = client.master_epoch
            epoch = promote(store, self.replica_log, seen)
            old_id = self.broker_id
            self.role, self.broker_id = role, 0
            self.ha_client = None
            if cfg.ha_listen_port and cfg.has_ha_secret:
                self._start_ha_service()
            broker.start_master_services()
            if broker.namesrv is not None:
                broker.namesrv.unregister(cfg.broker_name, old_id)
                broker.register_once()
        log.warning("broker %s#%d promoted to %s (was #%d), epoch %d, at physical offset %d",
                    cfg.broker_name, self.broker_id, role, old_id, epoch,
                    store.commitlog.written_offset)
        return {"brokerName": cfg.broker_name, "brokerId": 0, "role": role, "epoch": epoch,
                "offset": store.commitlog.written_offset}

    def check_failover(self) -> None:
        """One pass of AutoFailoverService."""
        if not self.is_replica or self.ha_client is None or self.ha_client.connected:
            return
        brokers = self.broker.namesrv.brokers()
        if brokers is None:            # no NameServer answered: no judge, no promotion
            return
        cfg = self.broker.config
        now = self.broker.clock_ms()
        heard = [b for b in brokers if b.get("brokerName") == cfg.broker_name
                 and b.get("brokerId") == 0
                 and now - int(b.get("lastSeenMs") or 0) < cfg.auto_failover_silence_ms]
        if heard:
            return
        log.warning("master of %s unheard by the NameServers for %d ms and the HA link is "
                    "down: promoting this replica", cfg.broker_name,
                    cfg.auto_failover_silence_ms)
        self.promote({"role": "ASYNC_MASTER"})

    # ------------------------------------------------------------ status
    def ha_status(self) -> dict:
        """Replication progress: a master's replicas and their lag, or a replica's link."""
        store = self.broker.store
        end = store.commitlog.written_offset
        if self.ha_client is not None:
            c = self.ha_client
            return {"role": "replica", "connected": c.connected, "offset": end,
                    "dispatchedOffset": c.rlog.dispatched_offset,
                    "truncatedTo": c.diverged_at, "divergedBytesKept": c.diverged_kept,
                    "masterOffset": c.master_offset, "lagBytes": c.lag_bytes(),
                    "masterEpoch": c.master_epoch, "lastError": c.last_error}
        out = {"role": "master", "epoch": store.epoch, "offset": end, "replicas": []}
        if self.ha_service is not None:
            out["port"] = self.ha_service.port
            out["replicas"] = self.ha_service.replicas()
        return out

    def lag_samples(self) -> list:
        """``sparkmq_ha_replica_lag_bytes`` samples: per attached replica on a master,
        this replica's own on a replica."""
        ha = self.ha_status()
        if ha["role"] == "replica":
            return [({"replica": str(self.broker_id)}, ha["lagBytes"])]
        return [({"replica": str(r["brokerId"])}, r["lagBytes"]) for r in ha["replicas"]]


def _ha_server_tls(cfg):
    """The HA service's TLS context (haTlsEnable), or None."""
    if not cfg.ha_tls_enable:
        return None
    from ..ha.tlslink import server_context
    return server_context(cfg.ha_tls_cert_path, cfg.ha_tls_key_path)


def _ha_client_tls(cfg):
    """A replica's TLS context for its master (haTlsEnable), or None."""
    if not cfg.ha_tls_enable:
        return None
    from ..ha.tlslink import client_context
    return client_context(cfg.ha_tls_ca_path or None)
