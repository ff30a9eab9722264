"""Retention planning: per-topic floors, which segments may go, who still needs them.

The CommitLog is shared by all topics, so a segment cannot be deleted for one
topic alone. Retention therefore works in two layers (docs/FORMAT.md section 13):

1. **Queue floors.** Every (topic, queue) has a floor, the first queue offset
   still readable (the ``retention`` action's ``queues``). A topic with its own
   retention (``retentionMs`` and/or ``retentionBytes`` in its ``topic`` action)
   has its floor raised by a retention pass as soon as its messages expire:
   readers of that topic see them as removed, although the bytes may remain.
   A topic without its own retention keeps RocketMQ's behaviour: its floor
   moves only when the segments holding its messages are removed.
2. **Segments.** A sealed segment at the head of the CommitLog is removed when
   every live topic has passed it: each queue's first retained message (at its
   floor, where topics on the broker default use ``fileReservedTime``) lies in
   a later segment. One long-lived topic thus keeps a shared segment on disk,
   and the segment goes when the last topic lets it go.

RocketMQ's three disk thresholds (log/disk.py), with RocketMQ's meaning (usage
measured as ``df`` shows it, :meth:`StoreFS.disk_usage_ratio`): over
``diskMaxUsedSpaceRatio`` (75 %) a pass runs at once instead of waiting for a
``deleteWhen`` hour, but still removes only what has expired; over
``diskSpaceCleanForciblyRatio`` (85 %) it also removes the oldest segment when
nothing has expired, logging a WARNING for every consumer group that loses
messages it has not consumed; over ``diskSpaceWarningLevelRatio`` (90 %) the
store refuses appends (``DiskFullError``) until usage drops below it again.

:func:`plan_retention` computes what a pass would do at a given time, without
changing anything; ``Store.run_retention`` applies the plan and logs its
``warnings`` first: consumer groups (broker consumers and Spark queries that
record a ``consumerGroup``) whose committed offset is below the new floor of a
queue, i.e. that still needed messages about to be removed. ``sparkmq admin
topic retention`` prints the same plan.

Thread-safety: planning only reads (a store's ConsumeQueue and segment list);
it may run next to appends. It imports neither pyspark nor network code.
"""
from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa

from ..errors import UserError
from ..progress import Progress
from .disk import note_disk_usage, retention_due
from . import segment as seg
from .actions import Action, QueueFloor, QueueStats, RemoveFile, Retention, TopicConfig

HOUR_MS = 3_600_000
NO_BATCH = 1 << 62          # "no retained message in this queue": it blocks nothing

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("sparkmq.store")


class RetentionCache:
    """What retention planning remembers between passes, owned by one store: the
    newest store time per topic of sealed segments (they never change; bounded),
    and the ConsumeQueue files' per-queue ranges of one log state. Used from the
    retention service's thread and admin calls; a race only recomputes."""

    def __init__(self):
        self.segment_topic_times: dict[str, dict[str, int] | None] = {}
        self.cq_stats: tuple | None = None


@dataclass
class QueuePlan:
    """One queue's floor now and after the planned pass."""

    topic: str
    topic_id: int
    queue_id: int
    min_offset: int            # current floor (first readable offset)
    max_offset: int            # next offset to be written
    new_min_offset: int        # floor after the pass
    reason: str | None         # "time", "bytes", "segment" or None (unchanged)
    first_kept_batch: int      # batch offset of the first message kept (NO_BATCH if none)
    oldest_kept_ms: int | None  # store time of the first message kept, if any

    @property
    def removed_messages(self) -> int:
        return self.new_min_offset - self.min_offset


@dataclass
class GroupWarning:
    """A consumer group whose committed offset lies below a queue's new floor."""

    group: str
    client_id: str | None
    topic: str
    queue_id: int
    consumer_offset: int
    new_min_offset: int

    @property
    def unconsumed_messages(self) -> int:
        return self.new_min_offset - self.consumer_offset

    def text(self) -> str:
        who = self.group + (f" (client {self.client_id})" if self.client_id else "")
        return (f"consumer group {who} is at offset {self.consumer_offset} of "
                f"{self.topic}:{self.queue_id}; retention removes offsets below "
                f"{self.new_min_offset} ({self.unconsumed_messages} messages it has not consumed)")


