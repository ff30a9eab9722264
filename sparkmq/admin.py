"""``sparkmq admin`` — mqadmin-style administration (``python -m sparkmq.admin ...``).

Targets (global options before the command):
- ``--store URL``: the store itself. Read commands open it read-only (safe next to a live
  broker holding the writer lease: they see its last published version). Write commands
  (topic create/update/delete, group reset-offset) open it writable and are refused with a
  clear message while a broker holds the lease: then use ``--broker``.
- ``--broker URL``: a broker's admin HTTP endpoint (``http://127.0.0.1:8082``): broker status;
  topic create through the broker. It needs the broker's admin token: ``--token``, else
  ``SPARKMQ_ADMIN_TOKEN``, else ``--token-file``, else ``admin.token`` beside ``--store``
  (``sparkmq.admin_auth``); ``--tls-ca FILE`` trusts an https endpoint's certificate.
- ``--namesrv host:port[;host:port]``: cluster list, topic route.

Output: aligned text tables, or ``--json`` (one JSON document on stdout). Exit status 0 on
success, 1 on an error (message on stderr naming what was wrong), 2 on bad usage.
``main(argv)`` is the entry point (``sparkmq admin`` calls it).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any, Sequence

from . import admin_acl, admin_controller, admin_verify
from .admin_broker import broker_ha, broker_promote, broker_status, cluster_list
from .log.topics import message_type_attributes, topic_message_type
from .errors import SparkMQError

__all__ = ["main"]


# ---------------------------------------------------------------- output
def _table(rows: list[dict], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(none)"
    cols = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bytes):
        text = v.decode("utf-8", "replace")
        return text if len(text) <= 60 else text[:57] + "..."
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return str(v)


def _emit(args, payload, columns=None) -> None:
    if args.json:
        print(json.dumps(payload, default=_json_default, indent=2))
    elif isinstance(payload, list):
        print(_table(payload, columns))
    elif isinstance(payload, dict):
        print(_table([{"key": k, "value": v} for k, v in payload.items()]))
    else:
        print(payload)


def _json_default(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


# ---------------------------------------------------------------- targets
def _store(args, *, write: bool = False):
    from .log.store import Store
    if not args.store:
        raise SparkMQError("this command needs --store URL (the broker's storePathRootDir)")
    if write:
        return Store.open(args.store, mode="w", create=False)
    return Store.open(args.store, mode="r", create=False)


def _http(args, path: str, body: dict | None = None) -> Any:
    """Call the broker admin endpoint ``args.broker`` with its token (``--token``,
    SPARKMQ_ADMIN_TOKEN, ``--token-file``, or the token file beside ``--store``)."""
    from .admin_auth import MISSING_TOKEN_HINT, auth_headers, client_ssl_context, find_token
    url = args.broker
    token = find_token(token=args.token, token_file=args.token_file, store_url=args.store)
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data,
                                 headers={"Content-Type": "application/json",
                                          **auth_headers(token)})
    try:
        with urllib.request.urlopen(req, timeout=10, context=client_ssl_context(args.tls_ca)) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        hint = f"; {MISSING_TOKEN_HINT}" if e.code == 401 else ""
        raise SparkMQError(f"{url}{path} answered {e.code}: "
                           f"{e.read().decode(errors='replace')}{hint}")
    except OSError as e:
        raise SparkMQError(f"cannot reach {url}{path}: {e}") from None


def _namesrv(args):
    from .namesrv import NameServerClient
    if not args.namesrv:
        raise SparkMQError("this command needs --namesrv host:port")
    return NameServerClient(args.namesrv)


def _msg_row(m) -> dict:
    return {"topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset,
            "messageId": m.unique_key or m.message_id, "tags": m.tags, "keys": ",".join(m.keys),
            "storeTimestamp": m.store_timestamp, "deliveryTimestamp": m.delivery_timestamp,
            "properties": dict(m.properties), "body": m.body}


# ---------------------------------------------------------------- topic
def topic_list(args) -> None:
    with _store(args) as s:
        rows = [{"topic": name, "readQueues": c.read_queue_nums,
                 "writeQueues": c.write_queue_nums, "perm": c.perm,
                 "messageType": topic_message_type(c),
                 "messages": sum(s.max_offset(name, q) - s.min_offset(name, q)
                                 for q in range(c.read_queue_nums))}
                for name, c in sorted(s.topics().items())]
    _emit(args, rows)


def topic_status(args) -> None:
    with _store(args) as s:
        c = _topic_conf(s, args.topic)
        rows = [{"queueId": q, "minOffset": s.min_offset(args.topic, q),
                 "maxOffset": s.max_offset(args.topic, q)} for q in range(c.read_queue_nums)]
    _emit(args, rows)


def _topic_conf(s, topic: str) -> dict:
    c = s.topics().get(topic)
    if c is None:
        raise SparkMQError(f"topic {topic!r} does not exist in this store; see 'topic list'")
    return c


def _retention_args(args) -> dict:
    """--retention-hours / --retention-bytes as store arguments (0 = broker default)."""
    out = {}
    if args.retention_hours is not None:
        if args.retention_hours < 0:
            raise SparkMQError("--retention-hours must be >= 0 (0 = the broker default)")
        out["retention_ms"] = int(round(args.retention_hours * 3_600_000))
        if args.retention_hours and not out["retention_ms"]:
            raise SparkMQError("--retention-hours is below one millisecond")
    if args.retention_bytes is not None:
        if args.retention_bytes < 0:
            raise SparkMQError("--retention-bytes must be >= 0 (0 = no size limit)")
        out["retention_bytes"] = args.retention_bytes
    return out


def topic_create(args) -> None:
    ret = _retention_args(args)
    if args.broker:
        body = {"name": args.topic, **({"queueNums": args.queues} if args.queues else {}),
                **({"messageType": args.message_type} if args.message_type else {}),
                **({"retentionMs": ret["retention_ms"]} if "retention_ms" in ret else {}),
                **({"retentionBytes": ret["retention_bytes"]} if "retention_bytes" in ret
                   else {})}
        return _emit(args, _http(args, "/admin/topics", body))
    with _store(args, write=True) as s:
        c = s.create_topic(args.topic, read_queue_nums=args.queues, write_queue_nums=args.queues,
                           attributes=message_type_attributes(args.message_type), **ret)
    _emit(args, {"topic": args.topic, **c.body()})


def topic_update(args) -> None:
    ret = _retention_args(args)
    if args.broker:
        body = {"name": args.topic, "update": True,
                **({"readQueueNums": args.read_queues} if args.read_queues else {}),
                **({"writeQueueNums": args.write_queues} if args.write_queues else {}),
                **({"perm": args.perm} if args.perm is not None else {}),
                **({"retentionMs": ret["retention_ms"]} if "retention_ms" in ret else {}),
                **({"retentionBytes": ret["retention_bytes"]} if "retention_bytes" in ret
                   else {})}
        return _emit(args, _http(args, "/admin/topics", body))
    with _store(args, write=True) as s:
        c = s.update_topic(args.topic, read_queue_nums=args.read_queues,
                           write_queue_nums=args.write_queues, perm=args.perm, **ret)
    _emit(args, {"topic": args.topic, **c.body()})


def topic_retention(args) -> None:
    """Per topic: its retention, what the next pass removes and when, and the consumer
    groups (broker consumers and Spark queries) that still need what goes."""
    import datetime as dt
    from .log.retention import describe
    from .log.store import Store
    if args.broker:    # the broker knows its fileReservedTime / deleteWhen and unpublished data
        report = _http(args, "/admin/retention")
        if args.topic and args.topic not in {t["topic"] for t in report["topics"]}:
            raise SparkMQError(f"topic {args.topic!r} does not exist on {args.broker}")
    else:
        if not args.store:
            raise SparkMQError("topic retention needs --broker URL or --store URL")
        conf = {k: v for k, v in (("fileReservedTime", args.file_reserved_time),
                                  ("deleteWhen", args.delete_when)) if v is not None}
        with Store.open(args.store, mode="r", create=False, **conf) as s:
            if args.topic:
                _topic_conf(s, args.topic)
            report = describe(s.retention_plan(detail=True), s)
    if args.topic:
        report["topics"] = [t for t in report["topics"] if t["topic"] == args.topic]
        report["warnings"] = [w for w in report["warnings"] if w["topic"] == args.topic]
    if args.json:
        return _emit(args, report)

    def when(ms):
        return "-" if ms is None else dt.datetime.fromtimestamp(ms / 1000).strftime(
            "%Y-%m-%d %H:%M")
    rows = [{"topic": t["topic"],
             "retention": f"{t['retentionHours']:g}h" + (
                 f", {t['retentionBytesPerQueue']} B/queue" if t["retentionBytesPerQueue"]
                 else "") + (" (broker)" if t["source"] == "broker" else ""),
             "messages": t["messages"], "removableNow": t["removableNow"],
             "nextRemoval": when(t["nextRemovalTime"]),
             "heldBy": t["heldBySegmentOf"], "laggingGroups": ",".join(t["laggingGroups"]) or None}
            for t in report["topics"]]
    print(_table(rows))
    print(f"next retention run: {when(report['nextRunTime'])}; segments it removes: "
          f"{len(report['removeSegments'])}"
          + (f"; oldest kept segment held by topic {report['segmentHeldBy']}"
             if report["segmentHeldBy"] else ""))
    for w in report["warnings"]:
        print(f"WARNING: {w['text']}")


def topic_delete(args) -> None:
    with _store(args, write=True) as s:
        s.delete_topic(args.topic)
    _emit(args, {"deleted": args.topic})


def topic_route(args) -> None:
    queues = _namesrv(args).route(args.topic)
    if queues is None:
        raise SparkMQError(f"no NameServer of {args.namesrv} answered")
    _emit(args, queues, ["brokerName", "brokerId", "endpoint", "queueId", "perm", "readable",
                         "writable"])


# ---------------------------------------------------------------- consumer groups
def _group_row(group: str, conf, has_offsets: bool) -> dict:
    """One row of ``group list``: RocketMQ's defaults where no config sets a field."""
    return {"group": group, "configured": conf is not None, "hasOffsets": has_offsets,
            "retryMaxTimes": conf.retry_max_times if conf else None,
            "consumeEnable": conf.receives_allowed if conf else True,
            "consumeBroadcastEnable": conf.broadcast_allowed if conf else True,
            "consumeMessageOrderly": conf.orderly if conf else False,
            "groupRetryPolicy": conf.group_retry_policy if conf and conf.group_retry_policy
            else None}


