"""``sparkmq admin controller …`` (RocketMQ 5's ``mqadmin getControllerMetaData``,
``getSyncStateSet``, ``electMaster``): the controllers' view of every broker group,
one group's SyncStateSet, and an operator's election (still only from the
SyncStateSet). ``--controller host:port;host:port`` names the controllers' HTTP
API (``controllerAddr``); writes are signed with the cluster secret."""
from __future__ import annotations

from .errors import SparkMQError


def _client(args):
    from .controller.client import ControllerClient
    if not args.controller:
        raise SparkMQError("this command needs --controller host:port[;host:port] "
                           "(the controllers' controllerAddr)")
    return ControllerClient(args.controller)


def _metadata(args) -> None:
    from .admin import _emit
    out = _client(args).metadata()
    if out is None:
        raise SparkMQError(f"no controller of {args.controller} answered")
    rows = [{"brokerName": name, "masterId": g["masterId"], "masterEpoch": g["masterEpoch"],
             "syncStateSet": g["syncStateSet"], "nodes": sorted(g["nodes"])}
            for name, g in sorted(out["groups"].items())]
    _emit(args, out if args.json else rows)


def _sync_state_set(args) -> None:
    from .admin import _emit
    out = _client(args).sync_state_set(args.broker_name)
    if out is None:
        raise SparkMQError(f"no controller of {args.controller} answered")
    _emit(args, out)


def _elect(args) -> None:
    from .admin import _emit
    out = _client(args).elect_master(args.broker_name, args.node_id)
    if out is None:
        raise SparkMQError("no majority of the controllers committed the election")
    code, body = out
    if code != 200:
        raise SparkMQError(f"election refused: {body.get('error')}")
    _emit(args, body)


def add_parsers(sub, parent) -> None:
    c = sub.add_parser("controller", help="controller mode: metadata, SyncStateSet, election")
    c.add_argument("--controller", help="the controllers' host:port[;host:port]")
    ops = c.add_subparsers(dest="op", required=True)
    ops.add_parser("metadata").set_defaults(fn=_metadata)
    s = ops.add_parser("sync-state-set")
    s.add_argument("--broker-name", required=True)
    s.set_defaults(fn=_sync_state_set)
    e = ops.add_parser("elect-master")
    e.add_argument("--broker-name", required=True)
    e.add_argument("--node-id", type=int, required=True, help="a SyncStateSet member's brokerId")
    e.set_defaults(fn=_elect)
