"""The store side of replication (RocketMQ's HAClient write path and a slave's reput).

:class:`ReplicaLog` writes a master's CommitLog bytes into a replica's own
store (its own folder, its own writer lease): the same segment names,
boundaries and bytes, so every segment file is byte-identical to the master's.
Two steps, as RocketMQ's slave: :meth:`ReplicaLog.write_from` appends the bytes
and finds the whole messages in them by their headers (no decoding) -- the
offset the replica acks; :class:`ReputService` (``sparkmq-replica-reput``) later
dispatches the written batches from the segment files in large steps with the
store's one :class:`~sparkmq.log.dispatch.Dispatcher`, so the replica builds its
own ConsumeQueue and Index, publishes its own ``_log/`` and serves reads -- of
dispatched messages only. :meth:`ReplicaLog.apply_meta` mirrors the master's
metadata (``REPLICATE META``), :meth:`ReplicaLog.truncate_to` cuts bytes a
rejoining old master has past the consistent point (``TRUNCATE``),
:meth:`ReplicaLog.cut_unfinished` drops an unfinished tail before promotion.
The network side (frames, sockets, splice) lives in :mod:`sparkmq.ha.replica`.

On disk: the store's own files (segments written in place, side files and
``_log/`` as any store). After a crash: the store's recovery dispatches what
was written and not yet dispatched; a replica's tail segment stays unsealed.

Thread-safety: writes happen under the store's append lock; dispatch under
this object's dispatch lock (taken after the append lock); the HA client
writes from one thread and the reput service dispatches from another.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
from dataclasses import replace
from typing import Callable

import pyarrow as pa

from ..durable import makedirs_durably, sync_folder
from ..errors import CorruptStoreError, HAProtocolError, InvalidConfigError
from ..lifecycle import ServiceThread
from . import format as fmt
from . import segment as seg
from . import sidefile
from .actions import (Action, AddFile, ConsumerOffset, GroupConfig, RemoveFile, Retention,
                      TopicConfig)
from .auth_actions import Acl, User
from .commitlog import SegmentRef
from .idtags import epoch_actions
from .store import Store
from .topics import group_delete_actions
from .txlog import LogState

log = logging.getLogger("sparkmq.ha")

MAX_HEADER_WAIT_BYTES = 1 << 20
PEEK_BYTES = 4096               # read back to find a message's length by its header
DISPATCH_STEP_BYTES = 32 << 20  # one dispatch step: readers see its batches at its end
REPUT_IDLE_WAIT_S = 1.0


def _valid_segment_path(path) -> bool:
    if not isinstance(path, str) or not fmt.is_relative_store_path(path):
        return False
    head, _, name = path.partition("/")
    return head == fmt.COMMITLOG_DIR and "/" not in name and name.endswith(".arrow")


class ReplicaLog:
    """Writes replicated bytes into ``store``; see the module docstring.

    Two steps, as RocketMQ's slave: :meth:`write` appends the bytes to the
    segment file and finds where whole messages end (the offset the replica
    acks, :attr:`whole_offset`), without decoding them; dispatch (decode the
    batches, build the ConsumeQueue/Index) follows from the segment files, in
    large steps, in the ``sparkmq-replica-reput`` thread once :meth:`start` ran
    (inline in :meth:`write` before). Readers see only dispatched messages (the
    store's visible max offsets advance after dispatch); after a crash the
    store's recovery dispatches what was written and not yet dispatched.
    """

    def __init__(self, store: Store):
        if not store.sfs.is_local:
            raise InvalidConfigError("a replica's store must be a local folder "
                                     f"(got {store.url})")
        self.store = store
        self._walk_pos = 0         # position in the active segment of the next message start
        self._unchecked: tuple[str, int, int] | None = None   # (path, pos, length) torn batch
        self._whole_end = store.commitlog.written_offset  # end of the last whole message
        self._dispatch_lock = threading.Lock()   # taken after the store's append lock
        self._reput: ReputService | None = None
        self._peek_fd: tuple[str, int] | None = None   # read-back of the active segment
        if store.commitlog.active is not None:
            self._walk_pos = store.commitlog.active.size

    @property
    def offset(self) -> int:
        """The physical offset up to which this replica has the master's bytes."""
        return self.store.commitlog.written_offset

    @property
    def whole_offset(self) -> int:
        """The end of the last whole record batch written here (page cache): what the
        replica acks, so an ack > a batch's offset means the whole batch is here."""
        return self._whole_end

    @property
    def dispatched_offset(self) -> int:
        """The end of the last batch in this replica's ConsumeQueue/Index (readable)."""
        return self.store.dispatcher.dispatched_offset

    # -- dispatch (RocketMQ's ReputMessageService on a slave) -------------------
    def start(self) -> "ReplicaLog":
        """Dispatch in the ``sparkmq-replica-reput`` thread from now on."""
        if self._reput is None:
            self._reput = ReputService(self)
            self._reput.start()
        return self

    def stop(self) -> None:
        """Stop the dispatch thread (what it has not dispatched, :meth:`drain` or the
        store's recovery at the next open dispatches)."""
        reput, self._reput = self._reput, None
        if reput is not None:
            reput.stop()
        with self.store.append_lock:
            self._close_peek()

    def drain(self) -> int:
        """Dispatch every whole batch written; returns the dispatched offset."""
        while self.dispatch_step(1 << 62):
            pass
        return self.store.dispatcher.dispatched_offset

    def dispatch_step(self, max_bytes: int = DISPATCH_STEP_BYTES) -> int:
        """Dispatch whole batches from the dispatched offset on, reading them from the
        segment files (memory-mapped), up to about ``max_bytes``; returns the bytes
        dispatched (0: nothing to do). Readers see them once the step is done."""
        st, cl = self.store, self.store.commitlog
        affected: list = []
        with self._dispatch_lock:
            start = off = st.dispatcher.dispatched_offset
            target = self._whole_end
            while off < target and off - start < max_bytes:
                ref = cl.segment_for(off)
                if ref is None:
                    raise HAProtocolError(f"no segment holds offset {off} (whole bytes end at "
                                          f"{target})")
                base = ref.base_offset
                end = min(target - base, ref.size, max_bytes + start - base + 1)
                buf = st.sfs.read_buffer(ref.path, cache=True, min_size=min(target - base,
                                                                            ref.size))
                pos = off - base
                if pos == 0:
                    pos = seg.header_length(buf)
                    if pos == 0:
                        raise HAProtocolError(f"segment {ref.path} lost its schema header")
                while pos < end:
                    n = seg.message_length(buf, pos)
                    if n == 0:                   # end of a sealed segment
                        pos = ref.size
                        break
                    if n is None:
                        raise HAProtocolError(f"segment {ref.path}: no whole batch at byte "
                                              f"{pos} below the acked end {target}")
                    batch = seg.read_batch_at(buf, pos, ref.path)
                    affected.extend(st.dispatcher.dispatch(batch, base + pos)[1])
                    pos += n
                del buf
                if base + pos == off:
                    break
                off = st.dispatcher.dispatched_offset = base + pos
        if affected:
            st.dispatcher.after_visible(affected)
        return off - start

    # -- writing -----------------------------------------------------------
    def begin_segment(self, path: str, base_offset: int) -> None:
        """The master started segment ``path`` at ``base_offset`` (its first bytes follow)."""
        if not _valid_segment_path(path) or not isinstance(base_offset, int):
            raise HAProtocolError(f"bad segment frame: path {path!r}, base {base_offset!r}")
        st, cl = self.store, self.store.commitlog
        with st.append_lock:
            if cl.active is not None:
                raise HAProtocolError(f"master began {path} before {cl.active.rel_path} was "
                                      "sealed")
            segs = cl.segments()
            if segs and base_offset != cl.written_offset:
                raise HAProtocolError(f"master began {path} at {base_offset}; this replica "
                                      f"ends at {cl.written_offset}")
            if any(r.path == path for r in segs):
                raise HAProtocolError(f"segment {path} already exists on this replica")
            # a truncation may have dropped this very path (the old master's own segment
            # at the same base offset): its tombstone must not delete the new copy, which
            # delete_removed_files protects as a segment of this CommitLog
            self._close_peek()
            full = st.sfs.local_path(path)
            makedirs_durably(os.path.dirname(full))
            os.close(os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
            sync_folder(os.path.dirname(full))    # (its name survives a power loss)
            st.sfs.forget(path)
            with self._dispatch_lock:
                cl.active = cl.writer(path, base_offset, create=False)
                cl.add_segment(SegmentRef(path, base_offset, 0, False))
                cl.written_offset = base_offset
                cl.flushed_offset = max(cl.flushed_offset, base_offset) if segs else base_offset
                if not segs:                  # else dispatch reaches it past the sealed one
                    st.dispatcher.dispatched_offset = base_offset
                self._whole_end = base_offset
                self._walk_pos = 0

    def write(self, path: str, pos: int, data,
              on_written: Callable[[int], None] | None = None) -> int:
        """Append ``data`` (bytes-like) at byte ``pos`` of segment ``path``; see
        :meth:`write_from`."""
        return self.write_from(path, pos, len(data), lambda a, _: a.append(data), on_written)

    def write_from(self, path: str, pos: int, count: int,
                   put: Callable[[seg.SegmentWriter, Callable[[], None]], None],
                   on_written: Callable[[int], None] | None = None) -> int:
        """Append ``count`` bytes at byte ``pos`` of segment ``path``: ``put(writer,
        progress)`` appends them (from a buffer, or spliced from the socket) and may
        call ``progress()`` after each part. After each part and at the end the new
        whole messages are found by their headers (a frame may end inside one), an
        end-of-stream marker seals the segment (fsync), and ``on_written(whole_offset)``
        runs when the whole offset advanced (a SYNC_MASTER sender of the frame's first
        batch need not wait for the frame's last). Without the dispatch thread
        (:meth:`start`) the whole batches are dispatched before returning. Returns
        the new offset. Raises HAProtocolError if the bytes do not continue the copy."""
        st, cl = self.store, self.store.commitlog
        with st.append_lock:
            a = cl.active
            if a is None or a.rel_path != path:
                a = self._reopen(path)
            if pos != a.size:
                raise HAProtocolError(f"master sent {path} at byte {pos}; this replica has "
                                      f"{a.size} bytes of it")
            ref = cl.ref(path)
            acked = self._whole_end

            def progress() -> None:
                nonlocal acked
                cl.set_size(ref, a.size)
                cl.written_offset = a.base_offset + a.size
                if not ref.sealed:
                    self._walk(a, ref)
                if on_written is not None and self._whole_end > acked:
                    acked = self._whole_end
                    on_written(acked)
            try:
                put(a, progress)
            finally:
                cl.set_size(ref, a.size)
                cl.written_offset = a.base_offset + a.size
            if a.size != pos + count:
                raise HAProtocolError(f"{path}: {a.size - pos} bytes written of {count}")
            progress()
            written = cl.written_offset
        st.request_flush(written)   # SYNC_FLUSH store: ask for an fsync, no wait
        reput = self._reput
        if reput is None:
            self.drain()
        else:
            reput.wakeup()
        return written

    def _peek(self, a: seg.SegmentWriter, pos: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``pos`` of the active segment (page cache)."""
        if self._peek_fd is None or self._peek_fd[0] != a.rel_path:
            self._close_peek()
            self._peek_fd = (a.rel_path, os.open(self.store.sfs.local_path(a.rel_path),
                                                 os.O_RDONLY))
        return os.pread(self._peek_fd[1], n, pos)

    def _close_peek(self) -> None:
        if self._peek_fd is not None:
            os.close(self._peek_fd[1])
            self._peek_fd = None

    def _walk(self, a: seg.SegmentWriter, ref: SegmentRef) -> None:
        """Advance over the whole messages written to ``a`` by their headers alone (read
        back from the page cache, no decoding); seal at an end-of-stream marker."""
        end = a.size
        p = self._walk_pos
        whole = None
        sealed = False
        torn, self._unchecked = self._unchecked, None
        if torn is not None and torn[0] == a.rel_path and torn[1] + torn[2] == p:
            if p > end:
                self._unchecked = torn
            else:
                self._check_batch(a, torn[1], torn[2])
        while p < end:
            head = self._peek(a, p, min(end - p, PEEK_BYTES))
            n = seg.message_extent(head, 0)
            if n is None and len(head) >= 8:       # a header longer than PEEK_BYTES
                meta = 8 + struct.unpack_from("<i", head, 4)[0]
                if len(head) < meta <= MAX_HEADER_WAIT_BYTES:
                    head = self._peek(a, p, min(end - p, meta))
                    n = seg.message_extent(head, 0)
            if n is None:
                if end - p >= MAX_HEADER_WAIT_BYTES:
                    raise HAProtocolError(f"segment {a.rel_path}: no message header within "
                                          f"{MAX_HEADER_WAIT_BYTES} bytes at byte {p}")
                break
            if n == seg.NOT_A_MESSAGE or (n == 0 and p == 0):
                raise HAProtocolError(f"segment {a.rel_path}: the master's bytes at {p} are "
                                      "not an Arrow IPC message")
            if n == 0:                         # end-of-stream: the master sealed here
                p += len(seg.EOS)
                if p != end:
                    raise HAProtocolError(f"bytes after the end of sealed segment "
                                          f"{a.rel_path}")
                whole, sealed = p, True
                break
            if p == 0 and n <= end:
                if seg.header_length(pa.py_buffer(self._peek(a, 0, n))) != n:
                    raise HAProtocolError(f"segment {a.rel_path} does not start with the "
                                          "segment schema")
            if p > 0 and p + n <= end:
                self._check_batch(a, p, n)
            elif p > 0:
                self._unchecked = (a.rel_path, p, n)   # checked once its last byte is here
            if p + n <= end:
                whole = p + n
            p += n
        if p <= end:              # p is a message boundary: every message before it is whole
            whole = p
        self._walk_pos = p
        if whole is not None and a.base_offset + whole > self._whole_end:
            self._whole_end = a.base_offset + whole
        if sealed:
            cl = self.store.commitlog
            self._close_peek()
            cl.seal_written(a, ref)

    def _check_batch(self, a: seg.SegmentWriter, pos: int, n: int) -> None:
        """Verify the checksum of the whole batch message just received at ``pos`` (read back
        from the page cache) before the replica acks it; a damaged copy is a protocol
        error (the replica does not ack it)."""
        try:
            seg.verify_message(self._peek(a, pos, n), a.rel_path, pos,
                               lambda: seg.segment_format(self._peek(a, 0, seg.HEADER_SIZE)) == 1)
        except CorruptStoreError as exc:
            raise HAProtocolError(f"received bytes fail their checksum: {exc}") from exc

    def _reopen(self, path: str) -> seg.SegmentWriter:
        cl = self.store.commitlog
        segs = cl.segments()
        if not segs or segs[-1].path != path or segs[-1].sealed:
            raise HAProtocolError(f"master sent bytes of {path}, which is not this replica's "
                                  "open segment")
        ref = segs[-1]
        self._close_peek()
        cl.active = cl.writer(path, ref.base_offset, create=False)
        if cl.active.size != ref.size:
            raise HAProtocolError(f"segment {path} has {cl.active.size} bytes on disk but "
                                  f"{ref.size} recovered")
        self._walk_pos = ref.size
        self._whole_end = ref.base_offset + ref.size
        return cl.active

    def apply_meta(self, meta: dict) -> None:
        """Mirror the master's topic configs, consumer offsets and subscription group
        configs into this store (and, while it is empty, the master's retention floor).
        A group config the master no longer has is deleted here with its offsets (the
        master deleted the group); offsets of groups the master never configured are
        left alone (consumers of this replica may keep their own). The frame is
        parsed into typed actions first (:func:`parse_meta`): a malformed one is an
        ``HAProtocolError`` and changes nothing."""
        st = self.store
        topics, offsets, groups, retention = parse_meta(meta)
        state = st.state
        auth = mirrored_auth_actions(state, meta)
        actions: list[Action] = [t for t in topics if state.topics_by_id.get(t.id) != t]
        actions += [o for o in offsets if state.consumer_offsets.get(o.key) != o.offset]
        if groups is not None:        # absent from masters older than this field
            wanted = {g.group_name: g for g in groups}
            master_keys = {o.key for o in offsets}
            actions += [conf for name, conf in wanted.items()
                        if state.subscription_groups.get(name) != conf]
            for name in state.subscription_groups.keys() - wanted.keys():
                actions += group_delete_actions(state, name, keep=master_keys)
        actions += auth
        empty = not st.commitlog.segments()
        if retention is not None and empty and state.retention != retention:
            # the copy starts at the master's retention floor: continue its queue offsets
            actions.append(retention)
        if actions:
            st.commit_actions(lambda s: actions, "REPLICATE META", {"actions": len(actions)})
            if empty:
                with st.append_lock, self._dispatch_lock:
                    st.dispatcher.reset_offsets(st.state)

    # -- rejoin ---------------------------------------------------------------
    def truncate_to(self, offset: int, keep_dir: str | None = None) -> int:
        """Drop every CommitLog byte at or past ``offset`` (a batch or segment end: the
        consistent point with a new master), in place: later segments are removed, the
        segment holding ``offset`` is cut there (unsealed again), ConsumeQueue and Index
        files with entries past it are rewritten without them, all in one ``TRUNCATE``
        commit. With ``keep_dir`` the dropped bytes are kept there first, as readable
        segment files (a cut tail gets the segment header), so messages that only this
        store had (acked by an ASYNC_MASTER, never replicated) can be inspected.
        Returns the bytes dropped."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        from .consumequeue import consumequeue_add, write_side_table
        from .index import index_add
        st, cl = self.store, self.store.commitlog
        with st.append_lock, self._dispatch_lock, st.commit_lock:
            self._close_peek()
            st.publish(force=True)             # every entry is in a side file now
            end = cl.written_offset
            if offset >= end:
                return 0
            segs = cl.segments()
            drop = [r for r in segs if r.base_offset >= offset]
            cut = next((r for r in segs if r.base_offset < offset < r.end_offset), None)
            if keep_dir is not None:
                os.makedirs(keep_dir, exist_ok=True)
                for r in drop:
                    with open(os.path.join(keep_dir, r.path.rsplit("/", 1)[1]), "wb") as f:
                        f.write(st.sfs.read_range(r.path, 0, r.size))
                if cut is not None:
                    tail = st.sfs.read_range(cut.path, offset - cut.base_offset, cut.size)
                    with open(os.path.join(keep_dir, fmt.segment_file(offset).rsplit("/", 1)[1]),
                              "wb") as f:
                        f.write(seg.SCHEMA_BYTES + tail)
            if cl.active is not None:
                cl.active.close()
                cl.active = None
            now = st.clock_ms()
            actions: list[Action] = [RemoveFile(path=r.path, deletion_timestamp=now,
                                                data_change=True) for r in drop]
            for adds, schema, make_add, new_rel, need in (
                    (st.state.consumequeue_files, fmt.CONSUMEQUEUE_SCHEMA, consumequeue_add,
                     fmt.consumequeue_file,
                     lambda a: any(q.max_batch_offset is None or q.max_batch_offset >= offset
                                   for q in a.queues or ())),
                    (st.state.index_files, fmt.INDEX_SCHEMA, index_add, fmt.index_file,
                     lambda a: True)):
                for add in list(adds.values()):
                    if not need(add):
                        continue
                    with sidefile.open_checked(st.sfs, add.path) as f:
                        table = pq.read_table(f, page_checksum_verification=True).cast(schema)
                    keep = table.filter(pc.less(table.column("batch_offset"), offset))
                    if keep.num_rows == table.num_rows:
                        continue
                    actions.append(RemoveFile(path=add.path, deletion_timestamp=now,
                                              data_change=False))
                    if keep.num_rows:
                        rel = new_rel()
                        size = write_side_table(st.sfs, rel, keep,
                                                row_group_rows=st.config.side_table_row_group_rows)
                        actions.append(make_add(rel, keep, size))
            if cut is not None:
                actions.append(AddFile(path=cut.path, kind="segment",
                                       base_offset=cut.base_offset,
                                       size=offset - cut.base_offset, sealed=False,
                                       modification_time=now))
            # (ids from the cut on carry a new tag: this store may have given ids to the
            # dropped messages, ``log/idtags.py``)
            st.commit_actions(lambda s: actions + epoch_actions(s, offset), "TRUNCATE",
                              {"toOffset": offset, "droppedBytes": end - offset})
            if cut is not None:
                st.sfs.truncate(cut.path, offset - cut.base_offset)
                cl.set_size(cut, offset - cut.base_offset, sealed=False)
            cl.drop_segments({r.path for r in drop})
            # the removed files are deleted after deletedFileRetentionMs (their tombstones)
            cl.clear_cache()
            cl.written_offset = cl.flushed_offset = offset
            st.dispatcher.dispatched_offset = offset
            st.dispatcher.clear(st.state, offset)
            self._walk_pos = (offset - cut.base_offset) if cut is not None else 0
            self._whole_end = offset
        log.warning("store %s truncated to physical offset %d: %d bytes dropped%s", st.url,
                    offset, end - offset, f" (kept in {keep_dir})" if keep_dir else "")
        return end - offset

    # -- promotion -----------------------------------------------------------
    def cut_unfinished(self) -> int:
        """Drop bytes of an unfinished message at the tail (promotion); a partly
        received Spark segment is sealed after its last whole batch. Returns the
        bytes dropped."""
        st, cl = self.store, self.store.commitlog
        self.stop()
        with st.append_lock:
            segs = cl.segments()
            if not segs or segs[-1].sealed:
                self.drain()
                return 0
            ref = segs[-1]
            a = cl.active or self._reopen(ref.path)
            self.drain()
            self._close_peek()
            keep = self._whole_end - ref.base_offset
            dropped = a.size - keep
            if dropped:
                a.close()
                st.sfs.truncate(ref.path, keep)
                cl.active = a = cl.writer(ref.path, ref.base_offset, create=False)
            if a.size < seg.HEADER_SIZE:
                a.append(seg.SCHEMA_BYTES[a.size:])
            cl.set_size(ref, a.size)
            cl.written_offset = cl.flushed_offset = a.base_offset + a.size
            st.dispatcher.dispatched_offset = self._whole_end = cl.written_offset
            self._walk_pos = a.size
            if fmt.parse_segment_file(ref.path.rsplit("/", 1)[-1]) is None:
                cl.seal_active()   # a Spark segment: never appended to by a broker
                st.dispatcher.dispatched_offset = cl.written_offset
            return dropped


class ReputService(ServiceThread):
    """``sparkmq-replica-reput``: dispatches what the replica wrote (RocketMQ's
    ReputMessageService on a slave), in steps of up to DISPATCH_STEP_BYTES, woken
    by each write (or every REPUT_IDLE_WAIT_S). Never dies: an error is logged
    and retried at the next wakeup (the bytes stay in the CommitLog)."""

    name = "replica-reput"

    def __init__(self, rlog: ReplicaLog):
        super().__init__(int(REPUT_IDLE_WAIT_S * 1000))
        self.rlog = rlog

    def run_once(self) -> None:
        while not self._stop.is_set() and self.rlog.dispatch_step():
            pass


def meta_frame(state: LogState) -> dict:
    """The meta frame a master sends (ha/protocol.py): every topic config ever (by
    id), the consumer offsets as ``[group, topic id, queue id, client id, offset]``
    rows, the retention floor and the subscription group configs, as JSON."""
    return {"topics": [t.body() for t in sorted(state.topics_by_id.values(),
                                                key=lambda t: t.id)],
            "consumerOffsets": [[g, tid, qid, cid, off] for (g, tid, qid, cid), off
                                in sorted(state.consumer_offsets.items())],
            "retention": state.retention.body() if state.retention else None,
            "subscriptionGroups": [state.subscription_groups[g].body()
                                   for g in sorted(state.subscription_groups)],
            "users": [state.users[u].body() for u in sorted(state.users)],
            "acls": [state.acls[a].body() for a in sorted(state.acls)]}


def mirrored_auth_actions(state: LogState, meta: dict) -> list[Action]:
    """The user and ACL actions that make ``state`` hold exactly the master's (those it
    lacks or has changed, deletions of those the master no longer has); none when the
    frame comes from a master older than these fields. HAProtocolError if malformed."""
    out: list[Action] = []
    for key, cls, live, name_of in (("users", User, state.users, lambda a: a.username),
                                    ("acls", Acl, state.acls, lambda a: a.subject)):
        bodies = meta.get(key)
        if bodies is None:
            continue
        if not isinstance(bodies, list):
            raise HAProtocolError(f"bad {key} in meta frame: {bodies!r}"[:300])
        wanted = {name_of(a): a for a in (_parsed(cls, b, key[:-1]) for b in bodies)}
        out += [a for name, a in wanted.items() if live.get(name) != a]
        out += [replace(live[name], deleted=True) for name in live.keys() - wanted.keys()]
    return out


def parse_meta(meta: dict) -> tuple[list[TopicConfig], list[ConsumerOffset],
                                    list[GroupConfig] | None, Retention | None]:
    """The typed content of a meta frame; ``HAProtocolError`` naming the first
    malformed part."""
    if not isinstance(meta, dict):
        raise HAProtocolError(f"meta frame is not an object: {meta!r}"[:300])
    topics, offsets = meta.get("topics"), meta.get("consumerOffsets")
    if not isinstance(topics, list) or not isinstance(offsets, list):
        raise HAProtocolError("meta frame needs lists 'topics' and 'consumerOffsets'")
    out_topics = [_parsed(TopicConfig, t, "topic") for t in topics]
    out_offsets = []
    for row in offsets:
        try:
            g, tid, qid, cid, off = row
            out_offsets.append(ConsumerOffset(group=g, topic_id=tid, queue_id=qid,
                                              client_id=cid or None, offset=off))
        except (TypeError, ValueError):
            raise HAProtocolError(f"bad consumer offset in meta frame: {row!r}") from None
    groups = meta.get("subscriptionGroups")
    if groups is not None:
        if not isinstance(groups, list):
            raise HAProtocolError(f"bad subscriptionGroups in meta frame: {groups!r}"[:300])
        groups = [_parsed(GroupConfig, g, "subscription group") for g in groups]
    retention = meta.get("retention")
    retention = _parsed(Retention, retention, "retention") if isinstance(retention, dict) \
        else None
    return out_topics, out_offsets, groups, retention


def _parsed(cls, body, what: str):
    try:
        if not isinstance(body, dict):
            raise TypeError("not an object")
        return cls.from_body(body)
    except (TypeError, ValueError, CorruptStoreError) as exc:
        raise HAProtocolError(f"bad {what} in meta frame ({exc}): {body!r}"[:300]) from None
