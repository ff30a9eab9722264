"""A controller node: the Raft state (``state.py``) behind a small HTTP/JSON API, and
the election service its leader runs.

Endpoints (JSON; POSTs signed with the cluster secret like NameServer writes,
``namesrv/signing.py``):

* ``POST /controller/heartbeat``  ``{brokerName, nodeId, endpoint, haEndpoint, offset}``
  -> the group's view: ``{masterId, masterEpoch, masterEndpoint, masterHaEndpoint,
  syncStateSet, syncStateSetEpoch, leaseMs}``. Answered only once a majority of the
  controllers has committed the heartbeat: a master renews its lease this way.
* ``POST /controller/alterSyncStateSet`` ``{brokerName, masterId, masterEpoch,
  syncStateSetEpoch, syncStateSet}`` (the master only).
* ``POST /controller/electMaster`` ``{brokerName, nodeId}`` (an operator's choice;
  still only from the SyncStateSet).
* ``GET /controller/metadata`` every group with its nodes; ``GET
  /controller/syncStateSet?brokerName=B``; ``GET /controller/status`` (Raft state).

A command that cannot be committed (no leader, no majority) answers 503; the
caller tries another controller. Settings use RocketMQ 5's names where they exist
(``controllerDLegerPeers``, ``controllerDLegerSelfId``, ``controllerStorePath``).
"""
from __future__ import annotations

import json
import logging
import time
from http.server import BaseHTTPRequestHandler
from typing import Callable
from urllib.parse import parse_qs, urlparse

from ..errors import InvalidConfigError
from ..lifecycle import HttpServerThread, ServiceThread
from ..namesrv.signing import RequestVerifier, resolve_secret
from ..properties import whole
from .state import ControllerState, monotonic_ms

log = logging.getLogger("sparkmq.controller")

DEFAULT_LEASE_MS = 6_000           # a master acknowledges this long after a renewal
DEFAULT_GRACE_MS = 2_000           # and is replaced only this much later still
COMMIT_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 1 << 20


def parse_peers(peers: str) -> dict[str, str]:
    """``n0-127.0.0.1:9878;n1-127.0.0.1:9879`` (``controllerDLegerPeers``) -> id -> address."""
    out = {}
    for part in (peers or "").replace(",", ";").split(";"):
        if not part.strip():
            continue
        node, sep, addr = part.strip().partition("-")
        if not sep or ":" not in addr:
            raise InvalidConfigError(f"controllerDLegerPeers entry {part!r} is not "
                                     "<id>-<host>:<port>")
        out[node] = addr
    if not out:
        raise InvalidConfigError("controllerDLegerPeers is empty: give every controller as "
                                 "n0-host:port;n1-host:port;n2-host:port")
    return out


class ElectionService(ServiceThread):
    """On the Raft leader: elects a new master for each group whose master's lease has
    surely expired (``ControllerState.election_due``)."""

    name = "controller-election"

    def __init__(self, controller: "Controller", interval_ms: int = 500):
        super().__init__(interval_ms)
        self.controller = controller

    def run_once(self) -> None:
        c = self.controller
        if not c.state._isLeader():
            c.leader_since = None
            return
        now = c.local_ms()
        if c.leader_since is None:
            c.leader_since = now     # a new leader waits a whole lease before it judges
        if now - c.leader_since < c.lease_ms + c.grace_ms:
            return
        for name, node, epoch in c.state.election_due(c.lease_ms, c.grace_ms):
            try:
                result = c.state.elect(name, node, epoch, sync=True, timeout=COMMIT_TIMEOUT_S)
            except Exception as e:  # no majority now: next pass tries again
                log.warning("electing a master for %s failed: %s", name, e)
                continue
            if result.get("ok"):
                log.warning("broker group %s: master unheard past its lease; elected node %d "
                            "(epoch %d, SyncStateSet %s)", name, node, result["masterEpoch"],
                            result["syncStateSet"])


