"""The master's fast path to a caught-up replica (sparkmq.ha.connection, sparkmq.ha.loopacks):
an append's bytes sent by the appending thread itself (``ReplicaConnection.push``), and
the replica's acks read on an event loop instead of a thread.

Real sockets on 127.0.0.1, real files; a "raw" replica speaks the protocol's own frames
so a test can choose when it reads, and checks every byte it is sent.
"""
from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.waiting import wait_until
from sparkmq import Message
from sparkmq.ha import connection as ha_conn
from sparkmq.ha.protocol import (data_frame_head, frame_head, new_nonce, proof, recv_frame,
                                 send_frame)
from sparkmq.log.status import PutMessageStatus
from test_ha import SECRET, segment_files, send

pytestmark = [pytest.mark.integration]


class RawReplica:
    """A replica made of the protocol's frames: it reads only when told to, and rebuilds
    each segment file from the data frames, refusing a gap or an overlap."""

    def __init__(self, port: int, *, rcvbuf: int | None = None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(60)
        self.sock.connect(("127.0.0.1", port))
        challenge, _ = recv_frame(self.sock)
        send_frame(self.sock, {"type": "hello", "brokerName": "broker-a", "brokerId": 1,
                               "nonce": new_nonce(), "offset": 0, "epochs": [],
                               "proof": proof(SECRET, "replica", challenge["nonce"],
                                              "broker-a")})
        welcome, _ = recv_frame(self.sock)
        assert welcome["type"] == "welcome", welcome
        self.files: dict[str, bytearray] = {}
        self.end = 0

    def read_until(self, offset: int) -> None:
        while self.end < offset:
            header, payload = recv_frame(self.sock)
            if header["type"] == "segment":
                assert header["path"] not in self.files, header
                self.files[header["path"]] = bytearray()
            elif header["type"] == "data":
                got = self.files[header["path"]]
                assert header["pos"] == len(got), (header, len(got))   # no gap, no overlap
                got += payload
                self.end = header["offset"] + len(payload)

    def ack(self, offset: int) -> None:
        send_frame(self.sock, {"type": "ack", "offset": offset})

    def close(self) -> None:
        self.sock.close()


def big_send(store, n: int, topic: str = "T") -> None:
    for _ in range(n):
        store.append([Message(topic, b"x" * 1024) for _ in range(50)])


@settings(deadline=None, max_examples=200)
@given(st.text(), st.integers(0, 2**62), st.integers(0, 2**62), st.booleans(),
       st.integers(0, 2**32))
def test_a_pushed_data_frame_head_is_the_generic_one(path, pos, offset, whole, count):
    """``data_frame_head`` formats a data frame's header directly: byte for byte what
    ``frame_head`` makes of the same header (any path, even one JSON must escape)."""
    assert data_frame_head(path, pos, offset, whole, count) == frame_head(
        {"type": "data", "path": path, "pos": pos, "offset": offset, "whole": whole}, count)


@pytest.fixture
def pushes(monkeypatch):
    """What each ``push`` got from the socket: [] all taken, a remainder, None nothing."""
    seen = []

    def spy(sock, parts):
        left = real(sock, parts)
        seen.append(None if left is None else sum(len(x) for x in left))
        return left
    real = ha_conn.send_now
    monkeypatch.setattr(ha_conn, "send_now", spy)
    return seen


@pytest.fixture
def streamed(monkeypatch):
    """The data frames the streaming thread sent (their offsets)."""
    seen = []

    def spy(sock, header, fd, offset, count):
        seen.append(header["offset"])
        return real(sock, header, fd, offset, count)
    real = ha_conn.send_frame_from_file
    monkeypatch.setattr(ha_conn, "send_frame_from_file", spy)
    return seen


def test_a_caught_up_replica_gets_each_append_from_the_appending_thread(pair, pushes,
                                                                          streamed):
    p = pair(segment_bytes=8 << 20)
    p.master.create_topic("T")
    send(p.master, 20)
    p.start_replica()
    wait_until(p.caught_up, "the replica to catch up")
    before = len(streamed)
    for i in range(10):
        send(p.master, 50, start=100 * i)
        end = p.master.commitlog.written_offset
        assert p.ha.wait_replicated(end, 30_000) is PutMessageStatus.PUT_OK
    wait_until(p.caught_up, "the replica to have every append")
    assert segment_files(p.replica_url) == segment_files(p.master_url)
    # each append went out once, by a push unless the streamer held the socket then
    assert pushes.count(0) >= 1
    assert pushes.count(0) + (len(streamed) - before) == 10


def test_a_replica_that_stops_reading_never_holds_up_an_append(pair, pushes):
    """Pushes never wait: a full socket leaves the bytes (or a frame's rest) to the
    streaming thread, and the replica still gets every byte exactly once, in order."""
    p = pair(segment_bytes=1 << 20)
    p.master.create_topic("T")
    raw = RawReplica(p.ha.port, rcvbuf=4096)
    try:
        wait_until(lambda: p.ha.replicas(), "the raw replica to attach")
        send(p.master, 10)
        raw.read_until(p.master.commitlog.written_offset)
        p.ha._conns[0].sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        appender = threading.Thread(target=big_send, args=(p.master, 60))
        appender.start()
        appender.join(60)      # (a push that waited for the replica would hang here)
        assert not appender.is_alive(), "an append waited for a replica that does not read"
        raw.read_until(p.master.commitlog.written_offset)
        assert {k: bytes(v) for k, v in raw.files.items()} == \
            {f"commitlog/{k}": v for k, v in segment_files(p.master_url).items()}
        assert any(pushes)               # a push the socket took only part of
    finally:
        raw.close()


@pytest.fixture
def loop():
    """An event loop running on a thread of its own, as the broker's gRPC loop."""
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(10)
    lp.close()


def on(loop, coro, timeout=60):
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


def ack_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sparkmq-ha-ack")]


def watched(loop) -> int:
    return on(loop, _watched())


async def _watched() -> int:
    return len(asyncio.get_running_loop()._selector.get_map())


def test_acks_read_on_the_loop_answer_its_waits_and_leave_no_descriptor(pair, loop):
    p = pair(ack_loop=loop)
    p.master.create_topic("T")
    idle = watched(loop)
    p.start_replica()
    wait_until(lambda: p.ha.replicas(), "the replica to attach")
    wait_until(lambda: watched(loop) == idle + 1, "the loop to watch the replica's acks")
    assert ack_threads() == []
    send(p.master, 10)
    end = p.master.commitlog.written_offset
    assert on(loop, p.ha.replicated_async(end, 30_000)) is PutMessageStatus.PUT_OK
    assert p.ha.wait_replicated(end, 30_000) is PutMessageStatus.PUT_OK   # a thread's too
    never = asyncio.run_coroutine_threadsafe(p.ha.replicated_async(end + 10**9, 30_000), loop)
    p.stop_replica()          # the replica leaves while awaited
    assert never.result(60) is PutMessageStatus.SLAVE_NOT_AVAILABLE
    wait_until(lambda: watched(loop) == idle, "the loop to forget the closed socket")
    p.start_replica()         # a new connection (maybe the same descriptor number) works
    wait_until(lambda: p.ha.replicas(), "the replica to attach again")
    send(p.master, 10, start=10)
    end = p.master.commitlog.written_offset
    assert on(loop, p.ha.replicated_async(end, 30_000)) is PutMessageStatus.PUT_OK
    p.ha.stop()
    assert watched(loop) == idle


def test_a_malformed_ack_ends_only_its_connection_and_the_loop_runs_on(pair, loop):
    p = pair(ack_loop=loop)
    p.master.create_topic("T")
    idle = watched(loop)
    raw = RawReplica(p.ha.port)
    try:
        wait_until(lambda: p.ha.replicas(), "the raw replica to attach")
        wait_until(lambda: watched(loop) == idle + 1, "the loop to watch its acks")
        raw.sock.sendall(b"\xff" * 64)          # a frame larger than any header may be
        wait_until(lambda: not p.ha.replicas(), "its connection to end")
    finally:
        raw.close()
    wait_until(lambda: watched(loop) == idle, "the loop to forget its socket")
    p.start_replica()                            # the loop still serves a real replica
    wait_until(lambda: p.ha.replicas(), "the replica to attach")
    send(p.master, 10)
    end = p.master.commitlog.written_offset
    assert on(loop, p.ha.replicated_async(end, 30_000)) is PutMessageStatus.PUT_OK
