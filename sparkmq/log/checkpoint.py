"""Checkpoints in parts (reader version 3, docs/FORMAT.md section 6), after Delta Lake's
v2 checkpoints with sidecars.

A checkpoint ``_log/<N>.checkpoint.json`` is a small *manifest*: the unpartitioned
actions (``protocol``, ``metaData``, ``lease``), one ``sidecar`` line per part, and the
CHECKPOINT ``commitInfo``. The rest of the state lives in sidecar files under
``_log/_sidecars/``, one per (part, bucket): every entry of the state belongs to one part
by its kind (:data:`PARTS`) and to one of the part's ``buckets`` (a power of two) by the
CRC32 of its key (:func:`bucket_of`), so an entry stays in its bucket from one checkpoint
to the next. A writer remembers the parts of the checkpoint its state was built from
(``LogState.parts``) and the keys changed since (``LogState.dirty``, kept by
``LogState.apply``); the next checkpoint rewrites only the buckets holding changed keys
and names the others' sidecars again. Its cost is the changed buckets, not the state.

On-disk invariants (what log cleanup relies on):

* a sidecar is written once, whole (put-if-absent, before the manifest naming it) and
  never changed; its name holds the checkpoint version it was written for and a random
  id (two writers of one version never collide);
* a manifest of version ``N`` names only sidecars written for versions above
  ``N - max_age_versions``: a part whose sidecar nears that age is rewritten even if
  unchanged (:func:`_stale`, staggered by bucket). So a sidecar written for a version
  at or below ``C - max_age_versions`` is named by no checkpoint ``>= C``.

Loading checks every sidecar against its manifest line (size, CRC32C, number of
actions, and that each action belongs to the part and bucket): a missing or damaged one
is ``CorruptStoreError``, on which the log falls back to an older checkpoint.

Thread-safety: the functions keep no state; a ``Parts`` value is never changed.
"""
from __future__ import annotations

import gc
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator

import crc32c

from ..errors import CorruptStoreError
from . import format as fmt
from .actions import (AddFile, ConsumerOffset, GroupConfig, RemoveFile, Retention, Sidecar,
                      TopicConfig, Txn, encode_actions, parse_actions)
from .auth_actions import Acl, User

if TYPE_CHECKING:
    from .fs import StoreFS
    from .state import LogState

#: the parts of a checkpoint, in the order a manifest lists them
PARTS = ("topic", "file", "txn", "offset", "group", "auth", "retention")
#: entries per sidecar a writer aims at (a part's bucket count is chosen from it)
ENTRIES_PER_PART = 256
#: a manifest of version N names no sidecar written for a version <= N - this
SIDECAR_MAX_AGE_VERSIONS = 20_000
# sidecars read at once from an object store (a GET each)
_READ_THREADS = 16

_KEYS = {
    AddFile: lambda a: ("file", a.path),
    RemoveFile: lambda a: ("file", a.path),
    TopicConfig: lambda a: ("topic", a.id),
    ConsumerOffset: lambda a: ("offset", a.key),
    Txn: lambda a: ("txn", a.app_id),
    GroupConfig: lambda a: ("group", a.group_name),
    User: lambda a: ("auth", ("u", a.username)),
    Acl: lambda a: ("auth", ("a", a.subject)),
    Retention: lambda a: ("retention", ""),
}


def part_key(action) -> tuple[str, object] | None:
    """(part, key) of the state entry an action sets; None for the unpartitioned actions
    (protocol, metaData, lease, commitInfo) and unknown ones."""
    f = _KEYS.get(type(action))
    return f(action) if f is not None else None


def bucket_of(part: str, key, buckets: int) -> int:
    """The bucket of ``key`` among ``buckets``: CRC32 of its text (FORMAT.md section 6).
    Consumer offsets hash by (group, topic id), so one group's queues of a topic share one."""
    if part == "offset":
        text = f"{key[0]}\0{key[1]}"
    elif part == "auth":
        text = f"{key[0]}\0{key[1]}"
    else:
        text = str(key)
    return zlib.crc32(text.encode()) % buckets


def checksum(data: bytes) -> str:
    return f"crc32c:{crc32c.crc32c(data):08x}"


@dataclass(frozen=True)
class PartSet:
    """The sidecars of one part: bucket -> (manifest line, keys it holds)."""

    buckets: int
    sidecars: dict


# ---------------------------------------------------------------- the state's entries
def _count(state: "LogState", part: str) -> int:
    if part == "topic":
        return len(state.topics_by_id)
    if part == "file":
        return (len(state.segments) + len(state.consumequeue_files) + len(state.index_files)
                + len(state.tombstones))
    if part == "txn":
        return len(state.txns)
    if part == "offset":
        return len(state.consumer_offsets)
    if part == "group":
        return len(state.subscription_groups)
    if part == "auth":
        return len(state.users) + len(state.acls)
    return 1 if state.retention else 0