def group_list(args) -> None:
    """Groups with a config (``group create``) or with recorded offsets (broker
    consumers, Spark queries' consumerGroup)."""
    with _store(args) as s:
        with_offsets = {g for (g, _, _, _) in s.state.consumer_offsets}
        confs = s.subscription_groups()
    rows = [_group_row(g, confs.get(g), g in with_offsets)
            for g in sorted(with_offsets | set(confs))]
    _emit(args, rows)


def _retry_policy(text: str) -> dict:
    """argparse type of ``--retry-policy`` (log/retrypolicy.py)."""
    import argparse
    from .log.retrypolicy import parse_policy_arg
    try:
        return parse_policy_arg(text)
    except SparkMQError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def group_create(args) -> None:
    """Create or replace a subscription group config (mqadmin updateSubGroup)."""
    body = {"name": args.group, "consumeEnable": not args.disable,
            "consumeBroadcastEnable": not args.no_broadcast,
            "consumeMessageOrderly": args.orderly,
            **({"retryMaxTimes": args.retry_max_times} if args.retry_max_times is not None
               else {}),
            **({"groupRetryPolicy": args.retry_policy} if args.retry_policy else {})}
    if args.broker:
        return _emit(args, _http(args, "/admin/groups", body))
    with _store(args, write=True) as s:
        c = s.create_group(args.group, retry_max_times=args.retry_max_times,
                           consume_message_orderly=args.orderly,
                           consume_enable=not args.disable,
                           consume_broadcast_enable=not args.no_broadcast,
                           retry_policy=args.retry_policy)
    _emit(args, c.body())


