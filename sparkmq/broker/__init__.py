"""The broker daemon: a store served over the RocketMQ 5.x gRPC MessagingService.

Run it with ``python -m sparkmq.broker -c conf/broker-a.properties``;
:func:`main` is the entry point ``sparkmq broker`` calls. See
:mod:`sparkmq.broker.broker` for the lifecycle and the module map, and
:mod:`sparkmq.broker.grpc_service` for the protocol mapping.
"""
from __future__ import annotations

from .. import heap
from ..lifecycle import StopSignals
from .broker import Broker, BrokerState
from .config import BrokerConfig, load_properties

__all__ = ["Broker", "BrokerState", "BrokerConfig", "load_properties", "main"]


def main(argv: list[str] | None = None, *, replica: bool = False) -> int:
    """Run a broker until SIGINT/SIGTERM. ``-c FILE`` (properties), ``-n namesrvAddr``,
    ``-p listenPort``, ``--admin-port``, ``--store`` override the file. ``replica``
    (``sparkmq replica``): the config must describe a replica (brokerRole=SLAVE,
    brokerId > 0); brokerRole defaults to SLAVE."""
    import argparse
    import logging
    import sys

    prog = "sparkmq replica" if replica else "sparkmq broker"
    p = argparse.ArgumentParser(prog=prog, description="run a sparkmq " +
                                ("replica (follows its master's CommitLog)" if replica else "broker"))
    p.add_argument("-c", "--config", help="broker.properties file (RocketMQ names)")
    p.add_argument("-n", "--namesrv", help="NameServer addresses, 'h:p;h:p'")
    p.add_argument("-p", "--port", type=int, help="gRPC listenPort")
    p.add_argument("--admin-port", type=int, help="HTTP adminPort")
    p.add_argument("--admin-listen-address",
                   help="adminListenAddress (default 127.0.0.1: the admin port on loopback only)")
    p.add_argument("--store", help="storePathRootDir")
    args = p.parse_args(argv)
    from ..errors import SparkMQError
    try:
        props = load_properties(args.config) if args.config else {}
    except SparkMQError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if replica:
        props.setdefault("brokerRole", "SLAVE")
        if props["brokerRole"] != "SLAVE":
            print(f"{prog}: the config says brokerRole={props['brokerRole']}; a replica needs "
                  "brokerRole=SLAVE (use 'sparkmq broker' for a master)", file=sys.stderr)
            return 2
    for key, val in (("namesrvAddr", args.namesrv), ("listenPort", args.port),
                     ("adminPort", args.admin_port), ("storePathRootDir", args.store),
                     ("adminListenAddress", args.admin_listen_address)):
        if val is not None:
            props[key] = str(val)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = StopSignals()
    try:
        broker = Broker(BrokerConfig.from_properties(props))
        broker.start()
    except (SparkMQError, OSError) as e:
        print(f"{prog}: cannot start: {e}", file=sys.stderr)
        return 1
    heap.settle()        # the start-up heap out of the collector's full passes (sparkmq.heap)
    flight = f"Arrow Flight {broker.flight.endpoint}, " if broker.flight is not None else ""
    print(f"{prog} {broker.config.broker_name}#{broker.broker_id} running: gRPC {broker.endpoint}, "
          f"{flight}admin {broker.admin_url}", flush=True)
    print(admin_token_banner(broker), flush=True)
    stop.wait()
    broker.stop()
    return 0


def admin_token_banner(broker) -> str:
    """What a broker daemon prints once at start (as Jupyter prints its token): how to
    call its admin endpoint, with the token."""
    where = (f"kept in {broker.admin_token_file} (mode 0600)" if broker.admin_token_file
             else "from SPARKMQ_ADMIN_TOKEN")
    return (f"    admin token ({where}):\n"
            f"        {broker.admin_token}\n"
            f"    e.g. curl -H 'Authorization: Bearer {broker.admin_token}' "
            f"{broker.admin_url}/status\n"
            f"    or   SPARKMQ_ADMIN_TOKEN=... sparkmq admin --broker {broker.admin_url} "
            "broker status")