def _keys(state: "LogState", part: str) -> Iterator:
    if part == "topic":
        yield from state.topics_by_id
    elif part == "file":
        for files in (state.segments, state.consumequeue_files, state.index_files,
                      state.tombstones):
            yield from files
    elif part == "txn":
        yield from state.txns
    elif part == "offset":
        yield from state.consumer_offsets
    elif part == "group":
        yield from state.subscription_groups
    elif part == "auth":
        yield from (("u", n) for n in state.users)
        yield from (("a", s) for s in state.acls)
    elif state.retention:
        yield ""


def _lookup(state: "LogState", part: str, key):
    """The action that rebuilds entry ``key`` of ``part``; None when it is gone."""
    if part == "topic":
        return state.topics_by_id.get(key)
    if part == "file":
        for files in (state.segments, state.consumequeue_files, state.index_files,
                      state.tombstones):
            a = files.get(key)
            if a is not None:
                return a
        return None
    if part == "txn":
        return state.txns.get(key)
    if part == "offset":
        off = state.consumer_offsets.get(key)
        if off is None:
            return None
        group, tid, qid, cid = key
        return ConsumerOffset(group=group, topic_id=tid, queue_id=qid,
                              client_id=cid or None, offset=off)
    if part == "group":
        return state.subscription_groups.get(key)
    if part == "auth":
        return (state.users if key[0] == "u" else state.acls).get(key[1])
    return state.retention


def _choose_buckets(part: str, count: int, base: int | None) -> int:
    """A power of two near ``count / ENTRIES_PER_PART``; the base checkpoint's count is
    kept while within a factor of 4 of it (a change rewrites the whole part)."""
    if part == "retention":
        return 1
    want = 1
    while want * ENTRIES_PER_PART < count:
        want *= 2
    if base is not None and base // 4 <= want <= base * 2:
        return base
    return want


