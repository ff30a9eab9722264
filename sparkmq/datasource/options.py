"""Read options of the ``sparkmq`` data source: parsing and offset resolution.

Option names follow Spark's Kafka source where the meaning is the same.
Everything here is pure (no Spark): functions take a :class:`Snapshot` and
the option map and return plain Python values, so they run on the driver's
planner worker and pickle to executors.

Options (names are case-insensitive; B = batch, S = streaming):

=========================  =======  ==========================================================
option                     default  meaning
=========================  =======  ==========================================================
``path`` (or load(url))    —        the store's URL (any fsspec URL)
``paths`` (load([a, b]))   —        several stores, one per broker (``stores.py``): rows
                                    carry ``broker_name``; offsets are keyed by broker
``stores``                 —        the same as a comma list of URLs
``namesrv``                —        ``host:port[;host:port]``: every broker group's master
                                    store, found through the NameServer (``stores.py``)
``adminTokenFile``         —        with namesrv: the brokers' admin token file (default
                                    SPARKMQ_ADMIN_TOKEN)
``topic`` / ``topics``     all      one topic / a comma list (B, S); must exist
``topicPattern``           —        regex over topic names (full match); S picks up new
                                    topics at their earliest offset, like Kafka
``queues``                 all      ``"0,2"`` (every selected topic) or JSON ``{"T":[0,1]}``
``startingOffsets``        B earl.  ``earliest``, ``latest`` or JSON ``{"T":{"0":5,"1":-2}}``
                           S latest (-2 earliest, -1 latest); S: only for a new query
``endingOffsets``          latest   B only; same forms (exclusive end)
``startingTimestamp``      —        epoch ms: first offset stored at or after it (wins over
                                    startingOffsets)
``endingTimestamp``        —        B only: end at the first offset stored at or after it
``versionAsOf``            newest   B only: read that transaction-log version
``timestampAsOf``          newest   B only: newest version committed at or before (ms or ISO)
``minPartitions``          —        split big queue ranges so there are at least N tasks
``failOnDataLoss``         true     offsets removed by retention: fail naming the earliest
                                    available offset, or (false) skip them with a warning
``maxMessagesPerTrigger``  —        S: at most N messages per micro-batch (exact; round robin
                                    over queues)
``maxBytesPerTrigger``     —        S: at most N body bytes per micro-batch (exact, but at
                                    least one message so a big one cannot stall the query)
``consumerGroup``          —        S: record the query's progress as this group's consumer
                                    offsets in the store (lag visible to admin tools)
``storageOptions``         —        JSON dict passed to fsspec
``minOffsetsPerTrigger``   —        S: wait for N messages (Kafka), at most ``maxTriggerDelay``
``maxTriggerDelay``        15m      S: with minOffsetsPerTrigger (``15m``, ``30s``, ``500ms``)
``startingOffsetsByTimestamp`` —    JSON {"T":{"0":ms}}: per queue, first offset at/after
``endingOffsetsByTimestamp``   —    B: the same for the end
``startingOffsetsByTimestampStrategy`` error: a queue with nothing that new fails; latest
``key``                    —        B: only messages with this key (through the Index)
``columns``                sparkmq  ``kafka``: the columns of Spark's Kafka source (``kafka.py``)
``includeHeaders``         false    with columns=kafka: add Kafka's ``headers`` column
``driverReadMaxMessages``  1000     S: a micro-batch of at most N messages is read in the
                                    driver's source worker, not in executor tasks (0: never)
=========================  =======  ==========================================================

Kafka's ``subscribe``, ``subscribePattern``, ``assign`` and ``maxOffsetsPerTrigger`` are
accepted as ``topics``, ``topicPattern``, ``topics`` + ``queues`` and
``maxMessagesPerTrigger``. Any other option is an error naming the closest known one.

The Python data source API has no column pruning: a read materializes every
column (cheap: slices of memory-mapped Arrow batches).

Offset JSON (``startingOffsets`` / ``endingOffsets``) is
``{"topic": {"queue_id": offset}}`` where ``-2`` means earliest and ``-1``
latest, exactly as in the Kafka source. Streaming offsets have the same shape
with non-negative offsets only: the next queue offset to read per queue.
A read of several stores (``paths``, ``stores``, ``namesrv``) keys its streaming
offsets by broker name first, ``{"broker-a": {"topic": {"0": 5}}}``, and its
offset options may too (``stores.split_offsets``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..errors import UserError
from ..log.reader import Snapshot

EARLIEST = -2
LATEST = -1

TopicQueue = tuple[str, int]


@dataclass(frozen=True)
class ReadOptions:
    """Parsed read options (case-insensitive keys were already folded by Spark)."""

    url: str
    topics: tuple[str, ...] | None = None
    topic_pattern: str | None = None
    queues: str | None = None
    starting_offsets: str | None = None
    ending_offsets: str | None = None
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    version_as_of: int | None = None
    timestamp_as_of_ms: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    consumer_group: str | None = None
    storage_options: dict | None = None
    min_messages_per_trigger: int | None = None    # Kafka's minOffsetsPerTrigger
    max_trigger_delay_ms: int | None = None        # with it: trigger anyway after this long
    starting_by_timestamp: dict | None = None      # {topic: {queue: epoch ms}}
    ending_by_timestamp: dict | None = None
    by_timestamp_strategy: str = "error"           # no offset at/after the time: error|latest
    key: str | None = None                         # B: only messages with this key (Index)
    urls: tuple[str, ...] = ()                     # paths / stores: several stores
    namesrv: str | None = None                     # or: the stores a NameServer knows
    admin_token_file: str | None = None            # with namesrv: to ask brokers /status
    by_broker: bool = False                        # several stores: offsets keyed by broker
    topics_anywhere: bool = False                  # a named topic may miss in this store
    kafka: bool = False                            # columns=kafka: Kafka's columns (kafka.py)
    include_headers: bool = False                  # with them: Kafka's headers column
    driver_read_max_messages: int = 1_000          # S: smaller micro-batches read on the driver


def _get(options, name: str):
    """Option lookup that works for Spark's case-insensitive dict and plain dicts."""
    for key in (name, name.lower()):
        if key in options:
            return options[key]
    for key, value in options.items():
        if key.lower() == name.lower():
            return value
    return None