@dataclass
class RetentionPlan:
    """What a retention pass at ``now_ms`` removes. Nothing is changed by planning."""

    now_ms: int
    due: bool                                   # a deleteWhen hour, forced, or disk full
    disk_full: bool
    remove_segments: list[str] = field(default_factory=list)
    physical_floor: int = 0                     # minPhysicalOffset after the pass
    queues: list[QueuePlan] = field(default_factory=list)
    warnings: list[GroupWarning] = field(default_factory=list)
    held_by: str | None = None                  # topic whose queue keeps the next segment
    next_segment: str | None = None             # the oldest segment that stays
    exact: bool = True     # queue floors cover every queue with rows in removed segments

    @property
    def changes(self) -> bool:
        return bool(self.remove_segments) or any(q.removed_messages for q in self.queues)

    def floors(self) -> dict[tuple[int, int], int]:
        return {(q.topic_id, q.queue_id): q.new_min_offset for q in self.queues}


def topic_retention(conf: TopicConfig, default_ms: int) -> tuple[int, int | None, bool]:
    """(retention ms, retention bytes per queue or None, own) of a topic config."""
    ms = conf.retention_ms
    nbytes = conf.retention_bytes
    own = ms is not None or nbytes is not None
    return (int(ms) if ms is not None else default_ms,
            int(nbytes) if nbytes is not None else None, own)


def next_run_ms(at_ms: int, delete_hours: set[int]) -> int:
    """The first moment at or after ``at_ms`` that lies in a ``deleteWhen`` hour
    (local time), which is when a pass removes what expired at ``at_ms``."""
    t = _dt.datetime.fromtimestamp(at_ms / 1000)
    if t.hour in delete_hours:
        return at_ms
    hour = t.replace(minute=0, second=0, microsecond=0)
    for _ in range(48):                          # bounded: some hour of a day matches
        hour += _dt.timedelta(hours=1)
        if hour.hour in delete_hours:
            return int(hour.timestamp() * 1000)
    return at_ms


