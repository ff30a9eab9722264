"""Creating a store and its topics on first use, as Delta creates a table on its first
write and a Kafka broker creates a topic on its first produce
(``autoCreateTopicEnable``).

* :func:`create_store` writes version 0 of a new store — its identity and the
  given topics — in ONE commit (put-if-absent: of two concurrent creators one wins
  and the other finds the store made).
* :func:`ensure_topic` creates a missing topic wherever the store's writer is: a
  broker holding the lease is asked (``POST /admin/topics`` with ``existOk``), a
  ``Store`` open for writing in this process creates it itself, and with no writer
  the topic is committed straight to the log. An existing topic is returned as it
  is (its queue count is never changed here).

Store identity actions (:func:`identity_actions`) are defined here once;
``Store.open(create=True)`` uses them too.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

from ..errors import CommitConflictError, UserError
from . import format as fmt
from .actions import MetaData, Protocol, TopicConfig
from .fs import StoreFS
from .names import validate_topic
from .topics import check_queue_nums
from .txlog import LogState, TransactionLog


def identity_actions(now_ms: int, broker_name: str) -> list:
    """The protocol and metaData actions of a new store (its version 0)."""
    return [Protocol(min_reader_version=fmt.MIN_READER_VERSION,
                     min_writer_version=fmt.MIN_WRITER_VERSION),
            MetaData(store_id=uuid.uuid4().hex, created_time=now_ms,
                     format_version=fmt.FORMAT_VERSION,
                     configuration={"brokerName": broker_name})]


def _topic(name: str, topic_id: int, queues: int, now_ms: int) -> TopicConfig:
    validate_topic(name)
    check_queue_nums(queues, queues, 6)
    return TopicConfig(name=name, id=topic_id, read_queue_nums=queues,
                       write_queue_nums=queues, created_time=now_ms)


def create_store(url: str, storage_options: dict | None, topics: dict[str, int],
                 broker_name: str = "broker-a") -> bool:
    """Make a store at ``url`` holding ``topics`` (name -> queue count) in one commit;
    False when it exists already (made by someone else first)."""
    if url.startswith("memory://"):
        raise UserError(f"{url}: a memory:// store lives in one process, and Spark reads and "
                        "writes from other processes (its executors); use a local path or "
                        "an object store URL")
    txlog = TransactionLog(StoreFS(url, storage_options))
    if txlog.exists():
        return False
    now = int(time.time() * 1000)
    actions = identity_actions(now, broker_name)
    actions += [_topic(n, i, q, now) for i, (n, q) in enumerate(sorted(topics.items()))]
    try:
        txlog.create(actions)
    except CommitConflictError:
        return False
    return True


def ensure_topic(url: str, storage_options: dict | None, name: str,
                 queues: int) -> TopicConfig:
    """The config of topic ``name``, created with ``queues`` queues if it is missing."""
    from .committer import BrokerCommitter, StoreCommitter, committer_for
    txlog = TransactionLog(StoreFS(url, storage_options))
    found = txlog.snapshot().topics.get(name)
    if found is not None:
        return found
    committer = committer_for(url, storage_options)
    if isinstance(committer, StoreCommitter):
        return committer.store.create_topic(name, read_queue_nums=queues,
                                            write_queue_nums=queues, exist_ok=True)
    if isinstance(committer, BrokerCommitter):
        committer.check()
        _ask_broker(committer, name, queues)
        return txlog.snapshot().topics[name]
    committer.check()             # no live writer (or a crashed one: refused)

    def build(state: LogState):
        if name in state.topics:
            return None
        return [_topic(name, state.next_topic_id(), queues, txlog.clock_ms())]
    state = txlog.commit(build, operation="CREATE TOPIC", parameters={"topic": name})
    return state.topics[name]


def _ask_broker(committer, name: str, queues: int) -> None:
    from ..admin_auth import auth_headers, client_ssl_context, find_token
    body = json.dumps({"name": name, "queueNums": queues, "existOk": True}).encode()
    req = urllib.request.Request(
        committer.endpoint.rstrip("/") + "/admin/topics", data=body, method="POST",
        headers={"Content-Type": "application/json",
                 **auth_headers(find_token(store_url=committer.url))})
    try:
        with urllib.request.urlopen(req, timeout=committer.timeout_s,
                                    context=client_ssl_context()):
            return
    except urllib.error.HTTPError as e:
        raise UserError(f"broker at {committer.endpoint} refused to create topic {name!r} "
                        f"({e.code}): {e.read().decode(errors='replace')[:300]}") from None
    except OSError as e:
        raise UserError(f"broker at {committer.endpoint} did not answer the creation of "
                        f"topic {name!r}: {e}") from None
