"""A send's held arrivals wake their long polls once, whatever gRPC context the send ran
under (longpoll.ArrivalNotifier.wake_after_reply), on a real grpc.aio server like the
broker's: a coroutine handler on its loop (no callback: woken as it ends) and a plain
handler on its workers (grpc.aio's sync context: its add_callback returns None and runs
the callback as the handler returns). Each arrival moves a queue's counter by one: a
second wake would move it by two."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc
import grpc.aio

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
