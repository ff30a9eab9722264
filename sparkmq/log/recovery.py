"""Crash recovery of a writable store, as a named phase (Kafka's LogLoader).

:func:`recover` runs once, when a writer opens the store (after taking the
lease). It loads the published segments, finds segment files rolled after the
last publish, and -- after a crash (``abort`` marker present, or a lease left
unreleased) -- scans the unpublished CommitLog tail from the last published
size, cuts it at the last whole batch and re-dispatches it; then it writes the
abort marker and publishes. A crashed writer's last segment is sealed
(:func:`seal_foreign_tail`): the old writer may only be paused, so its late
bytes must land where no one reads them. A replica's tail is not sealed (its
copy stays byte-identical to the master's).

On disk: reads ``commitlog/``, truncates a torn tail in place, writes
``abort``. After a crash during recovery: recovery runs again (it is
idempotent: what it re-dispatches is not published until its end).
Thread-safety: single-threaded (before the store's services start).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..progress import Progress
from . import format as fmt
from .actions import ConsumerOffset
from . import segment as seg
from .commitlog import SegmentRef
from .idtags import epoch_actions

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("sparkmq.store")


def recover(store: "Store") -> None:
    """Recover ``store`` (see the module docstring); ends with a publish."""
    sfs = store.sfs
    crashed = sfs.exists(fmt.abort_file()) or store.recovered_from_crash
    store.recovered_from_crash = crashed
    if crashed:
        log.warning("store %s: abort marker found, recovering from a crash", store.url)
    refs = [SegmentRef(a.path, int(a.base_offset), a.size, bool(a.sealed))
            for a in store.state.segments.values()]
    store.commitlog.load(refs)
    store.dispatcher.reset_offsets(store.state)
    refs.sort(key=lambda r: r.base_offset)
    # segment files written after the last publish (rolled), named by base offset
    known = {r.path for r in refs}
    end = store.state.address_end()
    extra = []
    for name in sfs.list_names(fmt.COMMITLOG_DIR):
        base = fmt.parse_segment_file(name)
        rel = f"{fmt.COMMITLOG_DIR}/{name}"
        if base is not None and rel not in known and base >= end:
            extra.append((base, rel))
        elif base is not None and rel not in known and base < store.state.min_physical_offset() \
                and rel not in store.state.tombstones:
            # removed by retention so long ago that checkpoints dropped the tombstone,
            # and no writer deleted the file (files with a tombstone wait for its delay)
            log.info("deleting segment file %s: below the retention floor", rel)
            sfs.delete(rel)
    extra.sort()
    tail: list[SegmentRef] = []
    if refs and not refs[-1].sealed:
        tail.append(refs[-1])
    for base, rel in extra:
        if tail and base != tail[-1].base_offset + sfs.size(tail[-1].path):
            log.warning("ignoring segment file %s: not contiguous with the CommitLog", rel)
            continue
        ref = SegmentRef(rel, base, seg.HEADER_SIZE, False)
        store.commitlog.add_segment(ref)
        tail.append(ref)
    redispatched = 0
    progress = Progress(sum(sfs.size(r.path) for r in tail), f"recover {store.url}", unit="B")
    for i, ref in enumerate(tail):
        buf = sfs.read_buffer(ref.path)
        start = max(seg.HEADER_SIZE, ref.size)
        result = seg.scan(buf, start, validate=crashed)
        if result.valid_end == 0:
            log.warning("segment %s has no valid header; truncating it to empty", ref.path)
            sfs.truncate(ref.path, 0)
            sfs.write(ref.path, seg.SCHEMA_BYTES)
            valid_end = seg.HEADER_SIZE
        else:
            valid_end = result.valid_end + (8 if result.sealed else 0)
        if len(buf) > valid_end:
            log.warning("segment %s: cutting torn tail at byte %d (file had %d bytes)",
                        ref.path, valid_end, len(buf))
            del buf
            sfs.truncate(ref.path, valid_end)
            buf = sfs.read_buffer(ref.path)
        for pos in result.positions:
            batch = seg.read_batch_at(buf, pos, ref.path)
            store.dispatcher.dispatch(batch, ref.base_offset + pos)
            redispatched += batch.num_rows
        ref.size = valid_end
        ref.sealed = result.sealed
        store.commitlog.load(store.commitlog.segments())
        progress.advance(valid_end)
    progress.close()
    # after a crash, ids from the end on carry a new tag: the crash may have taken
    # acknowledged (ASYNC_FLUSH) messages past it, whose ids must not name new ones
    new_ids = epoch_actions(store.state, store.commitlog.written_offset) \
        if crashed and not store.replica else []
    # continue appending to the last unsealed segment, if it is the newest
    segs = store.commitlog.segments()
    if segs and not segs[-1].sealed and fmt.parse_segment_file(segs[-1].path) is not None:
        if crashed and not store.replica:
            seal_foreign_tail(store, segs[-1])
        else:
            store.commitlog.open_active(segs[-1])
    for s in segs[:-1]:
        s.sealed = True  # frozen: something was placed after it
    store.commitlog.flushed_offset = store.commitlog.written_offset
    store.dispatcher.dispatched_offset = store.commitlog.written_offset
    store.dispatcher.show_all()
    if redispatched:
        log.info("store %s: re-dispatched %d messages from the CommitLog tail",
                 store.url, redispatched)
    sfs.write(fmt.abort_file(), store.owner.encode())
    corrected = offsets_past_the_end(store) if crashed and not store.replica else []
    store.publish(force=True, extra_actions=[*new_ids, *corrected])
    store.delete_removed_files()   # left by a previous writer that stopped too early


def seal_foreign_tail(store: "Store", ref: SegmentRef) -> None:
    """After an unclean stop the previous writer may still be alive (its lease
    expired while it was paused): never append to its file. Seal it with an
    end-of-stream marker, so bytes it writes late land past the sealed end and
    are never read; the next append rolls to a new segment."""
    w = seg.SegmentWriter(store.sfs, ref.path, ref.base_offset, create=False)
    try:
        w.append(seg.EOS)
        w.flush(sync=True)
        size = w.size
    finally:
        w.close()
    ref.size = size
    ref.sealed = True
    store.commitlog.load(store.commitlog.segments())


def offsets_past_the_end(store: "Store") -> list[ConsumerOffset]:
    """Consumer offsets (committed at once, durable) that point past their queue's max
    offset after a crash took the unflushed messages they had consumed (ASYNC_FLUSH),
    each moved back to that max offset. Left alone, a group would skip the messages
    appended next at those offsets. RocketMQ answers a pull past the max offset with
    OFFSET_OVERFLOW_BADLY and moves the consumer to the max offset; this does it once,
    at recovery, before any new append can hide the overshoot."""
    ends = store.dispatcher.visible_next
    live = {t.id for t in store.state.topics.values()}
    out = []
    for (group, tid, qid, client), off in sorted(store.state.consumer_offsets.items()):
        end = ends.get((tid, qid), 0)
        if tid in live and off > end:
            log.warning("store %s: group %s offset %d of queue %d/%d is past the queue's "
                        "max offset %d after the crash; moved back to it",
                        store.url, group, off, tid, qid, end)
            out.append(ConsumerOffset(group=group, topic_id=tid, queue_id=qid, offset=end,
                                      client_id=client or None))
    return out
