"""A send's waits for durability (its fsync, its replica): the replica's taken out of the
merged append, and both awaited on the gRPC loop instead of a worker thread.

SYNC_MASTER holds a send until a replica acked its bytes (``SendService.replicated``).
That wait is made by each request after ``SendMerger`` returns its rows, not inside the
merged append: a request never waits, as a follower, for another request's replica.
The appends put a :class:`Replicating` marker where a row's status goes, and
:func:`resolve` turns it into the status once per append.

Where a send would wait (SYNC_FLUSH, SYNC_MASTER; :func:`loop_waits`), the gRPC
service appends on its event loop as it does for sends that
never wait, inside :func:`held`: the append leaves its fsync and its rows' visibility to
the caller (``Store.append_batch``'s ``later``), ``replicated`` notes the offset to wait
for (``HELD``) instead of blocking, the response is built as if durable, and
:func:`finish` awaits the group commit's fsync and then the replica's ack as futures
(``Store.flushed_async``, ``HAService.replicated_async``; in controller mode every other
SyncStateSet member's, ``replicated_by_async``, and then the lease must still hold)
before it answers; a failed
wait turns the stored rows' entries into the status the blocking path gives
(:func:`with_put_status`). This is RocketMQ's own shape (``putMessage`` returns a future
that the flush and HA services complete) and spares the send the hop to a worker thread
and back, which cost a sequential sender ~15% of its messages a second here
(bench/README.md, fifth session). Sends inside ``held`` do not go through the merger:
the loop runs them one at a time, and one fsync still serves all that wait together.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from ..log.status import PutMessageStatus
from .protocol import Code, send_response


class Replicating:
    """A row's status until its append's replica wait is made (one per append)."""
    __slots__ = ("r",)

    def __init__(self, r):
        self.r = r


def resolve(sender, results: list) -> list:
    """``results`` of ``SendService``'s appends, each ``Replicating`` marker replaced by
    ``sender.replicated`` of its append (asked once per append)."""
    done: dict[int, PutMessageStatus] = {}
    out = []
    for x in results:
        if isinstance(x, tuple) and type(x[0]) is Replicating:
            st = done.get(id(x[0]))
            if st is None:
                st = done[id(x[0])] = sender.replicated(x[0].r)
            x = (st, *x[1:])
        out.append(x)
    return out


class _Held(threading.local):
    """Per thread, inside a ``held`` block: ``offsets`` the replica offsets its sends
    await, ``flushes`` what their appends left to flush and make visible (SYNC_FLUSH;
    ``Store.append_batch``'s ``later``), else None. ``loop``: the thread runs the gRPC
    server's event loop (``on_the_loop``)."""
    offsets: list | None = None
    flushes: list | None = None
    loop = False


HELD = _Held()


def on_the_loop() -> None:
    """Mark the calling thread as the gRPC server's event loop (``GrpcServer``): its
    sends run one at a time, so they are never merged (``merges``)."""
    HELD.loop = True


def merges() -> bool:
    """Whether a send made now may be merged with others waiting (``SendMerger``): not
    on the gRPC loop, whose sends run one at a time (with nothing to wait for, they are
    appended at once; inside ``held``, they await their fsync and replica together).
    Merging is for sends on threads (Flight, in-process callers)."""
    return HELD.offsets is None and not HELD.loop


@contextlib.contextmanager
def held(flush: bool):
    """Within the block, this thread's sends append without waiting: ``SendService``
    appends with ``later=HELD.flushes`` where ``flush`` (SYNC_FLUSH), and
    ``SendService.replicated`` notes the replica offset to wait for and answers PUT_OK.
    The caller must then :func:`finish` (yielded: the held state)."""
    state = _State([], [] if flush else None)
    HELD.offsets, HELD.flushes = state.offsets, state.flushes
    try:
        yield state
    finally:
        HELD.offsets = HELD.flushes = None


class _State:
    """What one ``held`` block's sends left to wait for (see ``_Held``)."""
    __slots__ = ("offsets", "flushes")

    def __init__(self, offsets: list, flushes: list | None):
        self.offsets, self.flushes = offsets, flushes


def loop_waits(sender) -> bool | None:
    """Whether a send may wait on the gRPC loop (``held``, then :func:`finish`) with the
    flush it needs (True: SYNC_FLUSH), or None: it runs on a worker (no store)."""
    if sender.store is None:
        return None
    return sender.store.config.flush_disk_type != "ASYNC_FLUSH"


async def finish(broker, answer, state, context):
    """The answer of sends made inside ``held`` (``state``), once durable as the blocking
    path makes them: their flush awaited (SYNC_FLUSH), then their rows made visible (long
    polls woken: ``wake_after_reply``), then their replica's ack awaited (SYNC_MASTER), then
    (controller mode) the lease checked; a failed wait gives the stored entries the
    status the blocking path gives."""
    put_status = PutMessageStatus.PUT_OK
    flushes, offsets = state.flushes, state.offsets
    if flushes:
        # in a task of its own, shielded: a client that gives up (the RPC cancelled)
        # must not leave stored rows invisible; they show once fsynced, as always
        task = asyncio.ensure_future(_flush_then_show(broker, flushes, context))
        _SHOWING.add(task)
        task.add_done_callback(_SHOWING.discard)
        put_status = await asyncio.shield(task)
    ha, controlled = broker.sender.ha_service, broker.controlled
    timeout_ms = broker.store.config.sync_flush_timeout_ms
    if put_status is PutMessageStatus.PUT_OK and offsets and ha is not None:
        put_status = await (ha.replicated_async(max(offsets), timeout_ms)
                            if controlled is None else   # every SyncStateSet member
                            ha.replicated_by_async(max(offsets), controlled.sync_replica_ids(),
                                                   timeout_ms))
        if put_status is not PutMessageStatus.PUT_OK:
            count_failure(broker.metrics, put_status)
    if put_status is PutMessageStatus.PUT_OK and controlled is not None and \
            not controlled.lease_valid():       # the lease must still hold as it answers
        put_status = PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        count_failure(broker.metrics, put_status)
    if put_status is PutMessageStatus.PUT_OK:
        return answer
    return with_put_status(answer, put_status)


_SHOWING: set = set()      # the tasks of _flush_then_show running (kept referenced)


async def _flush_then_show(broker, flushes: list, context) -> PutMessageStatus:
    """Await the fsync ``flushes`` need, then make their rows visible (long polls woken
    by ``wake_after_reply``: on the loop, at once, as the call may be over by now; a
    woken poll resumes a loop turn after ``finish`` does, so it runs once this send has
    answered: test_wake_after_reply.py holds that); the fsync's status."""
    put_status = await broker.store.flushed_async(max(o for o, _ in flushes))
    notifier = broker.notifier
    with notifier.deferred() as arrived:
        broker.store.make_visible(flushes)
    notifier.wake_after_reply(arrived, context)
    return put_status


def count_failure(metrics, put_status: PutMessageStatus) -> None:
    """Count a SYNC_MASTER send whose replica did not ack (blocking or awaited)."""
    metrics.inc("sparkmq_ha_sync_failures_total", status=put_status.value)


def with_put_status(answer, put_status: PutMessageStatus) -> spb.SendMessageResponse:
    """The SendMessage ``answer`` (a response or its bytes) built as if durable, with each
    stored entry given ``put_status`` (its fsync, or its replica's ack, came late or not
    at all), as
    ``send_response`` answers it: refused entries keep their status, recall handles
    stay."""
    resp = spb.SendMessageResponse.FromString(answer) if isinstance(answer, bytes) else answer
    results: list = [(put_status, e.message_id, e.offset, e.transaction_id)
                     if e.status.code == Code.OK else pb.Status(code=e.status.code,
                                                                 message=e.status.message)
                     for e in resp.entries]
    if not results:
        return resp
    out = send_response(results)
    for old, new in zip(resp.entries, out.entries):
        if old.recall_handle:
            new.recall_handle = old.recall_handle
    return out