def group_delete(args) -> None:
    """Delete a group's config and its recorded offsets (mqadmin deleteSubGroup)."""
    if args.broker:
        return _emit(args, _http(args, "/admin/groups",
                                 {"name": args.group, "delete": True,
                                  "keepOffsets": args.keep_offsets}))
    with _store(args, write=True) as s:
        s.delete_group(args.group, remove_offsets=not args.keep_offsets)
    _emit(args, {"deleted": args.group})


def group_progress(args) -> None:
    """Lag per (topic, queue) of a group: broker consumers and Spark queries alike (both
    record offsets in the store's log). ``--store`` reads the store; ``--broker`` asks
    the broker; ``--namesrv`` asks every master of the cluster (rows name the broker)."""
    from urllib.parse import quote
    from .log.progress import group_lag
    path = f"/admin/groups/progress?group={quote(args.group)}"
    if args.broker:
        rows = _http(args, path)["queues"]
    elif args.namesrv and not args.store:
        rows = []
        for b in _namesrv(args).brokers() or []:
            if b.get("brokerId") != 0 or not b.get("adminEndpoint"):
                continue
            url = f"{args.scheme}://{b['adminEndpoint']}"
            one = _http(argparse.Namespace(**{**vars(args), "broker": url}), path)
            rows += [{"brokerName": b.get("brokerName"), **r} for r in one["queues"]]
    else:
        with _store(args) as s:
            rows = group_lag(s, args.group)
    if not rows:
        raise SparkMQError(f"group {args.group!r} has no recorded offsets")
    if args.json:
        return _emit(args, {"group": args.group, "totalLag": sum(r["lag"] for r in rows),
                            "queues": rows})
    _emit(args, rows)
    print(f"total lag: {sum(r['lag'] for r in rows)}")


