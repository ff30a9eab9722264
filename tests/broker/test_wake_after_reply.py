"""A send's held arrivals wake their long polls once, whatever gRPC context the send ran
under (longpoll.ArrivalNotifier.wake_after_reply), on a real grpc.aio server like the
broker's: a coroutine handler on its loop (no callback: woken as it ends) and a plain
handler on its workers (grpc.aio's sync context: its add_callback returns None and runs
the callback as the handler returns). Each arrival moves a queue's counter by one: a
second wake would move it by two. And a SYNC_FLUSH send's long polls, woken once its rows
are fsynced, run after the send has answered (a real broker, the official clients)."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import grpc.aio
import pytest

from sparkmq.broker.longpoll import ArrivalNotifier

KEY = ("t", 3)


def _arrive(notifier: ArrivalNotifier, context, seen: list) -> bytes:
    """What a send does: its arrival held, then handed to wake_after_reply."""
    with notifier.deferred() as arrived:
        notifier.on_arrival(*KEY, 1)
    seen.append(notifier.version(*KEY)[0])     # (held: not woken yet)
    notifier.wake_after_reply(arrived, context)
    return b"ok"


def test_a_send_wakes_its_long_polls_once_under_either_grpc_aio_context():
    notifier = ArrivalNotifier()
    seen: list = []

    async def on_loop(request, context):
        return _arrive(notifier, context, seen)

    def on_worker(request, context):
        return _arrive(notifier, context, seen)

    async def run() -> list:
        pool = ThreadPoolExecutor(2)
        server = grpc.aio.server(migration_thread_pool=pool)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {
            name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=bytes,
                                                      response_serializer=bytes)
            for name, fn in (("Loop", on_loop), ("Worker", on_worker))}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        versions = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                for name in ("Loop", "Worker", "Loop", "Worker"):
                    call = channel.unary_unary(f"/t.T/{name}", request_serializer=bytes,
                                               response_deserializer=bytes)
                    assert await call(b"") == b"ok"
                    versions.append(notifier.version(*KEY)[0])
        finally:
            await server.stop(None)
            pool.shutdown()
        return versions

    versions = asyncio.run(run())
    # each send moved the queue's counter by exactly one, none inside its handler
    assert seen == [0, 1, 2, 3] and versions == [1, 2, 3, 4], (seen, versions)


@pytest.mark.integration
def test_a_sync_flush_sends_long_poll_runs_after_the_send_is_answered(make_broker, clients,
                                                                      monkeypatch):
    # A SYNC_FLUSH send on the gRPC loop makes its rows visible once fsynced, in a task of
    # its own, and wakes their long polls there; a woken poll must not run its pop before
    # the send's handler has answered (its pop would be in the reply's way). (It resumes
    # a loop turn after the handler: a flush task that yielded after the wake fails this.)
    from rocketmq import FilterExpression, Producer, SimpleConsumer

    from helpers.brokers import client_conf, msg
    from helpers.waiting import wait_until
    from sparkmq.broker import grpc_service

    b = make_broker(flushDiskType="SYNC_FLUSH")
    producer = clients(Producer(client_conf(b), ("Order",)))
    producer.send(msg("Order", b"first"))          # (the topic and the route made)
    consumer = clients(SimpleConsumer(client_conf(b), "G", {"Order": FilterExpression()},
                                      await_duration=20))
    consumer.receive(16, 30)                         # (the first message taken)
    events: list = []
    finish, wait_async = grpc_service.finish, b.notifier.wait_async

    async def finished(*args):
        answer = await finish(*args)
        events.append("send answered")
        return answer

    async def woken(*args, **kw):
        got = await wait_async(*args, **kw)
        events.append("poll woken")
        return got

    monkeypatch.setattr(grpc_service, "finish", finished)
    monkeypatch.setattr(b.notifier, "wait_async", woken)
    result: list = []
    t = threading.Thread(target=lambda: result.append(consumer.receive(16, 30)))
    t.start()
    wait_until(lambda: b.notifier.waiting, "the receive to be parked")
    producer.send(msg("Order", b"second"))
    t.join(15)
    assert not t.is_alive(), "the held receive was not woken by the arrival"
    assert [m.body for m in result[0]] == [b"second"]
    assert events[:2] == ["send answered", "poll woken"], events
