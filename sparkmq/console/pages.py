"""The console's read pages (GET): each a function of a :class:`~sparkmq.console.Request`
returning a :class:`~sparkmq.console.Page`; ``ROUTES`` maps paths to them. They read
the broker's admin status, the store (topics, queue ranges, lookups, the Index) and
``log.progress.group_lag``, and change nothing."""
from __future__ import annotations

from urllib.parse import quote, urlencode

from ..errors import UserError
from ..log.names import DLQ_PREFIX, RESERVED_TOPICS, RETRY_PREFIX, SYSTEM_PREFIXES
from . import html as h

MAX_RESULTS = 100        # messages a search or a DLQ page lists, at most
DLQ_PER_QUEUE = 100      # newest dead letters listed per DLQ queue
ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"             # the DLQ's properties (broker/pop.py)
ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"


def _page(req, title: str, content, *, active: str = "", status: int = 200,
          notice: str | None = None, error: str | None = None):
    from . import Page
    return Page(status, h.page(title, content, active=active, who="admin", notice=notice,
                               error=error))


def topic_url(name: str) -> str:
    return "/console/topic?" + urlencode({"name": name})


def group_url(name: str) -> str:
    return "/console/group?" + urlencode({"name": name})


def dlq_url(group: str) -> str:
    return "/console/dlq?" + urlencode({"group": group})


def message_url(message_id: str) -> str:
    return "/console/message?id=" + quote(message_id, safe="")


def topic_kind(name: str) -> str:
    """NORMAL, RETRY, DLQ or SYSTEM, as rocketmq-dashboard's topic filter names them."""
    if name.startswith(DLQ_PREFIX):
        return "DLQ"
    if name.startswith(RETRY_PREFIX):
        return "RETRY"
    if name in RESERVED_TOPICS or name.startswith(SYSTEM_PREFIXES):
        return "SYSTEM"
    return "NORMAL"


def perm_text(perm: int) -> str:
    return ("R" if perm & 4 else "-") + ("W" if perm & 2 else "-")


def retention_text(value, unit: str) -> str:
    return "broker default" if value is None else f"{value} {unit}"


# ---------------------------------------------------------------- login
def safe_next(target: str) -> str:
    """``target`` if it is a console page to return to after logging in (a path of this
    endpoint, no control characters: it becomes a Location header), else ``/console``."""
    bad = (not (target == "/console" or target.startswith(("/console/", "/console?")))
           or target.startswith("/console/log")
           or any(ord(c) < 0x21 or ord(c) == 0x7F for c in target))
    return "/console" if bad else target


def login_form(next_path: str = "/console") -> h.Markup:
    """The login form (posted to ``/console/login``; back to ``next_path`` after)."""
    next_path = safe_next(next_path)
    return h.form("/console/login", h.join([
        h.field_input("Admin token", "token", type_="password", autocomplete="off",
                      required=True, autofocus=True),
        h.hidden("next", next_path)]), button="Log in", legend="Admin token")


def login(req):
    from . import Page
    return Page(200, h.page("Log in", h.join([
        h.tag("p", "Paste the broker's admin token (SPARKMQ_ADMIN_TOKEN, or the admin.token "
                   "file in the broker's store folder)."),
        login_form(req.arg("next", "/console"))])))


