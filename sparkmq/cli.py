"""The ``sparkmq`` command.

Subcommands that inspect a store (read-only; safe while a writer runs):

* ``sparkmq topics STORE``            topics and queues with min/max offsets
* ``sparkmq log STORE``               transaction-log versions
* ``sparkmq print STORE -t TOPIC``    messages of a queue (or ``--id`` / ``--key``)
* ``sparkmq create-topic STORE NAME`` create a topic (takes the writer lease briefly)
* ``sparkmq demo``                    the main job on an embedded default
* ``sparkmq tls selfsigned --out DIR`` a self-signed key and certificate for development

The web console of a whole cluster: ``sparkmq console --namesrv host:9876 [--port P]``.

Daemons: ``sparkmq namesrv -p 9876``, ``sparkmq broker -c conf/broker-a.properties`` and
``sparkmq replica -c conf/broker-a-s.properties``
(their own option parsers; ``--help`` lists them).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys

from .errors import SparkMQError


def _ts(ms: int | None) -> str:
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_topics(args) -> int:
    from .log.reader import Snapshot
    snap = Snapshot.load(args.store, version=args.version)
    rows = []
    for name in snap.topic_names():
        conf = snap.topics()[name]
        for (t, q), (lo, hi) in sorted(snap.queue_ranges(name).items()):
            rows.append([t, q, lo, hi, hi - lo, conf.perm])
    if args.json:
        print(json.dumps([dict(zip(["topic", "queue", "min", "max", "count", "perm"], r))
                          for r in rows]))
        return 0
    print(f"store {args.store}  version {snap.version}  ({_ts(snap.timestamp_ms)} UTC)")
    print(_table(rows, ["topic", "queue", "min_offset", "max_offset", "messages", "perm"])
          if rows else "no topics")
    return 0


def cmd_log(args) -> int:
    from .log.fs import StoreFS
    from .log.actions import AddFile, CommitInfo
    from .log.txlog import TransactionLog
    tl = TransactionLog(StoreFS(args.store))
    versions = tl.versions()
    if not versions:
        print(f"no store at {args.store}", file=sys.stderr)
        return 1
    shown = versions[-args.limit:] if args.limit else versions
    rows = []
    for v in shown:
        actions = tl.read_actions(v)
        info = next((a for a in actions if isinstance(a, CommitInfo)), CommitInfo())
        kinds: dict[str, int] = {}
        for a in actions:
            k = f"add:{a.kind}" if isinstance(a, AddFile) else a.KIND
            if k != CommitInfo.KIND:
                kinds[k] = kinds.get(k, 0) + 1
        rows.append([v, _ts(info.timestamp or None), info.operation or "?",
                     " ".join(f"{k}={n}" for k, n in sorted(kinds.items()))])
    if args.json:
        print(json.dumps([dict(zip(["version", "time", "operation", "actions"], r)) for r in rows]))
        return 0
    print(_table(rows, ["version", "time (UTC)", "operation", "actions"]))
    return 0


def cmd_print(args) -> int:
    from .log.reader import Snapshot
    snap = Snapshot.load(args.store, version=args.version)
    if args.id:
        msgs = [m for m in [snap.lookup(args.id)] if m is not None]
    elif args.key:
        msgs = snap.query_by_key(args.topic, args.key, max_results=args.max)
    else:
        if not args.topic:
            print("give --topic (and --queue, --offset), or --id, or --key with --topic",
                  file=sys.stderr)
            return 2
        msgs = snap.read(args.topic, args.queue, args.offset, args.max)
    for m in msgs:
        body = m.body.decode("utf-8", "replace")
        if len(body) > args.body_chars:
            body = body[:args.body_chars] + "..."
        print(f"{m.topic}/{m.queue_id}@{m.queue_offset} id={m.message_id} "
              f"stored={_ts(m.store_timestamp)} tags={m.tags or ''} keys={','.join(m.keys)} "
              f"body={body!r}")
    if not msgs:
        print("no messages")
    return 0


def cmd_create_topic(args) -> int:
    from .log.store import Store
    with Store.open(args.store, start_services=False) as store:
        conf = store.create_topic(args.name, read_queue_nums=args.queues,
                                  write_queue_nums=args.queues)
    print(f"created topic {conf.name} (id {conf.id}, {args.queues} queues)")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(store_path=args.store, messages=args.messages, spark=not args.no_spark,
                    online=not args.no_online)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sparkmq", description="sparkmq: a RocketMQ-style log stored as a Spark table")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("namesrv", help="run a NameServer (sparkmq namesrv --help)")
    sub.add_parser("broker", help="run a broker daemon (sparkmq broker --help)")
    sub.add_parser("replica", help="run a replica of a broker (sparkmq replica --help)")
    sub.add_parser("controller", help="run a controller node (sparkmq controller --help)")
    sub.add_parser("admin", help="mqadmin-style commands (sparkmq admin --help)")
    sub.add_parser("tls", help="development TLS material (sparkmq tls selfsigned --help)")
    sub.add_parser("console", help="web console of a cluster: sparkmq console --namesrv ADDR")

    s = sub.add_parser("topics", help="list topics and queues with their offsets")
    s.add_argument("store")
    s.add_argument("--version", type=int, default=None, help="read this log version")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_topics)

    s = sub.add_parser("log", help="show the transaction log's versions")
    s.add_argument("store")
    s.add_argument("--limit", type=int, default=30, help="newest N versions (0: all)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_log)

    s = sub.add_parser("print", help="print messages")
    s.add_argument("store")
    s.add_argument("-t", "--topic")
    s.add_argument("-q", "--queue", type=int, default=0)
    s.add_argument("-o", "--offset", type=int, default=0)
    s.add_argument("-n", "--max", type=int, default=20)
    s.add_argument("--id", help="look a message up by its id")
    s.add_argument("--key", help="messages of --topic with this key")
    s.add_argument("--version", type=int, default=None)
    s.add_argument("--body-chars", type=int, default=80)
    s.set_defaults(fn=cmd_print)

    s = sub.add_parser("create-topic", help="create a topic")
    s.add_argument("store")
    s.add_argument("name")
    s.add_argument("--queues", type=int, default=4)
    s.set_defaults(fn=cmd_create_topic)

    s = sub.add_parser("demo", help="run the main job on an embedded default")
    s.add_argument("--store", default="demo-store", help="folder for the store (recreated)")
    s.add_argument("--messages", type=int, default=5000)
    s.add_argument("--no-spark", action="store_true", help="skip the Spark part")
    s.add_argument("--no-online", action="store_true",
                   help="skip the NameServer/broker/online-client part")
    s.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (``sparkmq print ... | head``): stop quietly; point
        # stdout at /dev/null so the interpreter's final flush does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "replica":
        from .broker import main as broker_main
        return broker_main(argv[1:], replica=True) or 0
    if argv and argv[0] == "console":
        from .console.cluster import main as console_main
        return console_main(argv[1:]) or 0
    if argv and argv[0] in ("broker", "namesrv", "admin", "tls", "controller"):
        if argv[0] == "broker":
            from .broker import main as daemon_main
        elif argv[0] == "admin":
            from .admin import main as daemon_main
        elif argv[0] == "tls":
            from .tls import main as daemon_main
        elif argv[0] == "controller":
            from .controller import main as daemon_main
        else:
            from .namesrv import main as daemon_main
        return daemon_main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.fn(args)
    except SparkMQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
