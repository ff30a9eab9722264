"""Streaming reads of a store: ``spark.readStream.format("sparkmq")``.

Where things run: ``SparkMQStreamReader`` lives in the driver's streaming source
worker for the whole query: ``latestOffset`` applies admission control
(``maxMessagesPerTrigger`` / ``maxBytesPerTrigger``, exactly: :func:`admit`),
``partitions`` plans one committed snapshot version per micro-batch (the same
planning as a batch read, ``reader.split_ranges``), and ``commit`` records the
``consumerGroup`` offsets in the store's log. ``read(partition)`` runs on
executors, as a batch read's does (``reader.read_range``), except for a small
micro-batch (``driverReadMaxMessages``): ``partitions`` plans it as one
partition and ``prefetched`` reads it in the driver's source worker, which hands
the rows to Spark with the partition (``prefetch.py``), saving an executor task.
Snapshots come from the process's cache (``snapshots.py``): a trigger reads only
the commits since the last one. A read of several
stores (``stores.py``) does all of this over every store's queues at once; its
offsets are keyed by broker name.

Freshness: while the query runs, ``latestOffset`` keeps a marker in each store's
``_readers/`` (:class:`ReaderInterest`, rewritten every few seconds, removed at
``stop``); a broker that sees it publishes every ``publishMinGapMs`` instead of
every ``publishIntervalMs`` (sparkmq/log/publish.py). Micro-batches still read
committed versions only.
"""
from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from dataclasses import dataclass

import numpy as np
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                              ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import StructType

from ..errors import UserError
from ..log.reader import Snapshot
from .options import (ReadOptions, TopicQueue, from_offset_json, parse_options,
                      resolve_offsets, select_queues, select_topics, to_offset_json)
from .reader import (QueueRange, broker_name, check_data_loss, open_snapshot, output_schema,
                     read_range, split_ranges)

log = logging.getLogger("sparkmq.datasource")


# -- admission control -----------------------------------------------------------------
#: a queue of one store of a read: (broker name, topic, queue id)
BrokerQueue = tuple[str, str, int]


def admit(snaps: Snapshot | dict[str, Snapshot], start: dict[tuple, int],
          avail: dict[tuple, int], max_rows: int | None,
          max_bytes: int | None) -> dict[tuple, int]:
    """End offsets taking at most ``max_rows`` messages and ``max_bytes`` body bytes.

    Keys are :data:`TopicQueue` with one ``Snapshot``, or :data:`BrokerQueue` with
    ``snaps`` a dict of snapshots by broker name.

    Messages are admitted round robin over the queues of every store (message i of
    every queue before message i+1 of any), so a trigger is shared fairly. The byte
    limit always admits at least one message, else a message bigger than the limit
    would stall the query. Both limits hold exactly otherwise.
    """
    pairs = [p for p in sorted(avail) if avail[p] > start.get(p, avail[p])]
    if not pairs or (max_rows is None and max_bytes is None):
        return dict(avail)
    sizes = []
    for p in pairs:
        lo, hi = start[p], avail[p]
        if max_rows is not None:
            hi = min(hi, lo + max_rows)
        snap, (t, q) = (snaps[p[0]], p[1:]) if isinstance(snaps, dict) else (snaps, p)
        sizes.append(_entry_sizes(snap, t, q, lo, hi, max_bytes)
                     if max_bytes is not None else np.ones(hi - lo, np.int64))
    qidx = np.concatenate([np.full(len(s), i, np.int64) for i, s in enumerate(sizes)])
    rank = np.concatenate([np.arange(len(s), dtype=np.int64) for s in sizes])
    flat = np.concatenate(sizes)
    order = np.lexsort((qidx, rank))
    k = len(order)
    if max_rows is not None:
        k = min(k, max_rows)
    if max_bytes is not None:
        cum = np.cumsum(flat[order])
        k = min(k, max(1, int(np.searchsorted(cum, max_bytes, "right"))))
    taken = np.bincount(qidx[order[:k]], minlength=len(pairs))
    out = dict(avail)
    for i, p in enumerate(pairs):
        out[p] = start[p] + int(taken[i])
    return out


def _entry_sizes(snap: Snapshot, topic: str, qid: int, lo: int, hi: int,
                 max_bytes: int) -> np.ndarray:
    """Body sizes of offsets lo.. until their sum passes ``max_bytes`` (or ``hi``)."""
    tid = snap.topic_id(topic)
    chunks, total, pos = [], 0, lo
    while pos < hi and total <= max_bytes:
        step = min(hi, pos + 65_536)
        e = snap.queue_entries(tid, qid, pos, step)
        if e.num_rows == 0:
            break
        s = e.column("size").to_numpy().astype(np.int64)
        chunks.append(s)
        total += int(s.sum())
        pos += len(s)
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int64)