# ---------------------------------------------------------------- cluster
def overview(req):
    """The broker: identity, role, state, epoch, store, HA link and replica lag."""
    b = req.broker
    st = b.admin.status()
    ha = st.get("ha") or {}
    rows = [("Cluster", st["cluster"]), ("Broker name", st["brokerName"]),
            ("Broker id", st["brokerId"]), ("Role", st["role"]), ("State", st["state"]),
            ("Fenced", st["fenced"] or "no"),
            ("Epoch", ha.get("epoch", ha.get("masterEpoch", b.store.epoch))),
            ("gRPC endpoint", st["endpoint"]), ("Admin port", st["adminPort"]),
            ("Store", st["store"]), ("Store version", st["storeVersion"]),
            ("Flush disk type", st["flushDiskType"]),
            ("NameServer", st["namesrvAddr"] or "none"), ("Started", h.when(st["startedMs"])),
            ("Topics", len(st["topics"])), ("Messages retained",
                                             sum(t["messages"] for t in st["topics"].values())),
            ("Clients", st["clients"]), ("Groups online", len(st["groups"])),
            ("Long polls waiting", st["longPollWaiting"])]
    parts = [h.table(["Broker", "Value"], rows, id_="broker")]
    if ha:
        parts.append(h.tag("h2", "High availability"))
        if ha.get("role") == "replica":
            keys = ["connected", "masterOffset", "offset", "lagBytes", "masterEpoch", "lastError"]
            parts.append(h.table(["Replica link", "Value"], [(k, ha.get(k)) for k in keys],
                                 id_="ha"))
        else:
            reps = ha.get("replicas") or []
            keys = sorted({k for r in reps for k in r})
            parts.append(h.tag("p", f"Master at CommitLog offset {ha.get('offset')}; "
                                    f"{len(reps)} replica(s) attached."))
            if reps:
                parts.append(h.table(keys, [[r.get(k) for k in keys] for r in reps], id_="ha"))
    return _page(req, f"Broker {st['brokerName']}", h.join(parts), active="/console")


# ---------------------------------------------------------------- topics
def topics(req):
    """Every topic: kind, message type, permission, queues, messages, retention; and
    the create-topic form."""
    from ..log.topics import topic_message_type
    from .samples import ring_for
    store = req.broker.store
    ring = ring_for(req.broker)
    now = ring.now()
    rates = ring.rates(now) if now is not None else {}
    rows = []
    for name, conf in sorted(store.topics().items()):
        ranges = store.queue_ranges(name)
        rate_in, rate_out = rates.get(name, (0.0, 0.0)) if rates else (None, None)
        rows.append([h.link(name, topic_url(name)), topic_kind(name), topic_message_type(conf),
                     perm_text(conf.perm), conf.read_queue_nums, conf.write_queue_nums,
                     sum(hi - lo for lo, hi in ranges.values()),
                     h.rate_text(rate_in), h.rate_text(rate_out),
                     h.sparkline(ring.in_rate_series(name, now), label="msg/s in"),
                     retention_text(conf.retention_ms, "ms"),
                     retention_text(conf.retention_bytes, "bytes")])
    table = h.table(["Topic", "Kind", "Message type", "Perm", "Read queues", "Write queues",
                     "Messages", "In msg/s", "Out msg/s", "In, last 10 min", "Retention time",
                     "Retention size"], rows, numeric=(4, 5, 6, 7, 8), id_="topics")
    note = h.tag("p", "Rates: messages stored by sends (in) and delivered to consumers (out) "
                      "per second over the last minute, from this console's samples (every "
                      f"{ring.interval_s:g} s; blank until a second sample). Spark reads of "
                      "the table are not deliveries.")
    notice = "Topic created." if req.arg("notice") == "created" else None
    return _page(req, "Topics", h.join([table, note, create_topic_form()]),
                 active="/console/topics", notice=notice)


def create_topic_form(name: str = "", queues: str = "", message_type: str = "NORMAL",
                      retention_ms: str = "") -> h.Markup:
    """The create-topic form (POST /console/topics); asks for the confirm box."""
    from ..log.topics import MESSAGE_TYPES
    options = h.join(h.tag("option", t, value=t, selected=t == message_type)
                     for t in MESSAGE_TYPES)
    return h.form("/console/topics", h.join([
        h.field_input("Name", "name", name, required=True, pattern=r"[%|a-zA-Z0-9_\-]{1,127}"),
        h.field_input("Queues", "queueNums", queues, type_="number", min="1", max="1024",
                      placeholder="broker default"),
        h.tag("label", h.join(["Message type ", h.tag("select", options, name="messageType")])),
        h.field_input("Retention ms", "retentionMs", retention_ms, type_="number", min="1",
                      placeholder="broker default"),
        h.confirm_box("Yes, create this topic")]), button="Create topic",
        legend="Create topic (mqadmin updateTopic)")