def plan_retention(store, now_ms: int, *, due: bool = True, disk_full: bool = False,
                   detail: bool = False) -> RetentionPlan:
    """What a retention pass of ``store`` at ``now_ms`` would remove (see module doc).

    ``store`` is a ``Store`` (writable or read-only). Cost: topics on the broker default
    are judged per segment from a summary of each sealed segment (newest store time per
    topic; read once per segment and cached, segments being immutable); a topic with its
    own retention costs one search per queue (the ConsumeQueue files' logged ranges
    narrow it to one file's rows, read once; ``retentionBytes`` reads the retained
    entries' sizes). Queues of default topics are searched only when segments holding
    their rows go, or with ``detail`` (the oldest message kept, for ``describe``).
    """
    plan = RetentionPlan(now_ms=now_ms, due=due, disk_full=disk_full)
    default_ms = int(store.config.file_reserved_time_hours * HOUR_MS)
    cur_floor = store.state.min_physical_offset()
    own_keep = NO_BATCH                    # first batch any own-retention queue still keeps
    own_holder = None
    default_topics: dict[str, TopicConfig] = {}
    own_queues: list[QueuePlan] = []
    bounds = _QueueBounds(store)
    for topic, conf in sorted(store.topics().items()):
        ret_ms, ret_bytes, own = topic_retention(conf, default_ms)
        if not own:
            default_topics[topic] = conf
            continue
        for qid in bounds.queue_ids(conf):
            lo, hi = bounds.get(conf.id, qid)
            floor = _first_offset_after(store, conf.id, qid, lo, hi, now_ms - ret_ms)
            reason = "time"
            if ret_bytes is not None and hi > floor:
                bytes_floor = _first_offset_within_bytes(store, conf.id, qid, floor, hi,
                                                         ret_bytes)
                if bytes_floor > floor:
                    floor, reason = bytes_floor, "bytes"
            batch, ts = _entry_at(store, conf.id, qid, floor, hi)
            if batch < own_keep:
                own_keep, own_holder = batch, topic
            own_queues.append(QueuePlan(topic, conf.id, qid, lo, hi, floor,
                                        reason if floor > lo else None, batch, ts))
    # segments: the sealed prefix that every live topic has passed
    removed_topics: set[str] = set()
    for ref in _sealed_segments(store):
        holder = None if ref.end_offset <= own_keep else own_holder
        times = segment_topic_times(store, ref) if holder is None else {}
        if holder is None:
            if times is None:
                holder = "(unreadable segment)"
            else:
                young = [(ts, t) for t, ts in times.items()
                         if t in default_topics and ts > now_ms - default_ms]
                holder = max(young)[1] if young else None
        if holder is None or (disk_full and not plan.remove_segments):
            plan.remove_segments.append(ref.path)
            removed_topics.update(times or segment_topic_times(store, ref) or ())
            cur_floor = max(cur_floor, ref.end_offset)
        else:
            plan.next_segment, plan.held_by = ref.path, holder
            break
    plan.physical_floor = cur_floor
    plan.exact = None not in (segment_topic_times(store, r) for r in _sealed_segments(store)
                              if r.path in set(plan.remove_segments))
    # default topics: their floors move with the segments
    for topic, conf in default_topics.items():
        moved = topic in removed_topics
        if not detail and not moved:
            continue
        for qid in bounds.queue_ids(conf):
            lo, hi = bounds.get(conf.id, qid)
            f = _first_offset_at_batch(store, conf.id, qid, lo, hi, cur_floor) if moved else lo
            batch, ts = _entry_at(store, conf.id, qid, f, hi) if detail or f > lo else (0, None)
            plan.queues.append(QueuePlan(topic, conf.id, qid, lo, hi, f,
                                         "segment" if f > lo else None, batch, ts))
    # own-retention queues too keep nothing below the physical floor
    for q in own_queues:
        if q.first_kept_batch < cur_floor and q.max_offset > q.new_min_offset:
            f = _first_offset_at_batch(store, q.topic_id, q.queue_id, q.new_min_offset,
                                       q.max_offset, cur_floor)
            if f > q.new_min_offset:
                q.new_min_offset = f
                q.reason = q.reason or "segment"
                q.first_kept_batch, q.oldest_kept_ms = _entry_at(
                    store, q.topic_id, q.queue_id, f, q.max_offset)
    plan.queues += own_queues
    plan.queues.sort(key=lambda q: (q.topic, q.queue_id))
    plan.warnings = _group_warnings(store, plan)
    return plan


def segment_topic_times(store, ref) -> dict[str, int] | None:
    """Newest store time (ms) per topic of a sealed segment; None if unreadable. Cached
    per store and path (a sealed segment never changes)."""
    cache = store.retention_cache.segment_topic_times
    if ref.path in cache:
        return cache[ref.path]
    out: dict[str, int] | None = {}
    try:
        buf = store.sfs.read_buffer(ref.path, cache=True)
        batches = [seg.read_batch_at(buf, pos, ref.path) for pos in seg.scan(buf).positions]
        batches = [b.select(["topic", "store_timestamp"]) for b in batches if b.num_rows]
        if batches:
            t = pa.Table.from_batches(batches)
            g = pa.table({"topic": t.column("topic"),
                          "ts": t.column("store_timestamp").cast(pa.int64())}
                         ).group_by("topic").aggregate([("ts", "max")])
            out = dict(zip(g.column("topic").to_pylist(), g.column("ts_max").to_pylist()))
    except Exception:   # unreadable: never expired by age (disk pressure still applies)
        log.warning("cannot read the timestamps of %s; it expires by size only", ref.path,
                    exc_info=True)
        out = None
    if len(cache) > 4096:           # bounded: segments come and go
        cache.clear()
    cache[ref.path] = out
    return out


