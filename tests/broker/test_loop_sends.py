"""RocketMQ sends that wait for their fsync (SYNC_FLUSH) run on the broker's gRPC loop and
await it as a future (``broker/replicawait.py``, ``GroupCommitService.flushed_async``), as
RocketMQ's putMessage future: no thread waits for the disk, the rows become visible only
once fsynced (as on the blocking path), and sends waiting together share one fsync.
Sends on the loop are appended alone, never merged: the loop runs its sends one at a time
(``replicawait.merges``); sends made on threads (Flight puts, in-process callers) may be
merged with others waiting (``SendMerger``)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from helpers.storetools import HeldSyncOS
from helpers.waiting import wait_until
from sparkmq.broker import replicawait
from sparkmq.client import Message, Producer
from sparkmq.client.core import Code

pytestmark = pytest.mark.integration


def test_sync_flush_sends_await_their_fsync_on_the_loop_visible_after_it_sharing_one(
        make_broker, monkeypatch):
    from sparkmq.log import segment
    b = make_broker(flushDiskType="SYNC_FLUSH", syncFlushTimeout=30_000,
                    autoCreateTopicEnable="false")
    b.store.create_topic("A", read_queue_nums=1, write_queue_nums=1)

    def blocked(*args, **kw):
        raise AssertionError("a send blocked a thread waiting for its fsync")
    monkeypatch.setattr(b.store.services.group_commit, "wait_for", blocked)
    slow = HeldSyncOS()
    monkeypatch.setattr(segment, "os", slow)
    with Producer(b.endpoint, transport="grpc", max_retries=0) as p:
        receipts: dict = {}

        def send(body: bytes):
            receipts[body] = p.send(Message("A", body, properties={"k": "v"}
                                            if body.endswith(b"rich") else {}))
        first = threading.Thread(target=send, args=(b"first",))
        first.start()
        wait_until(lambda: slow.syncs == 1, "the first send's fsync to start")
        # stored, not fsynced: not readable yet
        assert b.store.read("A", 0, 0, 10) == []
        rest = [threading.Thread(target=send, args=(body,))
                for body in (b"a", b"b-rich", b"c", b"d-rich")]
        for t in rest:
            t.start()
        wait_until(lambda: _appended(b) == 5, "every send appended, waiting for the disk")
        assert b.store.read("A", 0, 0, 10) == [] and b.store.max_offset("A", 0) == 0
        slow.release.set()
        for t in [first, *rest]:
            t.join(30)
    assert {body: r.status_code for body, r in receipts.items()} == dict.fromkeys(
        (b"first", b"a", b"b-rich", b"c", b"d-rich"), Code.OK)
    assert sorted(m.body for m in b.store.read("A", 0, 0, 10)) == \
        [b"a", b"b-rich", b"c", b"d-rich", b"first"]
    assert slow.syncs == 2          # the held one, then ONE for the four sent meanwhile


def _appended(b) -> int:
    """Rows appended to queue A/0, readable or not (the next queue offset it assigns)."""
    tid = b.store.topics()["A"]["id"]
    return b.store.dispatcher.next_offsets.get((tid, 0), 0)


def test_a_send_whose_client_gives_up_before_its_fsync_still_becomes_readable(
        make_broker, monkeypatch):
    """The RPC cancelled (the client's deadline) while its fsync is held: the stored row
    shows once the fsync is done, as on the blocking path, not never."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
    from sparkmq.log import segment
    b = make_broker(flushDiskType="SYNC_FLUSH", syncFlushTimeout=30_000,
                    autoCreateTopicEnable="false")
    b.store.create_topic("A", read_queue_nums=1, write_queue_nums=1)
    slow = HeldSyncOS()
    monkeypatch.setattr(segment, "os", slow)
    m = pb.Message(topic=pb.Resource(name="A"), body=b"given-up")
    m.system_properties.message_id = "ID-GIVEN-UP"
    m.system_properties.born_timestamp.FromMilliseconds(1_700_000_000_000)
    channel = grpc.insecure_channel(b.endpoint)
    try:
        with pytest.raises(grpc.RpcError) as e:
            MessagingServiceStub(channel).SendMessage(spb.SendMessageRequest(messages=[m]),
                                                      timeout=0.5)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        channel.close()
    assert slow.syncs >= 1 and b.store.read("A", 0, 0, 10) == []
    slow.release.set()
    wait_until(lambda: [x.body for x in b.store.read("A", 0, 0, 10)] == [b"given-up"],
               "the stored row to show once fsynced")


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
