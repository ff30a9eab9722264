"""The replica's side of replication (RocketMQ's HAClient) and promotion.

``ReplicaLog`` writes a master's CommitLog bytes into the replica's own store
(its own folder, its own writer lease): the same segment names, boundaries and
bytes, so every segment file is byte-identical to the master's. As whole
record batches arrive it dispatches them with the store's own dispatcher (the
CommitLog is the source of truth), so the replica builds its own ConsumeQueue
and Index, publishes its own ``_log/`` and serves reads. It is a friend of
``Store``: it appends under the store's append lock in place of
``Store.append`` and never builds batches itself.

``HAClient`` connects to the master's HA port, authenticates (HMAC over
``haSecret``), reports its offset, applies ``meta``/``segment``/``data``
frames and acks after each write. It reconnects with a bounded backoff and
catches up from any gap (from empty, across rolls and adopted Spark segments).

``ReplicaLog.truncate_to`` cuts the bytes a rejoining old master has past the
consistent point with its new master (in place; the dropped bytes are kept in
``<store>.diverged-<ms>/``).

``promote`` turns the replica's store into a master's: an unfinished message
at the tail is cut, the writer lease of the replica's store is re-taken with an
epoch above every epoch the replica has seen, and the epoch history records
where the new master's bytes begin.

Thread-safety: ``ReplicaLog`` methods take the store's append lock; ``HAClient``
runs one thread. Every wait and retry is bounded.
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from typing import Callable

import pyarrow as pa

from ..errors import HAProtocolError, InvalidConfigError, SparkMQError
from ..log import format as fmt
from ..log import segment as seg
from ..log.commitlog import SegmentRef
from ..log.store import Store
from . import epochs as epoch_history
from .protocol import (check_proof, new_nonce, parse_address, proof, recv_frame, send_frame)

log = logging.getLogger("sparkmq.ha")

MASTER_SILENCE_S = 5.0          # no frame for this long: the link is dead, reconnect
CONNECT_TIMEOUT_S = 3.0
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 2.0
MAX_HEADER_WAIT_BYTES = 1 << 20
FRAME_QUEUE_FRAMES = 8          # received, not yet written (up to 8 x 4 MiB)


def _valid_segment_path(path) -> bool:
    if not isinstance(path, str) or not fmt.is_relative_store_path(path):
        return False
    head, _, name = path.partition("/")
    return head == fmt.COMMITLOG_DIR and "/" not in name and name.endswith(".arrow")


class ReplicaLog:
    """Writes replicated bytes into ``store``; see the module docstring."""

    def __init__(self, store: Store):
        if not store.sfs.is_local:
            raise InvalidConfigError("a replica's store must be a local folder "
                                     f"(got {store.url})")
        self.store = store
        self._seg_pos = 0          # bytes of the active segment that are dispatched
        self._pending = b""        # bytes received past _seg_pos (an unfinished message)
        if store.commitlog.active is not None:
            self._seg_pos = store.commitlog.active.size

    @property
    def offset(self) -> int:
        """The physical offset up to which this replica has the master's bytes."""
        return self.store.commitlog.written_offset

    @property
    def whole_offset(self) -> int:
        """The end of the last whole record batch written (and dispatched) here: what
        the replica acks, so an ack > a batch's offset means the whole batch is here."""
        return min(self.store._dispatched_offset, self.store.commitlog.written_offset)

    # -- writing -----------------------------------------------------------
    def begin_segment(self, path: str, base_offset: int) -> None:
        """The master started segment ``path`` at ``base_offset`` (its first bytes follow)."""
        if not _valid_segment_path(path) or not isinstance(base_offset, int):
            raise HAProtocolError(f"bad segment frame: path {path!r}, base {base_offset!r}")
        st, cl = self.store, self.store.commitlog
        with st._append_lock:
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
            full = st.sfs.local_path(path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            os.close(os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
            st.sfs.forget(path)
            cl.active = seg.SegmentWriter(st.sfs, path, base_offset, create=False)
            cl.add_segment(SegmentRef(path, base_offset, 0, False))
            cl.written_offset = base_offset
            cl.flushed_offset = max(cl.flushed_offset, base_offset) if segs else base_offset
            st._dispatched_offset = base_offset
            self._seg_pos = 0
            self._pending = b""

    def write(self, path: str, pos: int, data: bytes,
              on_written: Callable[[int], None] | None = None) -> int:
        """Append ``data`` at byte ``pos`` of segment ``path``; dispatch every whole batch.
        ``on_written(offset)`` runs after the bytes are written, before the dispatch (the
        ack of a frame that ends at a batch end). Returns the new offset. Raises
        HAProtocolError if it does not continue the copy."""
        st, cl = self.store, self.store.commitlog
        affected = []
        with st._append_lock:
            a = cl.active
            if a is None or a.rel_path != path:
                a = self._reopen(path)
            if pos != a.size:
                raise HAProtocolError(f"master sent {path} at byte {pos}; this replica has "
                                      f"{a.size} bytes of it")
            a.append(data)
            with cl._lock:
                ref = cl._ref(path)
                ref.size = a.size
            cl.written_offset = a.base_offset + a.size
            if on_written is not None:
                on_written(cl.written_offset)
            affected = self._dispatch_new(a, ref, data)
        st._after_visible(affected)
        return cl.written_offset

    def _reopen(self, path: str) -> seg.SegmentWriter:
        cl = self.store.commitlog
        segs = cl.segments()
        if not segs or segs[-1].path != path or segs[-1].sealed:
            raise HAProtocolError(f"master sent bytes of {path}, which is not this replica's "
                                  "open segment")
        ref = segs[-1]
        cl.active = seg.SegmentWriter(self.store.sfs, path, ref.base_offset, create=False)
        if cl.active.size != ref.size:
            raise HAProtocolError(f"segment {path} has {cl.active.size} bytes on disk but "
                                  f"{ref.size} recovered")
        self._seg_pos = ref.size
        self._pending = b""
        return cl.active

    def _dispatch_new(self, a: seg.SegmentWriter, ref: SegmentRef, data) -> list:
        st, cl = self.store, self.store.commitlog
        affected: list = []
        buf = data
        if self._pending:
            # complete the message that straddles the frames (copy only that message)
            head = bytes(self._pending) + bytes(data[:MAX_HEADER_WAIT_BYTES])
            n = seg.message_length(pa.py_buffer(head), 0) if self._seg_pos else None
            if self._seg_pos == 0 or n is None or n == 0 or n > len(self._pending) + len(data):
                buf = bytes(self._pending) + bytes(data)    # rare: header, EOS, long message
            else:
                take = n - len(self._pending)
                whole = bytes(self._pending) + bytes(data[:take])
                batch = seg.read_batch_at(pa.py_buffer(whole), 0)
                affected.extend(st._dispatch(batch, a.base_offset + self._seg_pos)[1])
                self._seg_pos += n
                self._pending = b""
                buf = memoryview(data)[take:]
        i = 0
        if self._seg_pos == 0:
            h = seg.header_length(pa.py_buffer(buf))
            if h == 0:
                if len(buf) > MAX_HEADER_WAIT_BYTES:
                    raise HAProtocolError(f"segment {a.rel_path} does not start with the "
                                          "segment schema")
                self._pending = bytes(buf)
                return []
            i = self._seg_pos = h
        pbuf = pa.py_buffer(buf)
        sealed = False
        while i < len(buf):
            n = seg.message_length(pbuf, i)
            if n is None:
                break
            if n == 0:                       # end-of-stream: the master sealed here
                i += len(seg.EOS)
                self._seg_pos += len(seg.EOS)
                sealed = True
                break
            batch = seg.read_batch_at(pbuf, i)
            _, updates = st._dispatch(batch, a.base_offset + self._seg_pos)
            affected.extend(updates)
            i += n
            self._seg_pos += n
        self._pending = bytes(buf[i:])
        st._dispatched_offset = a.base_offset + self._seg_pos
        if sealed:
            if self._pending:
                raise HAProtocolError(f"bytes after the end of sealed segment {a.rel_path}")
            with cl._flush_lock:
                a.flush(sync=True)
                with cl._lock:
                    ref.sealed = True
                a.close()
                cl.active = None
                cl.flushed_offset = max(cl.flushed_offset, ref.end_offset)
        return affected

    def apply_meta(self, meta: dict) -> None:
        """Mirror the master's topic configs, consumer offsets and subscription group
        configs into this store (and, while it is empty, the master's retention floor).
        A group config the master no longer has is deleted here with its offsets (the
        master deleted the group); offsets of groups the master never configured are
        left alone (consumers of this replica may keep their own)."""
        st = self.store
        topics = meta.get("topics")
        offsets = meta.get("consumerOffsets")
        if not isinstance(topics, list) or not isinstance(offsets, list):
            raise HAProtocolError("meta frame needs lists 'topics' and 'consumerOffsets'")
        state = st.state
        actions = []
        for t in topics:
            if not isinstance(t, dict) or not isinstance(t.get("id"), int) or \
                    not isinstance(t.get("name"), str):
                raise HAProtocolError(f"bad topic in meta frame: {t!r}")
            if state.topics_by_id.get(t["id"]) != t:
                actions.append({"topic": t})
        for row in offsets:
            try:
                g, tid, qid, cid, off = row
            except (TypeError, ValueError):
                raise HAProtocolError(f"bad consumer offset in meta frame: {row!r}") from None
            if state.consumer_offsets.get((g, tid, qid, cid or "")) != off:
                actions.append({"consumerOffset": {"group": g, "topicId": tid, "queueId": qid,
                                                   "clientId": cid or None, "offset": off}})
        groups = meta.get("subscriptionGroups")
        if groups is not None:        # absent from masters older than this field
            if not isinstance(groups, list) or not all(
                    isinstance(g, dict) and isinstance(g.get("groupName"), str) for g in groups):
                raise HAProtocolError(f"bad subscriptionGroups in meta frame: {groups!r}"[:300])
            wanted = {g["groupName"]: g for g in groups}
            master_keys = {(g, tid, qid, cid or "") for g, tid, qid, cid, _ in offsets}
            for name, conf in wanted.items():
                if state.subscription_groups.get(name) != conf:
                    actions.append({"subscriptionGroup": conf})
            for name in state.subscription_groups.keys() - wanted.keys():
                actions.append({"subscriptionGroup": {"groupName": name, "deleted": True}})
                actions += [{"consumerOffset": {"group": g, "topicId": tid, "queueId": qid,
                                                "clientId": cid or None, "offset": None}}
                            for (g, tid, qid, cid) in state.consumer_offsets
                            if g == name and (g, tid, qid, cid) not in master_keys]
        retention = meta.get("retention")
        empty = not st.commitlog.segments()
        if isinstance(retention, dict) and empty and state.retention != retention:
            # the copy starts at the master's retention floor: continue its queue offsets
            actions.append({"retention": retention})
        if actions:
            st._commit(lambda s: actions, "REPLICATE META", {"actions": len(actions)})
            if empty:
                with st._append_lock:
                    st._reset_offsets()

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
        from ..log.consumequeue import MemoryConsumeQueue, consumequeue_add, write_side_table
        from ..log.index import MemoryIndex, index_add
        st, cl = self.store, self.store.commitlog
        with st._append_lock, st._commit_lock:
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
            actions: list[dict] = [{"remove": {"path": r.path, "deletionTimestamp": now,
                                               "dataChange": True}} for r in drop]
            for adds, schema, make_add, new_rel, need in (
                    (st.state.consumequeue_files, fmt.CONSUMEQUEUE_SCHEMA, consumequeue_add,
                     fmt.consumequeue_file,
                     lambda a: any(int(q.get("maxBatchOffset", 1 << 62)) >= offset
                                   for q in a.get("queues", ()))),
                    (st.state.index_files, fmt.INDEX_SCHEMA, index_add, fmt.index_file,
                     lambda a: True)):
                for add in list(adds.values()):
                    if not need(add):
                        continue
                    with st.sfs.open_input(add["path"]) as f:
                        table = pq.read_table(f).cast(schema)
                    keep = table.filter(pc.less(table.column("batch_offset"), offset))
                    if keep.num_rows == table.num_rows:
                        continue
                    actions.append({"remove": {"path": add["path"], "deletionTimestamp": now,
                                               "dataChange": False}})
                    if keep.num_rows:
                        rel = new_rel()
                        size = write_side_table(st.sfs, rel, keep,
                                                row_group_rows=st.config.side_table_row_group_rows)
                        actions.append({"add": make_add(rel, keep, size)})
            if cut is not None:
                actions.append({"add": {"path": cut.path, "kind": "segment",
                                        "baseOffset": cut.base_offset,
                                        "size": offset - cut.base_offset, "sealed": False,
                                        "modificationTime": now}})
            st._commit(lambda s: actions, "TRUNCATE", {"toOffset": offset,
                                                       "droppedBytes": end - offset})
            if cut is not None:
                st.sfs.truncate(cut.path, offset - cut.base_offset)
                with cl._lock:
                    cut.size = offset - cut.base_offset
                    cut.sealed = False
            cl.drop_segments({r.path for r in drop})
            # the removed files are deleted after deletedFileRetentionMs (their tombstones)
            with cl._lock:
                cl._cache.clear()
                cl._cache_bytes = 0
            cl.written_offset = cl.flushed_offset = offset
            st._dispatched_offset = offset
            st.cq = MemoryConsumeQueue(st.config.memory_consume_queue_entries)
            st.index = MemoryIndex()
            st._reset_offsets()
            st._visible_next = dict(st._next_offsets)
            self._seg_pos = (offset - cut.base_offset) if cut is not None else 0
            self._pending = b""
        log.warning("store %s truncated to physical offset %d: %d bytes dropped%s", st.url,
                    offset, end - offset, f" (kept in {keep_dir})" if keep_dir else "")
        return end - offset

    # -- promotion -----------------------------------------------------------
    def cut_unfinished(self) -> int:
        """Drop bytes of an unfinished message at the tail (promotion); a partly
        received Spark segment is sealed after its last whole batch. Returns the
        bytes dropped."""
        st, cl = self.store, self.store.commitlog
        with st._append_lock:
            segs = cl.segments()
            if not segs or segs[-1].sealed:
                return 0
            ref = segs[-1]
            a = cl.active or self._reopen(ref.path)
            keep = self._seg_pos if self._seg_pos else 0
            dropped = a.size - keep
            if dropped:
                a.close()
                st.sfs.truncate(ref.path, keep)
                cl.active = a = seg.SegmentWriter(st.sfs, ref.path, ref.base_offset, create=False)
            if a.size < seg.HEADER_SIZE:
                a.append(seg.SCHEMA_BYTES[a.size:])
            with cl._lock:
                ref.size = a.size
            cl.written_offset = cl.flushed_offset = a.base_offset + a.size
            st._dispatched_offset = cl.written_offset
            self._pending = b""
            self._seg_pos = a.size
            if fmt.parse_segment_file(ref.path.rsplit("/", 1)[-1]) is None:
                cl.seal_active()   # a Spark segment: never appended to by a broker
                st._dispatched_offset = cl.written_offset
            return dropped


def promote(store: Store, replica_log: ReplicaLog | None, seen_epoch: int) -> int:
    """Make this replica's store a master's: cut an unfinished tail, re-take the
    store's lease with an epoch above ``seen_epoch`` (the master's, learned from
    the stream) and every epoch in the history, record the new epoch's start
    offset, publish. Returns the new epoch."""
    if replica_log is not None:
        dropped = replica_log.cut_unfinished()
        if dropped:
            log.warning("promotion: dropped %d bytes of an unfinished message", dropped)
    history = epoch_history.load(store.sfs)
    floor = max([seen_epoch] + [e["epoch"] for e in history])
    epoch = store.raise_epoch(floor)
    store.replica = False          # from now on it appends its own batches
    epoch_history.append(store.sfs, epoch, store.store_id, store.commitlog.written_offset)
    store.publish(force=True)
    log.warning("store %s promoted: writer epoch %d from physical offset %d", store.url, epoch,
                store.commitlog.written_offset)
    return epoch


class HAClient:
    """Follows a master; see the module docstring. ``master_address`` is called
    before each connection attempt (a fixed ``haMasterAddress`` or a lookup)."""

    def __init__(self, replica_log: ReplicaLog, *, broker_name: str, broker_id: int,
                 secret: str, master_address: Callable[[], str | None]):
        if not secret:
            raise InvalidConfigError("a replica needs haSecret (the master's shared secret)")
        self.rlog = replica_log
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.secret = secret
        self.master_address = master_address
        self.connected = False
        self.master_epoch = 0
        self.master_offset = 0          # the master's written offset, as last heard
        self.last_error: str | None = None
        self.diverged_at: int | None = None      # where this store was truncated to rejoin
        self.diverged_kept: str | None = None    # where the dropped bytes were kept
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def offset(self) -> int:
        return self.rlog.offset

    def lag_bytes(self) -> int:
        return max(0, self.master_offset - self.rlog.offset)

    def start(self) -> "HAClient":
        self._thread = threading.Thread(target=self._loop, name="sparkmq-ha-client",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        backoff = BACKOFF_MIN_S
        while not self._stop.is_set():
            addr = None
            try:
                addr = self.master_address()
                if addr:
                    self._follow(addr)
                    backoff = BACKOFF_MIN_S
            except (OSError, ConnectionError, HAProtocolError, ValueError, SparkMQError) as e:
                self.last_error = f"{type(e).__name__}: {e}"
                if not self._stop.is_set():
                    log.warning("HA: link to master %s of %s lost: %s; retrying", addr,
                                self.broker_name, self.last_error)
            except Exception as e:   # never die: log, back off, retry
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("HA client failed")
            finally:
                self.connected = False
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
            self._stop.wait(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    def _follow(self, addr: str) -> None:
        host, port = parse_address(addr)
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        self._sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(MASTER_SILENCE_S)
        challenge, _ = recv_frame(sock)
        if challenge.get("type") != "challenge":
            raise HAProtocolError(f"{addr} is not a sparkmq HA port "
                                  f"(got {challenge.get('type')!r})")
        if challenge.get("brokerName") != self.broker_name:
            raise HAProtocolError(f"{addr} is the master of {challenge.get('brokerName')!r}, "
                                  f"not of {self.broker_name!r}")
        nonce = new_nonce()
        offset = self.rlog.offset
        send_frame(sock, {"type": "hello", "brokerName": self.broker_name,
                          "brokerId": self.broker_id, "nonce": nonce,
                          "proof": proof(self.secret, "replica", str(challenge.get("nonce")),
                                         self.broker_name),
                          "offset": offset, "epochs": epoch_history.load(self.rlog.store.sfs)})
        welcome, _ = recv_frame(sock)
        if welcome.get("type") == "error":
            raise HAProtocolError(f"master {addr} refused: {welcome.get('code')}: "
                                  f"{welcome.get('message')}")
        if welcome.get("type") != "welcome":
            raise HAProtocolError(f"expected welcome, got {welcome.get('type')!r}")
        if not check_proof(self.secret, "master", nonce, self.broker_name, welcome.get("proof")):
            raise HAProtocolError(f"{addr} failed to prove it knows haSecret; not following it")
        truncate_to = welcome.get("truncateTo")
        if isinstance(truncate_to, int) and 0 <= truncate_to < offset:
            # this store was a master before a promotion: it holds bytes the new master
            # lacks. Keep them aside, cut them here; the master streams from truncate_to.
            keep = f"{self.rlog.store.url.rstrip('/')}.diverged-{int(time.time() * 1000)}"
            dropped = self.rlog.truncate_to(truncate_to, keep_dir=keep)
            self.diverged_at, self.diverged_kept = truncate_to, keep
            log.warning("replica %s#%d: dropped %d bytes past offset %d that master %s lacks "
                        "(kept in %s)", self.broker_name, self.broker_id, dropped, truncate_to,
                        addr, keep)
        self.master_epoch = int(welcome.get("epoch") or 0)
        if isinstance(welcome.get("epochs"), list):
            epoch_history.save(self.rlog.store.sfs, welcome["epochs"])
        self.connected = True
        self.last_error = None
        log.info("HA: following master %s of %s (epoch %d) from offset %d", addr,
                 self.broker_name, self.master_epoch, offset)
        frames: queue.Queue = queue.Queue(maxsize=FRAME_QUEUE_FRAMES)
        reader = threading.Thread(target=self._read_frames, args=(sock, frames), daemon=True,
                                  name="sparkmq-ha-client-recv")
        reader.start()
        try:
            self._apply_frames(sock, frames)
        finally:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            while reader.is_alive():       # unblock a reader waiting on a full queue
                try:
                    frames.get_nowait()
                except queue.Empty:
                    pass
                reader.join(0.05)

    def _read_frames(self, sock: socket.socket, frames: "queue.Queue") -> None:
        """Receive frames while the applier writes the previous ones (the network and
        the disk overlap); bounded by FRAME_QUEUE_FRAMES frames."""
        try:
            while not self._stop.is_set():
                item = recv_frame(sock)
                while not self._stop.is_set():
                    try:
                        frames.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:   # handed to the applier, which raises it
            frames.put((None, e))

    def _apply_frames(self, sock: socket.socket, frames: "queue.Queue") -> None:
        while not self._stop.is_set():
            try:
                header, payload = frames.get(timeout=MASTER_SILENCE_S)
            except queue.Empty:
                raise ConnectionError(f"master silent for {MASTER_SILENCE_S} s") from None
            if header is None:
                raise payload
            kind = header["type"]
            if kind == "data":
                if header.get("whole"):   # ends at a batch end: ack once written
                    end = self.rlog.write(header.get("path"), header.get("pos"), payload,
                                          lambda off: send_frame(sock, {"type": "ack",
                                                                        "offset": off}))
                else:
                    end = self.rlog.write(header.get("path"), header.get("pos"), payload)
                    send_frame(sock, {"type": "ack", "offset": self.rlog.whole_offset})
                self.master_offset = max(self.master_offset, end)
            elif kind == "segment":
                self.rlog.begin_segment(header.get("path"), header.get("baseOffset"))
            elif kind == "meta":
                self.rlog.apply_meta(header)
            elif kind == "heartbeat":
                self.master_offset = int(header.get("writtenOffset") or 0)
                self.master_epoch = int(header.get("epoch") or self.master_epoch)
                send_frame(sock, {"type": "ack", "offset": self.rlog.whole_offset})
            elif kind == "error":
                raise HAProtocolError(f"master: {header.get('code')}: {header.get('message')}")
            else:
                log.debug("HA: ignoring frame %s", kind)
