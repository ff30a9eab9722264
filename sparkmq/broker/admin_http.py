"""The broker's admin endpoint: HTTP (HTTPS with adminTlsCertFile/adminTlsKeyFile) on
``adminListenAddress:adminPort`` (loopback unless configured).

Routes: ``GET /health`` (200 while running, else 503), ``GET /status`` (JSON),
``GET /metrics`` (Prometheus text), ``GET /admin/retention`` (what the next
retention pass removes), ``POST /admin/topics`` (create/update a topic, mqadmin
updateTopic), ``POST /admin/groups`` (create/replace/delete a subscription group),
``POST /admin/promote`` (make a replica the master), ``POST`` ``ADOPT_PATH`` (the
Spark committer hand-off; the store's lease advertises this endpoint); ``/console``
and below: the web console's pages and forms (``sparkmq.console``).

``BrokerAdmin`` is what the routes do (also called in-process, e.g. by tests);
``AdminServer`` serves them. Every request passes ``admin_guard.AdminGuard`` first
(403 cross-origin, 401 without the admin token, 415 for a POST that is not
``application/json``). A POST is answered 400 (malformed request or a
``UserError``), 409 (a retriable ``SparkMQError``), 503 (broker not running) or 500.

Thread-safety: the server runs each request on its own thread; the store and the
broker's services are thread-safe.
"""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .. import heap
from ..errors import InvalidConfigError, SparkMQError, TopicNotFoundError, UserError
from ..lifecycle import REQUEST_TIMEOUT_S
from ..log.batch import PERM_RW
from ..log.committer import ADOPT_PATH
from .admin_guard import is_console

log = logging.getLogger("sparkmq.broker")


