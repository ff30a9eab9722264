"""A client of the controllers' HTTP/JSON API (``server.py``), for brokers and admin.

``ControllerClient("127.0.0.1:9880;127.0.0.1:9881;127.0.0.1:9882")`` (RocketMQ's
``controllerAddr``) tries the controllers in turn, starting with the last that
answered, until one commits the request; None when none could. Writes are signed
with the cluster secret. Every call is bounded by ``timeout_s`` per controller.
Thread-safe (the preferred index is a plain int).
"""
from __future__ import annotations

import logging
from urllib.parse import quote

from ..namesrv.client import json_call, parse_addresses
from ..namesrv.signing import resolve_secret

log = logging.getLogger("sparkmq.controller.client")


class ControllerClient:
    def __init__(self, addresses: str | list[str], *, timeout_s: float = 3.0,
                 cluster_secret: str | None = None, cluster_secret_file: str | None = None):
        self.addresses = parse_addresses(addresses)
        self.timeout_s = timeout_s
        self._secret_source = (cluster_secret, cluster_secret_file)
        self._secret: str | None = None
        self._preferred = 0

    def _call(self, addr: str, path: str, body: dict | None) -> tuple[int, dict]:
        if body is not None and self._secret is None:
            self._secret = resolve_secret(*self._secret_source)
        return json_call(addr, path, body, self._secret, self.timeout_s)

    def request(self, path: str, body: dict | None = None) -> tuple[int, dict] | None:
        """The first answer other than 503 (not committed) from the controllers, or
        None when none gave one."""
        n = len(self.addresses)
        for k in range(n):
            i = (self._preferred + k) % n
            try:
                code, payload = self._call(self.addresses[i], path, body)
            except OSError as e:
                log.debug("controller %s: %s", self.addresses[i], e)
                continue
            if code != 503:
                self._preferred = i
                return code, payload
        return None

    def heartbeat(self, broker_name: str, node_id: int, endpoint: str, ha_endpoint: str,
                  offset: int, claims_master: bool = False) -> dict | None:
        """The group's view once a majority committed the heartbeat; None otherwise."""
        out = self.request("/controller/heartbeat", {
            "brokerName": broker_name, "nodeId": node_id, "endpoint": endpoint,
            "haEndpoint": ha_endpoint, "offset": offset, "claimsMaster": claims_master})
        return out[1] if out is not None and out[0] == 200 else None

    def alter_sync_state_set(self, broker_name: str, master_id: int, master_epoch: int,
                             sss_epoch: int, members: list[int]) -> dict | None:
        out = self.request("/controller/alterSyncStateSet", {
            "brokerName": broker_name, "masterId": master_id, "masterEpoch": master_epoch,
            "syncStateSetEpoch": sss_epoch, "syncStateSet": members})
        return out[1] if out is not None else None

    def elect_master(self, broker_name: str, node_id: int) -> tuple[int, dict] | None:
        return self.request("/controller/electMaster",
                            {"brokerName": broker_name, "nodeId": node_id})

    def metadata(self) -> dict | None:
        out = self.request("/controller/metadata")
        return out[1] if out is not None else None

    def sync_state_set(self, broker_name: str) -> dict | None:
        out = self.request(f"/controller/syncStateSet?brokerName={quote(broker_name)}")
        return out[1] if out is not None else None
