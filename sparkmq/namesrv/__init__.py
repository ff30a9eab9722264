"""The NameServer: the routing registry brokers register with (HTTP/JSON on loopback).

Run it with ``python -m sparkmq.namesrv -p 9876`` (or ``-c conf/namesrv.properties``);
:func:`main` is the entry point ``sparkmq namesrv`` calls.
"""
from __future__ import annotations

from .client import NameServerClient, parse_addresses
from .registry import BrokerRegistration, RouteRegistry
from .server import DEFAULT_PORT, NameServer

__all__ = ["NameServer", "NameServerClient", "RouteRegistry", "BrokerRegistration",
           "DEFAULT_PORT", "parse_addresses", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run a NameServer until SIGINT/SIGTERM. Options: ``-p PORT``, ``-c FILE``
    (properties: listenPort, brokerExpiryMs, scanIntervalMs, kvConfigPath, clusterSecret,
    clusterSecretFile), ``--host``, ``--kv-config-path``, ``--cluster-secret-file``."""
    import argparse
    import logging
    import sys

    from ..properties import load_properties

    p = argparse.ArgumentParser(prog="sparkmq namesrv", description="run a NameServer")
    p.add_argument("-c", "--config", help="namesrv.properties file")
    p.add_argument("-p", "--port", type=int, help=f"listen port (default {DEFAULT_PORT})")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--kv-config-path",
                   help="file where the newest master of each broker name is kept (master "
                        "fencing survives a restart); default: the kvConfigPath property, "
                        "else kept in memory only")
    p.add_argument("--cluster-secret-file",
                   help="file holding the secret brokers sign registrations with (default: "
                        "clusterSecret/clusterSecretFile properties, SPARKMQ_CLUSTER_SECRET, "
                        "else ~/.sparkmq/cluster.secret, made at the first start)")
    args = p.parse_args(argv)
    props = load_properties(args.config) if args.config else {}
    port = args.port if args.port is not None else int(props.get("listenPort", DEFAULT_PORT))
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kv_path = args.kv_config_path or props.get("kvConfigPath") or None
    from ..errors import SparkMQError
    try:
        srv = NameServer(host=args.host, port=port,
                         broker_expiry_ms=int(props.get("brokerExpiryMs", 120_000)),
                         scan_interval_ms=int(props.get("scanIntervalMs", 10_000)),
                         kv_config_path=kv_path,
                         cluster_secret=props.get("clusterSecret") or None,
                         cluster_secret_file=(args.cluster_secret_file
                                              or props.get("clusterSecretFile") or None))
    except SparkMQError as e:
        print(f"sparkmq namesrv: {e}", file=sys.stderr)
        return 1
    if kv_path is None:
        logging.getLogger("sparkmq.namesrv").warning(
            "no kvConfigPath: which master is newest is kept in memory only; after a restart "
            "this NameServer cannot fence an old master until the new one registers")
    from ..lifecycle import StopSignals
    stop = StopSignals()
    try:
        srv.start()
    except OSError as e:
        print(f"sparkmq namesrv: cannot listen on {args.host}:{port}: {e}", file=sys.stderr)
        return 1
    print(f"sparkmq NameServer listening on {srv.address}", flush=True)
    controller = None
    if str(props.get("enableControllerInNamesrv", "")).lower() == "true":
        from ..controller import from_properties    # RocketMQ 5: the controller inside
        controller = from_properties(props, host=args.host).start()
        print(f"sparkmq controller listening on {controller.address}", flush=True)
    from .. import heap
    heap.settle()        # the start-up heap out of the collector's full passes (sparkmq.heap)
    stop.wait()
    if controller is not None:
        controller.stop()
    srv.stop()
    return 0
