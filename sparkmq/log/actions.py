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

import dataclasses
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Iterable, Iterator, Mapping

from ..errors import CorruptStoreError
from . import format as fmt

FORMAT_VERSION = fmt.FORMAT_VERSION

PERM_NONE = 0
PERM_WRITE = 2
PERM_READ = 4
PERM_RW = PERM_READ | PERM_WRITE
PERMS = (PERM_NONE, PERM_WRITE, PERM_READ, PERM_RW)
MIN_QUEUE_NUMS = 1
MAX_QUEUE_NUMS = 1024

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _frozen(d: Mapping | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d)) if d else _EMPTY


class JsonView:
    """Read-only access to a public config by its JSON names (``conf["readQueueNums"]``,
    ``.get``, ``in``), answering what the JSON of FORMAT.md answers (absent optional
    fields are missing). For users of the public API who read configs as the JSON
    dicts earlier versions returned; code inside sparkmq uses attributes
    (tests/test_layering.py checks)."""

    def _json_attr(self, key: str):
        names = type(self).__dict__.get("_json_names")
        if names is None:
            names = {k: a for a, k in self.FIELDS.items()}    # type: ignore[attr-defined]
            type(self)._json_names = names
        attr = names.get(key)
        if attr is None:
            if key in self.extra:                              # type: ignore[attr-defined]
                return _to_json_value(self.extra[key])         # type: ignore[attr-defined]
            raise KeyError(key)
        v = getattr(self, attr)
        if v is None and attr in self.OPTIONAL:                # type: ignore[attr-defined]
            raise KeyError(key)
        return _to_json_value(v)

    def __getitem__(self, key: str):
        return self._json_attr(key)

    def get(self, key: str, default=None):
        try:
            return self._json_attr(key)
        except KeyError:
            return default

    def __contains__(self, key: str) -> bool:
        try:
            self._json_attr(key)
            return True
        except KeyError:
            return False


class _Action:
    """Base of every action: ``KIND`` is its JSON key; ``FIELDS`` maps the
    attribute names to JSON names, in the order they are declared; attributes in
    ``OPTIONAL`` are left out of the JSON when None."""

    KIND: ClassVar[str] = ""
    FIELDS: ClassVar[dict[str, str]] = {}
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def body(self) -> dict:
        """The action's JSON body (without the action-type key)."""
        out = dict(self.extra)    # type: ignore[attr-defined]
        for attr, key in self.FIELDS.items():
            v = getattr(self, attr)
            if v is None and attr in self.OPTIONAL:
                continue
            out[key] = _to_json_value(v)
        return out

    def to_json(self) -> dict:
        return {self.KIND: self.body()}

    def __reduce__(self):
        # (mapping fields are read-only proxies, which do not pickle): rebuild from JSON
        return type(self).from_body, (self.body(),)

    @classmethod
    def from_body(cls, body: Mapping) -> "_Action":
        plan = cls.__dict__.get("_plan") or _plan(cls)
        kwargs = {}
        for attr, key, required, nested in plan:
            v = body.get(key, _MISSING)
            if v is _MISSING:
                if required:
                    raise CorruptStoreError(f"{cls.KIND} action lacks {key!r}: {dict(body)}")
                continue
            if nested is not None:
                v = tuple(nested.from_json(x) for x in v)
            elif type(v) is dict:
                v = _frozen(v)
            elif type(v) is list:
                v = tuple(v)
            kwargs[attr] = v
        if len(body) > len(kwargs):
            known = cls.__dict__["_known"]
            extra = {k: v for k, v in body.items() if k not in known}
            if extra:
                kwargs["extra"] = _frozen(extra)
        obj = _built(cls, {**cls.__dict__["_defaults"], **kwargs})
        if hasattr(cls, "__post_init__"):
            obj.__post_init__()
        return obj


_MISSING = object()


def _plan(cls) -> tuple:
    """(attribute, JSON key, required, nested struct type) per field of ``cls``, cached."""
    nested = getattr(cls, "NESTED", {})
    plan = tuple((attr, key, attr not in cls.OPTIONAL and not _has_default(cls, attr),
                  nested.get(attr)) for attr, key in cls.FIELDS.items())
    cls._plan = plan
    cls._known = frozenset(cls.FIELDS.values())
    cls._defaults = {f.name: f.default if f.default is not dataclasses.MISSING
                     else f.default_factory()
                     for f in dataclasses.fields(cls)
                     if f.default is not dataclasses.MISSING
                     or f.default_factory is not dataclasses.MISSING}
    return plan


