"""A consumer group's progress: lag per (topic, queue) from the offsets recorded in a
store's log (broker consumers and Spark queries with ``consumerGroup`` alike). One
implementation for ``sparkmq admin group progress --store`` and the broker's
``GET /admin/groups/progress``."""
from __future__ import annotations


def group_lag(store, group: str) -> list[dict]:
    """Rows ``{topic, queueId, consumerOffset, maxOffset, lag}`` of ``group`` in ``store``
    (anything with ``consumer_offsets``, ``topics`` and ``max_offset``: a Store or a
    Snapshot), for topics that still exist, sorted."""
    topics = store.topics()
    rows = []
    for (topic, q), off in sorted(store.consumer_offsets(group).items()):
        if topic not in topics:
            continue
        hi = store.max_offset(topic, q)
        rows.append({"topic": topic, "queueId": q, "consumerOffset": off, "maxOffset": hi,
                     "lag": max(0, hi - off)})
    return rows
