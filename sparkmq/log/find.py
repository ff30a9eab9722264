"""Finding one message by the id an operator has: the store's own message id (its
place in the CommitLog, ``Store.lookup``) or the client-generated id (``UNIQ_KEY``,
the ``unique_key`` column, what RocketMQ 5 clients show as the message id). One
implementation for ``sparkmq admin message id`` and the web console's search."""
from __future__ import annotations

import pyarrow.compute as pc

from ..errors import SparkMQError


def find_message(store, message_id: str, *, topic: str | None = None):
    """The ``StoredMessage`` with this id, or None. A store-issued id is looked up
    directly; any other id is searched for as a client id in ``topic`` (else in every
    topic): a column scan, since client ids are not indexed."""
    try:
        m = store.lookup(message_id)
    except SparkMQError:          # not a store-issued id: a client-generated unique key
        m = None
    if m is not None and (topic is None or m.topic == topic):
        return m
    return by_unique_key(store, message_id, topic=topic)


def by_unique_key(store, unique_key: str, *, topic: str | None = None):
    """The first message whose client-side id is ``unique_key`` (in ``topic``, else in
    any topic), or None."""
    topics = store.topics()
    for name in ([topic] if topic else sorted(topics)):
        conf = topics.get(name)
        if conf is None:
            continue
        for q in range(max(conf.read_queue_nums, conf.write_queue_nums)):
            lo = store.min_offset(name, q)
            for batch in store.iter_batches(name, q, lo, columns=["queue_offset", "unique_key"],
                                            on_removed="skip"):
                hit = batch.filter(pc.equal(batch.column("unique_key"), unique_key))
                if hit.num_rows:
                    return store.read(name, q, hit.column("queue_offset")[0].as_py(), 1)[0]
    return None
