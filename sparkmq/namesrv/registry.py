"""The NameServer's routing table (RocketMQ's RouteInfoManager).

A broker registers a :class:`BrokerRegistration` (cluster, broker name, broker
id, role, gRPC endpoint, topics with queue counts) on start and every 30 s.
A broker silent for ``broker_expiry_ms`` (120 s) is dropped: route queries
skip it at once, and ``expire()`` removes it from the table.

Invariants: one entry per (broker name, broker id); a route lists every queue
of a topic across broker groups, masters (id 0) first.

Master fencing (replication, ``sparkmq.ha``): per broker name the registry
remembers the newest master writer it accepted, as (epoch, storeId) from the
registration's epoch history. A registration as master (id 0) is refused when
its history does not contain that writer: it comes from a store that was left
behind by a promotion (an old master returning), and the broker must refuse
writes. With ``kv_config_path`` (RocketMQ's ``kvConfigPath``) this memory is
persisted, written atomically (temp file, fsync, rename) whenever it changes and
loaded at start, so a restarted NameServer still fences the old master; without
it, after a restart the first master to register is believed (run several
NameServers). The clock is injected (``clock_ms``) so tests can age a broker
without waiting.

Thread-safety: every public method takes one lock; safe from many threads.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..durable import makedirs_durably, replace_durably
from ..errors import InvalidConfigError
from ..properties import whole

BROKER_EXPIRY_MS = 120_000
MASTER_ID = 0


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class BrokerRegistration:
    """What a broker tells the NameServer about itself."""

    cluster: str
    broker_name: str
    broker_id: int
    role: str
    endpoint: str                       # "host:port" of its gRPC MessagingService
    topics: dict[str, dict] = field(default_factory=dict)  # name -> {readQueueNums, writeQueueNums, perm}
    admin_endpoint: str | None = None
    ha_endpoint: str | None = None      # "host:port" of its HA service (masters)
    epochs: list = field(default_factory=list)  # epoch history [{epoch, storeId, startOffset}]
    last_seen_ms: int = 0

    @classmethod
    def from_json(cls, data: dict) -> "BrokerRegistration":
        """Build from the JSON body of a register call; raises ValueError if malformed
        (a number where a whole one belongs: a fraction, a string, ``1e999``, names it)."""
        try:
            topics = {str(k): {name: whole(v.get(name, default), name)
                               for name, default in (("readQueueNums", 0), ("writeQueueNums", 0),
                                                     ("perm", 6))}
                      for k, v in dict(data.get("topics") or {}).items()}
            return cls(cluster=str(data["cluster"]), broker_name=str(data["brokerName"]),
                       broker_id=whole(data["brokerId"], "brokerId"),
                       role=str(data.get("role", "ASYNC_MASTER")),
                       endpoint=str(data["endpoint"]), topics=topics,
                       admin_endpoint=data.get("adminEndpoint"),
                       ha_endpoint=data.get("haEndpoint"),
                       epochs=[{"epoch": whole(e["epoch"], "epoch"), "storeId": str(e["storeId"])}
                               for e in list(data.get("epochs") or [])])
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"malformed broker registration: {e!r}") from None

    def to_json(self) -> dict:
        return {"cluster": self.cluster, "brokerName": self.broker_name,
                "brokerId": self.broker_id, "role": self.role, "endpoint": self.endpoint,
                "adminEndpoint": self.admin_endpoint, "topics": self.topics,
                "haEndpoint": self.ha_endpoint,
                "epoch": self.epochs[-1]["epoch"] if self.epochs else None,
                "lastSeenMs": self.last_seen_ms}


class RouteRegistry:
    """Brokers and their topics; see the module docstring for the contract."""

    def __init__(self, *, broker_expiry_ms: int = BROKER_EXPIRY_MS,
                 clock_ms: Callable[[], int] | None = None,
                 kv_config_path: str | None = None):
        self.broker_expiry_ms = broker_expiry_ms
        self.clock_ms = clock_ms or _now_ms
        self.kv_config_path = kv_config_path
        self._brokers: dict[tuple[str, int], BrokerRegistration] = {}
        self._masters: dict[str, dict] = {}     # broker name -> newest master {epoch, storeId}
        self._lock = threading.Lock()
        if kv_config_path is not None:
            self._masters = _load_masters(kv_config_path)

    def register(self, reg: BrokerRegistration) -> dict | None:
        """Add or refresh a broker; its topic list replaces the previous one.
        Returns None, or (refused, nothing stored) ``{"fenced": True, "master": {epoch,
        storeId}}`` for a master whose epoch history misses the newest accepted master."""
        reg.last_seen_ms = self.clock_ms()
        with self._lock:
            if reg.broker_id == MASTER_ID and reg.role != "SLAVE" and reg.epochs:
                known = self._masters.get(reg.broker_name)
                mine = [(e["epoch"], e["storeId"]) for e in reg.epochs]
                if known is not None and (known["epoch"], known["storeId"]) not in mine:
                    return {"fenced": True, "master": dict(known)}
                newest = {"epoch": reg.epochs[-1]["epoch"], "storeId": reg.epochs[-1]["storeId"]}
                if newest != known:
                    if self.kv_config_path is not None:
                        # persisted before it is believed: a crash right after a
                        # promotion's registration must not forget the new master
                        _save_masters(self.kv_config_path, {**self._masters,
                                                            reg.broker_name: newest})
                    self._masters[reg.broker_name] = newest
            self._brokers[(reg.broker_name, reg.broker_id)] = reg
        return None

    def master_epoch(self, broker_name: str) -> dict | None:
        """The newest master writer accepted for ``broker_name`` ({epoch, storeId})."""
        with self._lock:
            known = self._masters.get(broker_name)
            return dict(known) if known else None

    def unregister(self, broker_name: str, broker_id: int) -> bool:
        with self._lock:
            return self._brokers.pop((broker_name, broker_id), None) is not None

    def _alive(self, reg: BrokerRegistration, now_ms: int) -> bool:
        return now_ms - reg.last_seen_ms < self.broker_expiry_ms

    def expire(self) -> list[str]:
        """Drop brokers silent for ``broker_expiry_ms``; returns their names."""
        now = self.clock_ms()
        with self._lock:
            dead = [k for k, r in self._brokers.items() if not self._alive(r, now)]
            for k in dead:
                del self._brokers[k]
        return [f"{name}#{bid}" for name, bid in dead]

    def brokers(self) -> list[BrokerRegistration]:
        """Live brokers, sorted by (name, id)."""
        now = self.clock_ms()
        with self._lock:
            return [r for _, r in sorted(self._brokers.items()) if self._alive(r, now)]

    def route(self, topic: str) -> list[dict]:
        """Every queue of ``topic`` on live brokers: dicts with brokerName,
        brokerId, endpoint, queueId, perm. Empty if no live broker has it."""
        out = []
        for reg in self.brokers():
            conf = reg.topics.get(topic)
            if conf is None:
                continue
            n = max(conf["readQueueNums"], conf["writeQueueNums"])
            for qid in range(n):
                out.append({"brokerName": reg.broker_name, "brokerId": reg.broker_id,
                            "cluster": reg.cluster, "endpoint": reg.endpoint, "queueId": qid,
                            "perm": conf["perm"], "readable": qid < conf["readQueueNums"],
                            "writable": qid < conf["writeQueueNums"]})
        out.sort(key=lambda q: (q["brokerName"], q["brokerId"] != MASTER_ID, q["queueId"]))
        return out

    def clusters(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for reg in self.brokers():
            out.setdefault(reg.cluster, [])
            if reg.broker_name not in out[reg.cluster]:
                out[reg.cluster].append(reg.broker_name)
        return out


def _load_masters(path: str) -> dict[str, dict]:
    """The persisted fencing memory ({} when the file does not exist yet)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise InvalidConfigError(
            f"kvConfigPath {path}: cannot read the NameServer's saved master epochs ({e}); "
            "repair or remove the file (removing it forgets which master is newest)") from None
    masters = data.get("masters") if isinstance(data, dict) else None
    if not isinstance(masters, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("epoch"), int)
            and isinstance(v.get("storeId"), str) for v in masters.values()):
        raise InvalidConfigError(
            f"kvConfigPath {path}: expected {{\"masters\": {{name: {{epoch, storeId}}}}}}; "
            "repair or remove the file")
    return {str(k): {"epoch": v["epoch"], "storeId": v["storeId"]} for k, v in masters.items()}


def _save_masters(path: str, masters: dict[str, dict]) -> None:
    """Write the fencing memory so a power loss leaves it whole, old or new
    (:func:`~sparkmq.durable.replace_durably`)."""
    makedirs_durably(os.path.dirname(os.path.abspath(path)))
    replace_durably(path, json.dumps({"masters": masters}, sort_keys=True).encode())