class BrokerAdmin:
    """The admin actions of one broker (``broker``: a :class:`sparkmq.broker.Broker`)."""

    def __init__(self, broker):
        self.broker = broker

    @property
    def store(self):
        return self.broker.store

    def create_topic(self, request: dict) -> dict:
        """``POST /admin/topics`` ``{"name": .., "queueNums": N, "perm": 6, "retentionMs":
        .., "retentionBytes": ..}`` (mqadmin updateTopic): create the topic here (or set
        its queue counts) and re-register (``"existOk": true``: an existing topic is left
        as it is). With ``"update": true`` only the fields given
        change (``readQueueNums``, ``writeQueueNums``, ``perm``, retention)."""
        name = request.get("name")
        retention = {k: (None if request.get(f) is None else int(request[f]))
                     for k, f in (("retention_ms", "retentionMs"),
                                  ("retention_bytes", "retentionBytes"))}
        if request.get("update"):
            if self.broker.topic_conf(name) is None:
                raise TopicNotFoundError(f"topic {name!r} does not exist; create it first")
            opt = lambda f: None if request.get(f) is None else int(request[f])  # noqa: E731
            conf = self.store.update_topic(name, read_queue_nums=opt("readQueueNums"),
                                           write_queue_nums=opt("writeQueueNums"),
                                           perm=opt("perm"), **retention)
            self.broker.topic_created(name)
            return {"topic": name, **conf.body()}
        n = int(request.get("queueNums") or self.store.config.default_topic_queue_nums)
        perm = int(request.get("perm") or PERM_RW)
        existing = self.broker.topic_conf(name)
        if existing is not None and request.get("existOk"):   # create-if-missing only
            return {"topic": name, **existing.body()}
        if existing is not None:
            conf = self.store.update_topic(name, read_queue_nums=n, write_queue_nums=n, perm=perm,
                                           **retention)
        else:
            from ..log.topics import message_type_attributes
            conf = self.store.create_topic(
                name, read_queue_nums=n, write_queue_nums=n, perm=perm,
                attributes=message_type_attributes(request.get("messageType")),
                **{k: v for k, v in retention.items() if v})
        self.broker.topic_created(name)
        body = conf.body()
        from ..log.topics import topic_message_type
        return {"topic": name, "messageType": topic_message_type(conf), **{k: body[k] for k in (
            "readQueueNums", "writeQueueNums", "perm", "retentionMs", "retentionBytes")
            if k in body}}

    def update_group(self, request: dict) -> dict:
        """``POST /admin/groups`` ``{"name": .., "retryMaxTimes": N, "consumeEnable": true,
        "consumeBroadcastEnable": false, "groupRetryPolicy": {...}}`` creates or replaces a subscription group
        config (mqadmin updateSubGroup); ``{"name": .., "delete": true}`` deletes it and
        its offsets (deleteSubGroup). Configs live in the store's log."""
        name = request.get("name")
        if not isinstance(name, str):
            raise UserError("'name' (the consumer group) is required")
        if request.get("delete"):
            self.broker.receiver.drop_group(name, keep_offsets=bool(request.get("keepOffsets")))
            return {"deleted": name}
        retry = request.get("retryMaxTimes")
        return self.store.create_group(
            name, retry_max_times=None if retry is None else int(retry),
            consume_enable=bool(request.get("consumeEnable", True)),
            consume_broadcast_enable=bool(request.get("consumeBroadcastEnable", True)),
            consume_message_orderly=bool(request.get("consumeMessageOrderly", False)),
            retry_policy=request.get("groupRetryPolicy")).body()

    def auth(self, request: dict):
        """``POST /admin/auth``: create, update, delete, get or list ACL 2.0 users and
        ACLs (``sparkmq.auth.meta.execute``; ``sparkmq admin user|acl --broker``)."""
        from ..auth.meta import execute
        return execute(self.store, request)

    def retention_report(self) -> dict:
        """``GET /admin/retention``: what the store's next retention pass removes, per
        topic, and the consumer groups that still need it (log/retention.py)."""
        from ..log.retention import describe
        return describe(self.store.retention_plan(detail=True), self.store)

    # ------------------------------------------------------------ Spark commits
    def adopt(self, request: dict) -> dict:
        """The broker side of the Spark committer hand-off (``POST /admin/adopt``):
        ``Store.adopt`` the staged segment files, atomically and idempotently; online
        consumers see the job's messages at once (the store wakes long polls)."""
        paths = request.get("paths")
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise InvalidConfigError("adopt needs 'paths': a list of staged segment files")
        app_id, app_version = request.get("appId"), request.get("appVersion")
        if (app_id is None) != (app_version is None):
            raise InvalidConfigError("give both appId and appVersion, or neither")
        before = set(self.store.topics())
        result = self.store.adopt(paths, app_id=app_id,
                                  app_version=None if app_version is None else int(app_version))
        for topic in set(self.store.topics()) - before:
            self.broker.topic_created(topic)
        log.info("adopted %d staged file(s), %d messages, version %d%s", len(paths),
                 result.num_messages, result.version, " (replay skipped)" if result.skipped else "")
        return {"version": result.version, "numMessages": result.num_messages,
                "skipped": result.skipped}

    def status(self) -> dict:
        """``GET /status``: identity, state, role and HA link, topics (queues, messages
        retained), clients and groups."""
        b, store = self.broker, self.store
        topics = {}
        for name, conf in sorted(store.topics().items()):
            ranges = store.queue_ranges(name)
            topics[name] = {"queues": max(conf.read_queue_nums, conf.write_queue_nums),
                            "messages": sum(hi - lo for lo, hi in ranges.values())}
        return {"cluster": b.config.cluster_name, "brokerName": b.config.broker_name,
                "brokerId": b.broker_id, "role": b.role,
                "state": b.state.value, "fenced": b.fenced_reason,
                "ha": b.ha.ha_status(), "endpoint": b.endpoint,
                "adminPort": b.admin_port, "store": b.config.store_path,
                "storeVersion": store.version,
                "flushDiskType": store.config.flush_disk_type,
                "namesrvAddr": b.config.namesrv_addr, "startedMs": b.started_ms,
                "topics": topics, "clients": b.clients.count(),
                "groups": {g: {"clients": b.clients.groups().get(g, 0)}
                           for g in sorted({k.group for k in b.pop.groups()}
                                           | set(b.clients.groups()))},
                "longPollWaiting": b.notifier.waiting}

    def metrics_text(self) -> str:
        """``GET /metrics``: the broker's counters and gauges in Prometheus text format."""
        b = self.broker
        depth = []
        for name in self.store.topic_names():
            for (t, q), (lo, hi) in sorted(self.store.queue_ranges(name).items()):
                depth.append(({"topic": t, "queue": str(q)}, hi - lo))
        lag = [({"group": k.group, "topic": t, **({"client": k.client_id} if k.client_id else {})}, v)
               for (k, t), v in b.receiver.consumer_lag().items()]
        gauges = {
            "sparkmq_queue_depth": ("Messages retained per queue (max - min offset).", depth),
            "sparkmq_consumer_lag": ("Messages not yet consumed per group and topic.", lag),
            "sparkmq_long_poll_waiting": ("Receives held by long polling now.",
                                          [({}, b.notifier.waiting)]),
            "sparkmq_receipt_handles_held": (
                "Messages received with auto_renew, kept hidden while their consumer works.",
                [({}, b.renewer.held_count())]),
            "sparkmq_broker_up": ("1 while the broker is running.",
                                  [({}, 1 if b.is_running else 0)]),
            "sparkmq_ha_replica_lag_bytes": (
                "CommitLog bytes a replica does not have yet (per attached replica on a "
                "master; this replica's own on a replica).", b.ha.lag_samples()),
        }
        counters = {"sparkmq_dlq_messages_total": (
            "Messages moved to a dead-letter topic (max attempts or forwarded).",
            [({}, b.pop.dlq_count)])}
        from .rocketmq_metrics import families          # RocketMQ 5's names too
        rmq_counters, rmq_gauges = families(b)
        gc_counters, gc_gauges = heap.metric_families()
        return b.metrics.render({**gauges, **rmq_gauges, **gc_gauges},
                                {**counters, **rmq_counters, **gc_counters})


