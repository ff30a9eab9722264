"""Topics, subscription groups and consumer offsets of a writable store.

Each function validates its arguments, then commits its actions (``topic``,
``subscriptionGroup``, ``consumerOffset``) as the store's writer, in one
transaction-log version (FORMAT.md); a lost race re-reads and rebuilds.
:func:`group_delete_actions` is shared with the replica's metadata mirror.

On disk: only transaction-log actions. After a crash: a committed action is
there, an uncommitted one is not (nothing to recover). Thread-safety: commits
are serialized by the store's commit lock; a deleted topic's in-memory queues
are dropped under the append lock.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Mapping

from ..errors import GroupNotFoundError, TopicExistsError, TopicNotFoundError, UserError
from ..properties import is_whole
from .actions import (MAX_QUEUE_NUMS, MIN_QUEUE_NUMS, PERM_RW, PERMS, ConsumerOffset,
                      GroupConfig, TopicConfig)
from .names import validate_group, validate_topic
from .retrypolicy import validate_policy
from .txlog import LogState

if TYPE_CHECKING:
    from .store import Store


def create_topic(store: "Store", name: str, *, read_queue_nums: int | None = None,
                 write_queue_nums: int | None = None, perm: int = PERM_RW,
                 attributes: dict | None = None, system: bool = False,
                 exist_ok: bool = False, retention_ms: int | None = None,
                 retention_bytes: int | None = None) -> TopicConfig:
    """Create a topic (committed at once). Returns its config.

    ``retention_ms`` / ``retention_bytes`` (per queue, message bodies) give the
    topic its own retention on top of the broker default (log/retention.py)."""
    store.require_writable()
    store.require_not_replica()
    validate_topic(name, system=system)
    n = store.config.default_topic_queue_nums
    rq = n if read_queue_nums is None else read_queue_nums
    wq = n if write_queue_nums is None else write_queue_nums
    check_queue_nums(rq, wq, perm)
    retention = retention_fields(retention_ms, retention_bytes)
    created: list[TopicConfig] = []

    def build(state: LogState):
        created.clear()
        if name in state.topics:
            if exist_ok:
                created.append(state.topics[name])
                return None
            raise TopicExistsError(f"topic {name!r} already exists")
        t = TopicConfig(name=name, id=state.next_topic_id(), read_queue_nums=rq,
                        write_queue_nums=wq, perm=perm, created_time=store.clock_ms(),
                        attributes=dict(attributes or {}), deleted=False, **retention)
        created.append(t)
        return [t]
    store.commit_actions(build, "CREATE TOPIC", {"topic": name})
    return created[0]


def update_topic(store: "Store", name: str, *, read_queue_nums: int | None = None,
                 write_queue_nums: int | None = None, perm: int | None = None,
                 attributes: dict | None = None, retention_ms: int | None = None,
                 retention_bytes: int | None = None) -> TopicConfig:
    """Change a topic's queue counts, permission, attributes or retention
    (``retention_ms`` / ``retention_bytes``: None keeps, 0 goes back to the
    broker default)."""
    store.require_writable()
    store.require_not_replica()
    retention = retention_fields(retention_ms, retention_bytes)   # validates before commit
    updated: list[TopicConfig] = []

    def build(state: LogState):
        t = state.topics.get(name)
        if t is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist")
        changes = {k: v for k, v in (("read_queue_nums", read_queue_nums),
                                     ("write_queue_nums", write_queue_nums), ("perm", perm))
                   if v is not None}
        if attributes is not None:
            changes["attributes"] = dict(attributes)
        t = replace(t, **changes, **retention)
        check_queue_nums(t.read_queue_nums, t.write_queue_nums, t.perm)
        updated[:] = [t]
        return [t]
    store.commit_actions(build, "UPDATE TOPIC", {"topic": name})
    return updated[0]


def delete_topic(store: "Store", name: str) -> None:
    """Delete a topic: its messages stay in segments until retention, unreadable."""
    store.require_writable()
    store.publish(force=True)   # persist its entries under the old id first
    tid = None

    def build(state: LogState):
        nonlocal tid
        t = state.topics.get(name)
        if t is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist")
        tid = t.id
        return [replace(t, deleted=True)]
    store.commit_actions(build, "DELETE TOPIC", {"topic": name})
    with store.append_lock:
        store.dispatcher.drop_topic(tid)


def commit_consumer_offsets(store: "Store", group: str, offsets: dict[tuple[str, int], int], *,
                            client_id: str | None = None) -> None:
    """Record a consumer group's offsets (next offset to consume) per (topic, queue)."""
    store.require_writable()
    validate_group(group)

    store.commit_actions(lambda state: consumer_offset_actions(state, group, offsets, client_id),
                         "COMMIT OFFSETS", {"group": group})


def consumer_offset_actions(state: LogState, group: str, offsets: dict[tuple[str, int], int],
                            client_id: str | None, *, where: str = "") -> list[dict] | None:
    """The ``consumerOffset`` actions recording ``offsets`` ((topic, queue) -> next
    offset) of ``group`` in ``state`` (None if there are none); TopicNotFoundError
    names ``where`` (a store) for an unknown topic."""
    actions = []
    for (topic, qid), off in sorted(offsets.items()):
        t = state.topics.get(topic)
        if t is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist{where}")
        actions.append(ConsumerOffset(group=group, topic_id=t.id, queue_id=int(qid),
                                      offset=int(off), client_id=client_id))
    return actions or None