def _int(options, name: str, *, minimum: int | None = None) -> int | None:
    raw = _get(options, name)
    if raw is None or str(raw).strip() == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise UserError(f"option {name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise UserError(f"option {name} must be >= {minimum}, got {value}")
    return value


def bool_option(options, name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise UserError(f"option {name} must be true or false, got {raw!r}")
    return text == "true"


def _timestamp_ms(options, name: str) -> int | None:
    """An epoch-millisecond option, or an ISO timestamp string (timestampAsOf)."""
    raw = _get(options, name)
    if raw is None:
        return None
    text = str(raw).strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    import datetime as dt
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"option {name} must be epoch milliseconds or an ISO timestamp, "
                        f"got {raw!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return int(parsed.timestamp() * 1000)


#: every read option, as documented (Spark hands them lower-cased); Kafka's names are
#: aliases where the meaning is the same
READ_NAMES = {n.lower(): n for n in (
    "path", "topic", "topics", "topicPattern", "queues", "startingOffsets", "endingOffsets",
    "startingTimestamp", "endingTimestamp", "versionAsOf", "timestampAsOf", "minPartitions",
    "failOnDataLoss", "maxMessagesPerTrigger", "maxBytesPerTrigger", "consumerGroup",
    "storageOptions", "subscribe", "subscribePattern", "assign", "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger", "maxTriggerDelay", "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "key", "paths",
    "stores", "namesrv", "adminTokenFile", "columns", "includeHeaders",
    "driverReadMaxMessages")}
#: Kafka source name -> sparkmq name (same meaning)
KAFKA_ALIASES = {"subscribe": "topics", "subscribePattern": "topicPattern",
                 "maxOffsetsPerTrigger": "maxMessagesPerTrigger"}


def _kafka_options(options) -> dict:
    """``options`` with Kafka's names turned into sparkmq's (both given: UserError)."""
    out = {str(k): v for k, v in dict(options).items()}
    for key in out:
        if key.lower() not in READ_NAMES:
            raise unknown_option_error(key, READ_NAMES, "read")
    for kafka, ours in KAFKA_ALIASES.items():
        value = _get(out, kafka)
        if value is None:
            continue
        if _get(out, ours) is not None:
            raise UserError(f"give only one of {kafka} (Kafka's name) and {ours}")
        out[ours] = value
    assign = _get(out, "assign")
    if assign is not None:        # Kafka: {"topic": [partitions]}
        if _get(out, "queues") is not None or _get(out, "topics") is not None:
            raise UserError("give assign alone (it names the topics and their queues)")
        try:
            parsed = json.loads(assign)
            out["topics"] = ",".join(parsed)
            out["queues"] = json.dumps({t: [int(q) for q in qs] for t, qs in parsed.items()})
        except (ValueError, TypeError, AttributeError) as e:
            raise UserError(f'option assign must be JSON like {{"topic": [0, 1]}}: {e}') from None
    return out


def _offsets_by_timestamp(options, name: str) -> dict[str, dict[str, int]] | None:
    raw = _get(options, name)
    if raw is None:
        return None
    parsed = parse_offset_json(str(raw), name)
    if any(ts < 0 for qs in parsed.values() for ts in qs.values()):
        raise UserError(f"option {name}: timestamps are epoch milliseconds >= 0")
    return parsed


def parse_options(options) -> ReadOptions:
    """Validate and parse the options of a read. Raises UserError naming the bad option
    (an unknown one with the closest known name)."""
    options = _kafka_options(options)
    url, urls, namesrv = _store_sources(options)
    topic_opts = [n for n in ("topic", "topics", "topicPattern") if _get(options, n)]
    if len(topic_opts) > 1:
        raise UserError(f"give only one of topic, topics, topicPattern (got {topic_opts})")
    topics = None
    for name in ("topic", "topics"):
        if _get(options, name):
            topics = tuple(t.strip() for t in str(_get(options, name)).split(",") if t.strip())
    pattern = _get(options, "topicPattern")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UserError(f"option topicPattern is not a valid regex: {exc}") from None
    if _get(options, "versionAsOf") is not None and _get(options, "timestampAsOf") is not None:
        raise UserError("give only one of versionAsOf and timestampAsOf")
    if (urls or namesrv) and _get(options, "versionAsOf") is not None:
        raise UserError("versionAsOf numbers the versions of one store; a read of several "
                        "stores takes timestampAsOf (each store's version at that time)")
    storage = _get(options, "storageOptions")
    strategy = str(_get(options, "startingOffsetsByTimestampStrategy") or "error").lower()
    if strategy not in ("error", "latest"):
        raise UserError("option startingOffsetsByTimestampStrategy must be error or latest")
    return ReadOptions(
        url=str(url), topics=topics, topic_pattern=pattern, queues=_get(options, "queues"),
        starting_offsets=_get(options, "startingOffsets"),
        ending_offsets=_get(options, "endingOffsets"),
        starting_timestamp_ms=_int(options, "startingTimestamp", minimum=0),
        ending_timestamp_ms=_int(options, "endingTimestamp", minimum=0),
        version_as_of=_int(options, "versionAsOf", minimum=0),
        timestamp_as_of_ms=_timestamp_ms(options, "timestampAsOf"),
        min_partitions=_int(options, "minPartitions", minimum=1),
        fail_on_data_loss=bool_option(options, "failOnDataLoss", True),
        max_messages_per_trigger=_int(options, "maxMessagesPerTrigger", minimum=1),
        max_bytes_per_trigger=_int(options, "maxBytesPerTrigger", minimum=1),
        consumer_group=_get(options, "consumerGroup") or None,
        storage_options=json.loads(storage) if storage else None,
        min_messages_per_trigger=_int(options, "minOffsetsPerTrigger", minimum=1),
        max_trigger_delay_ms=_duration_ms(options, "maxTriggerDelay"),
        starting_by_timestamp=_offsets_by_timestamp(options, "startingOffsetsByTimestamp"),
        ending_by_timestamp=_offsets_by_timestamp(options, "endingOffsetsByTimestamp"),
        by_timestamp_strategy=strategy, key=_get(options, "key") or None,
        urls=urls, namesrv=namesrv, admin_token_file=_get(options, "adminTokenFile") or None,
        by_broker=bool(urls or namesrv), kafka=columns_option(options)[0],
        include_headers=columns_option(options)[1],
        driver_read_max_messages=_default(_int(options, "driverReadMaxMessages", minimum=0),
                                          1_000))


def _default(value, default):
    return default if value is None else value


def columns_option(options) -> tuple[bool, bool]:
    """(Kafka's columns?, with headers?) from options ``columns`` and ``includeHeaders``."""
    columns = str(_get(options, "columns") or "sparkmq").strip().lower()
    if columns not in ("sparkmq", "kafka"):
        raise UserError(f"option columns must be sparkmq (the default) or kafka (the "
                        f"columns of Spark's Kafka source), got {_get(options, 'columns')!r}")
    headers = bool_option(options, "includeHeaders", False)
    if headers and columns != "kafka":
        raise UserError("includeHeaders=true adds Kafka's headers column: it goes with "
                        "columns=kafka (sparkmq's own columns carry properties, tags, keys)")
    return columns == "kafka", headers


def _store_sources(options) -> tuple[str, tuple[str, ...], str | None]:
    """(url, urls, namesrv): one store (``path``) or several (``paths`` as Spark passes
    ``load([a, b])``, ``stores``, ``namesrv``); exactly one of the forms."""
    given = [n for n in ("path", "paths", "stores", "namesrv") if _get(options, n)]
    if not given:
        raise UserError("no store given: use .load(url), .load([url, url]), "
                        ".option('stores', 'url,url') or .option('namesrv', 'host:port')")
    if len(given) > 1:
        raise UserError(f"give the stores one way only: got {', '.join(given)} (path / "
                        "load(url) is one store; paths / load([..]), stores and namesrv "
                        "are several)")
    if given[0] == "path":
        return str(_get(options, "path")), (), None
    if given[0] == "namesrv":
        return "", (), str(_get(options, "namesrv")).strip()
    raw = str(_get(options, given[0]))
    if given[0] == "paths":
        try:
            urls = json.loads(raw)
        except ValueError:
            urls = raw.split(",")
        if isinstance(urls, str):
            urls = [urls]
    else:
        urls = raw.split(",")
    urls = tuple(str(u).strip() for u in urls if str(u).strip())
    if not urls:
        raise UserError(f"option {given[0]} names no store")
    if len(set(urls)) != len(urls):
        raise UserError(f"option {given[0]} names a store twice: {list(urls)}")
    return urls[0], urls, None


def _duration_ms(options, name: str) -> int | None:
    """A duration option: milliseconds, or Spark's forms (``15m``, ``30s``, ``500ms``)."""
    raw = _get(options, name)
    if raw is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)?\s*", str(raw))
    if m is None:
        raise UserError(f"option {name} must be a duration like 15m, 30s or 500ms; got {raw!r}")
    factor = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    return int(m.group(1)) * factor[m.group(2)]


def unknown_option_error(key: str, known: dict[str, str], what: str) -> UserError:
    """The error for option ``key`` unknown to a ``what`` (read/write); ``known`` maps
    lower-case names to their spelling."""
    import difflib
    close = difflib.get_close_matches(key.lower(), list(known), n=1, cutoff=0.6)
    hint = f"; did you mean {known[close[0]]!r}?" if close else ""
    return UserError(f"unknown {what} option {key!r}{hint} (sparkmq {what} options: "
                     f"{', '.join(sorted(known.values(), key=str.lower))})")


# -- topics and queues ------------------------------------------------------
def select_topics(snap: Snapshot, opts: ReadOptions) -> list[str]:
    """Topics the read covers, in this snapshot. Named topics must exist."""
    names = snap.topic_names()
    if opts.topics:
        missing = [t for t in opts.topics if t not in names]
        if opts.topics_anywhere:     # one store of several: stores.py checked they exist
            return [t for t in opts.topics if t in names]
        if missing:
            raise UserError(f"topics {missing} do not exist in version {snap.version} of "
                            f"{opts.url}; topics: {names or 'none'}")
        return list(opts.topics)
    if opts.topic_pattern:
        rx = re.compile(opts.topic_pattern)
        return [t for t in names if rx.fullmatch(t)]
    return names


def _queue_count(snap: Snapshot, topic: str) -> int:
    conf = snap.topics()[topic]
    return max(conf.read_queue_nums, conf.write_queue_nums)


def select_queues(snap: Snapshot, topics: list[str], opts: ReadOptions) -> list[TopicQueue]:
    """(topic, queue) pairs to read. ``queues``: "0,2" for every topic or JSON {"T":[0,1]}."""
    spec = opts.queues
    chosen: dict[str, list[int] | None] = {t: None for t in topics}
    if spec:
        text = str(spec).strip()
        if text.startswith("{"):
            try:
                parsed = json.loads(text)
            except ValueError as exc:
                raise UserError(f"option queues is not valid JSON: {exc}") from None
            chosen = {t: [int(q) for q in parsed[t]] for t in topics if t in parsed}
        else:
            try:
                ids = [int(q) for q in text.split(",") if q.strip()]
            except ValueError:
                raise UserError(f"option queues must be like '0,2' or JSON, got {spec!r}") from None
            chosen = {t: ids for t in topics}
    out = []
    for topic, ids in chosen.items():
        n = _queue_count(snap, topic)
        for q in (range(n) if ids is None else ids):
            if not 0 <= q < n:
                raise UserError(f"queue {q} of topic {topic!r} does not exist (queues 0..{n - 1})")
            out.append((topic, q))
    return out


# -- offsets ----------------------------------------------------------------
def parse_offset_json(text: str, name: str) -> dict[str, dict[str, int]]:
    try:
        parsed = json.loads(text)
        return {str(t): {str(q): int(o) for q, o in qs.items()} for t, qs in parsed.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise UserError(f"option {name} must be earliest, latest or JSON like "
                        f'{{"topic":{{"0":5,"1":-2}}}}; got {text!r} ({exc})') from None


def resolve_offsets(snap: Snapshot, pairs: list[TopicQueue], spec: str | None,
                    timestamp_ms: int | None, default: str, name: str,
                    by_timestamp: dict | None = None, strategy: str = "latest",
                    ) -> dict[TopicQueue, int]:
    """Concrete queue offsets for ``pairs`` from an offsets option or a timestamp.

    A timestamp wins over ``spec`` (first offset stored at or after it); per-queue
    timestamps (Kafka's ``...OffsetsByTimestamp``) win over both for the queues they
    name (``strategy`` error: a queue with nothing stored at or after its time is an
    error; latest: it starts at its end). JSON entries missing for a pair fall back
    to ``default`` ("earliest"/"latest").
    """
    if by_timestamp:
        rest = [p for p in pairs if str(p[1]) not in by_timestamp.get(p[0], {})]
        out = resolve_offsets(snap, rest, spec, timestamp_ms, default, name) if rest else {}
        for t, q in pairs:
            ts = by_timestamp.get(t, {}).get(str(q))
            if ts is None:
                continue
            off = snap.offset_for_time(t, q, ts)
            if strategy == "error" and off >= snap.max_offset(t, q):
                raise UserError(f"option {name}ByTimestamp: queue {t}/{q} has no message "
                                f"stored at or after {ts}; set "
                                "startingOffsetsByTimestampStrategy=latest to start at its end")
            out[(t, q)] = off
        return out
    if timestamp_ms is not None:
        return {(t, q): snap.offset_for_time(t, q, timestamp_ms) for t, q in pairs}
    text = (spec or default).strip()
    per_pair: dict[TopicQueue, int] = {}
    if text.lower() in ("earliest", "latest"):
        code = EARLIEST if text.lower() == "earliest" else LATEST
        per_pair = {p: code for p in pairs}
    else:
        parsed = parse_offset_json(text, name)
        fallback = EARLIEST if default == "earliest" else LATEST
        per_pair = {(t, q): parsed.get(t, {}).get(str(q), fallback) for t, q in pairs}
    out = {}
    for (t, q), code in per_pair.items():
        if code == EARLIEST:
            out[(t, q)] = snap.min_offset(t, q)
        elif code == LATEST:
            out[(t, q)] = snap.max_offset(t, q)
        elif code < 0:
            raise UserError(f"option {name}: offset {code} for {t}/{q} is not -2, -1 or >= 0")
        else:
            out[(t, q)] = code
    return out


def to_offset_json(offsets: dict[TopicQueue, int]) -> dict[str, dict[str, int]]:
    """{(topic, queue): offset} -> the JSON-able streaming offset {topic: {"queue": offset}}."""
    out: dict[str, dict[str, int]] = {}
    for (t, q), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(q)] = int(o)
    return out


def from_offset_json(offset: dict) -> dict[TopicQueue, int]:
    return {(t, int(q)): int(o) for t, qs in (offset or {}).items() for q, o in qs.items()}