class _AdminHTTPServer(ThreadingHTTPServer):
    """A connection that breaks before a request is read (a failed TLS handshake, a
    plain-HTTP client on the HTTPS port, a reset) is logged, not printed."""

    def handle_error(self, request, client_address):
        log.info("admin connection from %s failed", client_address[0], exc_info=True)


def admin_ssl_context(config):
    """The server TLS context of adminTlsCertFile/adminTlsKeyFile, or None (plain HTTP)."""
    if not config.admin_tls_cert_file:
        return None
    from ..tls import server_ssl_context
    return server_ssl_context(config.admin_tls_cert_file, config.admin_tls_key_file,
                              "adminTlsCertFile/adminTlsKeyFile")


class AdminServer:
    """``ThreadingHTTPServer`` serving ``BrokerAdmin``'s routes. Its accept loop
    (``serve_forever``) is a blocking loop with its own ``shutdown``, not a periodic
    pass, so it runs on a plain daemon thread rather than a ``ServiceThread``."""

    def __init__(self, broker, host: str, port: int, guard, ssl_context=None):
        self.guard = guard
        self._http = _AdminHTTPServer((host, port), _admin_handler(broker, self))
        self._http.daemon_threads = True
        if ssl_context is not None:   # the handshake runs on the request's own thread
            self._http.socket = ssl_context.wrap_socket(self._http.socket, server_side=True,
                                                        do_handshake_on_connect=False)
        self.port = self._http.server_address[1]

    def set_guard(self, guard) -> None:
        """The ``AdminGuard`` requests pass (known once the port is bound)."""
        self.guard = guard

    def start(self) -> "AdminServer":
        if self.guard is None:
            raise RuntimeError("AdminServer.start without a guard")
        threading.Thread(target=self._http.serve_forever, name="sparkmq-broker-admin",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()


def _admin_handler(broker, server: AdminServer):
    """The request handler class of ``broker``'s admin endpoint (see the module docstring)."""
    admin = broker.admin

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = REQUEST_TIMEOUT_S     # a stuck client holds no thread for ever

        def log_message(self, fmt, *args):
            log.debug("admin " + fmt, *args)

        def _reply(self, code: int, body: str, ctype: str, headers=()) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _refused(self, method: str, path: str) -> bool:
            """Answer and close the connection (a refused body stays unread) if the
            guard refuses this request."""
            refusal = server.guard.refusal(method, path, self.headers)
            if refusal is None:
                return False
            self.close_connection = True
            if is_console(path):     # an HTML page (with the login form for a 401)
                from ..console import refusal_page
                self._console_reply(refusal_page(refusal, self.path))
                return True
            self._reply(refusal.status, json.dumps({"code": refusal.code,
                                                    "message": refusal.message}),
                        "application/json", refusal.headers + (("Connection", "close"),))
            return True

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if self._refused("GET", path):
                return
            if is_console(path):
                return self._console("GET")
            try:
                if path == "/health":
                    up = broker.is_running
                    return self._reply(200 if up else 503, broker.state.value + "\n", "text/plain")
                if path == "/status":
                    return self._reply(200, json.dumps(admin.status(), indent=1),
                                       "application/json")
                if path == "/admin/groups/progress":
                    from urllib.parse import parse_qs, urlparse
                    from ..log.progress import group_lag
                    group = (parse_qs(urlparse(self.path).query).get("group") or [""])[0]
                    if not group:
                        return self._reply(400, "give the group: ?group=NAME\n", "text/plain")
                    return self._reply(200, json.dumps({"group": group, "queues": group_lag(
                        broker.store, group)}), "application/json")
                if path == "/admin/retention":
                    return self._reply(200, json.dumps(admin.retention_report()),
                                       "application/json")
                if path == "/metrics":
                    return self._reply(200, admin.metrics_text(),
                                       "text/plain; version=0.0.4; charset=utf-8")
                return self._reply(404, f"unknown path {path}; try /health /status /metrics\n",
                                   "text/plain")
            except Exception as e:  # the endpoint answers 500 and keeps serving; logged
                log.exception("admin %s failed", path)
                return self._reply(500, f"{type(e).__name__}: {e}\n", "text/plain")

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            if self._refused("POST", path):
                return
            if is_console(path):
                return self._console("POST")
            actions = {ADOPT_PATH: admin.adopt, "/admin/topics": admin.create_topic,
                       "/admin/groups": admin.update_group, "/admin/auth": admin.auth,
                       "/admin/promote": broker.ha.promote}
            if path not in actions:
                return self._json(404, {"code": "NOT_FOUND", "message": f"unknown path {path}"})
            try:
                n = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(request, dict):
                    raise ValueError("body must be a JSON object")
            except ValueError as e:
                return self._json(400, {"code": "BAD_REQUEST", "message": f"malformed body: {e}"})
            if not broker.is_running:
                return self._json(503, {"code": "SPARKMQ_RETRIABLE",
                                        "message": f"broker is {broker.state.value}"})
            try:
                return self._json(200, actions[path](request))
            except SparkMQError as e:
                code = 400 if isinstance(e, UserError) else 409 if e.retriable else 500
                return self._json(code, {"code": e.code, "message": e.message})
            except (TypeError, ValueError) as e:
                return self._json(400, {"code": "BAD_REQUEST", "message": f"bad field: {e}"})
            except Exception as e:  # the endpoint answers 500 and keeps serving; logged
                log.exception("admin %s failed", path)
                return self._json(500, {"code": "SPARKMQ_ERROR", "message": f"{type(e).__name__}: {e}"})

        def _json(self, code: int, payload: dict) -> None:
            self._reply(code, json.dumps(payload), "application/json")

        def _console(self, method: str) -> None:
            """A page or form of the web console (``sparkmq.console.handle``)."""
            from ..console import MAX_FORM_BYTES, handle, too_large
            try:
                n = int(self.headers.get("Content-Length") or 0) if method == "POST" else 0
            except ValueError:
                n = -1
            if not 0 <= n <= MAX_FORM_BYTES:
                self.close_connection = True
                return self._console_reply(too_large())
            self._console_reply(handle(broker, server.guard, method, self.path, self.headers,
                                       self.rfile.read(n) if n else b""))

        def _console_reply(self, page) -> None:
            self._reply(page.status, page.body, page.ctype, page.headers)

    return Handler