class Controller:
    """One controller node (see the module docstring)."""

    def __init__(self, *, self_id: str, peers: str, host: str = "127.0.0.1", port: int = 0,
                 store_path: str | None = None, cluster_secret: str | None = None,
                 cluster_secret_file: str | None = None, lease_ms: int = DEFAULT_LEASE_MS,
                 grace_ms: int = DEFAULT_GRACE_MS,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 local_ms: Callable[[], int] = monotonic_ms,
                 election_interval_ms: int = 500):
        nodes = parse_peers(peers)
        if self_id not in nodes:
            raise InvalidConfigError(f"controllerDLegerSelfId {self_id!r} is not in "
                                     f"controllerDLegerPeers ({', '.join(nodes)})")
        secret = resolve_secret(cluster_secret, cluster_secret_file)
        self.verifier = RequestVerifier(secret)
        self.lease_ms, self.grace_ms = lease_ms, grace_ms
        # the wall clock stamps lastSeenMs (for operators); leases are judged on local_ms
        self.clock_ms, self.local_ms = clock_ms, local_ms
        self.leader_since: int | None = None
        self.host, self.port = host, port
        journal = None
        if store_path:
            import os
            os.makedirs(store_path, exist_ok=True)
            journal = os.path.join(store_path, f"raft-{self_id}.journal")
        self.state = ControllerState(nodes[self_id], [a for n, a in nodes.items()
                                                      if n != self_id],
                                     secret=secret, journal_path=journal, local_ms=local_ms)
        self._election = ElectionService(self, election_interval_ms)
        self._http: HttpServerThread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "Controller":
        self._http = HttpServerThread(self.host, self.port, _handler(self),
                                      "sparkmq-controller-http").start()
        self.port = self._http.port
        self._election.start()
        log.info("controller %s serving on http://%s", self.state.selfNode, self.address)
        return self

    def judge_leases(self) -> None:
        """One pass of the election service now, on this thread (what its timer does
        every ``election_interval_ms``); a test with manual clocks steps it so."""
        self._election.run_once()

    def stop(self) -> None:
        self._election.stop()
        if self._http is not None:
            self._http.stop()
            self._http = None
        self.state.destroy()

    # ------------------------------------------------------------ requests
    def handle(self, path: str, body: dict) -> tuple[int, dict]:
        now = self.clock_ms()
        try:
            if path == "/controller/heartbeat":
                view = self.state.heartbeat(
                    str(body["brokerName"]), _id(body["nodeId"], "nodeId"),
                    str(body.get("endpoint") or ""), str(body.get("haEndpoint") or ""),
                    _id(body.get("offset") or 0, "offset"), now, bool(body.get("claimsMaster")),
                    sync=True, timeout=COMMIT_TIMEOUT_S)
                return 200, {**view, "leaseMs": self.lease_ms}
            if path == "/controller/alterSyncStateSet":
                members = body["syncStateSet"]
                if not isinstance(members, list):
                    raise TypeError(f"'syncStateSet' is a list of node ids, got {members!r}")
                out = self.state.alter_sync_state_set(
                    str(body["brokerName"]), _id(body["masterId"], "masterId"),
                    _id(body["masterEpoch"], "masterEpoch"),
                    _id(body["syncStateSetEpoch"], "syncStateSetEpoch"),
                    [_id(i, "syncStateSet") for i in members],
                    sync=True, timeout=COMMIT_TIMEOUT_S)
                return (200 if out.get("ok") else 409), out
            if path == "/controller/electMaster":
                name = str(body["brokerName"])
                epoch = self.state.view(name).get("masterEpoch", 0)
                out = self.state.elect(name, _id(body["nodeId"], "nodeId"), epoch, sync=True,
                                       timeout=COMMIT_TIMEOUT_S)
                return (200 if out.get("ok") else 409), out
        except (KeyError, TypeError, ValueError) as e:
            return 400, {"error": f"malformed request: {e!r}"}
        except Exception as e:   # pysyncobj: no leader / no majority / timeout
            return 503, {"error": f"not committed by a majority of the controllers: {e!r}"}
        return 404, {"error": f"unknown path {path}"}


def _id(value, name: str) -> int:
    """A request's field ``name``: a whole number >= 0 (a node id, an epoch, an offset),
    else ValueError naming what was wrong."""
    if whole(value, name) < 0:
        raise ValueError(f"{name!r} is >= 0, got {value}")
    return value


def _handler(controller: Controller):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def _reply(self, code: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            url = urlparse(self.path)
            st = controller.state
            if url.path == "/controller/metadata":
                return self._reply(200, {"groups": st.metadata()})
            if url.path == "/controller/syncStateSet":
                name = (parse_qs(url.query).get("brokerName") or [""])[0]
                return self._reply(200, st.view(name))
            if url.path == "/controller/status":
                s = st.getStatus()
                return self._reply(200, {"self": str(s.get("self")), "leader": str(
                    s.get("leader")), "isLeader": st._isLeader(), "term": s.get("raft_term"),
                    "ready": st.isReady()})
            return self._reply(404, {"error": f"unknown path {url.path}"})

        def do_POST(self):
            path = urlparse(self.path).path
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = -1
            if not 0 <= n <= MAX_BODY_BYTES:
                self.close_connection = True
                return self._reply(400, {"error": f"Content-Length must be 0..{MAX_BODY_BYTES}"})
            raw = self.rfile.read(n)
            refused = controller.verifier.refusal("POST", path, raw, self.headers)
            if refused is not None:
                log.warning("refused %s from %s: %s", path, self.address_string(), refused)
                return self._reply(401, {"error": refused})
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("body must be a JSON object")
            except ValueError as e:
                return self._reply(400, {"error": f"malformed JSON body: {e}"})
            code, payload = controller.handle(path, body)
            return self._reply(code, payload)

    return Handler