def topic(req):
    """One topic: its config and each queue's min/max offset."""
    from ..log.topics import topic_message_type
    name = req.arg("name")
    store = req.broker.store
    conf = store.topics().get(name)
    if conf is None:
        raise UserError(f"no topic {name!r} on this broker")
    ranges = store.queue_ranges(name)
    rows = [[q, lo, hi, hi - lo] for (_, q), (lo, hi) in sorted(ranges.items())]
    info = h.table(["Topic", "Value"], [
        ("Name", name), ("Kind", topic_kind(name)), ("Message type", topic_message_type(conf)),
        ("Perm", perm_text(conf.perm)), ("Read queues", conf.read_queue_nums),
        ("Write queues", conf.write_queue_nums), ("Created", h.when(conf.created_time or None)),
        ("Retention time", retention_text(conf.retention_ms, "ms")),
        ("Retention size", retention_text(conf.retention_bytes, "bytes"))], id_="topic")
    queues = h.table(["Queue", "Min offset", "Max offset", "Messages"], rows,
                     numeric=(0, 1, 2, 3), id_="queues")
    search = h.link("Search this topic's messages",
                    "/console/messages?" + urlencode({"topic": name}))
    notice = "Topic created." if req.arg("notice") == "created" else None
    return _page(req, f"Topic {name}", h.join([info, h.tag("h2", "Queues"), queues, search]),
                 active="/console/topics", notice=notice)


# ---------------------------------------------------------------- consumer groups
def group_names(broker) -> list[str]:
    """Groups configured, with recorded offsets, online, or with a DLQ topic."""
    store = broker.store
    names = set(store.subscription_groups())
    names |= {k[0] for k in store.state.consumer_offsets}   # as 'sparkmq admin group list'
    names |= set(broker.clients.groups()) | {k.group for k in broker.pop.groups()}
    names |= {t[len(DLQ_PREFIX):] for t in store.topics() if t.startswith(DLQ_PREFIX)}
    return sorted(names)


def groups(req):
    """Every consumer group: config, online clients, total lag, dead letters."""
    from ..log.progress import group_lag
    from .samples import ring_for
    b = req.broker
    store = b.store
    ring = ring_for(b)
    now = ring.now()
    confs, online = store.subscription_groups(), b.clients.groups()
    topics_now = store.topics()
    rows = []
    for g in group_names(b):
        conf = confs.get(g)
        lag = group_lag(store, g)
        dlq = DLQ_PREFIX + g
        dead = (sum(hi - lo for lo, hi in store.queue_ranges(dlq).values())
                if dlq in topics_now else 0)
        rows.append([h.link(g, group_url(g)), "yes" if conf else "no",
                     "yes" if conf and conf.orderly else "no",
                     conf.retry_max_times if conf and conf.retry_max_times is not None
                     else "broker default", online.get(g, 0),
                     sum(r["lag"] for r in lag),
                     h.sparkline(ring.lag_series(g, now=now), label="lag"),
                     h.link(dead, dlq_url(g)) if dead else 0])
    table = h.table(["Group", "Configured", "Orderly", "Max retries", "Clients online", "Lag",
                     "Lag, last 10 min", "Dead letters"], rows, numeric=(4, 5, 7), id_="groups")
    return _page(req, "Consumer groups", table, active="/console/groups")


