"""``GET /console/api/summary``: the broker as JSON for the cluster console
(:mod:`.cluster`, ``sparkmq console --namesrv``), which asks every broker of a cluster
for it with the admin token. Read only; same guard as every console page.

The answer: ``broker`` (cluster, name, id, role, state, fenced, epoch, HA lag in bytes:
the greatest of the attached replicas' on a master, its own on a replica),
``topics`` (name -> kind, message type, queues, min and max offset per queue, messages
retained, in/out messages per second from :mod:`.samples`) and ``groups`` (name ->
lag summed over its queues, clients online).
"""
from __future__ import annotations

import json


def ha_lag(ha: dict) -> int | None:
    """Replication lag in CommitLog bytes: a replica's own, or a master's worst
    replica's; None without replication."""
    if not ha:
        return None
    if ha.get("role") == "replica":
        return ha.get("lagBytes")
    lags = [r.get("lagBytes") or 0 for r in ha.get("replicas") or []]
    return max(lags) if lags else None


def summary_of(broker) -> dict:
    from ..log.progress import group_lag
    from ..log.topics import topic_message_type
    from .pages import group_names, topic_kind
    from .samples import ring_for
    st = broker.admin.status()
    ha = st.get("ha") or {}
    ring = ring_for(broker)
    now = ring.now()
    rates = ring.rates(now) if now is not None else {}
    store = broker.store
    topics = {}
    for name, conf in sorted(store.topics().items()):
        ranges = sorted(store.queue_ranges(name).items())
        rate_in, rate_out = rates.get(name, (0.0, 0.0)) if rates else (None, None)
        topics[name] = {"kind": topic_kind(name), "messageType": topic_message_type(conf),
                        "queues": max(conf.read_queue_nums, conf.write_queue_nums),
                        "minOffsets": {str(q): lo for (_, q), (lo, _) in ranges},
                        "maxOffsets": {str(q): hi for (_, q), (_, hi) in ranges},
                        "messages": sum(hi - lo for _, (lo, hi) in ranges),
                        "inPerSecond": rate_in, "outPerSecond": rate_out}
    online = broker.clients.groups()
    groups = {g: {"lag": sum(r["lag"] for r in group_lag(store, g)),
                  "clients": online.get(g, 0)} for g in group_names(broker)}
    return {"broker": {"cluster": st["cluster"], "brokerName": st["brokerName"],
                       "brokerId": st["brokerId"], "role": st["role"], "state": st["state"],
                       "fenced": st["fenced"],
                       "epoch": ha.get("epoch", ha.get("masterEpoch", store.epoch)),
                       "haLagBytes": ha_lag(ha), "endpoint": st["endpoint"]},
            "topics": topics, "groups": groups}


def summary(req):
    from . import Page
    return Page(200, json.dumps(summary_of(req.broker)), "application/json")


ROUTES = {"/console/api/summary": summary}
