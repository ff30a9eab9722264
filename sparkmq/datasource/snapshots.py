"""The snapshots a Python process of a Spark read holds, kept across tasks and triggers.

Where it runs: in every Python process of a read, one cache per process
(:data:`CACHE`): the driver's planner and streaming source workers, and the
executors' Python workers (Spark reuses those across tasks: ``spark.python.
worker.reuse``, on by default), so a streaming query's executors and its driver
keep their snapshots from one micro-batch to the next.

What it keeps, per store (URL and storage options; the same URL with other
options may be another store, or other credentials):

* the newest snapshot it has seen. A newer version, or "the newest", is
  :meth:`Snapshot.advance` from it: the commits after its version read and
  replayed, not a checkpoint load. So a trigger that finds ``k`` new commits
  reads ``k`` commit files (and probes one more), whatever the store's size;
* the last few pinned versions asked for, by version (a batch read's tasks, a
  micro-batch's partitions), returned as they are.

Snapshots are immutable: the one a caller got keeps reading exactly its version,
whatever the cache later advances to (snapshot isolation is unchanged; the cache
only decides where a new snapshot is built from). Bounded: :data:`MAX_STORES`
stores and :data:`MAX_PINNED` pinned versions, least recently used dropped
first. Thread-safe (one lock around the maps; loads run outside it, so two
threads may build one version twice, and either copy is right).
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict

from ..log.reader import Snapshot

#: stores whose newest snapshot a process keeps
MAX_STORES = 4
#: pinned (url, options, version) snapshots a process keeps
MAX_PINNED = 8


def options_key(storage_options: dict | None) -> str:
    """The storage options as part of a cache key (sorted JSON)."""
    return json.dumps(storage_options or {}, sort_keys=True, default=repr)


class SnapshotCache:
    """Snapshots by store and version (see the module doc); ``stats`` counts how
    each request was served: ``hits`` (a cached snapshot as it is), ``advances``
    (built from a cached one by replaying newer commits) and ``loads`` (built from
    a checkpoint: the first read of a store, an older version, a time-travel read)."""

    def __init__(self, max_stores: int = MAX_STORES, max_pinned: int = MAX_PINNED):
        self.max_stores = max_stores
        self.max_pinned = max_pinned
        self._newest: OrderedDict[tuple, Snapshot] = OrderedDict()
        self._pinned: OrderedDict[tuple, Snapshot] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = {"hits": 0, "advances": 0, "loads": 0}

    def get(self, url: str, version: int | None = None, *,
            timestamp_ms: int | None = None, storage_options: dict | None = None) -> Snapshot:
        """The snapshot of ``version`` of the store at ``url`` (default: its newest
        version now; ``timestamp_ms``: the newest committed at or before it)."""
        if timestamp_ms is not None:
            with self._lock:
                self.stats["loads"] += 1
            return Snapshot.load(url, timestamp_ms=timestamp_ms, storage_options=storage_options)
        store = (url, options_key(storage_options))
        with self._lock:
            if version is not None:
                snap = self._pinned.get((store, version))
                if snap is not None:
                    self._pinned.move_to_end((store, version))
                    self.stats["hits"] += 1
                    return snap
            base = self._newest.get(store)
        if base is not None and (version is None or version >= base.version):
            snap = base.advance(version)
            what = "hits" if snap is base else "advances"
        else:
            snap = Snapshot.load(url, version=version, storage_options=storage_options)
            what = "loads"
        with self._lock:
            self.stats[what] += 1
            self._remember(store, snap)
        return snap

    def _remember(self, store: tuple, snap: Snapshot) -> None:
        newest = self._newest.get(store)
        if newest is None or snap.version >= newest.version:
            self._newest[store] = snap
        self._newest.move_to_end(store)
        while len(self._newest) > self.max_stores:
            self._newest.popitem(last=False)
        self._pinned[(store, snap.version)] = snap
        self._pinned.move_to_end((store, snap.version))
        while len(self._pinned) > self.max_pinned:
            self._pinned.popitem(last=False)

    def clear(self) -> None:
        """Forget every snapshot and reset the counts."""
        with self._lock:
            self._newest.clear()
            self._pinned.clear()
            self.stats = {"hits": 0, "advances": 0, "loads": 0}


#: this process's cache (every read of the data source goes through it)
CACHE = SnapshotCache()