def group_reset_offset(args) -> None:
    """Set a group's offsets of one topic to the first message stored at/after a time."""
    with _store(args, write=True) as s:
        c = _topic_conf(s, args.topic)
        offsets = {(args.topic, q): s.offset_for_time(args.topic, q, args.timestamp)
                   for q in range(c.read_queue_nums)}
        s.commit_consumer_offsets(args.group, offsets)
    _emit(args, [{"topic": t, "queueId": q, "offset": o} for (t, q), o in offsets.items()])


# ---------------------------------------------------------------- messages
def message_by_id(args) -> None:
    from .log.find import find_message
    with _store(args) as s:
        m = find_message(s, args.id)
    if m is None:
        raise SparkMQError(f"no message with id {args.id} (removed by retention, or not "
                           "from this store)")
    _emit(args, _msg_row(m))


def message_by_key(args) -> None:
    with _store(args) as s:
        msgs = s.query_by_key(args.topic, args.key, max_results=args.max)
    _emit(args, [_msg_row(m) for m in msgs], _LIST_COLUMNS)


def message_by_offset(args) -> None:
    with _store(args) as s:
        msgs = s.read(args.topic, args.queue, args.offset, 1)
    if not msgs or msgs[0].queue_offset != args.offset:
        raise SparkMQError(f"no message at {args.topic}:{args.queue}:{args.offset}")
    _emit(args, _msg_row(msgs[0]))


_LIST_COLUMNS = ["queueId", "queueOffset", "messageId", "tags", "keys", "storeTimestamp",
                 "deliveryTimestamp", "body"]


def message_print(args) -> None:
    with _store(args) as s:
        start = args.offset if args.offset is not None else s.min_offset(args.topic, args.queue)
        msgs = s.read(args.topic, args.queue, start, args.count)
    _emit(args, [_msg_row(m) for m in msgs], _LIST_COLUMNS)


