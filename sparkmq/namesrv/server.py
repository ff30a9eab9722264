"""The NameServer process: the route registry behind a small HTTP/JSON API.

Endpoints (all on ``127.0.0.1:<port>``, default 9876; bodies are JSON):

* ``POST /brokers/register``   a broker's registration (see
  :class:`~sparkmq.namesrv.registry.BrokerRegistration.from_json`) -> ``{"ok": true}``
* ``POST /brokers/unregister`` ``{"brokerName": .., "brokerId": ..}``
* ``GET /route?topic=NAME``    ``{"topic": .., "queues": [...]}``; 404 if no live broker has it
* ``GET /brokers``             live brokers with their topics
* ``GET /health``              ``ok``

The two POSTs must be signed with the cluster secret (``signing.py``): unsigned,
wrongly signed, stale or replayed ones are answered 401 and change nothing. A
refused master registration (409, fenced) says only that it is fenced: no epoch,
no store id a caller could reuse.

Several NameServers run side by side and never talk to each other: brokers
register with each of them. A ``ScanBrokerService`` drops silent brokers every
``scan_interval_ms``; route queries also skip them at once.

Thread-safety: requests are served by one thread each (ThreadingHTTPServer);
the registry serializes them.
"""
from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler
from typing import Callable
from urllib.parse import parse_qs, urlparse

from ..lifecycle import HttpServerThread, ServiceThread
from ..properties import whole
from .registry import BROKER_EXPIRY_MS, BrokerRegistration, RouteRegistry
from .signing import RequestVerifier, resolve_secret

log = logging.getLogger("sparkmq.namesrv")

DEFAULT_PORT = 9876
MAX_BODY_BYTES = 8 << 20


class ScanBrokerService(ServiceThread):
    """Drops brokers silent for the expiry time, every ``interval_ms``."""

    name = "namesrv-scan-broker"

    def __init__(self, registry: RouteRegistry, interval_ms: int):
        super().__init__(interval_ms)
        self.registry = registry

    def run_once(self) -> None:
        for name in self.registry.expire():
            log.warning("broker %s silent for %d ms: dropped from the routes", name,
                        self.registry.broker_expiry_ms)


class NameServer:
    """One NameServer: ``start()`` binds and serves, ``stop()`` closes (idempotent)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 broker_expiry_ms: int = BROKER_EXPIRY_MS, scan_interval_ms: int = 10_000,
                 clock_ms: Callable[[], int] | None = None, kv_config_path: str | None = None,
                 cluster_secret: str | None = None, cluster_secret_file: str | None = None):
        """``cluster_secret``/``cluster_secret_file``: see ``signing.resolve_secret``."""
        self.registry = RouteRegistry(broker_expiry_ms=broker_expiry_ms, clock_ms=clock_ms,
                                      kv_config_path=kv_config_path)
        # wall clock, as the signing brokers use (``clock_ms`` ages registrations only)
        self.verifier = RequestVerifier(resolve_secret(cluster_secret, cluster_secret_file))
        self.host = host
        self.port = port
        self._scan = ScanBrokerService(self.registry, scan_interval_ms)
        self._http: HttpServerThread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "NameServer":
        self._http = HttpServerThread(self.host, self.port,
                                      _make_handler(self.registry, self.verifier),
                                      "sparkmq-namesrv-http").start()
        self.port = self._http.port
        self._scan.start()
        log.info("NameServer listening on http://%s", self.address)
        return self

    def stop(self) -> None:
        self._scan.stop()
        if self._http is not None:
            self._http.stop()
            self._http = None
        log.info("NameServer %s stopped", self.address)

    def __enter__(self) -> "NameServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _make_handler(registry: RouteRegistry, verifier: RequestVerifier):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # route access logs to logging, quietly
            log.debug("%s " + fmt, self.address_string(), *args)

        def _reply(self, code: int, payload) -> None:
            body = (json.dumps(payload) if not isinstance(payload, str) else payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json" if not isinstance(payload, str)
                             else "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json_body(self, path: str) -> dict | None:
            """The signed JSON object body, or None (answered 400 or 401)."""
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = -1
            if not 0 <= n <= MAX_BODY_BYTES:
                self.close_connection = True
                self._reply(400, {"error": f"Content-Length must be 0..{MAX_BODY_BYTES}"})
                return None
            raw = self.rfile.read(n)
            refused = verifier.refusal("POST", path, raw, self.headers)
            if refused is not None:
                log.warning("refused %s from %s: %s", path, self.address_string(), refused)
                self._reply(401, {"error": refused})
                return None
            try:
                data = json.loads(raw or b"{}")
                if not isinstance(data, dict):
                    raise ValueError("body must be a JSON object")
                return data
            except ValueError as e:
                self._reply(400, {"error": f"malformed JSON body: {e}"})
                return None

        def do_GET(self):
            url = urlparse(self.path)
            if url.path == "/health":
                return self._reply(200, "ok")
            if url.path == "/brokers":
                return self._reply(200, {"brokers": [r.to_json() for r in registry.brokers()],
                                         "clusters": registry.clusters()})
            if url.path == "/route":
                topic = (parse_qs(url.query).get("topic") or [""])[0]
                if not topic:
                    return self._reply(400, {"error": "give the topic: /route?topic=NAME"})
                queues = registry.route(topic)
                if not queues:
                    return self._reply(404, {"error": f"no live broker serves topic {topic!r}",
                                             "topic": topic, "queues": []})
                return self._reply(200, {"topic": topic, "queues": queues})
            return self._reply(404, {"error": f"unknown path {url.path}"})

        def do_POST(self):
            url = urlparse(self.path)
            if url.path not in ("/brokers/register", "/brokers/unregister"):
                self.close_connection = True
                return self._reply(404, {"error": f"unknown path {url.path}"})
            data = self._json_body(url.path)
            if data is None:
                return
            if url.path == "/brokers/register":
                try:
                    reg = BrokerRegistration.from_json(data)
                except ValueError as e:
                    return self._reply(400, {"error": str(e)})
                known = any(r.broker_name == reg.broker_name and r.broker_id == reg.broker_id
                            for r in registry.brokers())
                refused = registry.register(reg)
                if refused is not None:
                    log.warning("refused master registration of %s#%d: epoch history lacks the "
                                "newest master %s (promoted elsewhere)", reg.broker_name,
                                reg.broker_id, refused["master"])
                    return self._reply(409, {"fenced": True,
                                             "error": "a newer master of this broker group was "
                                             "promoted; this broker must not accept writes"})
                if not known:
                    log.info("broker %s#%d (%s, cluster %s) registered at %s with %d topics",
                             reg.broker_name, reg.broker_id, reg.role, reg.cluster,
                             reg.endpoint, len(reg.topics))
                return self._reply(200, {"ok": True})
            try:                                   # /brokers/unregister
                gone = registry.unregister(str(data["brokerName"]),
                                           whole(data["brokerId"], "brokerId"))
            except (KeyError, TypeError, ValueError) as e:
                return self._reply(400, {"error": f"malformed unregister body: {e!r}"})
            log.info("broker %s#%s unregistered", data.get("brokerName"), data.get("brokerId"))
            return self._reply(200, {"ok": gone})

    return Handler