def create_group(store: "Store", group: str, *, retry_max_times: int | None = None,
                 consume_broadcast_enable: bool = True, consume_enable: bool = True,
                 consume_message_orderly: bool = False,
                 retry_policy: Mapping | None = None) -> GroupConfig:
    """Create or replace a consumer group's subscription group config (mqadmin
    updateSubGroup), committed at once as a ``subscriptionGroup`` action.
    ``retry_max_times`` (None: the broker's ``maxReconsumeTimes``) bounds
    redeliveries before the dead-letter queue; ``consume_enable=False`` makes the
    broker refuse receives of the group, ``consume_broadcast_enable=False`` its
    broadcasting consumers (RocketMQ's defaults: both allowed);
    ``consume_message_orderly`` makes it a FIFO group (clients told ``fifo=true``);
    ``retry_policy`` (log/retrypolicy.py; None: RocketMQ's default customized steps) is
    sent to its consumers."""
    store.require_writable()
    validate_group(group)
    if retry_max_times is not None and not (is_whole(retry_max_times)
                                            and 0 <= retry_max_times <= 10_000):
        raise UserError(f"retry_max_times must be an integer in 0..10000, "
                        f"got {retry_max_times!r}")
    conf = GroupConfig(group_name=group, consume_enable=bool(consume_enable),
                       consume_broadcast_enable=bool(consume_broadcast_enable),
                       created_time=store.clock_ms(), deleted=False,
                       retry_max_times=retry_max_times,
                       consume_message_orderly=True if consume_message_orderly else None,
                       group_retry_policy=(None if retry_policy is None
                                           else validate_policy(retry_policy)))
    committed = [conf]

    def build(state: LogState):
        prev = state.subscription_groups.get(group)
        if prev is not None and prev.created_time is not None:
            committed[0] = replace(conf, created_time=prev.created_time)
        else:
            committed[0] = conf
        return [committed[0]]
    store.commit_actions(build, "UPDATE GROUP", {"group": group})
    return committed[0]


def delete_group(store: "Store", group: str, *, remove_offsets: bool = True) -> None:
    """Delete a group's config and (``remove_offsets``) its committed consumer
    offsets, in one commit. A group known only by its offsets can be deleted
    too; a group unknown in both ways is an error."""
    store.require_writable()

    def build(state: LogState):
        if group not in state.subscription_groups and \
                not any(k[0] == group for k in state.consumer_offsets):
            raise GroupNotFoundError(
                f"consumer group {group!r} has neither a config nor offsets in {store.url}")
        return group_delete_actions(state, group, remove_offsets=remove_offsets)
    store.commit_actions(build, "DELETE GROUP", {"group": group})


def check_queue_nums(rq: int, wq: int, perm: int) -> None:
    for name, v in (("read_queue_nums", rq), ("write_queue_nums", wq)):
        if not isinstance(v, int) or not MIN_QUEUE_NUMS <= v <= MAX_QUEUE_NUMS:
            raise UserError(f"{name} must be an integer in {MIN_QUEUE_NUMS}..{MAX_QUEUE_NUMS}, "
                            f"got {v!r}")
    if perm not in PERMS:
        raise UserError(f"perm must be 2 (write), 4 (read) or 6 (read+write), got {perm!r}")


def retention_fields(retention_ms: int | None, retention_bytes: int | None) -> dict:
    """The ``TopicConfig`` changes setting a topic's own retention (None keeps,
    0 goes back to the broker default); UserError for a bad value."""
    out = {}
    for attr, v, what in (("retention_ms", retention_ms, "retention_ms (milliseconds)"),
                          ("retention_bytes", retention_bytes,
                           "retention_bytes (bytes per queue)")):
        if v is None:
            continue
        if not is_whole(v) or v < 0:
            raise UserError(f"{what} must be a positive integer, or 0 for the broker "
                            f"default; got {v!r}")
        out[attr] = v or None
    return out


def group_delete_actions(state: LogState, group: str, *, remove_offsets: bool = True,
                         keep: frozenset | set = frozenset()) -> list:
    """The actions deleting ``group``'s subscription group config and (with
    ``remove_offsets``) its committed consumer offsets in ``state``, except the
    offset keys (group, topic id, queue id, client id) in ``keep``."""
    actions: list = [GroupConfig(group_name=group, deleted=True)]
    if remove_offsets:
        actions += [ConsumerOffset(group=g, topic_id=tid, queue_id=qid, client_id=cid or None,
                                   offset=None)
                    for (g, tid, qid, cid) in state.consumer_offsets
                    if g == group and (g, tid, qid, cid) not in keep]
    return actions


# ---------------------------------------------------------------- message types
#: RocketMQ 5's topic attribute naming the message type a topic accepts
MESSAGE_TYPE_ATTRIBUTE = "message.type"
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")


def message_type_attributes(message_type: str | None) -> dict:
    """The topic attributes for ``message_type`` (None: none, the topic accepts every
    type); UserError for an unknown type."""
    if message_type is None:
        return {}
    value = str(message_type).strip().upper()
    if value not in MESSAGE_TYPES:
        raise UserError(f"message type must be one of {', '.join(MESSAGE_TYPES)}; "
                        f"got {message_type!r}")
    return {MESSAGE_TYPE_ATTRIBUTE: value}


def topic_message_type(conf) -> str:
    """The message type ``conf`` accepts: its ``message.type`` attribute, MIXED when it
    has none (topics made before the attribute, or without a type, take every type)."""
    attrs = getattr(conf, "attributes", None) or {}
    return str(attrs.get(MESSAGE_TYPE_ATTRIBUTE) or "MIXED").upper()


def type_conflict(expected: str, actual: str) -> str | None:
    """Why a message of type ``actual`` may not go to a topic of type ``expected`` (the
    proxy's DefaultTopicMessageTypeValidator), or None."""
    if expected == "MIXED" or expected == actual:
        return None
    return (f"TopicMessageType validate failed, the expected type is {expected}, but actual "
            f"type is {actual}; send {expected} messages to this topic, or create it with "
            "--message-type MIXED")