# ---------------------------------------------------------------- cluster / broker
def store_vacuum(args) -> None:
    """Delete unreferenced files older than the retention (``Store.vacuum``). Uses the
    store's newest version read-only, so it also runs next to a live broker."""
    from .log.store import Store
    url = args.store_url or args.store
    if not url:
        raise SparkMQError("vacuum needs the store: sparkmq admin vacuum <store URL>")
    if args.retain_hours is not None and args.retain_hours < 0:
        raise SparkMQError(f"--retain-hours must be 0 or more, got {args.retain_hours:g}")
    retention_ms = None if args.retain_hours is None else int(args.retain_hours * 3_600_000)
    with Store.open(url, mode="r", create=False) as s:
        result = s.vacuum(retention_ms=retention_ms, dry_run=args.dry_run, force=args.force)
    if args.json:
        return _emit(args, result.to_dict())
    verb = "would delete" if result.dry_run else "deleted"
    for rel in result.files:
        print(f"{verb} {rel}")
    print(f"vacuum {verb} {len(result.files)} files ({result.total_bytes} bytes) unreferenced "
          f"for more than {result.retention_ms / 3_600_000:g} h; {result.kept_young} younger "
          "unreferenced files kept")


# ---------------------------------------------------------------- parser
def _add_retention_options(c) -> None:
    c.add_argument("--retention-hours", type=float,
                   help="the topic's own retention time (0: back to fileReservedTime)")
    c.add_argument("--retention-bytes", type=int,
                   help="keep at most this many body bytes per queue (0: no size limit)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sparkmq admin", description=__doc__.split("\n")[0])
    p.add_argument("--store", help="store URL or path (read: read-only; write: needs the lease)")
    p.add_argument("--broker", help="broker admin URL, e.g. http://127.0.0.1:8082")
    p.add_argument("--namesrv", help="NameServer address(es) host:port[;host:port]")
    p.add_argument("--token", help="the broker's admin token (default: SPARKMQ_ADMIN_TOKEN, "
                                   "--token-file, or admin.token beside --store)")
    p.add_argument("--token-file", help="file holding the broker's admin token")
    p.add_argument("--tls-ca", help="CA/certificate file to trust for an https:// --broker "
                                    "(default: SPARKMQ_ADMIN_CA)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--scheme", default="http", choices=["http", "https"],
                   help="scheme of the brokers' admin ports found through --namesrv")
    sub = p.add_subparsers(dest="area", required=True)

    t = sub.add_parser("topic").add_subparsers(dest="cmd", required=True)
    t.add_parser("list").set_defaults(fn=topic_list)
    for name, fn in (("status", topic_status), ("delete", topic_delete), ("route", topic_route)):
        c = t.add_parser(name)
        c.add_argument("topic")
        c.set_defaults(fn=fn)
    c = t.add_parser("retention", help="per topic: what retention removes next and when")
    c.add_argument("topic", nargs="?")
    c.add_argument("--file-reserved-time", type=float,
                   help="with --store: the broker's fileReservedTime in hours (default 72)")
    c.add_argument("--delete-when", help="with --store: the broker's deleteWhen (default 04)")
    c.set_defaults(fn=topic_retention)
    c = t.add_parser("create")
    c.add_argument("topic")
    c.add_argument("--queues", type=int, default=None)
    c.add_argument("--message-type", type=str.upper, default=None,
                   choices=["NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"],
                   help="the message type the topic accepts (RocketMQ 5's message.type; "
                        "default: every type)")
    _add_retention_options(c)
    c.set_defaults(fn=topic_create)
    c = t.add_parser("update")
    c.add_argument("topic")
    c.add_argument("--read-queues", type=int)
    c.add_argument("--write-queues", type=int)
    c.add_argument("--perm", type=int)
    _add_retention_options(c)
    c.set_defaults(fn=topic_update)

    g = sub.add_parser("group").add_subparsers(dest="cmd", required=True)
    g.add_parser("list").set_defaults(fn=group_list)
    c = g.add_parser("create", help="create or replace a subscription group config")
    c.add_argument("group")
    c.add_argument("--orderly", action="store_true",
                   help="a FIFO consumer group (consumeMessageOrderly): clients consume each "
                        "message group in order")
    c.add_argument("--retry-max-times", type=int,
                   help="redeliveries before the DLQ (default: the broker's maxReconsumeTimes)")
    c.add_argument("--retry-policy", type=_retry_policy, metavar="POLICY",
                   help="how long consumers wait before a failed message comes back: "
                        "customized:1s,5s,30s,... or exponential:INITIAL,MAX,MULTIPLIER "
                        "(e.g. exponential:5s,2h,2); default RocketMQ's 1s 5s 10s 30s 1m ... 2h")
    c.add_argument("--no-broadcast", action="store_true",
                   help="consumeBroadcastEnable=false: refuse broadcasting consumers")
    c.add_argument("--disable", action="store_true", help="consumeEnable=false: refuse receives")
    c.set_defaults(fn=group_create)
    c = g.add_parser("delete", help="delete a group's config and its offsets")
    c.add_argument("group")
    c.add_argument("--keep-offsets", action="store_true")
    c.set_defaults(fn=group_delete)
    c = g.add_parser("progress")
    c.add_argument("group")
    c.set_defaults(fn=group_progress)
    c = g.add_parser("reset-offset")
    c.add_argument("group")
    c.add_argument("--topic", required=True)
    c.add_argument("--timestamp", type=int, required=True, help="ms since epoch")
    c.set_defaults(fn=group_reset_offset)

    m = sub.add_parser("message").add_subparsers(dest="cmd", required=True)
    c = m.add_parser("id")
    c.add_argument("id")
    c.set_defaults(fn=message_by_id)
    c = m.add_parser("key")
    c.add_argument("topic")
    c.add_argument("key")
    c.add_argument("--max", type=int, default=64)
    c.set_defaults(fn=message_by_key)
    c = m.add_parser("offset")
    c.add_argument("topic")
    c.add_argument("queue", type=int)
    c.add_argument("offset", type=int)
    c.set_defaults(fn=message_by_offset)
    c = m.add_parser("print")
    c.add_argument("topic")
    c.add_argument("queue", type=int)
    c.add_argument("--offset", type=int)
    c.add_argument("--count", type=int, default=32)
    c.set_defaults(fn=message_print)

    c = sub.add_parser("vacuum", help="delete unreferenced files older than a retention")
    c.add_argument("store_url", nargs="?", metavar="store", help="store URL (or --store)")
    c.add_argument("--retain-hours", type=float,
                   help="keep unreferenced files younger than this (default 168 = 7 days; "
                        "at least 1 unless --force)")
    c.add_argument("--dry-run", action="store_true", help="list what would go; delete nothing")
    c.add_argument("--force", action="store_true",
                   help="allow a retention below 1 h (no Spark job may be writing)")
    c.set_defaults(fn=store_vacuum)
    admin_verify.add_parser(sub)
    admin_acl.add_parsers(sub)
    admin_controller.add_parsers(sub, p)

    cl = sub.add_parser("cluster").add_subparsers(dest="cmd", required=True)
    cl.add_parser("list").set_defaults(fn=cluster_list)
    b = sub.add_parser("broker").add_subparsers(dest="cmd", required=True)
    b.add_parser("status").set_defaults(fn=broker_status)
    b.add_parser("ha", help="replication progress and lag").set_defaults(fn=broker_ha)
    c = b.add_parser("promote", help="make a replica (brokerRole=SLAVE) the master")
    c.add_argument("--role", default="ASYNC_MASTER", choices=["ASYNC_MASTER", "SYNC_MASTER"])
    c.set_defaults(fn=broker_promote)
    c = sub.add_parser("promote", help="= broker promote: make a replica the master")
    c.add_argument("--role", default="ASYNC_MASTER", choices=["ASYNC_MASTER", "SYNC_MASTER"])
    c.set_defaults(fn=broker_promote)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one admin command; returns the exit status (0 ok, 1 error, 2 usage)."""
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return int(e.code or 0)
    try:
        args.fn(args)
    except SparkMQError as e:
        print(f"error: {e.message if hasattr(e, 'message') else e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
