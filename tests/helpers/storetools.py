"""Small helpers for the store tests: message builders and file access.

Everything goes through public APIs (``Store``, ``Message``, ``format``) so the
tests exercise what users and other processes see.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import threading
import types

import pyarrow as pa

from sparkmq.log import Message
from sparkmq.log import format as fmt
from sparkmq.log import segment as seg

SMALL_SEGMENT_BYTES = 8192


def msg(topic: str, body: bytes, queue_id: int | None = 0, **kw) -> Message:
    return Message(topic=topic, body=body, queue_id=queue_id, **kw)


def bodies(store, topic: str, queue_id: int, start: int = 0, end: int | None = None) -> list[bytes]:
    table = store.read_table(topic, queue_id, start, end, columns=["body"])
    return table.column("body").to_pylist()


def segment_batch(n: int = 3, topic: str = "t", prefix: bytes = b"m") -> pa.RecordBatch:
    """A record batch in the segment schema with ``n`` rows."""
    from sparkmq.log.message import messages_to_batch
    msgs = [Message(topic=topic, body=prefix + str(i).encode()) for i in range(n)]
    return messages_to_batch(msgs, queue_ids=[0] * n, store_timestamp_ms=1_700_000_000_000,
                             store_host="127.0.0.1:10911", max_message_size_bytes=1 << 20)


def as_segment_batch(table: pa.Table) -> pa.RecordBatch:
    """``table``'s columns in SEGMENT_SCHEMA (missing ones null): append_batch's fast path."""
    n = table.num_rows
    cols = [table.column(f.name).cast(f.type).combine_chunks() if f.name in table.column_names
            else pa.nulls(n, f.type) for f in fmt.SEGMENT_SCHEMA]
    return pa.RecordBatch.from_arrays(cols, schema=fmt.SEGMENT_SCHEMA)


def segment_paths(local_root: str) -> list[str]:
    """Absolute paths of the broker-written segments of a local store, oldest first."""
    folder = os.path.join(local_root, fmt.COMMITLOG_DIR)
    names = [n for n in os.listdir(folder) if fmt.parse_segment_file(n) is not None]
    return [os.path.join(folder, n) for n in sorted(names)]


def batch_ends(path: str) -> list[int]:
    """End byte position of each whole batch in a segment file (its valid prefixes)."""
    buf = pa.py_buffer(open(path, "rb").read())
    res = seg.scan(buf)
    return [p + n for p, n in zip(res.positions, res.lengths)]


def inline_replica_log(replica, master, ref):
    """A ReplicaLog of ``replica`` (not started: it dispatches inline) that mirrors
    ``master``'s topics and has begun receiving segment ``ref``."""
    from sparkmq.log.replication import ReplicaLog
    rlog = ReplicaLog(replica)
    rlog.apply_meta({"topics": [t.body() for t in master.state.topics_by_id.values()],
                     "consumerOffsets": []})
    rlog.begin_segment(ref.path, ref.base_offset)
    return rlog


#: the fields a golden store's expected.json records of each message (tests/golden)
GOLDEN_FIELDS = ("topic", "queue_id", "queue_offset", "message_id", "tags", "keys",
                 "properties", "message_group", "message_type", "delivery_timestamp",
                 "transaction_id", "store_timestamp")


def files_of(root) -> dict[str, tuple[int, int]]:
    """Every file below ``root`` (a pathlib.Path): relative path -> (size, mtime ns)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def read_only_copy(store_dir, tmp_path):
    """A copy of the store at ``store_dir`` under ``tmp_path`` (its path as a string);
    fails if anything the block did wrote to the copy."""
    copy = tmp_path / "store"
    shutil.copytree(store_dir, copy)
    before = files_of(copy)
    yield str(copy)
    assert files_of(copy) == before, "a read-only open wrote to the store"


class HeldSyncOS(types.SimpleNamespace):
    """``os`` for the segment module (``monkeypatch.setattr(segment, "os", ...)``) whose
    ``fdatasync`` waits until ``release`` is set: a disk slower than syncFlushTimeout, or
    an fsync held for as long as the test needs. ``syncs``: the calls so far."""

    def __init__(self):
        super().__init__(**{n: getattr(os, n) for n in dir(os)
                            if not n.startswith("__") and n != "fdatasync"})
        self.release = threading.Event()
        self.syncs = 0

    def fdatasync(self, fd):
        self.syncs += 1
        self.release.wait(30)
        os.fdatasync(fd)


def pause_before_the_write(writer, during) -> list:
    """Make ``writer`` (a Store) stop once between its lease check and its next write, as a
    paused process would: its store time, read under the append lock just before the bytes
    go out, first runs ``during()`` (another writer taking the store over, say). Returns a
    list that holds what ``during`` returned, once it ran."""
    stamp, ran = writer.appender._store_ts, []

    def paused() -> int:
        if not ran:
            ran.append(during())
        return stamp()
    writer.appender._store_ts = paused
    return ran


def offset_commits(store, group: str, after: int) -> list[dict[int, int]]:
    """The queue -> offset of ``group`` each version of ``store``'s log after ``after``
    records, for the versions that record any, in order (a commitOffset's own, then any
    of the broker's offset passes)."""
    out = []
    for v in range(after + 1, store.state.version + 1):
        got = {a["consumerOffset"]["queueId"]: a["consumerOffset"]["offset"]
               for a in store.txlog.read_version(v)
               if a.get("consumerOffset", {}).get("group") == group}
        if got:
            out.append(got)
    return out
