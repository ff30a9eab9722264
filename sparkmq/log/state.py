"""The reconciled state of a store's transaction log at one version (FORMAT.md section 7):
what replaying the actions gives, and the views derived from it. Built by
``txlog.TransactionLog``; every reader and writer of the store works on one.

Thread-safety: a state returned by the log is never changed again (``copy`` makes a new
one to apply more actions to); its derived views are computed once.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from ..errors import UnsupportedFormatError
from . import format as fmt
from .actions import (Action, AddFile, CommitInfo, ConsumerOffset, GroupConfig, Lease,
                      MetaData, Protocol, RemoveFile, Retention, TopicConfig, Txn,
                      parse_action)
from .auth_actions import Acl, User
from .idtags import IdTags
from .checkpoint import part_key

log = logging.getLogger("sparkmq.txlog")


def _put(live: dict, key: str, action) -> None:
    """The newest action of ``key`` replaces the previous one; a deleted one removes it."""
    if action.deleted:
        live.pop(key, None)
    else:
        live[key] = action


@dataclass
class LogState:
    """The reconciled state of the log at one version."""

    version: int = -1
    timestamp_ms: int = 0
    protocol: Protocol | None = None
    metadata: MetaData | None = None
    topics: dict[str, TopicConfig] = field(default_factory=dict)        # live, by name
    topics_by_id: dict[int, TopicConfig] = field(default_factory=dict)  # every topic ever
    segments: dict[str, AddFile] = field(default_factory=dict)    # path -> add (segment)
    consumequeue_files: dict[str, AddFile] = field(default_factory=dict)
    index_files: dict[str, AddFile] = field(default_factory=dict)
    txns: dict[str, Txn] = field(default_factory=dict)            # appId -> txn
    lease: Lease | None = None
    consumer_offsets: dict[tuple, int] = field(default_factory=dict)
    retention: Retention | None = None
    subscription_groups: dict[str, GroupConfig] = field(default_factory=dict)  # live
    # path -> remove of files removed and not added again (their deletion is due
    # deletion_timestamp + deletedFileRetentionMs later; checkpoints keep them a while)
    tombstones: dict[str, RemoveFile] = field(default_factory=dict)
    users: dict[str, User] = field(default_factory=dict)    # ACL 2.0 users, live, by name
    acls: dict[str, Acl] = field(default_factory=dict)      # live, by subject (User:<name>)
    # checkpoints in parts (checkpoint.py): the parts of the checkpoint this state was
    # loaded from or last wrote (shared between states, never changed), and the
    # (part, key) of every entry changed since; None: no such checkpoint, write all parts
    parts: dict | None = field(default=None, repr=False, compare=False)
    dirty: set | None = field(default=None, repr=False, compare=False)
    # derived views (queue offset ranges, address end), computed once per state
    _views: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- replay ------------------------------------------------------------
    def apply(self, action: Action | dict) -> None:
        """Apply one typed action (a raw JSON dict is parsed first); unknown
        action types from newer writers of the same reader version are skipped."""
        if type(action) is dict:
            action = parse_action(action)
        self._views.clear()
        if self.dirty is not None:
            key = part_key(action)
            if key is not None:
                self.dirty.add(key)
        match action:
            case AddFile():
                self._files(action.kind)[action.path] = action
                self.tombstones.pop(action.path, None)
            case CommitInfo():
                self.timestamp_ms = int(action.timestamp)
            case ConsumerOffset():
                if action.offset is None:
                    self.consumer_offsets.pop(action.key, None)
                else:
                    self.consumer_offsets[action.key] = int(action.offset)
            case RemoveFile():
                for target in (self.segments, self.consumequeue_files, self.index_files):
                    target.pop(action.path, None)
                self.tombstones[action.path] = action
            case TopicConfig():
                self._apply_topic(action)
            case Txn():
                self.txns[action.app_id] = action
            case Lease():
                self.lease = action
            case Retention():
                self.retention = action
            case GroupConfig():
                if action.deleted:
                    self.subscription_groups.pop(action.group_name, None)
                else:
                    self.subscription_groups[action.group_name] = action
            case Protocol():
                if action.min_reader_version > fmt.READER_VERSION:
                    raise UnsupportedFormatError(
                        f"store needs reader version {action.min_reader_version}; this "
                        f"sparkmq reads up to version {fmt.READER_VERSION}. Upgrade sparkmq.")
                self.protocol = action
            case MetaData():
                self.metadata = action
            case User():
                _put(self.users, action.username, action)
            case Acl():
                _put(self.acls, action.subject, action)
            case _:
                log.debug("ignoring unknown action %s", getattr(action, "kind", action))

    def _apply_topic(self, t: TopicConfig) -> None:
        """The newest config of id ``t.id`` replaces the previous one (which may have
        had another name): found through ``topics_by_id``, not by scanning every
        live topic (a scan per topic action made replay quadratic in topics)."""
        old = self.topics_by_id.get(t.id)
        self.topics_by_id[t.id] = t
        if old is not None:
            live = self.topics.get(old.name)
            if live is not None and live.id == t.id:
                del self.topics[old.name]
        if not t.deleted:
            self.topics[t.name] = t

    def _files(self, kind: str) -> dict:
        if kind == "segment":
            return self.segments
        if kind == "consumequeue":
            return self.consumequeue_files
        return self.index_files

    def copy(self) -> "LogState":
        """A state to apply more actions to: new containers, shared action bodies
        (they are never changed in place; a deep copy of every add on each
        commit was the publish thread's main cost on big stores)."""
        return LogState(
            version=self.version, timestamp_ms=self.timestamp_ms, protocol=self.protocol,
            metadata=self.metadata, topics=dict(self.topics),
            topics_by_id=dict(self.topics_by_id), segments=dict(self.segments),
            consumequeue_files=dict(self.consumequeue_files),
            index_files=dict(self.index_files), txns=dict(self.txns), lease=self.lease,
            consumer_offsets=dict(self.consumer_offsets), retention=self.retention,
            subscription_groups=dict(self.subscription_groups),
            tombstones=dict(self.tombstones), users=dict(self.users), acls=dict(self.acls),
            parts=self.parts, dirty=None if self.dirty is None else self.dirty.copy())

    def _view(self, name: str, build: Callable[[], object]):
        v = self._views.get(name)
        if v is None:
            v = self._views[name] = build()
        return v

    # -- derived views -----------------------------------------------------
    @property
    def store_id(self) -> str:
        return self.metadata.store_id if self.metadata else ""

    @property
    def id_tags(self) -> IdTags:
        """The tags of the store's message ids by offset (``log/idtags.py``)."""
        return self._view("id_tags", lambda: IdTags(self.metadata))

    def next_topic_id(self) -> int:
        return max(self.topics_by_id, default=-1) + 1

    def address_end(self) -> int:
        """First physical offset after every segment (the next segment's base)."""
        return self._view("address_end", self._address_end)

    def _address_end(self) -> int:
        end = self.min_physical_offset()
        for add in self.segments.values():
            end = max(end, add.end_offset)
        return end

    def min_physical_offset(self) -> int:
        return int(self.retention.min_physical_offset) if self.retention else 0

    def queue_max_offsets(self) -> dict[tuple[int, int], int]:
        """(topic_id, queue_id) -> next queue offset, from the ConsumeQueue file stats.

        Computed once per state; callers must not change the dict."""
        return self._view("queue_max_offsets", self._queue_max_offsets)

    def _queue_max_offsets(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for add in self.consumequeue_files.values():
            for q in add.queues or ():
                key = (q.topic_id, q.queue_id)
                out[key] = max(out.get(key, 0), int(q.max_offset))
        for f in self._floors():
            # a queue whose files all went to retention still continues from its floor
            key = (f.topic_id, f.queue_id)
            out[key] = max(out.get(key, 0), int(f.min_offset))
        return out

    def queue_min_offsets(self) -> dict[tuple[int, int], int]:
        """(topic_id, queue_id) -> first queue offset still stored.

        Computed once per state; callers must not change the dict."""
        return self._view("queue_min_offsets", self._queue_min_offsets)

    def _queue_min_offsets(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for add in self.consumequeue_files.values():
            for q in add.queues or ():
                key = (q.topic_id, q.queue_id)
                out[key] = min(out.get(key, 1 << 62), int(q.min_offset))
        for f in self._floors():
            # also when retention removed every file of the queue: it starts at its floor
            key = (f.topic_id, f.queue_id)
            out[key] = max(out.get(key, 0), int(f.min_offset))
        return out

    def _floors(self) -> tuple:
        return self.retention.queues if self.retention else ()

    def prune_tombstones(self, older_than_ms: int) -> None:
        """Forget tombstones whose ``deletionTimestamp`` is below ``older_than_ms``
        (only on a state not yet returned to anyone: states are immutable after)."""
        for path in [p for p, rm in self.tombstones.items()
                     if int(rm.deletion_timestamp or 0) < older_than_ms]:
            del self.tombstones[path]
            if self.dirty is not None:
                self.dirty.add(part_key(RemoveFile(path=path)))

    def live_actions(self) -> list[Action]:
        """The actions that rebuild this state (the content of a checkpoint)."""
        out: list[Action] = [a for a in (self.protocol, self.metadata) if a]
        out += sorted(self.topics_by_id.values(), key=lambda t: t.id)
        for files in (self.segments, self.consumequeue_files, self.index_files):
            out += files.values()
        out += self.tombstones.values()
        out += self.txns.values()
        if self.lease:
            out.append(self.lease)
        for (group, tid, qid, cid), off in sorted(self.consumer_offsets.items()):
            out.append(ConsumerOffset(group=group, topic_id=tid, queue_id=qid,
                                      client_id=cid or None, offset=off))
        if self.retention:
            out.append(self.retention)
        out += (self.subscription_groups[name] for name in sorted(self.subscription_groups))
        out += [self.users[n] for n in sorted(self.users)] + [self.acls[n] for n in sorted(self.acls)]
        out.append(CommitInfo(timestamp=self.timestamp_ms, operation="CHECKPOINT"))
        return out
