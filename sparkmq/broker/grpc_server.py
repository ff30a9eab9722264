"""The broker's gRPC server: ``grpc.aio`` on an event loop of its own thread.

Long polls (ReceiveMessage, PullMessage) and Telemetry streams are coroutines: a poll
with nothing to deliver is suspended on the arrival notifier (``longpoll.py``), as
RocketMQ's PullRequestHoldService holds pull requests, so thousands of open polls cost
memory, not threads. Every other RPC is a plain function that grpc.aio runs on the
worker pool (``grpcThreadPoolNums`` threads: its ``migration_thread_pool``), as the
threaded server did; blocking work of a coroutine (a look into the store) goes to the
same pool through :meth:`GrpcServer.offload`.

Thread-safety: ``start``/``stop`` from one thread; ``offload`` only from the loop.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent import futures
from typing import Callable

import grpc
import grpc.aio

from ..errors import BindError
from .replicawait import on_the_loop


class Malformed:
    """Stands in for request bytes that do not decode; handlers answer BAD_REQUEST."""

    def __init__(self, error: str):
        self.error = error


def lenient(message_class):
    """A request deserializer that turns bytes that do not decode into :class:`Malformed`."""
    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        # every bad input must become BAD_REQUEST, and what the protobuf runtime raises
        # for it differs by implementation (upb, cpp, python: DecodeError, ValueError,
        # RuntimeError...): catch all, the error text goes back to the client
        except Exception as e:
            return Malformed(f"{message_class.__name__} does not decode ({e}); "
                             "the request is malformed or truncated")
    return parse


class GrpcServer:
    """One ``grpc.aio`` server on ``host:port`` (0: a free port), its handlers added by
    ``register(server)``; ``credentials`` for TLS, else plaintext."""

    def __init__(self, host: str, port: int, *, workers: int, options: list,
                 register: Callable, credentials=None):
        self.pool = futures.ThreadPoolExecutor(max_workers=workers,
                                               thread_name_prefix="sparkmq-grpc")
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever,
                                        name="sparkmq-grpc-loop", daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        try:
            self.port = self._call(self._start(host, port, options, register, credentials))
        except BaseException:
            self._close_loop()
            raise

    def _call(self, coro, timeout: float | None = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self, host, port, options, register, credentials) -> int:
        on_the_loop()                    # (this coroutine runs on the loop's thread)
        server = grpc.aio.server(migration_thread_pool=self.pool, options=options)
        register(server)
        address = f"{host}:{port}"
        try:
            bound = (server.add_secure_port(address, credentials) if credentials is not None
                     else server.add_insecure_port(address))
        except RuntimeError as e:   # grpc reports a taken port this way
            raise BindError(f"cannot bind gRPC port {address}: {e}; set listenPort to a "
                            "free port or stop the process holding it") from None
        if bound == 0:
            raise BindError(f"cannot bind gRPC port {address}; set listenPort to a free "
                            "port or stop the process holding it")
        await server.start()
        self._server = server
        return bound

    async def offload(self, fn: Callable, *args):
        """Run blocking ``fn(*args)`` on the worker pool; the calling coroutine waits."""
        return await self.loop.run_in_executor(self.pool, fn, *args)

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving (open calls get ``grace`` seconds, then are cancelled), then end
        the loop and the pool."""
        if self._server is not None:
            try:
                self._call(self._server.stop(grace), timeout=grace + 5)
            except (futures.TimeoutError, RuntimeError):  # the loop is gone or stuck: go on
                pass
            self._server = None
        self._close_loop()

    def _close_loop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        if not self.loop.is_running():
            self.loop.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