def group(req):
    """One group: lag per (topic, queue) from its committed offsets."""
    from ..log.progress import group_lag
    name = req.arg("name")
    if not name:
        raise UserError("give the group: ?name=GROUP")
    from .samples import ring_for
    b = req.broker
    ring = ring_for(b)
    now = ring.now()
    rows = group_lag(b.store, name)
    table = h.table(["Topic", "Queue", "Consumer offset", "Max offset", "Lag",
                     "Lag, last 10 min"],
                    [[h.link(r["topic"], topic_url(r["topic"])), r["queueId"],
                      r["consumerOffset"], r["maxOffset"], r["lag"],
                      h.sparkline(ring.lag_series(name, (r["topic"], r["queueId"]), now),
                                  label="lag")] for r in rows],
                    numeric=(1, 2, 3, 4), id_="lag", empty="no committed offsets")
    conf = b.store.subscription_groups().get(name)
    facts = h.table(["Group", "Value"], [
        ("Name", name), ("Configured", "yes" if conf else "no"),
        ("Clients online", b.clients.groups().get(name, 0)),
        ("Total lag", sum(r["lag"] for r in rows)),
        ("Total lag, last 10 min", h.sparkline(ring.lag_series(name, now=now), width=240,
                                               height=40, label="total lag"))], id_="group")
    return _page(req, f"Consumer group {name}", h.join([
        facts, h.tag("h2", "Lag per queue"), table,
        h.tag("p", "Offsets as last persisted (flushConsumerOffsetInterval)."),
        h.link("Dead letters (%DLQ%" + name + ")", dlq_url(name))]), active="/console/groups")


# ---------------------------------------------------------------- messages
def message_rows(msgs, *, dlq_group: str | None = None) -> list[list]:
    """Result table rows; in a DLQ listing the origin and a resend form too."""
    rows = []
    for m in msgs:
        shown_id = m.unique_key or m.message_id
        row = [h.link(shown_id, message_url(m.message_id)), m.topic, m.queue_id, m.queue_offset,
               m.tags, ",".join(m.keys), h.when(m.store_timestamp),
               h.tag("span", h.body_text(m.body), class_="body")]
        if dlq_group is not None:
            row[1:2] = [m.properties.get(ORIGIN_TOPIC, ""), m.reconsume_times]
            row.append(h.form("/console/dlq/resend", h.join([
                h.hidden("group", dlq_group), h.hidden("id", m.message_id),
                h.confirm_box("confirm")]), button="Resend", class_="inline"))
        rows.append(row)
    return rows


MESSAGE_HEADERS = ["Message id", "Topic", "Queue", "Offset", "Tags", "Keys", "Stored (UTC)",
                   "Body"]


def messages(req):
    """Search: by message id (store id or client id), by key, by store time range."""
    store = req.broker.store
    topic_name, mid, key = req.arg("topic"), req.arg("id"), req.arg("key")
    start, end = req.arg("start"), req.arg("end")
    results, what = None, ""
    if topic_name and topic_name not in store.topics():
        raise UserError(f"no topic {topic_name!r} on this broker")
    if mid:
        from ..log.find import find_message
        m = find_message(store, mid, topic=topic_name or None)
        results, what = ([m] if m else []), f"message id {mid}"
    elif key:
        if not topic_name:
            raise UserError("a key search needs the topic")
        results = store.query_by_key(topic_name, key, max_results=MAX_RESULTS)
        what = f"key {key} in {topic_name}"
    elif start or end:
        if not topic_name:
            raise UserError("a time search needs the topic")
        lo = h.parse_time_ms(start) if start else 0
        hi = h.parse_time_ms(end) if end else req.broker.clock_ms()
        results = store.query_by_time(topic_name, lo, hi, max_results=MAX_RESULTS)
        what = f"{topic_name} stored {h.when(lo)} .. {h.when(hi)} UTC"
    parts = [search_forms(store, topic_name, mid, key, start, end)]
    if results is not None:
        parts += [h.tag("h2", f"{len(results)} message(s): {what}"),
                  h.table(MESSAGE_HEADERS, message_rows(results), numeric=(2, 3),
                          id_="results", empty="no message found")]
    return _page(req, "Messages", h.join(parts), active="/console/messages")