def _stale(sc: Sidecar, version: int, max_age: int) -> bool:
    """A sidecar to rewrite at checkpoint ``version`` although unchanged: older than
    half the maximum age plus a per-bucket stagger (below the maximum)."""
    half = max(1, max_age // 2)
    return version - sc.version >= half + zlib.crc32(f"{sc.part}.{sc.bucket}".encode()) % half


# ---------------------------------------------------------------- writing
def write_parts(sfs: "StoreFS", state: "LogState", max_age: int = SIDECAR_MAX_AGE_VERSIONS
                ) -> tuple[list[Sidecar], dict, dict]:
    """Write the sidecars checkpoint ``state.version`` needs: every bucket of a part when
    ``state.parts`` has no such part with the same bucket count, else only the buckets
    of ``state.dirty`` keys and stale ones. Returns (manifest lines, the new parts for
    ``state.parts``, {"written": sidecars, "bytes": bytes written, "entries": written})."""
    version = state.version
    dirty: dict[str, list] = {}
    for part, key in state.dirty or ():
        dirty.setdefault(part, []).append(key)
    parts: dict[str, PartSet] = {}
    stats = {"written": 0, "bytes": 0, "entries": 0}
    for part in PARTS:
        count = _count(state, part)
        base = (state.parts or {}).get(part) if state.dirty is not None else None
        k = _choose_buckets(part, count, base.buckets if base else None)
        rewrite: dict[int, set] = {}
        if base is None or base.buckets != k:
            sidecars: dict = {}
            for key in _keys(state, part):
                rewrite.setdefault(bucket_of(part, key, k), set()).add(key)
        else:
            sidecars = dict(base.sidecars)
            for key in dirty.get(part, ()):
                b = bucket_of(part, key, k)
                if b not in rewrite:
                    rewrite[b] = set(sidecars[b][1]) if b in sidecars else set()
                rewrite[b].add(key)
            for b, (sc, keys) in base.sidecars.items():
                if b not in rewrite and _stale(sc, version, max_age):
                    rewrite[b] = set(keys)
        for b in sorted(rewrite):
            live = [(key, a) for key in sorted(rewrite[b])
                    if (a := _lookup(state, part, key)) is not None]
            if not live:
                sidecars.pop(b, None)
                continue
            data = encode_actions(a for _, a in live)
            sc = Sidecar(path=fmt.sidecar_file(version, part, b), part=part, bucket=b,
                         buckets=k, version=version, actions=len(live), size=len(data),
                         checksum=checksum(data))
            sfs.put_if_absent(sc.path, data)      # a random name: always new
            sidecars[b] = (sc, frozenset(key for key, _ in live))
            stats["written"] += 1
            stats["bytes"] += len(data)
            stats["entries"] += len(live)
        if sidecars:
            parts[part] = PartSet(k, sidecars)
    lines = [sc for part in PARTS if part in parts
             for _, (sc, _) in sorted(parts[part].sidecars.items())]
    return lines, parts, stats


# ---------------------------------------------------------------- reading
def _read_all(sfs: "StoreFS", paths: list[str]) -> list[bytes | None]:
    """The bytes of each path (None: missing); concurrently on object stores."""
    def one(path: str) -> bytes | None:
        try:
            return sfs.read_bytes(path)
        except FileNotFoundError:
            return None
    if sfs.is_local or len(paths) < 2:
        return [one(p) for p in paths]
    with ThreadPoolExecutor(min(_READ_THREADS, len(paths))) as pool:
        return list(pool.map(one, paths))


def check_lines(sidecars: Iterable[Sidecar], manifest: str) -> None:
    """Refuse a manifest whose sidecar lines cannot be right (``CorruptStoreError``)."""
    seen: dict[str, int] = {}
    taken: set = set()
    for sc in sidecars:
        if not fmt.is_sidecar_path(sc.path) or sc.part not in PARTS \
                or not 0 <= sc.bucket < sc.buckets or seen.setdefault(sc.part, sc.buckets) \
                != sc.buckets or (sc.part, sc.bucket) in taken:
            raise CorruptStoreError(f"{manifest}: bad sidecar line {sc.to_json()}")
        taken.add((sc.part, sc.bucket))


class _NoCycleCollection:
    """Python's cycle collector paused while a checkpoint's entries are built (as
    a context manager; nested and concurrent uses keep it paused until the last
    ends, and it is resumed only if it was on). Loading builds several objects per
    entry, none of them in a cycle, and every collection triggered meanwhile walks
    all of them again: at 50,000 topics that made a load grow faster than the
    state (a load was ~30 % collection). Reference counting frees as usual."""

    _lock = threading.Lock()
    _depth = 0
    _was_enabled = False

    def __enter__(self):
        with self._lock:
            cls = type(self)
            if cls._depth == 0:
                cls._was_enabled = gc.isenabled()
                gc.disable()
            cls._depth += 1

    def __exit__(self, *exc):
        with self._lock:
            cls = type(self)
            cls._depth -= 1
            if cls._depth == 0 and cls._was_enabled:
                gc.enable()


def load_parts(sfs: "StoreFS", sidecars: list[Sidecar], state: "LogState",
               manifest: str) -> None:
    """Apply every sidecar of a manifest to ``state`` (built without change tracking)
    and set ``state.parts``; ``CorruptStoreError`` naming the first sidecar that is
    missing, does not match its line, or holds an entry of another part or bucket."""
    check_lines(sidecars, manifest)
    with _NoCycleCollection():
        _load_parts(sfs, sidecars, state, manifest)


def _load_parts(sfs: "StoreFS", sidecars: list[Sidecar], state: "LogState",
                manifest: str) -> None:
    parts: dict[str, PartSet] = {}
    for sc, data in zip(sidecars, _read_all(sfs, [sc.path for sc in sidecars])):
        if data is None:
            raise CorruptStoreError(f"sidecar {sc.path} of {manifest} is missing")
        if len(data) != sc.size or checksum(data) != sc.checksum:
            raise CorruptStoreError(f"sidecar {sc.path} of {manifest}: checksum mismatch "
                                    f"({len(data)} bytes, {sc.size} expected)")
        actions = parse_actions(data, sc.path)
        if len(actions) != sc.actions:
            raise CorruptStoreError(f"sidecar {sc.path}: {len(actions)} actions, "
                                    f"{sc.actions} expected")
        keys = set()
        for a in actions:
            pk = part_key(a)
            if pk is None or pk[0] != sc.part or bucket_of(sc.part, pk[1], sc.buckets) \
                    != sc.bucket:
                raise CorruptStoreError(f"sidecar {sc.path}: an action of another part: "
                                        f"{a.to_json()!r:.200}")
            state.apply(a)
            keys.add(pk[1])
        ps = parts.setdefault(sc.part, PartSet(sc.buckets, {}))
        ps.sidecars[sc.bucket] = (sc, frozenset(keys))
    state.parts = parts


def unreferenced(names: Iterable[str], keep_from: int,
                 max_age: int = SIDECAR_MAX_AGE_VERSIONS) -> list[str]:
    """Sidecar names no checkpoint at or above ``keep_from`` can name: written for a
    version at or below ``keep_from - max_age`` (the age invariant above)."""
    out = []
    for name in names:
        v = fmt.parse_sidecar_file(name)
        if v is not None and v <= keep_from - max_age:
            out.append(name)
    return out
