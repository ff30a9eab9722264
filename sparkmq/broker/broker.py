"""The broker daemon: one store served over gRPC and HTTP, composed of its domains.

Composition (each domain in its own module):

- ``send.SendService`` (``broker.sender``): refusal checks, the send model
  ``SendRows``, merging concurrent sends, the store append;
- ``receive.ReceiveService`` (``broker.receiver``): pop-mode receive with long
  polling (``pop.PopService``, ``longpoll.ArrivalNotifier``), ack, pull, offsets;
  ``receive.ClientRegistry`` (``broker.clients``);
- ``role.HARole`` (``broker.ha``): master or replica, fencing, promotion,
  ``AutoFailoverService``;
- ``schedule.ScheduleService`` and ``transaction.TransactionService``: delayed
  and transactional messages, run by the master only;
- ``grpc_service.MessagingServicer``: protobuf to and from those domains;
- ``admin_http.AdminServer`` / ``BrokerAdmin``: the admin HTTP endpoint.

This module owns the lifecycle, the topic lookups and the NameServer registration.
Lifecycle (explicit states, logged): ``STARTING`` -> ``RECOVERING`` (the store
is opened for writing: writer lease, crash recovery) -> ``RUNNING`` (gRPC and
HTTP serve, registered with every NameServer) -> ``STOPPING`` (servers stop,
consumer offsets persisted, unregistered, store closed) -> ``STOPPED``.

Named background services (``sparkmq.lifecycle.ServiceThread``):
``RegisterBrokerService`` (every ``registerBrokerIntervalMs``, and at once when
a topic is created), ``ConsumerOffsetPersistService`` (every
``flushConsumerOffsetInterval``, and at stop), ``ReceiptRenewService`` (every
``renewSchedulePeriodMillis``: auto-renewed receipts, renew.py), ``AutoFailoverService``
(replicas with ``enableAutoFailover``). Long polling is woken by the store's arrival
listener.

Thread-safety: the store and the domain services are thread-safe; the gRPC
server calls the broker from many threads; ``start``/``stop`` from one.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Callable

from .. import heap
from ..errors import BindError, SparkMQError
from ..lifecycle import ServiceThread
from ..log.store import Store
from ..log.actions import TopicConfig
from ..log.retrypolicy import default_policy
from ..namesrv.client import NameServerClient
from ..admin_auth import broker_token
from .admin_guard import AdminGuard, own_origins
from .admin_http import AdminServer, BrokerAdmin, admin_ssl_context
from .config import BrokerConfig
from .longpoll import ArrivalNotifier
from .metrics import Metrics
from .authn import Authenticator
from .authz import Authorizer
from .handles import HandleSigner, handle_secret_path
from .pop import PopService
from .receive import ClientRegistry, ReceiveService
from .renew import ReceiptRenewer, ReceiptRenewService
from .controlled import ControlledRole, ControllerHeartbeatService
from .role import AutoFailoverService, HARole
from .schedule import ScheduleService
from .send import SendService
from .batchsend import BatchSender
from .transaction import ProducerStreams, TransactionService

log = logging.getLogger("sparkmq.broker")


class BrokerState(enum.Enum):
    STARTING = "starting"
    RECOVERING = "recovering"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class RegisterBrokerService(ServiceThread):
    name = "register-broker"

    def __init__(self, broker: "Broker", interval_ms: int):
        super().__init__(interval_ms)
        self.broker = broker

    def run_once(self) -> None:
        self.broker.register_once()


class ConsumerOffsetPersistService(ServiceThread):
    name = "consumer-offset-persist"

    def __init__(self, broker: "Broker", interval_ms: int):
        super().__init__(interval_ms)
        self.broker = broker

    def run_once(self) -> None:
        self.broker.persist_offsets()


class Broker:
    """One broker; ``start()`` / ``stop()`` (idempotent). See the module docstring."""

    def __init__(self, config: BrokerConfig, *, clock_ms: Callable[[], int] | None = None):
        self.config = config
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.state = BrokerState.STOPPED
        self.store: Store | None = None
        self.pop: PopService | None = None
        self.notifier = ArrivalNotifier(config.long_polling_capacity)
        self.metrics = Metrics()
        self.clients = ClientRegistry(self.clock_ms)
        self.namesrv = NameServerClient(
            config.namesrv_addr, cluster_secret=config.cluster_secret or None,
            cluster_secret_file=config.cluster_secret_file or None) if config.namesrv_addr else None
        self._grpc = None                         # the GrpcServer (grpc_server.py)
        self.flight = None                        # the Arrow Flight service (flight.py)
        self.flight_port: int | None = None
        self._tls_pair: tuple[bytes, bytes] | None = None   # (cert, key) PEM; grpc_tls.py
        self._admin_server: AdminServer | None = None
        self._services: list[ServiceThread] = []
        self._register_service: RegisterBrokerService | None = None
        self._topic_lock = threading.Lock()
        self.listen_port = config.listen_port
        self.admin_port = config.admin_port
        self.admin_token: str | None = None        # set at start (_start_admin)
        #: checks every RPC's credentials (authenticationEnabled; authn.py)
        self.authenticator = Authenticator.from_config(
            config.authentication_enabled, config.init_authentication_user,
            lambda: self.store.state.users)
        #: decides every authenticated RPC by the user's ACL (authorizationEnabled; authz.py)
        self.authorizer = Authorizer.from_config(config, self.authenticator,
                                                 lambda: self.store.state)
        self.admin_token_file: str | None = None
        self.started_ms = 0
        self.delay_policy = config.delay_policy
        self.schedule: ScheduleService | None = None
        self.streams = ProducerStreams()
        self.transactions: TransactionService | None = None
        self.ha = HARole(self)
        #: controller mode: role, lease and SyncStateSet from the controllers (controlled.py)
        self.controlled = ControlledRole(self) if config.enable_controller_mode else None
        self.sender = SendService(self)
        self.batch_sender = BatchSender(self)      # record batches: Flight, plain gRPC
        self.receiver = ReceiveService(self)
        #: messages received with auto_renew, kept hidden while their consumer works (renew.py)
        self.renewer = ReceiptRenewer(
            self.receiver, self.clients.online, self.group_retry_policy, clock_ms=self.clock_ms,
            ahead_ms=config.renew_ahead_ms, max_ms=config.renew_max_ms,
            clear_ms=config.invisible_ms_when_clear,
            on_renewed=lambda: self.metrics.inc("sparkmq_receipt_renewals_total"))
        self.admin = BrokerAdmin(self)

    # ------------------------------------------------------------ lifecycle
    @property
    def is_running(self) -> bool:
        return self.state is BrokerState.RUNNING

    def _set_state(self, state: BrokerState) -> None:
        self.state = state
        log.info("broker %s#%d: %s", self.config.broker_name, self.broker_id, state.value)

    def start(self) -> "Broker":
        heap.watch()                    # the collector's pauses, for /metrics
        self._set_state(BrokerState.STARTING)
        self._set_state(BrokerState.RECOVERING)
        cfg = self.config
        try:
            self.store = Store.open(cfg.store_path, mode="w", clock_ms=self.clock_ms,
                                    replica=self.is_replica, **cfg.store_config_options())
        except BaseException:
            self._set_state(BrokerState.STOPPED)
            raise
        if self.store.recovered_from_crash:
            log.warning("store %s: recovered after a crash (abort marker found)", cfg.store_path)
        self.handles = HandleSigner.from_file(handle_secret_path(cfg.admin_token_path))
        self.pop = PopService(self.store, broker_name=cfg.broker_name, handles=self.handles,
                              max_delivery_attempts=cfg.max_delivery_attempts,
                              consume_from_where=cfg.consume_from_where, clock_ms=self.clock_ms,
                              on_topic_created=self.topic_created)
        self.store.add_listener(self.notifier.on_arrival)
        try:
            from .grpc_tls import server_pair
            self._tls_pair = server_pair(cfg)   # tlsServerMode: gRPC's and Flight's
            self._start_grpc()
            self._start_flight()
            self._start_admin()
            self.store.advertise_endpoint(self.admin_url)
            self.ha.start()
        except BaseException:
            self._stop_servers()
            self.store.close()
            self._set_state(BrokerState.STOPPED)
            raise
        self._start_services()
        self.started_ms = self.clock_ms()
        self._set_state(BrokerState.RUNNING)
        log.info("broker %s serving gRPC on %s:%d, %sadmin on %s, store %s",
                 cfg.broker_name, cfg.host, self.listen_port,
                 f"Arrow Flight on {self.flight.endpoint}, " if self.flight else "",
                 self.admin_url, cfg.store_path)
        return self

    def _start_grpc(self) -> None:
        """The RocketMQ 5 gRPC service (and the OTLP metrics collector) on an asyncio
        gRPC server (grpc_server.py: long polls suspended, other RPCs on the workers)."""
        limit = max(64 << 20, 2 * self.store.config.max_message_size_bytes)
        pending = max(1000, min(self.config.long_polling_capacity, 1 << 20) + 1000)
        from .grpc_server import GrpcServer
        from .grpc_service import MessagingServicer, add_to_server
        from . import otlp
        servicer = MessagingServicer(self)

        def register(server) -> None:
            add_to_server(servicer, server)
            otlp.add_to_server(self, server)
        credentials = None
        if self._tls_pair is not None:
            from .grpc_tls import grpc_server_credentials
            credentials = grpc_server_credentials(self._tls_pair)
        self._grpc = GrpcServer(
            self.config.host, self.config.listen_port, workers=self.config.grpc_workers,
            options=[("grpc.max_receive_message_length", limit),
                     ("grpc.max_send_message_length", limit), ("grpc.so_reuseport", 0),
                     # gRPC core cancels calls the server has not taken up yet past 1,000
                     # (randomly, up to 3,000): a burst of long polls opening at once
                     # would lose some; the cap that applies is maxLongPollingRequests
                     ("grpc.server.max_pending_requests", pending),
                     ("grpc.server.max_pending_requests_hard_limit", 2 * pending)],
            register=register, credentials=credentials)
        servicer.offload = self._grpc.offload
        self.listen_port = self._grpc.port

    def _start_flight(self) -> None:
        """The Arrow Flight service (``flightEnable``, ``flightPort``; flight.py), on
        ``brokerIP1`` as gRPC, with gRPC's TLS (``tlsServerMode``) and its authenticator
        and authorizer: whatever the RocketMQ port lets in, this port does, no more."""
        if not self.config.flight_enable:
            return
        from .flight import FlightService
        ports = self.config.flight_ports()
        for i, port in enumerate(ports):
            try:
                self.flight = FlightService(self, self.config.host, port,
                                            tls_pair=self._tls_pair).start()
                break
            except Exception as e:   # pyarrow reports a taken port as an ArrowException
                if i + 1 == len(ports):
                    raise BindError(f"cannot serve Arrow Flight on {self.config.host}:{port}: "
                                    f"{e}; set flightPort to a free port or "
                                    "flightEnable=false") from None
                log.warning("Arrow Flight: port %d (listenPort + 2) is taken; serving on a "
                            "free port, advertised on QueryRoute (set flightPort to fix it)",
                            port)
        self.flight_port = self.flight.port

    def _start_admin(self) -> None:
        """Bind the admin endpoint on adminListenAddress with its token (made and
        written 0600 at the first start; ``sparkmq.admin_auth``) and optional TLS."""
        cfg = self.config
        self.admin_token, self.admin_token_file, created = broker_token(cfg.admin_token_path)
        if created:
            log.warning("broker %s: made an admin token, kept in %s (mode 0600)",
                        cfg.broker_name, self.admin_token_file)
        server = AdminServer(self, cfg.admin_listen_address, cfg.admin_port, None,
                             admin_ssl_context(cfg))
        self.admin_port = server.port
        server.set_guard(AdminGuard(
            self.admin_token, own_origins(cfg.admin_scheme, cfg.admin_listen_address, cfg.host,
                                          self.admin_port),
            metrics_need_token=cfg.admin_metrics_auth,
            super_user=self.authenticator.super_user))
        self._admin_server = server.start()

    @property
    def admin_url(self) -> str:
        """``http(s)://host:adminPort`` of the running admin endpoint."""
        return self.config.admin_url(self.admin_port)

    def _start_services(self) -> None:
        persist = ConsumerOffsetPersistService(self, self.config.offset_persist_interval_ms)
        self._services = [persist]
        if self.config.auto_renew:
            self._services.append(ReceiptRenewService(self.renewer, self.config.renew_period_ms))
        if self.namesrv is not None:
            self.register_once()      # a fenced master learns it here, before it writes
            self._register_service = RegisterBrokerService(self, self.config.register_interval_ms)
            self._services.append(self._register_service)
        if self.is_master and self.fenced_reason is None:
            self.start_master_services()
        if self.is_replica and self.config.enable_auto_failover and self.namesrv is not None:
            self._services.append(AutoFailoverService(self.ha))
        if self.controlled is not None:
            self.controlled.tick()           # a master acknowledges only once renewed
            self._services.append(ControllerHeartbeatService(
                self.controlled, self.config.broker_heartbeat_interval_ms))
        for s in self._services:
            s.start()

    def group_retry_policy(self, group: str) -> dict:
        """``group``'s retry policy (its subscription group config's, else RocketMQ's):
        what its consumers are told (Telemetry settings) and what the renewer lets a
        message go with."""
        conf = self.store.state.subscription_groups.get(group)
        return conf.retry_policy if conf is not None else default_policy()

    def start_master_services(self) -> None:
        """Only the master delivers parked delayed messages and checks transactions."""
        self.schedule = ScheduleService(self.store, self.delay_policy,
                                        clock_ms=self.clock_ms).start()
        from .protocol import recover_command
        cfg = self.config
        self.transactions = TransactionService(
            self.store, self.streams, make_command=recover_command, clock_ms=self.clock_ms,
            timeout_ms=cfg.transaction_timeout_ms,
            check_interval_ms=cfg.transaction_check_interval_ms,
            check_max=cfg.transaction_check_max, on_topic_created=self.topic_created).start()

    def stop_master_services(self) -> None:
        """Stop the schedule and transaction services (at stop, or when fenced)."""
        if self.schedule is not None:
            self.schedule.stop()
            self.schedule = None
        if self.transactions is not None:
            self.transactions.stop()
            self.transactions = None

    def stop(self) -> None:
        if self.state in (BrokerState.STOPPED, BrokerState.STOPPING):
            return
        self._set_state(BrokerState.STOPPING)
        self.notifier.close()
        self._stop_servers()
        for s in self._services:
            s.stop()
        self.stop_master_services()
        try:
            self.persist_offsets()
        except SparkMQError as e:
            log.error("could not persist consumer offsets at stop: %s", e)
        self.ha.stop()
        if self.namesrv is not None and self.fenced_reason is None:
            self.namesrv.unregister(self.config.broker_name, self.broker_id)
        self.store.close()
        self._set_state(BrokerState.STOPPED)

    def _stop_servers(self) -> None:
        if self.flight is not None:
            self.flight.stop()
            self.flight = None
        if self._grpc is not None:
            self._grpc.stop(grace=1.0)
            self._grpc = None
        if self._admin_server is not None:
            self._admin_server.stop()
            self._admin_server = None

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return f"{self.config.host}:{self.listen_port}"

    # ------------------------------------------------------------ HA role (role.HARole)
    @property
    def role(self) -> str:
        return self.ha.role

    @property
    def broker_id(self) -> int:
        return self.ha.broker_id

    @property
    def is_master(self) -> bool:
        return self.ha.is_master

    @property
    def is_replica(self) -> bool:
        return self.ha.is_replica

    @property
    def fenced_reason(self) -> str | None:
        return self.ha.fenced_reason

    @property
    def event_loop(self):
        """The gRPC server's event loop (None before it starts): replica acks are read
        there (ha/loopacks.py), where the sends that await them run."""
        return self._grpc.loop if self._grpc is not None else None

    @property
    def ha_service(self):
        return self.ha.ha_service

    @property
    def ha_client(self):
        return self.ha.ha_client

    @property
    def replica_log(self):
        return self.ha.replica_log

    # ------------------------------------------------------------ registration
    def registration(self) -> dict:
        """What this broker tells the NameServers: identity, role, endpoints, topics, epochs."""
        topics = {name: {"readQueueNums": t.read_queue_nums, "writeQueueNums": t.write_queue_nums,
                         "perm": t.perm}
                  for name, t in self.store.topics().items()}
        from ..ha import epochs as epoch_history
        return {"cluster": self.config.cluster_name, "brokerName": self.config.broker_name,
                "brokerId": self.broker_id, "role": self.role,
                "endpoint": self.endpoint,
                "adminEndpoint": self.admin_url.split("://", 1)[1], "topics": topics,
                "haEndpoint": (f"{self.config.host}:{self.ha_service.port}"
                               if self.ha_service is not None else None),
                "epochs": epoch_history.load(self.store.sfs) if self.is_master else []}

    def register_once(self) -> None:
        """Register with every NameServer (``RegisterBrokerService``); a master that a
        NameServer answers as fenced (a newer master exists) is fenced here."""
        if self.fenced_reason is not None:
            return
        ok = self.namesrv.register(self.registration())
        if self.namesrv.fenced_by and self.is_master:
            addr, answer = next(iter(self.namesrv.fenced_by.items()))
            self.ha.fenced_by_newer_master(addr)
            return
        failed = [a for a, good in ok.items() if not good]
        if failed:
            log.warning("registration with NameServer(s) %s failed; will retry", failed)

    def topic_created(self, topic: str) -> None:
        """A topic was created or changed here: re-register with the NameServers now."""
        log.info("topic %s created on %s", topic, self.config.broker_name)
        if self._register_service is not None:
            self._register_service.wakeup()

    # ------------------------------------------------------------ topics and routes
    def topic_conf(self, topic: str) -> TopicConfig | None:
        """The config of ``topic`` in this broker's store (None: not here). The store
        lists no deleted topic. (Read from its state's table, which a commit replaces and
        never changes: a put asks up to three times, and ``Store.topics`` copies the
        table, a cost that grows with the broker's topics.)"""
        return self.store.state.topics.get(topic)

    def local_queues(self, topic: str) -> list[dict]:
        """This broker's queues of ``topic`` as route entries (none if it is not here)."""
        conf = self.topic_conf(topic)
        if conf is None:
            return []
        n = max(conf.read_queue_nums, conf.write_queue_nums)
        return [{"brokerName": self.config.broker_name, "brokerId": self.broker_id,
                 "endpoint": self.endpoint, "queueId": q, "perm": conf.perm,
                 "readable": q < conf.read_queue_nums, "writable": q < conf.write_queue_nums}
                for q in range(n)]

    def route(self, topic: str) -> list[dict]:
        """Every queue of ``topic`` in the cluster (this broker's from its store,
        the others' from the NameServers); auto-creates it here if allowed."""
        queues = self.local_queues(topic)
        if self.namesrv is not None:
            remote = self.namesrv.route(topic) or []
            me = (self.config.broker_name, self.broker_id)
            queues += [q for q in remote if (q["brokerName"], q["brokerId"]) != me]
        if not queues and self.store.config.auto_create_topic:
            self.ensure_topic(topic)
            queues = self.local_queues(topic)
        return queues

    def ensure_topic(self, topic: str) -> bool:
        """True if ``topic`` exists here (created now when autoCreateTopicEnable)."""
        if self.topic_conf(topic) is not None:
            return True
        if not self.store.config.auto_create_topic or self.is_replica:
            return False
        with self._topic_lock:
            if self.topic_conf(topic) is None:
                self.store.create_topic(topic, exist_ok=True)
                self.topic_created(topic)
        return True

    # ------------------------------------------------------------ offsets
    def persist_offsets(self) -> None:
        """Commit consumer offsets that moved since the last pass (see
        ``ReceiveService.persist_offsets``)."""
        self.receiver.persist_offsets()