# -- reader interest: ask the stores' brokers to publish sooner ------------------------------
class ReaderInterest:
    """This query's ``_readers/<id>.json`` marker in each store it reads (driver,
    streaming source worker; one thread). ``touch`` rewrites the markers at most
    every ``READER_TOUCH_INTERVAL_MS``; failures (a read-only store, say) are logged
    and cost only freshness. ``stop`` removes them."""

    def __init__(self, stores: dict[str, ReadOptions]):
        self.reader_id = uuid.uuid4().hex
        self._stores = stores
        self._touched_s: float | None = None
        self._warned = False

    def _fs(self):
        from ..log.fs import StoreFS
        return [StoreFS(o.url, o.storage_options) for o in self._stores.values()]

    def touch(self) -> None:
        from ..log.publish import READER_TOUCH_INTERVAL_MS, touch_reader_marker
        now_s = time.monotonic()
        if self._touched_s is not None and \
                now_s - self._touched_s < READER_TOUCH_INTERVAL_MS / 1000.0:
            return
        self._touched_s = now_s
        for sfs in self._fs():
            try:
                touch_reader_marker(sfs, self.reader_id, int(time.time() * 1000))
            except Exception:   # a hint only: without it the stream sees data at the interval
                if not self._warned:
                    log.warning("cannot write the reader marker in %s; the broker will "
                                "publish at its interval", sfs.url, exc_info=True)
                    self._warned = True

    def stop(self) -> None:
        from ..log.publish import remove_reader_marker
        if self._touched_s is None:
            return
        for sfs in self._fs():
            try:
                remove_reader_marker(sfs, self.reader_id)
            except Exception:   # best effort: the broker deletes markers long expired
                log.debug("cannot remove the reader marker in %s", sfs.url, exc_info=True)


# -- streaming reader ----------------------------------------------------------------------
#: a micro-batch read in the driver holds at most this many bytes (else executors read it)
DRIVER_READ_MAX_BYTES = 64 << 20


@dataclass
class QueueRanges(InputPartition):
    """The ranges of a small micro-batch as one partition (read in the driver, or by one
    executor task)."""

    ranges: tuple

    def __post_init__(self):
        InputPartition.__init__(self, None)


def _offset_key(offset) -> str:
    return json.dumps(offset or {}, sort_keys=True)


class SparkMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("sparkmq")``. Offsets: {"topic": {"queue": next_offset}},
    or for a read of several stores {"broker": {"topic": {"queue": next_offset}}}.

    One instance lives in the driver's streaming source worker for the query
    (not thread-safe; Spark calls it from one thread). Each micro-batch is
    planned from one committed snapshot per store: the newest at ``partitions``
    time, which holds every offset below the batch's end (versions only grow).
    Internally every queue is a :data:`BrokerQueue`; only the JSON differs.
    """

    def __init__(self, options, schema: StructType | None = None):
        from .stores import plan_stores
        self.opts: ReadOptions = parse_options(options)
        self.schema = output_schema(schema, self.opts)
        if self.opts.version_as_of is not None or self.opts.timestamp_as_of_ms is not None:
            raise UserError("versionAsOf / timestampAsOf are for batch reads; a stream "
                            "always follows the newest version")
        if self.opts.ending_offsets or self.opts.ending_timestamp_ms is not None:
            raise UserError("endingOffsets / endingTimestamp are for batch reads only")
        if self.opts.key is not None or self.opts.ending_by_timestamp is not None:
            raise UserError("key / endingOffsetsByTimestamp are for batch reads only")
        #: broker name -> that store's options (fixed for the query's life)
        self.stores: dict[str, ReadOptions] = {
            r.broker: r.opts for r, _ in plan_stores(self.opts, self._open_newest, broker_name)}
        self.target: dict[BrokerQueue, int] | None = None
        self.interest = ReaderInterest(self.stores)
        self._recorded: dict[str, dict[TopicQueue, int]] = {}
        #: (start, end, its partition) of the last micro-batch planned as one piece
        self._planned: tuple | None = None
        #: micro-batches read in this process (the driver) by :meth:`prefetched`
        self.driver_reads = 0

    @staticmethod
    def _open_newest(opts: ReadOptions) -> Snapshot:
        return open_snapshot(opts.url, storage_options=opts.storage_options)

    def _latest(self) -> dict[str, Snapshot]:
        return {b: self._open_newest(o) for b, o in self.stores.items()}

    def _pairs(self, snaps: dict[str, Snapshot]) -> list[BrokerQueue]:
        out = []
        for b, snap in snaps.items():
            opts = self.stores[b]
            out += [(b, t, q) for t, q in select_queues(snap, select_topics(snap, opts), opts)]
        return out

    # -- offsets JSON: one store keeps its format; several are keyed by broker ------
    def _to_json(self, offsets: dict[BrokerQueue, int]) -> dict:
        per = {b: {} for b in self.stores}
        for (b, t, q), o in offsets.items():
            per[b][(t, q)] = o
        if not self.opts.by_broker:
            return to_offset_json(next(iter(per.values())))
        return {b: to_offset_json(o) for b, o in sorted(per.items())}

    def _from_json(self, offset) -> dict[BrokerQueue, int]:
        from .stores import check_one_store_offset, offsets_by_broker
        if not self.opts.by_broker:
            (b,) = self.stores
            return {(b, t, q): o for (t, q), o in
                    from_offset_json(check_one_store_offset(offset)).items()}
        per = offsets_by_broker(offset, sorted(self.stores))
        return {(b, t, q): o for b, one in per.items()
                for (t, q), o in from_offset_json(one).items()}

    def initialOffset(self):
        snaps = self._latest()
        starts: dict[BrokerQueue, int] = {}
        for b, snap in snaps.items():
            opts = self.stores[b]
            pairs = [(t, q) for bb, t, q in self._pairs({b: snap})]
            one = resolve_offsets(snap, pairs, opts.starting_offsets, opts.starting_timestamp_ms,
                                  "latest", "startingOffsets", opts.starting_by_timestamp,
                                  opts.by_timestamp_strategy)
            starts.update({(b, t, q): o for (t, q), o in one.items()})
        return self._to_json(starts)

    def _available(self, snaps: dict[str, Snapshot],
                   start: dict[BrokerQueue, int]) -> dict[BrokerQueue, int]:
        """Max offsets now; queues new since ``start`` begin at their earliest (like Kafka)."""
        avail = {}
        for p in self._pairs(snaps):
            avail[p] = max(snaps[p[0]].max_offset(*p[1:]), start.get(p, 0))
        for p, o in start.items():   # a topic that vanished keeps its position
            avail.setdefault(p, o)
        if self.target is not None:
            avail = {p: max(start.get(p, o), min(o, self.target.get(p, start.get(p, 0))))
                     for p, o in avail.items()}
        return avail

    def _start(self, snaps: dict[str, Snapshot], start) -> dict[BrokerQueue, int]:
        s = self._from_json(start)
        for p in self._pairs(snaps):
            s.setdefault(p, snaps[p[0]].min_offset(*p[1:]))
        return s

    def prepareForTriggerAvailableNow(self):
        snaps = self._latest()
        self.target = {p: snaps[p[0]].max_offset(*p[1:]) for p in self._pairs(snaps)}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.min_messages_per_trigger is not None:
            return ReadMinRows(self.opts.min_messages_per_trigger)
        if self.opts.max_messages_per_trigger is not None:
            return ReadMaxRows(self.opts.max_messages_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start=None, limit=None):
        if self.target is None:     # (an AvailableNow run reads what is there)
            self.interest.touch()
        snaps = self._latest()
        self._record_group(self._from_json(start or self._empty()))
        begin = self._start(snaps, start or self._empty())
        avail = self._available(snaps, begin)
        if limit is None or isinstance(limit, ReadAllAvailable):
            return self._to_json(avail)
        if isinstance(limit, ReadMinRows):
            if not self._min_rows_due(begin, avail, limit.min_rows):
                return self._to_json(begin)           # wait for more (Kafka semantics)
            self._last_trigger_s = time.monotonic()
            limit = (ReadMaxRows(self.opts.max_messages_per_trigger)
                     if self.opts.max_messages_per_trigger is not None else None)
            if limit is None:
                return self._to_json(avail)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        # both options set: the default limit carries rows; bytes come from the options
        if max_rows is not None and self.opts.max_bytes_per_trigger is not None:
            max_bytes = self.opts.max_bytes_per_trigger
        return self._to_json(admit(snaps, begin, avail, max_rows, max_bytes))

    def _empty(self) -> dict:
        """No position yet (``start`` None): nothing per broker."""
        return {b: {} for b in self.stores} if self.opts.by_broker else {}

    def _min_rows_due(self, begin: dict, avail: dict, min_rows: int) -> bool:
        """minOffsetsPerTrigger: enough messages, or maxTriggerDelay (Kafka's default
        15 min) passed since the last batch, or an AvailableNow run (never waits)."""
        if self.target is not None:
            return True
        waiting = sum(max(0, o - begin.get(p, o)) for p, o in avail.items())
        if waiting >= min_rows:
            return True
        delay_ms = self.opts.max_trigger_delay_ms
        delay_s = (15 * 60_000 if delay_ms is None else delay_ms) / 1000.0
        last = getattr(self, "_last_trigger_s", None)
        if last is None:
            self._last_trigger_s = last = time.monotonic()
        return waiting > 0 and time.monotonic() - last >= delay_s

    def reportLatestOffset(self):
        snaps = self._latest()
        return self._to_json({p: snaps[p[0]].max_offset(*p[1:]) for p in self._pairs(snaps)})

    def partitions(self, start, end):
        snaps = self._latest()
        begin = self._start(snaps, start or self._empty())
        ranges = []
        for (b, t, q), hi in sorted(self._from_json(end).items()):
            lo, snap, opts = begin.get((b, t, q), 0), snaps[b], self.stores[b]
            if hi <= lo or t not in snap.state.topics:
                continue
            r = check_data_loss(snap, QueueRange(opts.url, snap.version, t, q, lo, hi,
                                                 opts.fail_on_data_loss,
                                                 storage_options=opts.storage_options,
                                                 schema=self.schema, kafka=self.opts.kafka))
            if r is not None:
                ranges.append(r)
        ranges = [r for r in ranges if r.end > r.start]
        self._planned = None
        if ranges and self._small(ranges):
            one = QueueRanges(tuple(ranges))
            self._planned = (_offset_key(start), _offset_key(end), one)
            return [one]
        return split_ranges(ranges, self.opts.min_partitions)

    def _small(self, ranges: list[QueueRange]) -> bool:
        """A micro-batch read in one piece (one partition, in the driver when Spark asks
        for prefetched rows: :meth:`prefetched`): at most ``driverReadMaxMessages``
        messages, and no ``minPartitions`` above one asks for parallel tasks."""
        limit = self.opts.driver_read_max_messages
        return (limit > 0 and (self.opts.min_partitions or 1) <= 1
                and sum(r.end - r.start for r in ranges) <= limit)

    def prefetched(self, start, end):
        """The rows of the micro-batch from ``start`` to ``end``, read here (the driver's
        source worker), as an iterator of record batches; None when :meth:`partitions`
        did not plan it as one small piece, or it holds more than
        :data:`DRIVER_READ_MAX_BYTES` (its one partition is then read by an executor
        task, as any other). Reading here saves the micro-batch an executor Python task
        (``prefetch.py``)."""
        planned = self._planned
        if planned is None or planned[:2] != (_offset_key(start), _offset_key(end)):
            return None
        batches, nbytes = [], 0
        for batch in self.read(planned[2]):
            batches.append(batch)
            nbytes += batch.nbytes
            if nbytes > DRIVER_READ_MAX_BYTES:
                return None
        self.driver_reads += 1
        return iter(batches)

    def read(self, partition: "QueueRange | QueueRanges"):
        if isinstance(partition, QueueRanges):
            return itertools.chain.from_iterable(read_range(r) for r in partition.ranges)
        return read_range(partition)

    def commit(self, end):
        self._record_group(self._from_json(end))

    def _record_group(self, offsets: dict[BrokerQueue, int]) -> None:
        """Record ``offsets`` as the consumerGroup's offsets, in each store its own
        (when set and changed).

        Spark calls ``commit(end of batch N-1)`` only when it plans batch N, so
        the last batch of a run would never be recorded; ``latestOffset``'s
        ``start`` is the end of the last batch whose commit-log entry is
        written, so it is recorded too. One log version per change, none when idle.
        """
        group = self.opts.consumer_group
        if not group or not offsets:
            return
        per: dict[str, dict[TopicQueue, int]] = {}
        for (b, t, q), o in offsets.items():
            per.setdefault(b, {})[(t, q)] = o
        for b, one in sorted(per.items()):
            if one and one != self._recorded.get(b):
                opts = self.stores[b]
                commit_consumer_offsets(opts.url, group, one,
                                        storage_options=opts.storage_options)
                self._recorded[b] = dict(one)

    def stop(self):
        self.interest.stop()


def commit_consumer_offsets(url: str, group: str, offsets: dict[TopicQueue, int],
                            storage_options: dict | None = None) -> None:
    """Record ``group``'s next offsets in the store (no broker needed; see
    :func:`sparkmq.log.committer.commit_consumer_offsets`)."""
    from ..log.committer import commit_consumer_offsets as commit
    commit(url, group, offsets, storage_options=storage_options)
