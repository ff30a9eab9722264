"""A client of the NameServer's HTTP/JSON API (used by brokers and clients).

``NameServerClient("127.0.0.1:9876;127.0.0.1:9877")`` talks to every listed
NameServer: ``register`` sends to all of them, signed with the cluster secret
(``signing.py``) (a failure of one is logged and
reported, not raised), ``route`` asks them in turn until one answers.
Every call is bounded by ``timeout_s``. Thread-safe (no shared state).
"""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from urllib.parse import quote

from .signing import resolve_secret, sign

log = logging.getLogger("sparkmq.namesrv.client")


def parse_addresses(addrs: str | list[str] | None) -> list[str]:
    """``"h:p;h:p"`` (RocketMQ's namesrvAddr) -> ``["h:p", "h:p"]``."""
    if not addrs:
        return []
    if isinstance(addrs, str):
        addrs = addrs.replace(",", ";").split(";")
    return [a.strip().removeprefix("http://") for a in addrs if a and a.strip()]


def json_call(addr: str, path: str, body: dict | None, secret: str | None,
              timeout_s: float) -> tuple[int, dict]:
    """GET (``body`` None) or POST a JSON ``body`` signed with ``secret`` to
    ``http://addr/path``; (status, JSON answer). OSError when unreachable. Shared by the
    NameServer and controller clients."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if data is not None:
        headers.update(sign(secret, "POST", path, data))
    req = urllib.request.Request(f"http://{addr}{path}", data=data, headers=headers,
                                 method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {}


class NameServerClient:
    """``cluster_secret``/``cluster_secret_file``: what signs registrations
    (``signing.resolve_secret``, looked up at the first registration; route queries
    need none)."""

    def __init__(self, addresses: str | list[str] | None, *, timeout_s: float = 3.0,
                 cluster_secret: str | None = None, cluster_secret_file: str | None = None):
        self.addresses = parse_addresses(addresses)
        self.timeout_s = timeout_s
        self.fenced_by: dict[str, dict] = {}
        self._secret_source = (cluster_secret, cluster_secret_file)
        self._secret: str | None = None

    def _call(self, addr: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        if body is not None and self._secret is None:
            self._secret = resolve_secret(*self._secret_source)
        return json_call(addr, path, body, self._secret, self.timeout_s)

    def register(self, registration: dict) -> dict[str, bool]:
        """Register with every NameServer; returns address -> success. A NameServer
        that fences this broker (a newer master was promoted) is recorded in
        ``self.fenced_by`` (address -> its answer)."""
        out = {}
        for addr in self.addresses:
            try:
                code, body = self._call(addr, "/brokers/register", registration)
                out[addr] = code == 200
                if code == 409 and body.get("fenced"):
                    self.fenced_by[addr] = body
            except OSError as e:
                log.warning("register with NameServer %s failed: %s", addr, e)
                out[addr] = False
        return out

    def unregister(self, broker_name: str, broker_id: int) -> None:
        for addr in self.addresses:
            try:
                self._call(addr, "/brokers/unregister",
                           {"brokerName": broker_name, "brokerId": broker_id})
            except OSError as e:
                log.warning("unregister from NameServer %s failed: %s", addr, e)

    def route(self, topic: str) -> list[dict] | None:
        """The queues of ``topic`` from the first NameServer that answers;
        ``[]`` if it knows no broker serving it; None if none answered."""
        for addr in self.addresses:
            try:
                code, data = self._call(addr, f"/route?topic={quote(topic)}")
            except OSError as e:
                log.warning("route query to NameServer %s failed: %s", addr, e)
                continue
            if code in (200, 404):
                return list(data.get("queues") or [])
        return None

    def brokers(self) -> list[dict] | None:
        for addr in self.addresses:
            try:
                code, data = self._call(addr, "/brokers")
            except OSError:
                continue
            if code == 200:
                return data.get("brokers", [])
        return None
