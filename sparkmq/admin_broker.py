"""``sparkmq admin cluster list`` and ``broker status | ha | promote``: the cluster as the
NameServers see it, and one broker's state, replication and promotion through its admin
port (``--broker``)."""
from __future__ import annotations

from .errors import SparkMQError


def _emit(args, payload, columns=None):
    from .admin import _emit as emit
    return emit(args, payload, columns)


def _http(args, path, body=None):
    from .admin import _http as http
    return http(args, path, body)


def _table(rows, columns=None):
    from .admin import _table as table
    return table(rows, columns)


def _namesrv(args):
    from .admin import _namesrv as namesrv
    return namesrv(args)


def cluster_list(args) -> None:
    brokers = _namesrv(args).brokers()
    if brokers is None:
        raise SparkMQError(f"no NameServer of {args.namesrv} answered")
    rows = [{"cluster": b.get("cluster"), "brokerName": b.get("brokerName"),
             "brokerId": b.get("brokerId"), "role": b.get("role"), "endpoint": b.get("endpoint"),
             "topics": len(b.get("topics") or {})} for b in brokers]
    _emit(args, rows)


def broker_status(args) -> None:
    if not args.broker:
        raise SparkMQError("broker status needs --broker http://host:adminPort")
    _emit(args, _http(args, "/status"))


def broker_ha(args) -> None:
    """Replication progress: a master's replicas (acked offset, lag) or a replica's link."""
    if not args.broker:
        raise SparkMQError("broker ha needs --broker http://host:adminPort")
    ha = _http(args, "/status").get("ha") or {}
    if args.json:
        _emit(args, ha)
        return
    if ha.get("role") == "replica":
        _emit(args, [{k: ha.get(k) for k in ("role", "connected", "offset", "masterOffset",
                                               "lagBytes", "masterEpoch", "lastError")}])
    else:
        print(f"master epoch {ha.get('epoch')}  offset {ha.get('offset')}")
        rows = ha.get("replicas") or []
        print(_table(rows, ["brokerId", "address", "ackedOffset", "lagBytes"])
              if rows else "no replica attached")


def broker_promote(args) -> None:
    """``sparkmq admin --broker URL promote``: make a running replica the master.
    ``--store PATH``: promote a stopped replica's store (then start it with
    ``sparkmq broker`` as brokerId 0)."""
    if args.broker:
        _emit(args, _http(args, "/admin/promote", {"role": args.role}))
        return
    if not args.store:
        raise SparkMQError("promote needs --broker http://host:adminPort of a running replica, "
                           "or --store PATH of a stopped one")
    from .ha.replica import promote
    from .log.store import Store
    store = Store.open(args.store, create=False, start_services=False)
    try:
        epoch = promote(store, None, 0)
        out = {"store": args.store, "epoch": epoch, "offset": store.commitlog.written_offset}
    finally:
        store.close()
    _emit(args, out)