class _QueueBounds:
    """(min, max) offsets of queues as ``Store.min_offset`` / ``max_offset`` give them,
    with the log state's derived views computed once per plan (not once per queue)."""

    def __init__(self, store):
        self.store = store
        self.mins = store.state.queue_min_offsets()
        self.maxes = store.state.queue_max_offsets()
        self.visible = dict(store.dispatcher.visible_next) if store.writable else None
        self.by_topic: dict[int, set[int]] = {}
        for (t, q) in list(self.maxes) + list(self.visible or ()):
            self.by_topic.setdefault(t, set()).add(q)

    def queue_ids(self, conf: TopicConfig) -> list[int]:
        ids = set(range(max(conf.read_queue_nums, conf.write_queue_nums)))
        ids.update(self.by_topic.get(conf.id, ()))
        return sorted(ids)

    def get(self, tid: int, qid: int) -> tuple[int, int]:
        key = (tid, qid)
        hi = self.visible.get(key, 0) if self.visible is not None else self.maxes.get(key, 0)
        if key in self.mins:
            return self.mins[key], hi
        first = self.store.cq.first_offset(tid, qid)
        return (first if first is not None else hi), hi


def _sealed_segments(store) -> list:
    """The sealed prefix of the CommitLog a pass may remove; never the newest segment
    (as RocketMQ keeps its last file): the next writer places its segment after it."""
    active = getattr(store.commitlog, "active", None)
    active_path = active.rel_path if active is not None else None
    out = []
    for ref in store.commitlog.segments()[:-1]:
        add = store.state.segments.get(ref.path)
        sealed = ref.sealed if store.writable else bool(add and add.sealed)
        if not sealed or ref.path == active_path:
            break                                   # only a prefix of sealed segments
        out.append(ref)
    return out


def _entry_at(store, tid: int, qid: int, off: int, hi: int) -> tuple[int, int | None]:
    """(batch offset, store ms) of the message at ``off``; (NO_BATCH, None) past the end."""
    if off >= hi:
        return NO_BATCH, None
    e = store.queue_entries(tid, qid, off, off + 1)
    if not e.num_rows:
        return -1, None            # unknown: hold everything (never remove blindly)
    ts = e.column("store_timestamp").cast(pa.int64())[0].as_py()
    return int(e.column("batch_offset")[0].as_py()), ts


def _narrow(store, tid: int, qid: int, lo: int, hi: int, min_key: str, max_key: str,
            value: int) -> tuple[int, int]:
    """[lo, hi) narrowed by the ConsumeQueue files' logged ranges, for the first offset
    whose ``min_key``/``max_key`` column is past ``value`` (files wholly at or below it
    raise lo, files wholly past it lower hi)."""
    for q in _file_stats(store).get((tid, qid), ()):
        top = getattr(q, max_key)
        if top is not None:
            if int(top) <= value:
                lo = max(lo, int(q.max_offset))
            elif int(getattr(q, min_key)) > value:
                hi = min(hi, int(q.min_offset))
    return lo, max(lo, hi)


def _file_stats(store) -> dict[tuple[int, int], list[QueueStats]]:
    """The ConsumeQueue adds' per-queue ranges, indexed by (topic id, queue id); cached
    per log state (rebuilt when the store moves to another version)."""
    cache = store.retention_cache.cq_stats
    if cache is not None and cache[0] is store.state:
        return cache[1]
    out: dict[tuple[int, int], list[QueueStats]] = {}
    for add in store.state.consumequeue_files.values():
        for q in add.queues or ():
            out.setdefault((q.topic_id, q.queue_id), []).append(q)
    store.retention_cache.cq_stats = (store.state, out)
    return out


SEARCH_READ_ROWS = 1 << 17      # a narrowed range this small is read once, not probed


