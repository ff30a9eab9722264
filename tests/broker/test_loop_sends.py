"""Sends on the gRPC server's event loop are appended alone, never merged: the loop runs
its sends one at a time (``replicawait.merges``). Sends made on threads (Flight puts,
in-process callers) may be merged with others waiting (``SendMerger``). A real broker,
its grpc.aio server, and sparkmq's Producer over RocketMQ gRPC."""
from __future__ import annotations

import asyncio
import threading

import pytest

from sparkmq.broker import replicawait
from sparkmq.client import Message, Producer


@pytest.mark.integration
@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_sends_on_the_grpc_loop_are_not_merged(make_broker, monkeypatch, flush):
    b = make_broker(flushDiskType=flush)
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    seen: list = []
    for merger in {id(m): m for m in (b.batch_sender.merger, b.sender.merger)}.values():
        def spy(rows, *, merge=True, real=merger.submit):
            seen.append((threading.current_thread().name, merge))
            return real(rows, merge=merge)
        monkeypatch.setattr(merger, "submit", spy)
    p = Producer(b.endpoint, transport="grpc")
    try:
        p.send(Message("T", b"plain"))                              # the plain path
        p.send(Message("T", b"rich", properties={"k": "v"}))        # SendService's
    finally:
        p.shutdown()
    assert seen == [("sparkmq-grpc-loop", False)] * 2
    assert [m.body for m in b.store.read("T", 0, 0, 10)] == [b"plain", b"rich"]


@pytest.mark.integration
def test_a_thread_may_merge_and_the_loop_and_a_held_block_do_not(make_broker):
    b = make_broker()
    assert replicawait.merges()                       # this (the test's) thread

    async def ask():
        return replicawait.merges(), threading.current_thread().name
    on_loop = asyncio.run_coroutine_threadsafe(ask(), b._grpc.loop).result(30)
    assert on_loop == (False, "sparkmq-grpc-loop")
    with replicawait.held(False):
        assert not replicawait.merges()
    assert replicawait.merges()
