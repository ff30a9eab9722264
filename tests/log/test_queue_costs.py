"""Costs independent of the number of queues (issue 18 item 5), counted: dispatch groups a
batch's rows by (topic, queue) with one sort, not one scan of every row per queue; a cold
read finds a queue's stats in a ConsumeQueue file's add through an index, not a scan."""
from __future__ import annotations

import numpy as np

from sparkmq.log import dispatch
from sparkmq.log.actions import AddFile, QueueStats
from sparkmq.log.consumequeue import _queue_stats


class _Info:
    def __init__(self, qids, topic_index=None, topic_names=("T",)):
        self.queue_ids = np.asarray(qids, np.int32)
        self.topic_index = topic_index
        self.topic_names = list(topic_names)


def test_dispatch_groups_rows_with_one_pass_whatever_the_queues(monkeypatch):
    calls = {"flatnonzero": 0}
    real = np.flatnonzero

    def counted(a):
        calls["flatnonzero"] += 1
        return real(a)
    monkeypatch.setattr(dispatch.np, "flatnonzero", counted)
    rng = np.random.default_rng(7)
    for queues in (4, 64, 1024):
        qids = rng.integers(0, queues, 5000)
        calls["flatnonzero"] = 0
        groups, _ = dispatch.queue_groups([3], _Info(qids, np.zeros(5000, np.int32)),
                                          5000)
        assert calls["flatnonzero"] <= 1                 # not one per queue
        got = {(t, q): rows.tolist() for t, q, rows in groups}
        want = {(3, int(q)): np.flatnonzero(qids == q).tolist() for q in np.unique(qids)}
        assert got == want                               # same rows, in batch order


def test_queue_stats_come_from_an_index_built_once():
    stats = [QueueStats(topic_id=t, queue_id=q, min_offset=0, max_offset=t * 100 + q)
             for t in range(50) for q in range(8)]
    add = AddFile(path="consumequeue/x.parquet", kind="consumequeue", size=1, queues=tuple(stats))
    assert _queue_stats(add, 7, 3).max_offset == 703
    assert _queue_stats(add, 99, 0) is None
    object.__setattr__(add, "queues", ())        # lookups no longer read the list
    assert _queue_stats(add, 49, 7).max_offset == 4907