def search_forms(store, topic_name, mid, key, start, end) -> h.Markup:
    options = h.join([h.tag("option", "(any topic)", value="")] + [
        h.tag("option", t, value=t, selected=t == topic_name) for t in sorted(store.topics())])

    def topic_select():
        return h.tag("label", h.join(["Topic ", h.tag("select", options, name="topic")]))
    by_id = h.form("/console/messages", h.join([topic_select(),
                                                h.field_input("Message id", "id", mid, size="40")]),
                   method="get", button="Find by id", legend="By message id")
    by_key = h.form("/console/messages", h.join([topic_select(),
                                                 h.field_input("Key", "key", key)]),
                    method="get", button="Find by key", legend="By key")
    by_time = h.form("/console/messages", h.join([
        topic_select(), h.field_input("From (UTC)", "start", start, type_="datetime-local",
                                      step="1"),
        h.field_input("To (UTC)", "end", end, type_="datetime-local", step="1")]),
        method="get", button="Find by time", legend="By store time")
    return h.join([by_id, by_key, by_time])


def message(req):
    """One message: every field, its properties, and its body (up to 64 KiB)."""
    from ..log.find import find_message
    mid = req.arg("id")
    m = find_message(req.broker.store, mid) if mid else None
    if m is None:
        raise UserError(f"no message with id {mid!r} (removed by retention, or never here)")
    rows = [("Message id (store)", m.message_id), ("Client id (UNIQ_KEY)", m.unique_key),
            ("Topic", h.link(m.topic, topic_url(m.topic))), ("Queue", m.queue_id),
            ("Queue offset", m.queue_offset), ("Tags", m.tags), ("Keys", ",".join(m.keys)),
            ("Message group", m.message_group), ("Born", h.when(m.born_timestamp)),
            ("Born host", m.born_host), ("Stored", h.when(m.store_timestamp)),
            ("Delivery time", h.when(m.delivery_timestamp)),
            ("Reconsume times", m.reconsume_times), ("Body size", f"{len(m.body)} bytes")]
    props = h.table(["Property", "Value"], sorted(m.properties.items()), id_="properties")
    body = h.tag("pre", h.body_text(m.body, h.BODY_DETAIL_BYTES), class_="body", id="body")
    return _page(req, "Message", h.join([h.table(["Field", "Value"], rows, id_="message"),
                                         h.tag("h2", "Properties"), props,
                                         h.tag("h2", "Body"), body]),
                 active="/console/messages")


def dlq(req):
    """A group's dead letters (``%DLQ%<group>``), newest first, each with a resend form."""
    group_name = req.arg("group")
    if not group_name:
        raise UserError("give the group: ?group=GROUP")
    store = req.broker.store
    topic_name = DLQ_PREFIX + group_name
    msgs = []
    if topic_name in store.topics():
        for (_, q), (lo, hi) in sorted(store.queue_ranges(topic_name).items()):
            first = max(lo, hi - DLQ_PER_QUEUE)
            msgs += store.read(topic_name, q, first, hi - first)
    msgs.sort(key=lambda m: m.store_timestamp, reverse=True)
    headers = ["Message id", "Original topic", "Deliveries", "Queue", "Offset", "Tags", "Keys",
               "Stored (UTC)", "Body", "Resend to the original topic"]
    table = h.table(headers, message_rows(msgs[:MAX_RESULTS], dlq_group=group_name),
                    numeric=(2, 3, 4), id_="dlq", empty="no dead letters")
    return _page(req, f"Dead letters of {group_name}", h.join([
        h.tag("p", h.join(["Topic ", h.tag("code", topic_name), ". Resend appends a copy to the "
                           "original topic; the dead letter stays."])), table]),
        active="/console/groups")


ROUTES = {"/console": overview, "/console/login": login, "/console/topics": topics,
          "/console/topic": topic, "/console/groups": groups, "/console/group": group,
          "/console/messages": messages, "/console/message": message, "/console/dlq": dlq}