def _search(store, tid, qid, lo: int, hi: int, column: str, value: int) -> int:
    """First offset in [lo, hi) whose ``column`` (non-decreasing along the queue) is past
    ``value``; hi if none."""
    if hi - lo <= SEARCH_READ_ROWS:
        e = store.queue_entries(tid, qid, lo, hi)
        if e.num_rows == hi - lo:
            col = e.column(column)
            if column == "store_timestamp":
                col = col.cast(pa.int64())
            values = col.to_numpy(zero_copy_only=False)
            return lo + int(np.searchsorted(values, value, side="right"))
    while lo < hi:                                  # large or incomplete: probe
        mid = (lo + hi) // 2
        e = store.queue_entries(tid, qid, mid, mid + 1)
        col = e.column(column) if e.num_rows else None
        if col is not None and column == "store_timestamp":
            col = col.cast(pa.int64())
        if col is not None and col[0].as_py() <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _first_offset_after(store, tid, qid, lo: int, hi: int, cutoff_ms: int) -> int:
    """First offset in [lo, hi) stored after ``cutoff_ms`` (hi if none): a queue's store
    timestamps do not decrease within one writer."""
    lo, hi = _narrow(store, tid, qid, lo, hi, "min_timestamp", "max_timestamp", cutoff_ms)
    return _search(store, tid, qid, lo, hi, "store_timestamp", cutoff_ms)


def _first_offset_at_batch(store, tid, qid, lo: int, hi: int, floor: int) -> int:
    """First offset in [lo, hi) whose batch is at or past physical offset ``floor``."""
    lo, hi = _narrow(store, tid, qid, lo, hi, "min_batch_offset", "max_batch_offset", floor - 1)
    return _search(store, tid, qid, lo, hi, "batch_offset", floor - 1)


def _first_offset_within_bytes(store, tid, qid, lo: int, hi: int, max_bytes: int) -> int:
    """The smallest offset f in [lo, hi] such that the bodies of [f, hi) total at most
    ``max_bytes`` (Kafka's retention.bytes, per queue)."""
    e = store.queue_entries(tid, qid, lo, hi)
    if e.num_rows != hi - lo:
        return lo                                   # entries missing: remove nothing
    sizes = e.column("size").to_numpy(zero_copy_only=False).astype(np.int64)
    suffix = np.cumsum(sizes[::-1])[::-1]           # suffix[i] = bytes of [lo + i, hi)
    over = np.nonzero(suffix > max_bytes)[0]
    return lo if not len(over) else lo + int(over[-1]) + 1


def _group_warnings(store, plan: RetentionPlan) -> list[GroupWarning]:
    by_key = {(q.topic_id, q.queue_id): q for q in plan.queues}
    names = {q.topic_id: q.topic for q in plan.queues}
    out = []
    for (group, tid, qid, cid), off in sorted(store.state.consumer_offsets.items()):
        q = by_key.get((tid, qid))
        if q is None or q.new_min_offset <= q.min_offset:
            continue
        if off < q.new_min_offset and off < q.max_offset:
            out.append(GroupWarning(group, cid or None, names[tid], qid, int(off),
                                    q.new_min_offset))
    return out


