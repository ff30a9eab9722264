"""Transaction-log actions and the configs they carry, typed (FORMAT.md section 5).

Every line of a commit file is one JSON object with exactly one key, the action
type. This module is the one place that turns those objects into typed values
(:func:`parse_action`) and back (``action.to_json()``); no other module looks
an action's fields up by string. It implements format version
:data:`FORMAT_VERSION` (``format.FORMAT_VERSION``).

Rules every type here keeps:

* frozen: a state shares action values between versions, so none is changed in
  place; :func:`dataclasses.replace` makes a changed copy;
* round trip: ``parse_action(a).to_json() == a`` for every action this code or
  an older writer of the same format wrote. Optional fields that were absent stay
  absent, and fields this reader does not know are kept in ``extra`` and written
  back (a newer writer's field survives a checkpoint written by this one);
* defaults are defined once, here (``PERM_RW``, queue-count bounds).

Thread-safety: values are immutable; the functions are pure.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Iterable, Iterator, Mapping

from ..errors import CorruptStoreError
from . import format as fmt
from .actions_base import _EMPTY, JsonView, _Action, _Struct

FORMAT_VERSION = fmt.FORMAT_VERSION

PERM_NONE = 0
PERM_WRITE = 2
PERM_READ = 4
PERM_RW = PERM_READ | PERM_WRITE
PERMS = (PERM_NONE, PERM_WRITE, PERM_READ, PERM_RW)
MIN_QUEUE_NUMS = 1
MAX_QUEUE_NUMS = 1024



# ---------------------------------------------------------------- store identity
@dataclass(frozen=True)
class Protocol(_Action):
    """The reader and writer versions a store requires (section 1)."""

    KIND = "protocol"
    FIELDS = {"min_reader_version": "minReaderVersion", "min_writer_version": "minWriterVersion"}
    min_reader_version: int = fmt.MIN_READER_VERSION
    min_writer_version: int = fmt.MIN_WRITER_VERSION
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


def protocol_at_least(p: "Protocol | None", reader: int, writer: int = 1) -> "Protocol | None":
    """``p`` (a store's protocol; None: it has none) raised to need at least reader version
    ``reader`` and writer version ``writer``; None where it already does (the one rule for
    a commit that makes a store need more: ``TransactionLog.commit``'s upgrade, a
    message-id epoch's)."""
    if p is None:
        return Protocol(min_reader_version=reader, min_writer_version=writer)
    if p.min_reader_version >= reader and p.min_writer_version >= writer:
        return None
    return replace(p, min_reader_version=max(p.min_reader_version, reader),
                   min_writer_version=max(p.min_writer_version, writer))


@dataclass(frozen=True)
class IdEpoch(_Struct):
    """From physical offset ``start_offset`` on, message ids carry ``tag``."""

    FIELDS = {"start_offset": "startOffset", "tag": "tag"}
    start_offset: int
    tag: int
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class MetaData(_Action):
    """The store's identity: ``store_id`` fixes the message-id tag, and ``id_epochs``
    (None: none yet) the tags of the offsets after a crash (``log/idtags.py``)."""

    KIND = "metaData"
    FIELDS = {"store_id": "storeId", "created_time": "createdTime",
              "format_version": "formatVersion", "configuration": "configuration",
              "id_epochs": "idEpochs"}
    OPTIONAL = frozenset({"id_epochs"})
    NESTED: ClassVar[dict] = {"id_epochs": IdEpoch}
    store_id: str = ""
    created_time: int = 0
    format_version: int = FORMAT_VERSION
    configuration: Mapping = field(default_factory=lambda: _EMPTY)
    id_epochs: tuple[IdEpoch, ...] | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


# ---------------------------------------------------------------- topics and groups
@dataclass(frozen=True)
class TopicConfig(JsonView, _Action):
    """A topic's whole config; the newest with an ``id`` replaces the previous one.

    ``perm``: 2 write, 4 read, 6 both, 0 none. ``retention_ms`` /
    ``retention_bytes`` (per queue): the topic's own retention, None for the
    broker default."""

    KIND = "topic"
    FIELDS = {"attributes": "attributes", "created_time": "createdTime", "deleted": "deleted",
              "id": "id", "name": "name", "perm": "perm", "read_queue_nums": "readQueueNums",
              "retention_bytes": "retentionBytes", "retention_ms": "retentionMs",
              "write_queue_nums": "writeQueueNums"}
    OPTIONAL = frozenset({"retention_bytes", "retention_ms"})
    name: str
    id: int
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_RW
    created_time: int = 0
    attributes: Mapping = field(default_factory=lambda: _EMPTY)
    deleted: bool = False
    retention_ms: int | None = None
    retention_bytes: int | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


@dataclass(frozen=True)
class GroupConfig(JsonView, _Action):
    """A consumer group's subscription group config (mqadmin updateSubGroup).
    ``retry_max_times`` None: the broker's ``maxReconsumeTimes``."""

    KIND = "subscriptionGroup"
    FIELDS = {"consume_broadcast_enable": "consumeBroadcastEnable",
              "consume_enable": "consumeEnable",
              "consume_message_orderly": "consumeMessageOrderly", "created_time": "createdTime",
              "deleted": "deleted", "group_name": "groupName",
              "retry_max_times": "retryMaxTimes", "group_retry_policy": "groupRetryPolicy"}
    OPTIONAL = frozenset({"consume_broadcast_enable", "consume_enable", "created_time",
                          "retry_max_times", "consume_message_orderly", "group_retry_policy"})
    group_name: str
    consume_enable: bool | None = None
    consume_broadcast_enable: bool | None = None
    created_time: int | None = None
    deleted: bool = False
    retry_max_times: int | None = None
    consume_message_orderly: bool | None = None
    group_retry_policy: Mapping | None = None      # log/retrypolicy.py; None: the default
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def retry_policy(self) -> dict:
        """The group's retry policy (``groupRetryPolicy``), RocketMQ's default when unset."""
        from .retrypolicy import default_policy, validate_policy
        if self.group_retry_policy is None:
            return default_policy()
        return validate_policy(self.group_retry_policy)

    @property
    def orderly(self) -> bool:
        """``consumeMessageOrderly`` (RocketMQ's FIFO consumer group), false when absent."""
        return bool(self.consume_message_orderly)

    @property
    def receives_allowed(self) -> bool:
        """``consumeEnable``, true when absent (RocketMQ's default)."""
        return self.consume_enable is not False

    @property
    def broadcast_allowed(self) -> bool:
        """``consumeBroadcastEnable``, true when absent (RocketMQ's default)."""
        return self.consume_broadcast_enable is not False


@dataclass(frozen=True)
class ConsumerOffset(_Action):
    """A group's next offset in one queue; ``offset`` None deletes the key."""

    KIND = "consumerOffset"
    FIELDS = {"client_id": "clientId", "group": "group", "offset": "offset",
              "queue_id": "queueId", "topic_id": "topicId"}
    group: str
    topic_id: int
    queue_id: int
    offset: int | None
    client_id: str | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def key(self) -> tuple[str, int, int, str]:
        return self.group, self.topic_id, self.queue_id, self.client_id or ""


# ---------------------------------------------------------------- files
@dataclass(frozen=True)
class QueueStats(_Struct):
    """One (topic, queue)'s range inside a ConsumeQueue file (``maxOffset`` exclusive)."""

    FIELDS = {"max_batch_offset": "maxBatchOffset", "max_offset": "maxOffset",
              "max_timestamp": "maxTimestamp", "min_batch_offset": "minBatchOffset",
              "min_offset": "minOffset", "min_timestamp": "minTimestamp",
              "queue_id": "queueId", "topic_id": "topicId"}
    OPTIONAL = frozenset({"max_batch_offset", "min_batch_offset", "max_timestamp",
                          "min_timestamp"})
    topic_id: int
    queue_id: int
    min_offset: int
    max_offset: int
    min_timestamp: int | None = None
    max_timestamp: int | None = None
    min_batch_offset: int | None = None
    max_batch_offset: int | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class AddFile(_Action):
    """An ``add``: a file joins the store (or a growing segment is re-added).

    ``kind`` is ``segment`` (``base_offset``, ``sealed``, ``modification_time``,
    optional ``reserved_size``), ``consumequeue`` (``rows``, ``queues``) or
    ``index`` (``rows``, ``topic_ids``, time and batch-offset bounds)."""

    KIND = "add"
    FIELDS = {"base_offset": "baseOffset", "kind": "kind", "max_batch_offset": "maxBatchOffset",
              "max_timestamp": "maxTimestamp", "min_batch_offset": "minBatchOffset",
              "min_timestamp": "minTimestamp", "modification_time": "modificationTime",
              "path": "path", "queues": "queues", "reserved_size": "reservedSize",
              "rows": "rows", "sealed": "sealed", "size": "size", "topic_ids": "topicIds"}
    OPTIONAL = frozenset(set(FIELDS) - {"kind", "path", "size"})
    NESTED: ClassVar[dict] = {"queues": QueueStats}
    KINDS: ClassVar[tuple[str, ...]] = ("segment", "consumequeue", "index")
    path: str
    kind: str
    size: int
    base_offset: int | None = None
    sealed: bool | None = None
    modification_time: int | None = None
    reserved_size: int | None = None
    rows: int | None = None
    queues: tuple[QueueStats, ...] | None = None
    topic_ids: tuple[int, ...] | None = None
    min_timestamp: int | None = None
    max_timestamp: int | None = None
    min_batch_offset: int | None = None
    max_batch_offset: int | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise CorruptStoreError(f"add action has unknown kind {self.kind!r}")
        if self.kind == "segment" and self.base_offset is None:
            raise CorruptStoreError(f"segment add of {self.path} lacks baseOffset")

    @property
    def end_offset(self) -> int:
        """A segment's address end: ``base_offset`` + reserved (or readable) size."""
        return int(self.base_offset or 0) + int(
            self.size if self.reserved_size is None else self.reserved_size)


@dataclass(frozen=True)
class RemoveFile(_Action):
    """A ``remove``: ``path`` leaves the snapshot; the file is deleted later.
    ``data_change``: messages stop being readable (retention) or not (compaction)."""

    KIND = "remove"
    FIELDS = {"data_change": "dataChange", "deletion_timestamp": "deletionTimestamp",
              "path": "path"}
    OPTIONAL = frozenset({"data_change", "deletion_timestamp"})
    path: str
    deletion_timestamp: int | None = None
    data_change: bool | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class QueueFloor(_Struct):
    """The first queue offset still stored in one (topic, queue)."""

    FIELDS = {"min_offset": "minOffset", "queue_id": "queueId", "topic_id": "topicId"}
    topic_id: int
    queue_id: int
    min_offset: int
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class Retention(_Action):
    """The floor below which data is gone; the newest replaces the previous one."""

    KIND = "retention"
    FIELDS = {"min_physical_offset": "minPhysicalOffset", "queues": "queues", "time": "time"}
    OPTIONAL = frozenset({"time"})
    NESTED: ClassVar[dict] = {"queues": QueueFloor}
    min_physical_offset: int = 0
    queues: tuple[QueueFloor, ...] = ()
    time: int | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


# ---------------------------------------------------------------- writers
@dataclass(frozen=True)
class Txn(_Action):
    """Idempotence record of an application writer (appId, version)."""

    KIND = "txn"
    FIELDS = {"app_id": "appId", "last_updated": "lastUpdated", "version": "version"}
    OPTIONAL = frozenset({"last_updated"})
    app_id: str
    version: int
    last_updated: int | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class Lease(_Action):
    """The single writer lease; ``endpoint`` is a broker's admin URL where other
    processes hand their commits. ``owner`` is ``host:pid:token`` (the token, random
    per open, is the holder's identity); ``scope`` names where that pid means the
    holder's process (host, boot, PID namespace): only a process of the same scope
    may judge the holder gone by its pid. Absent in leases written by format-1 writers."""

    KIND = "lease"
    FIELDS = {"acquired_time": "acquiredTime", "endpoint": "endpoint", "epoch": "epoch",
              "expires_time": "expiresTime", "owner": "owner", "released": "released",
              "scope": "scope"}
    OPTIONAL = frozenset({"acquired_time", "endpoint", "expires_time", "scope"})
    owner: str
    epoch: int
    acquired_time: int | None = None
    expires_time: int | None = None
    released: bool = False
    endpoint: str | None = None
    scope: str | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class CommitInfo(_Action):
    """Exactly one per commit, last: the monotonic commit ``timestamp``."""

    KIND = "commitInfo"
    FIELDS = {"operation": "operation", "operation_parameters": "operationParameters",
              "timestamp": "timestamp"}
    OPTIONAL = frozenset({"operation", "operation_parameters"})
    timestamp: int = 0
    operation: str | None = None
    operation_parameters: Mapping | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class Sidecar(_Action):
    """One line of a checkpoint manifest (reader version 3, FORMAT.md section 6): the
    sidecar file at ``path`` holds part ``part``/``bucket`` (of ``buckets``) of the
    state, ``actions`` JSON lines, ``size`` bytes whose CRC32C is ``checksum``;
    ``version`` is the checkpoint it was written for (it may be reused by later ones)."""

    KIND = "sidecar"
    FIELDS = {"actions": "actions", "bucket": "bucket", "buckets": "buckets",
              "checksum": "checksum", "part": "part", "path": "path", "size": "size",
              "version": "version"}
    path: str
    part: str
    bucket: int
    buckets: int
    version: int
    actions: int
    size: int
    checksum: str
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class UnknownAction:
    """An action type this reader does not know: skipped by replay (section 11),
    kept as it was."""

    kind: str
    raw: Mapping

    @property
    def KIND(self) -> str:     # noqa: N802  (the typed actions' class attribute)
        return self.kind

    def to_json(self) -> dict:
        return {self.kind: dict(self.raw)}


from .auth_actions import Acl, User  # noqa: E402

ACTION_TYPES: dict[str, type] = {t.KIND: t for t in (
    Protocol, MetaData, TopicConfig, GroupConfig, ConsumerOffset, AddFile, RemoveFile,
    Retention, Txn, Lease, CommitInfo, User, Acl, Sidecar)}

Action = (Protocol | MetaData | TopicConfig | GroupConfig | ConsumerOffset | AddFile
          | RemoveFile | Retention | Txn | Lease | CommitInfo | User | Acl | Sidecar
          | UnknownAction)


def parse_action(obj: Mapping, where: str = "") -> Action:
    """The typed action of one decoded JSON line; ``CorruptStoreError`` naming
    ``where`` when it is not an object with exactly one key or lacks a field."""
    if (type(obj) is not dict and not isinstance(obj, Mapping)) or len(obj) != 1:
        raise CorruptStoreError(f"{where}: an action is a JSON object with exactly one key, "
                                f"got {obj!r:.200}")
    (kind, body), = obj.items()
    cls = ACTION_TYPES.get(kind)
    if cls is None:
        return UnknownAction(kind, body)
    if type(body) is not dict and not isinstance(body, Mapping):
        raise CorruptStoreError(f"{where}: {kind} action body is not an object: {body!r:.200}")
    try:
        return cls.from_body(body)
    except (TypeError, ValueError) as e:
        raise CorruptStoreError(f"{where}: malformed {kind} action ({e}): {dict(body)}") from None


# ---------------------------------------------------------------- commit files
def encode_actions(actions: Iterable[Action | dict]) -> bytes:
    """A commit file's bytes: one line of compact, key-sorted JSON per action
    (``a.to_json()``; a raw JSON dict is written as it is)."""
    return ("\n".join(json.dumps(a if type(a) is dict else a.to_json(), separators=(",", ":"),
                                 sort_keys=True) for a in actions) + "\n").encode()


def _json_lines(data: bytes, where: str) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON) of each non-empty line; ``CorruptStoreError``
    naming ``where`` and the line when one is not UTF-8 JSON."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise CorruptStoreError(f"{where} is not UTF-8 text: {exc}") from None
    lines = text.splitlines()
    if len(lines) > 1 and all(line.startswith("{") for line in lines):
        try:                    # one decode for the whole file (a checkpoint's sidecar)
            objs = json.loads("[" + ",".join(lines) + "]")
        except json.JSONDecodeError:
            objs = None         # some line is not JSON: the loop below names it
        if objs is not None and len(objs) == len(lines):    # else lines ran together
            return enumerate(objs, 1)
    return _each_line(lines, where)


def _each_line(lines: list[str], where: str) -> Iterator[tuple[int, Any]]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorruptStoreError(f"{where} line {n} is not JSON: {exc}") from exc


def decode_actions(data: bytes, where: str) -> list[dict]:
    """The raw JSON object of each line (for tools that show a commit as written);
    replay uses :func:`parse_actions`."""
    return [obj for _, obj in _json_lines(data, where)]


def parse_actions(data: bytes, where: str) -> list[Action]:
    """The typed action of each line (:func:`parse_action`); ``CorruptStoreError``
    naming the file and line of a malformed one."""
    return [parse_action(obj, f"{where} line {n}") for n, obj in _json_lines(data, where)]
