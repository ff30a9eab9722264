"""Broker configuration from a RocketMQ-style ``broker.conf`` (Java properties).

``BrokerConfig.from_properties(props)`` reads the broker's own names
(brokerClusterName, brokerName, brokerId, brokerRole, namesrvAddr, listenPort,
adminPort, adminListenAddress, adminTokenFile, adminTls*, clusterSecret, haSecret,
maxReconsumeTimes, ...); every other name (flushDiskType, storePathRootDir,
fileReservedTime, maxMessageSize, autoCreateTopicEnable, defaultTopicQueueNums, ...)
is handed to ``Store.open`` as store config.
Attributes carry their unit in the name. Immutable; thread-safe to share.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..config import DEFAULT_MAX_MESSAGE_SIZE_BYTES, StoreConfig
from ..errors import InvalidConfigError, SparkMQError
from ..properties import load_properties, parse_bool, parse_int

ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
CONSUME_FROM = ("CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_LAST_OFFSET")


@dataclass(frozen=True)
class BrokerConfig:
    """One broker's settings (RocketMQ property name in each comment)."""

    cluster_name: str = "DefaultCluster"          # brokerClusterName
    broker_name: str = "broker-a"                 # brokerName
    broker_id: int = 0                            # brokerId (0 = master)
    broker_role: str = "ASYNC_MASTER"             # brokerRole
    store_path: str = "./store/broker-a"          # storePathRootDir
    namesrv_addr: str = ""                        # namesrvAddr ("h:p;h:p")
    host: str = "127.0.0.1"                       # brokerIP1
    listen_port: int = 8081                       # listenPort (gRPC MessagingService)
    admin_port: int = 8082                        # adminPort (HTTP health/status/metrics)
    admin_listen_address: str = "127.0.0.1"       # adminListenAddress (loopback unless set)
    admin_token_file: str = ""                    # adminTokenFile (default: admin.token
                                                  #   in the store folder; admin_auth.py)
    authentication_enabled: bool = False          # authenticationEnabled (gRPC credentials)
    init_authentication_user: str = ""            # initAuthenticationUser ({"username","password"})
    authorization_enabled: bool = False           # authorizationEnabled (ACL 2.0; sparkmq/auth)
    tls_server_mode: str = "disabled"             # tlsServerMode: disabled | enforcing (gRPC
                                                  #   and Arrow Flight alike)
    tls_server_cert_path: str = ""                # tlsServerCertPath (PEM certificate chain)
    tls_server_key_path: str = ""                 # tlsServerKeyPath  (PEM private key)
    admin_metrics_auth: bool = False              # adminMetricsAuthEnable (/metrics needs
                                                  #   the token too)
    admin_tls_cert_file: str = ""                 # adminTlsCertFile (PEM; with the key:
    admin_tls_key_file: str = ""                  # adminTlsKeyFile   HTTPS on adminPort)
    register_interval_ms: int = 30_000            # registerBrokerIntervalMs
    cluster_secret: str = ""                      # clusterSecret (signs NameServer writes;
    cluster_secret_file: str = ""                 # clusterSecretFile  namesrv/signing.py)
    offset_persist_interval_ms: int = 5_000       # flushConsumerOffsetInterval
    max_reconsume_times: int = 16                 # maxReconsumeTimes
    default_invisible_ms: int = 30_000            # defaultInvisibleTimeMs (also what an
                                                  #   auto-renewed receive starts with)
    auto_renew: bool = True                       # enableProxyAutoRenew (renew.py)
    renew_ahead_ms: int = 10_000                  # renewAheadTimeMillis
    renew_max_ms: int = 3 * 3600_000              # renewMaxTimeMillis
    renew_period_ms: int = 5_000                  # renewSchedulePeriodMillis
    invisible_ms_when_clear: int = 1_000          # invisibleTimeMillisWhenClear (a gone
                                                  #   client's held messages)
    max_long_polling_ms: int = 30_000             # maxLongPollingTimeMs
    consume_from_where: str = "CONSUME_FROM_FIRST_OFFSET"  # consumeFromWhere (new groups)
    grpc_workers: int = 128                       # grpcThreadPoolNums
    max_long_polling_requests: int = 10_000       # maxLongPollingRequests (suspended polls
                                                  #   held at once; each costs memory, no thread)
    enable_property_filter: bool = False          # enablePropertyFilter (SQL92 filters)
    message_delay_level: str = ("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m "
                                "1h 2h")              # messageDelayLevel
    timer_max_delay_s: int = 3 * 24 * 3600        # timerMaxDelaySec (longest delivery delay)
    transaction_timeout_ms: int = 6_000           # transactionTimeOut (first check-back)
    transaction_check_interval_ms: int = 30_000   # transactionCheckInterval (between checks)
    transaction_check_max: int = 15               # transactionCheckMax (then rolled back)
    ha_listen_port: int = 0                       # haListenPort (HA service of a master; 0 = none)
    ha_secret: str = ""                           # haSecret (shared by a master and its replicas)
    ha_secret_file: str = ""                      # haSecretFile (instead of haSecret: a 0600
                                                  #   file, made at the first start if absent)
    ha_master_address: str = ""                   # haMasterAddress (replica: master's HA host:port;
                                                  #   empty = the master's haEndpoint from the NameServers)
    ha_tls_enable: bool = False                   # haTlsEnable (TLS on the HA link; ha/tlslink.py)
    ha_tls_cert_path: str = ""                    # haTlsCertPath \ the master's certificate
    ha_tls_key_path: str = ""                     # haTlsKeyPath  / and key (PEM)
    ha_tls_ca_path: str = ""                      # haTlsCaPath (replica: trusts; default system roots)
    allow_anonymous_network: bool = False         # allowAnonymousNetworkAccess: serve a
                                                  #   non-loopback brokerIP1 without
                                                  #   authenticationEnabled (off: refused)
    flight_enable: bool = True                    # flightEnable (Arrow Flight beside gRPC,
                                                  #   on brokerIP1 with its TLS and checks)
    flight_port: int | None = None                # flightPort (unset: listenPort + 2, e.g.
                                                  #   8083, or a free port if that is taken;
                                                  #   0: a free port)
    enable_topic_message_type_check: bool = True  # enableTopicMessageTypeCheck (proxy's name)
    enable_controller_mode: bool = False          # enableControllerMode (roles by the controllers)
    controller_addr: str = ""                     # controllerAddr (host:port;host:port;...)
    broker_heartbeat_interval_ms: int = 1_000     # brokerHeartbeatInterval (to the controllers)
    ha_max_time_slave_not_catchup_ms: int = 15_000  # haMaxTimeSlaveNotCatchup (then it leaves
                                                  #   the SyncStateSet)
    controller_master_role: str = "SYNC_MASTER"   # controllerMasterRole (role of an elected node)
    enable_auto_failover: bool = False            # enableAutoFailover (replica promotes itself)
    auto_failover_silence_ms: int = 120_000       # autoFailoverSilenceMs (master unheard by every
                                                  #   NameServer this long, HA link down: promote)
    store_options: dict = field(default_factory=dict)  # everything else -> Store.open

    _ALIASES = {
        "brokerClusterName": "cluster_name", "brokerName": "broker_name",
        "brokerId": "broker_id", "brokerRole": "broker_role",
        "storePathRootDir": "store_path", "namesrvAddr": "namesrv_addr",
        "brokerIP1": "host", "listenPort": "listen_port", "grpcServerPort": "listen_port",
        "adminPort": "admin_port", "adminListenAddress": "admin_listen_address",
        "adminTokenFile": "admin_token_file", "clusterSecret": "cluster_secret",
        "clusterSecretFile": "cluster_secret_file", "adminMetricsAuthEnable": "admin_metrics_auth",
        "authenticationEnabled": "authentication_enabled",
        "initAuthenticationUser": "init_authentication_user",
        "authorizationEnabled": "authorization_enabled", "tlsServerMode": "tls_server_mode",
        "tlsServerCertPath": "tls_server_cert_path", "tlsServerKeyPath": "tls_server_key_path",
        "adminTlsCertFile": "admin_tls_cert_file", "adminTlsKeyFile": "admin_tls_key_file",
        "registerBrokerIntervalMs": "register_interval_ms",
        "flushConsumerOffsetInterval": "offset_persist_interval_ms",
        "maxReconsumeTimes": "max_reconsume_times",
        "defaultInvisibleTimeMs": "default_invisible_ms",
        "enableProxyAutoRenew": "auto_renew", "renewAheadTimeMillis": "renew_ahead_ms",
        "renewMaxTimeMillis": "renew_max_ms", "renewSchedulePeriodMillis": "renew_period_ms",
        "invisibleTimeMillisWhenClear": "invisible_ms_when_clear",
        "maxLongPollingTimeMs": "max_long_polling_ms",
        "consumeFromWhere": "consume_from_where", "grpcThreadPoolNums": "grpc_workers",
        "maxLongPollingRequests": "max_long_polling_requests",
        "enablePropertyFilter": "enable_property_filter",
        "messageDelayLevel": "message_delay_level", "timerMaxDelaySec": "timer_max_delay_s",
        "transactionTimeOut": "transaction_timeout_ms",
        "transactionCheckInterval": "transaction_check_interval_ms",
        "transactionCheckMax": "transaction_check_max",
        "haListenPort": "ha_listen_port", "haSecret": "ha_secret",
        "haSecretFile": "ha_secret_file",
        "haMasterAddress": "ha_master_address", "haTlsEnable": "ha_tls_enable",
        "haTlsCertPath": "ha_tls_cert_path", "haTlsKeyPath": "ha_tls_key_path",
        "haTlsCaPath": "ha_tls_ca_path", "enableControllerMode": "enable_controller_mode",
        "controllerAddr": "controller_addr",
        "brokerHeartbeatInterval": "broker_heartbeat_interval_ms",
        "haMaxTimeSlaveNotCatchup": "ha_max_time_slave_not_catchup_ms",
        "controllerMasterRole": "controller_master_role",
        "enableTopicMessageTypeCheck": "enable_topic_message_type_check",
        "allowAnonymousNetworkAccess": "allow_anonymous_network",
        "flightEnable": "flight_enable", "flightPort": "flight_port", "enableAutoFailover": "enable_auto_failover",
        "autoFailoverSilenceMs": "auto_failover_silence_ms",
    }
    _BOOLS = ("allow_anonymous_network", "enable_property_filter", "enable_auto_failover", "admin_metrics_auth",
              "authentication_enabled", "authorization_enabled", "ha_tls_enable",
              "enable_controller_mode", "enable_topic_message_type_check", "flight_enable",
              "auto_renew")
    _INTS = ("broker_id", "listen_port", "admin_port", "register_interval_ms",
             "offset_persist_interval_ms", "max_reconsume_times", "default_invisible_ms",
             "max_long_polling_ms", "grpc_workers", "timer_max_delay_s",
             "max_long_polling_requests", "renew_ahead_ms", "renew_max_ms", "renew_period_ms",
             "invisible_ms_when_clear",
             "transaction_timeout_ms", "transaction_check_interval_ms", "transaction_check_max",
             "ha_listen_port", "auto_failover_silence_ms", "broker_heartbeat_interval_ms",
             "ha_max_time_slave_not_catchup_ms", "flight_port")

    def __post_init__(self):
        if not (self.authentication_enabled or self.allow_anonymous_network
                or is_loopback(self.host)):
            raise InvalidConfigError(
                f"brokerIP1={self.host} serves gRPC and Arrow Flight on a network without "
                "authentication: anyone who reaches it could send, read and delete messages. "
                "Set authenticationEnabled=true with initAuthenticationUser (README, "
                "'Production'), or allowAnonymousNetworkAccess=true to accept that on a "
                "network you trust")
        if self.broker_role not in ROLES:
            raise InvalidConfigError(f"brokerRole must be one of {ROLES}, got {self.broker_role!r}")
        if self.consume_from_where not in CONSUME_FROM:
            raise InvalidConfigError(
                f"consumeFromWhere must be one of {CONSUME_FROM}, got {self.consume_from_where!r}")
        if self.max_reconsume_times < 0:
            raise InvalidConfigError("maxReconsumeTimes must be >= 0")
        from .delaypolicy import parse_delay_levels
        try:
            parse_delay_levels(self.message_delay_level)
        except SparkMQError as e:
            raise InvalidConfigError(e.message) from None
        for name in ("register_interval_ms", "offset_persist_interval_ms",
                     "default_invisible_ms", "max_long_polling_ms", "grpc_workers",
                     "timer_max_delay_s", "transaction_timeout_ms",
                     "transaction_check_interval_ms", "renew_max_ms", "renew_period_ms"):
            if getattr(self, name) <= 0:
                raise InvalidConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("renew_ahead_ms", "invisible_ms_when_clear"):
            if getattr(self, name) < 0:
                raise InvalidConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.broker_role == "SLAVE":
            if self.broker_id <= 0:
                raise InvalidConfigError("a replica (brokerRole=SLAVE) needs brokerId > 0")
            if not self.has_ha_secret:
                raise InvalidConfigError("a replica needs haSecret (or haSecretFile), the "
                                         "secret its master's is set to")
            if not (self.ha_master_address or self.namesrv_addr or self.enable_controller_mode):
                raise InvalidConfigError("a replica needs haMasterAddress (host:port of the "
                                         "master's haListenPort), or namesrvAddr or "
                                         "enableControllerMode to find it")
        elif self.ha_listen_port and not self.has_ha_secret:
            raise InvalidConfigError("haListenPort is set but haSecret is empty; replication "
                                     "traffic must be authenticated: set haSecret or "
                                     "haSecretFile")
        if self.ha_tls_enable and self.broker_role != "SLAVE" and not (
                self.ha_tls_cert_path and self.ha_tls_key_path):
            raise InvalidConfigError("haTlsEnable=true on a master needs haTlsCertPath and "
                                     "haTlsKeyPath (PEM; `sparkmq tls selfsigned` makes a "
                                     "development pair)")
        if self.ha_secret:
            from ..ha.protocol import check_secret as check_ha_secret
            check_ha_secret(self.ha_secret)
        if self.ha_master_address:
            from ..ha.protocol import parse_address
            try:
                parse_address(self.ha_master_address)
            except InvalidConfigError as e:
                raise InvalidConfigError(f"haMasterAddress: {e.message}") from None
        if self.flight_port is not None and not 0 <= self.flight_port <= 65535:
            raise InvalidConfigError(f"flightPort must be 0..65535 (0: a free port), got "
                                     f"{self.flight_port}; leave it unset for listenPort + 2")
        if not 0 <= self.ha_listen_port <= 65535 or self.auto_failover_silence_ms <= 0:
            raise InvalidConfigError("haListenPort must be 0..65535 and autoFailoverSilenceMs "
                                     "positive")
        if self.cluster_secret:
            from ..namesrv.signing import check_secret
            check_secret(self.cluster_secret)
        if bool(self.admin_tls_cert_file) != bool(self.admin_tls_key_file):
            raise InvalidConfigError("set both adminTlsCertFile and adminTlsKeyFile (PEM files; "
                                     "`sparkmq tls selfsigned` makes a pair), or neither")
        if self.enable_controller_mode:
            if not self.controller_addr:
                raise InvalidConfigError("enableControllerMode=true needs controllerAddr "
                                         "(host:port;host:port;host:port of the controllers)")
            if self.enable_auto_failover:
                raise InvalidConfigError("enableAutoFailover is the classic mode's failover; "
                                         "with enableControllerMode the controllers elect: "
                                         "turn enableAutoFailover off")
            if self.controller_master_role not in ("SYNC_MASTER", "ASYNC_MASTER"):
                raise InvalidConfigError("controllerMasterRole must be SYNC_MASTER or "
                                         "ASYNC_MASTER")
        if self.tls_server_mode not in ("disabled", "enforcing"):
            raise InvalidConfigError(
                f"tlsServerMode must be disabled or enforcing, got {self.tls_server_mode!r} "
                "(RocketMQ's permissive mode, TLS and plaintext on one port, is not offered: "
                "Python gRPC serves one or the other per port)")
        if self.tls_server_mode == "enforcing" and not (self.tls_server_cert_path
                                                        and self.tls_server_key_path):
            raise InvalidConfigError("tlsServerMode=enforcing needs tlsServerCertPath and "
                                     "tlsServerKeyPath (PEM files; `sparkmq tls selfsigned` "
                                     "makes a pair for development)")
        StoreConfig.from_options(self.store_config_options())  # validates store options

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "BrokerConfig":
        """Build from RocketMQ property names (strings are parsed)."""
        values: dict[str, Any] = {}
        store: dict[str, Any] = {}
        for key, raw in props.items():
            name = cls._ALIASES.get(key)
            if name is None:
                store[key] = raw
            elif name in cls._INTS:
                values[name] = parse_int(key, raw)
            elif name in cls._BOOLS:
                values[name] = parse_bool(key, raw)
            else:
                values[name] = str(raw)
        return cls(store_options=store, **values)

    @classmethod
    def from_file(cls, path: str) -> "BrokerConfig":
        return cls.from_properties(load_properties(path))

    @property
    def max_delivery_attempts(self) -> int:
        """Deliveries before a message goes to the DLQ (first delivery + maxReconsumeTimes)."""
        return self.max_reconsume_times + 1

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.listen_port}"

    def flight_ports(self) -> list[int]:
        """The Arrow Flight ports to try in order (0: one the OS picks): ``flightPort``
        when set (it must bind); else ``listenPort + 2`` (8083 beside 8081, as RocketMQ
        derives its ports from listenPort, so brokers sharing a host do not collide),
        then a free port if something else holds that one (sparkmq's clients learn the
        port from QueryRoute; set flightPort for clients that do not). The derived port is
        skipped where the broker's own adminPort or haListenPort names it: Flight binds
        first and would take it from them."""
        if self.flight_port is not None:
            return [self.flight_port]
        derived = self.listen_port + 2 if 0 < self.listen_port <= 65533 else 0
        if derived in (self.admin_port, self.ha_listen_port):
            derived = 0
        return [derived, 0] if derived else [0]

    @property
    def has_ha_secret(self) -> bool:
        return bool(self.ha_secret or self.ha_secret_file)

    def resolved_ha_secret(self) -> str:
        """The HA secret: ``haSecret``, else the content of ``haSecretFile`` (made 0600
        with a random secret if absent: a master and replicas on one machine share
        it; elsewhere copy the file). Checked (``ha.protocol.check_secret``)."""
        from ..ha.protocol import check_secret as check_ha_secret
        if self.ha_secret:
            return check_ha_secret(self.ha_secret)
        from ..secretfile import load_or_create
        secret, _ = load_or_create(self.ha_secret_file)
        return check_ha_secret(secret, f"haSecretFile {self.ha_secret_file}")

    @property
    def admin_scheme(self) -> str:
        """``https`` when the admin port serves TLS, else ``http``."""
        return "https" if self.admin_tls_cert_file else "http"

    def admin_url(self, port: int) -> str:
        """The URL other processes reach the admin endpoint at (``brokerIP1`` when the
        admin port listens on every interface)."""
        host = self.admin_listen_address
        if host in ("0.0.0.0", "::", ""):
            host = self.host
        return f"{self.admin_scheme}://{host}:{port}"

    @property
    def admin_token_path(self) -> str:
        """The admin token file (``adminTokenFile``, else the default of admin_auth.py)."""
        from ..admin_auth import default_token_file
        return self.admin_token_file or default_token_file(
            self.store_path, cluster=self.cluster_name, broker_name=self.broker_name,
            broker_id=self.broker_id)

    @property
    def long_polling_capacity(self) -> int:
        """Long polls held at once (``maxLongPollingRequests``; 0 or less: no cap). A gRPC
        poll is a suspended coroutine holding no worker (grpc_server.py); a thread-holding
        poll (Arrow Flight) counts against the same cap, a followed read for its whole life."""
        if self.max_long_polling_requests > 0:
            return self.max_long_polling_requests
        return 1 << 30

    def store_config_options(self) -> dict[str, Any]:
        opts = dict(self.store_options)
        opts.setdefault("brokerName", self.broker_name)
        opts.setdefault("storeHost", self.endpoint)
        opts.setdefault("maxMessageSize", DEFAULT_MAX_MESSAGE_SIZE_BYTES)
        return opts

    @property
    def store_config(self) -> StoreConfig:
        return StoreConfig.from_options(self.store_config_options())

    @property
    def delay_policy(self):
        """The DelayPolicy of messageDelayLevel and timerMaxDelaySec."""
        from .delaypolicy import DelayPolicy, parse_delay_levels
        return DelayPolicy(parse_delay_levels(self.message_delay_level),
                           self.timer_max_delay_s * 1000)

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0 and self.broker_role != "SLAVE"


def is_loopback(host: str) -> bool:
    """``host`` (an address or name to listen on) is this machine only: 127.0.0.0/8,
    ::1 or ``localhost``."""
    import ipaddress
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
