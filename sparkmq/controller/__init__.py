"""Controller mode (RocketMQ 5): a Raft group that owns each broker group's master,
master epoch and SyncStateSet (``state.py``), its HTTP API (``server.py``) and a
client (``client.py``). Run it standalone (``sparkmq controller -c FILE``) or inside
the NameServers (``enableControllerInNamesrv=true`` in namesrv.properties).

Properties (RocketMQ's names): ``controllerDLegerPeers`` (``n0-host:port;...``, the
Raft ports), ``controllerDLegerSelfId`` (``n0``), ``controllerStorePath`` (the Raft
journal), ``controllerListenPort`` (the HTTP API brokers use as ``controllerAddr``),
``clusterSecret``/``clusterSecretFile`` (signs requests, encrypts Raft traffic),
``controllerLeaseMs``/``controllerLeaseGraceMs``.
"""
from __future__ import annotations


def from_properties(props: dict, host: str = "127.0.0.1"):
    """A :class:`~sparkmq.controller.server.Controller` configured by ``props``."""
    from .server import DEFAULT_GRACE_MS, DEFAULT_LEASE_MS, Controller
    return Controller(self_id=str(props.get("controllerDLegerSelfId") or ""),
                      peers=str(props.get("controllerDLegerPeers") or ""), host=host,
                      port=int(props.get("controllerListenPort") or 0),
                      store_path=props.get("controllerStorePath") or None,
                      cluster_secret=props.get("clusterSecret") or None,
                      cluster_secret_file=props.get("clusterSecretFile") or None,
                      lease_ms=int(props.get("controllerLeaseMs") or DEFAULT_LEASE_MS),
                      grace_ms=int(props.get("controllerLeaseGraceMs") or DEFAULT_GRACE_MS))


def main(argv: list[str] | None = None) -> int:
    """``sparkmq controller -c controller.properties``: run one controller node until
    SIGINT/SIGTERM."""
    import argparse
    import logging
    import sys

    from ..errors import SparkMQError
    from ..properties import load_properties
    p = argparse.ArgumentParser(prog="sparkmq controller", description="run a controller node")
    p.add_argument("-c", "--config", required=True, help="controller.properties")
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ..lifecycle import StopSignals
    stop = StopSignals()
    try:
        ctl = from_properties(load_properties(args.config), host=args.host).start()
    except (SparkMQError, OSError) as e:
        print(f"sparkmq controller: {e}", file=sys.stderr)
        return 1
    print(f"sparkmq controller listening on {ctl.address}", flush=True)
    from .. import heap
    heap.settle()        # the start-up heap out of the collector's full passes (sparkmq.heap)
    stop.wait()
    ctl.stop()
    return 0
