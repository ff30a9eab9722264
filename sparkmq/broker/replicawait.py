"""A send's wait for its replica, taken out of the merged append, and awaited on the gRPC
loop where that is the send's only wait.

SYNC_MASTER holds a send until a replica acked its bytes (``SendService.replicated``).
That wait is made by each request after ``SendMerger`` returns its rows, not inside the
merged append: a request never waits, as a follower, for another request's replica.
The appends put a :class:`Replicating` marker where a row's status goes, and
:func:`resolve` turns it into the status once per append.

Where a send waits for nothing but its replica (ASYNC_FLUSH, SYNC_MASTER, outside
controller mode: :func:`replica_only_wait`), the gRPC service appends on its event loop
as it does for sends that never wait, inside :func:`held`: ``replicated`` then notes the
offset to wait for (``HELD``) instead of blocking, the response is built as if acked,
and the coroutine awaits ``HAService.replicated_async`` (a future the replica's ack
resolves) before it answers; a late or lost ack turns the stored rows' entries into the
status the blocking wait gives (:func:`with_put_status`). This is RocketMQ's own shape
(``putMessage`` returns a future the HA service completes) and spares the send the hop
to a worker thread and back, which cost a sequential sender ~15% of its messages a
second here (bench/README.md, fifth session).
"""
from __future__ import annotations

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
    """Per thread: the offsets a ``held`` block's sends are to await (None outside)."""
    offsets: list | None = None


HELD = _Held()


@contextlib.contextmanager
def held():
    """Within the block, ``SendService.replicated`` on this thread notes the offset a
    SYNC_MASTER send waits for (yielded list) and answers PUT_OK at once; the caller
    must await them (``HAService.replicated_async``) before it answers."""
    offsets: list[int] = []
    HELD.offsets = offsets
    try:
        yield offsets
    finally:
        HELD.offsets = None


def replica_only_wait(sender):
    """The HA service if a send waits for nothing but one replica's ack (ASYNC_FLUSH,
    SYNC_MASTER, outside controller mode, whose lease and replica set are checked by
    the blocking wait), else None."""
    b = sender.broker
    ha = sender.ha_service
    if ha is None or sender.role != "SYNC_MASTER" or b.controlled is not None \
            or sender.store is None or sender.store.config.flush_disk_type != "ASYNC_FLUSH":
        return None
    return ha


def count_failure(metrics, put_status: PutMessageStatus) -> None:
    """Count a SYNC_MASTER send whose replica did not ack (blocking or awaited)."""
    metrics.inc("sparkmq_ha_sync_failures_total", status=put_status.value)


def with_put_status(answer, put_status: PutMessageStatus) -> spb.SendMessageResponse:
    """The SendMessage ``answer`` (a response or its bytes) built as if acked, with each
    stored entry given ``put_status`` (its replica's ack came late or not at all), as
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