def _built(cls, values: dict):
    """An instance of the frozen dataclass ``cls`` holding ``values`` (every field),
    made without the frozen ``__init__`` and its per-field ``object.__setattr__``:
    replay builds one value per action and one per queue of every ConsumeQueue add,
    and this halves the cost of loading a snapshot. The values are checked by the
    caller (required fields present; defaults filled in)."""
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


def _has_default(cls, attr: str) -> bool:
    f = cls.__dataclass_fields__[attr]
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _to_json_value(v):
    if isinstance(v, Mapping):
        return {k: _to_json_value(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_to_json_value(x) for x in v]
    if isinstance(v, _Struct):
        return v.to_json()
    return v


class _Struct:
    """A nested JSON object inside an action (a queue's stats, a queue floor)."""

    FIELDS: ClassVar[dict[str, str]] = {}
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict:
        out = dict(self.extra)    # type: ignore[attr-defined]
        for attr, key in self.FIELDS.items():
            v = getattr(self, attr)
            if v is None and attr in self.OPTIONAL:
                continue
            out[key] = v
        return out

    def __reduce__(self):
        return type(self).from_json, (self.to_json(),)

    @classmethod
    def from_json(cls, body: Mapping):
        if len(body) == len(cls.FIELDS):    # the common case: every field, nothing else
            try:
                values = dict(zip(cls.FIELDS, map(body.__getitem__, cls.FIELDS.values())))
            except KeyError:
                pass
            else:
                values["extra"] = _EMPTY
                return _built(cls, values)
        known = set(cls.FIELDS.values())
        kwargs = {attr: body[key] for attr, key in cls.FIELDS.items() if key in body}
        missing = [key for attr, key in cls.FIELDS.items()
                   if key not in body and attr not in cls.OPTIONAL]
        if missing:
            raise CorruptStoreError(f"{cls.__name__} lacks {missing}: {dict(body)}")
        return cls(**kwargs, extra=_frozen({k: v for k, v in body.items() if k not in known}))


# ---------------------------------------------------------------- store identity
@dataclass(frozen=True)
class Protocol(_Action):
    """The reader and writer versions a store requires (section 1)."""

    KIND = "protocol"
    FIELDS = {"min_reader_version": "minReaderVersion", "min_writer_version": "minWriterVersion"}
    min_reader_version: int = fmt.MIN_READER_VERSION
    min_writer_version: int = fmt.MIN_WRITER_VERSION
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)


@dataclass(frozen=True)
class MetaData(_Action):
    """The store's identity: ``store_id`` fixes the message-id tag."""

    KIND = "metaData"
    FIELDS = {"store_id": "storeId", "created_time": "createdTime",
              "format_version": "formatVersion", "configuration": "configuration"}
    store_id: str = ""
    created_time: int = 0
    format_version: int = FORMAT_VERSION
    configuration: Mapping = field(default_factory=lambda: _EMPTY)
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
              "consume_enable": "consumeEnable", "created_time": "createdTime",
              "deleted": "deleted", "group_name": "groupName",
              "retry_max_times": "retryMaxTimes"}
    OPTIONAL = frozenset({"consume_broadcast_enable", "consume_enable", "created_time",
                          "retry_max_times"})
    group_name: str
    consume_enable: bool | None = None
    consume_broadcast_enable: bool | None = None
    created_time: int | None = None
    deleted: bool = False
    retry_max_times: int | None = None
    extra: Mapping = field(default_factory=lambda: _EMPTY, compare=False)

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


ACTION_TYPES: dict[str, type] = {t.KIND: t for t in (
    Protocol, MetaData, TopicConfig, GroupConfig, ConsumerOffset, AddFile, RemoveFile,
    Retention, Txn, Lease, CommitInfo)}

Action = (Protocol | MetaData | TopicConfig | GroupConfig | ConsumerOffset | AddFile
          | RemoveFile | Retention | Txn | Lease | CommitInfo | UnknownAction)


def parse_action(obj: Mapping, where: str = "") -> Action:
    """The typed action of one decoded JSON line; ``CorruptStoreError`` naming
    ``where`` when it is not an object with exactly one key or lacks a field."""
    if not isinstance(obj, Mapping) or len(obj) != 1:
        raise CorruptStoreError(f"{where}: an action is a JSON object with exactly one key, "
                                f"got {obj!r:.200}")
    (kind, body), = obj.items()
    cls = ACTION_TYPES.get(kind)
    if cls is None:
        return UnknownAction(kind, body)
    if not isinstance(body, Mapping):
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
    for n, line in enumerate(text.splitlines(), 1):
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