def describe(plan: RetentionPlan, store) -> dict:
    """The plan for people and scripts (``sparkmq admin topic retention``): per topic its
    retention, what the next pass removes and when, and the groups that lag behind."""
    default_ms = int(store.config.file_reserved_time_hours * HOUR_MS)
    hours = store.config.delete_hours()
    run_now = plan.now_ms if plan.due else next_run_ms(plan.now_ms, hours)
    topics = []
    for topic, conf in sorted(store.topics().items()):
        ret_ms, ret_bytes, own = topic_retention(conf, default_ms)
        qs = [q for q in plan.queues if q.topic == topic]
        due_now = sum(q.removed_messages for q in qs)
        kept = [q.oldest_kept_ms for q in qs if q.oldest_kept_ms is not None]
        expires = min(kept) + ret_ms if kept else None
        if due_now:
            next_ms = run_now
        elif expires is not None:
            next_ms = next_run_ms(max(expires, plan.now_ms), hours)
        else:
            next_ms = None
        topics.append({
            "topic": topic,
            "retentionHours": round(ret_ms / HOUR_MS, 3),
            "retentionBytesPerQueue": ret_bytes,
            "source": "topic" if own else "broker",
            "messages": sum(q.max_offset - q.min_offset for q in qs),
            "removableNow": due_now,
            "nextRemovalTime": next_ms,
            "heldBySegmentOf": (plan.held_by if not own and plan.held_by not in (None, topic)
                                else None),
            "laggingGroups": sorted({w.group for w in plan.warnings if w.topic == topic}),
        })
    return {"nowMs": plan.now_ms, "due": plan.due, "diskFull": plan.disk_full,
            "nextRunTime": run_now, "removeSegments": plan.remove_segments,
            "minPhysicalOffset": plan.physical_floor, "nextSegmentKept": plan.next_segment,
            "segmentHeldBy": plan.held_by, "topics": topics,
            "warnings": [{"group": w.group, "clientId": w.client_id, "topic": w.topic,
                          "queueId": w.queue_id, "consumerOffset": w.consumer_offset,
                          "newMinOffset": w.new_min_offset,
                          "unconsumedMessages": w.unconsumed_messages, "text": w.text()}
                         for w in plan.warnings]}


# ---------------------------------------------------------------------- a store's retention pass
def run_retention(store: "Store", *, force_hour: bool = False) -> list[str]:
    """One retention pass (log/retention.py): at ``deleteWhen`` hours (or at once
    when the disk is fuller than ``diskMaxUsedSpaceRatio``) raise the floors of
    topics with their own retention and remove the sealed segments every topic
    has passed. Consumer groups that still needed removed offsets are logged
    (WARNING) before the commit. Returns the removed segment paths."""
    if not store.writable or store.closed:
        return []
    note_disk_usage(store)
    store.delete_removed_files()
    if not retention_due(store, store.clock_ms(), force_hour)[0]:
        return []          # outside deleteWhen hours nothing is planned (no reads)
    plan = store.retention_plan(force_hour=force_hour)
    if not plan.due or not plan.changes:
        return []
    if plan.disk_full and plan.remove_segments:
        log.warning("retention: the disk of %s is over diskSpaceCleanForciblyRatio (%d%%): "
                    "removing the oldest segment(s) %s whether expired or not",
                    store.url, store.config.disk_space_clean_forcibly_ratio,
                    plan.remove_segments)
    for w in plan.warnings:
        log.warning("retention: %s", w.text())
    return store.remove_segments(plan.remove_segments, queue_floors=plan.floors(),
                                exact_floors=plan.exact)


def retention_plan(store: "Store", *, force_hour: bool = False, now_ms: int | None = None,
                   detail: bool = False):
    """What a retention pass would do now (``retention.RetentionPlan``); changes
    nothing. ``plan.due`` says whether a pass at this moment acts at all; ``detail``
    also reports every queue of topics on the broker default (for admin)."""
    now = store.clock_ms() if now_ms is None else now_ms
    due, disk_full = retention_due(store, now, force_hour)
    return plan_retention(store, now, due=due, disk_full=disk_full, detail=detail)


def remove_segments(store: "Store", paths: Sequence[str], *,
                    queue_floors: dict[tuple[int, int], int] | None = None,
                    exact_floors: bool = False) -> list[str]:
    """Remove the oldest segments (a prefix of the CommitLog) and everything
    that points into them; their offsets then read as removed. ``queue_floors``
    ((topic id, queue id) -> first offset kept) also raises queue floors
    (per-topic retention), with or without segments removed; a floor never
    goes down and never passes the queue's max offset. ``exact_floors``: the
    given floors already cover every queue with rows in ``paths`` (a retention
    plan), so no queue is searched here."""
    store.require_writable()
    with store.append_lock, store.commit_lock:
        segs = store.commitlog.segments()
        prefix = segs[:len(paths)]
        if [s.path for s in prefix] != list(paths) or any(
                store.commitlog.active is not None and s.path == store.commitlog.active.rel_path
                for s in prefix):
            raise UserError("only a prefix of sealed segments can be removed")
        if paths and len(prefix) == len(segs):
            raise UserError(f"the newest segment {segs[-1].path} cannot be removed (the next "
                            "is placed after it); remove the segments before it")
        floor = prefix[-1].end_offset if prefix else store.state.min_physical_offset()
        # flush and publish first: a floor past the published end makes the next writer
        # after a crash re-dispatch the tail from that floor (expired messages come back)
        store.flush()
        queues = queue_floors_at(store, floor, queue_floors or {}, search=not exact_floors)
        qmin = {(q.topic_id, q.queue_id): q.min_offset for q in queues}
        prev = previous_floors(store.state)
        if not paths and all(v <= prev.get(k, 0) for k, v in qmin.items()):
            return []
        now = store.clock_ms()
        cq_files = list(store.state.consumequeue_files.values())
        index_files = list(store.state.index_files.values())
        # a pass over many files says where it is (a bar on a terminal, else log lines)
        with Progress(2 * len(paths) + len(cq_files) + len(index_files),
                      f"retention {store.url}: files", unit="files") as progress:
            actions: list[Action] = [RemoveFile(path=p, deletion_timestamp=now,
                                                data_change=True) for p in paths]
            progress.advance(len(paths))
            for add in cq_files:
                if all(int(_or(q.max_batch_offset, 1 << 62)) < floor or
                       int(q.max_offset) <= qmin.get((q.topic_id, q.queue_id), 0)
                       for q in add.queues or ()):
                    actions.append(RemoveFile(path=add.path, deletion_timestamp=now,
                                              data_change=False))
                progress.advance()
            for add in index_files:
                # (files written before maxBatchOffset was logged stay: compaction drops
                # their entries below the floor when it merges them)
                if add.max_batch_offset is not None and int(add.max_batch_offset) < floor:
                    actions.append(RemoveFile(path=add.path, deletion_timestamp=now,
                                              data_change=False))
                progress.advance()
            actions.append(Retention(min_physical_offset=floor, queues=tuple(queues),
                                     time=now))
            store.commit_actions(lambda s: actions, "RETENTION", {"segments": len(paths)})
            for path in paths:            # one at a time: the progress moves per segment
                store.commitlog.drop_segments({path})
                progress.advance()
        log.info("retention removed %d segments and %d other files below physical offset %d",
                 len(paths), len(actions) - 1 - len(paths), floor)
        return list(paths)


def queue_floors_at(store: "Store", floor: int, raised: dict[tuple[int, int], int], *,
                  search: bool = True) -> list[QueueFloor]:
    out = []
    prev = previous_floors(store.state)
    keys = set(store.dispatcher.next_offsets) | set(prev)
    for tid, qid in sorted(keys):
        nxt = store.dispatcher.next_offsets.get((tid, qid), 0)
        lo = max(prev.get((tid, qid), 0), min(raised.get((tid, qid), 0), nxt))
        hi = nxt if search else lo
        while lo < hi:   # first offset whose batch is at or above the floor
            mid = (lo + hi) // 2
            e = store.queue_entries(tid, qid, mid, mid + 1)
            if e.num_rows and int(e.column("batch_offset")[0].as_py()) >= floor:
                hi = mid
            else:
                lo = mid + 1
        out.append(QueueFloor(topic_id=tid, queue_id=qid, min_offset=lo))
    return out


def previous_floors(state) -> dict[tuple[int, int], int]:
    """(topic id, queue id) -> the queue floor of ``state``'s retention action."""
    return {(q.topic_id, q.queue_id): q.min_offset
            for q in (state.retention.queues if state.retention else ())}


def _or(value, default):
    return default if value is None else value
