#!/usr/bin/env python
"""Broker benchmark: sparkmq vs Redis Streams vs NATS JetStream, 1 KiB messages.

Each system runs as its own process on 127.0.0.1 with comparable durability:
- sparkmq broker (``python -m sparkmq.broker``), flushDiskType=ASYNC_FLUSH
  (fsync every flushIntervalCommitLog=500 ms), driven by sparkmq.client;
- redis-server, appendonly yes + appendfsync everysec, driven by redis-py + hiredis
  (XADD / XREADGROUP BLOCK / XACK);
- nats-server -js, file storage (its default fsync interval), driven by nats-py
  (js.publish / publish_async / pull_subscribe fetch + ack).

Workloads (same for all):
1. producer throughput with batching: N messages in batches of B (sparkmq send_batch,
   Redis pipeline of XADDs, JetStream B publish_async then wait for the acks), one batch
   at a time; and again with ``IN_FLIGHT`` (4) batches in flight: sparkmq and Redis from
   4 threads (one Producer / one redis.Redis, a pipeline per batch), JetStream in bursts
   of 4 x B publish_async;
2. sync-send latency p50/p99: one message at a time, wait for the store's answer;
3. end-to-end latency p50/p99: send one message, a long-polling consumer thread (its
   own connection) receives and acks it; the next is sent after it arrived;
4. receive of 32 (sparkmq and the floor only): the server process's CPU (user +
   system, from /proc) per ReceiveMessage of 32 waiting messages, against a server
   stream of the same 34 messages (timestamp, 32 x 1.1 KB, status) from an empty
   handler: the part of a RocketMQ receive that is Python gRPC's own.

Every system gets the same untimed warm-up (one batch and 50 single sends on each
topic) before its timed runs. A fourth column, ``grpc floor``, is Python gRPC with no
work behind it (grpcio, a thread-pool server like the broker's, in its own process):
an EMPTY unary call (the floor of any Python gRPC broker's sync send on this machine)
and the end-to-end pattern with empty handlers (unary send wakes a long-polling
server stream of 3 messages, then an empty unary ack).
``--repeat N`` runs everything N times and prints the range of each ratio.

``--paired ROUNDS``: only the sync-send row, which one run's 300 sends move by +-30 %
here: sparkmq's sync send (its RocketMQ gRPC path), the empty unary call on the floor's
thread-pool server, and the same on a ``grpc.aio`` server (the broker's kind), in blocks
of 200 calls taking turns, ROUNDS rounds, the order rotated each round; and the durable
floor (``DURABLE_UNARY_SERVER``: the least durable work a Python RocketMQ gRPC broker
does for a SendMessage, on a grpc.aio server) and sparkmq's broker, each called with the
producer's request bytes, headers and timeout as a raw call (the producer's own work left
out: the send's row less the broker's raw call is the client's share). Each broker row
has a broker of its own, serving only its row's calls. It prints each
one's p50 and p99, the p50 over the floor's (the issue's target: 1.5), and each server
process's and the client's CPU a call. One more broker answers every raw call with its
first answer (``CANNED_BROKER``): sparkmq's server without the send's work, so the raw
call's row less it is the send's handler, and it less the durable floor's is the rest
of sparkmq's server. ``--ceiling`` adds a row for a send stored as one native append would
leave it (``CEILING_BROKER``: not a broker, as it keeps no ConsumeQueue): how much such an
append could gain. Forty rounds read a tree within +-0.01 a minute
apart on this host, six within +-0.06 (bench/README.md, "twenty-fourth session").

Redis and NATS come from Debian packages (apt-get install if missing); redis/hiredis/
nats-py from PyPI into the running interpreter's environment if missing. A peer that
cannot be installed is reported and skipped. Run: ``.venv/bin/python bench/bench_broker.py --quick``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from sparkmq.progress import track

BODY = os.urandom(1024)


# ---------------------------------------------------------------- setup
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout_s} s")


def ensure_apt(binary: str, package: str) -> str | None:
    """Path of ``binary``, installing the Debian package if missing; None if impossible."""
    found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin")
    if found:
        return found
    policy = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True)
    if "Candidate: (none)" in policy.stdout or "Candidate" not in policy.stdout:
        subprocess.run(["apt-get", "update"], capture_output=True)
    r = subprocess.run(["apt-get", "install", "-y", package], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"# {package}: not installable ({r.stderr.strip()[-200:]}); skipped")
        return None
    return shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin")


def ensure_pip(module: str, *packages: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        pass
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *packages],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"# pip install {' '.join(packages)} failed; skipped: {r.stderr.strip()[-200:]}")
        return False
    return True


@contextlib.contextmanager
def process(cmd: list[str], port: int, **kw):
    """Run ``cmd`` until the block ends, once ``port`` listens. Its stderr goes to a
    temporary file (a pipe nobody reads fills up and blocks the process's logging)."""
    err = tempfile.TemporaryFile()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, **kw)
    try:
        try:
            wait_port(port)
        except RuntimeError:
            p.kill()
            p.wait(5)
            err.seek(0)
            raise RuntimeError(f"{cmd[0]} did not start: {err.read().decode()[-500:]}")
        yield p
    finally:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
        err.close()


def broker_conf(tmp: str, **extra) -> tuple[str, int, int]:
    """A broker.properties in ``tmp`` (ASYNC_FLUSH, store ``tmp/mq``, free ports, topics
    auto-created) plus ``extra`` properties: (its path, gRPC port, admin port)."""
    port, admin = free_port(), free_port()
    props = {"brokerName": "bench", "flushDiskType": "ASYNC_FLUSH",
             "storePathRootDir": f"{tmp}/mq", "listenPort": port, "adminPort": admin,
             "autoCreateTopicEnable": "true",
             "flightEnable": "false",       # the clients' sends take RocketMQ gRPC
             **extra}
    conf = os.path.join(tmp, "broker.properties")
    with open(conf, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in props.items()))
    return conf, port, admin


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] * 1000.0


# ---------------------------------------------------------------- sparkmq
def bench_sparkmq(tmp: str, n: int, batch: int, m: int) -> dict:
    from sparkmq.client import Message, Producer, SimpleConsumer
    # the RocketMQ gRPC path (broker_conf turns Flight off; Flight: bench_flight)
    conf, port, _ = broker_conf(tmp, flushIntervalCommitLog=500, defaultTopicQueueNums=4)
    with process([sys.executable, "-m", "sparkmq.broker", "-c", conf], port) as broker:
        ep = f"127.0.0.1:{port}"
        p = Producer(ep, request_timeout_s=30)
        c = SimpleConsumer(ep, "bench", {"e2e": "*"})
        rc = SimpleConsumer(ep, "bench-rcv", {"rcv": "*"})
        try:
            for t in ("tput", "lat"):           # create topics, warm up channels
                warm_up(lambda: p.send_batch([Message(t, BODY) for _ in range(batch)]),
                        lambda: p.send(Message(t, BODY)))
            p.send(Message("e2e", b"warm"))
            for x in c.receive(8, wait_s=2):
                c.ack(x)
            t0 = time.perf_counter()
            for _ in track(range(n // batch), "throughput sends", unit="batches"):
                p.send_batch([Message("tput", BODY) for _ in range(batch)])
            tput = (n // batch) * batch / (time.perf_counter() - t0)
            tput_k = in_flight(lambda: p.send_batch([Message("tput", BODY) for _ in range(batch)]),
                               n // batch) * batch
            lat = []
            for _ in track(range(m), "latency sends"):
                t = time.perf_counter()
                p.send(Message("lat", BODY))
                lat.append(time.perf_counter() - t)

            def recv(stop, got):
                while not stop.is_set():
                    for x in c.receive(16, invisible_duration_s=30, wait_s=2):
                        got.put(time.perf_counter())
                        c.ack(x)
            e2e = ping_pong(recv, lambda: p.send(Message("e2e", BODY)), m)
            calls = max(50, m // 2)
            for _ in range(calls + 30):                 # a backlog (left unacked)
                p.send_batch([Message("rcv", BODY) for _ in range(RECEIVE_BATCH)])
            for _ in range(10):
                rc.receive(RECEIVE_BATCH, wait_s=2)     # warm-up
            got, t0 = 0, cpu_s(broker.pid)
            for _ in range(calls):
                got += len(rc.receive(RECEIVE_BATCH, wait_s=2))
            rcv_cpu = (cpu_s(broker.pid) - t0) / calls * 1000.0
            assert got == calls * RECEIVE_BATCH, got
        finally:
            c.close()
            rc.close()
            p.shutdown()
    return {"tput": tput, "tput_k": tput_k, "lat": lat, "e2e": e2e, "rcv_cpu": rcv_cpu}


RECEIVE_BATCH = 32


WARM_UP_SENDS = 50
IN_FLIGHT = 4          # batches in flight in the pipelined throughput row


def in_flight(send_batch, batches: int, k: int = IN_FLIGHT) -> float:
    """Batches per second with ``k`` threads each sending batches one after the other
    (so ``k`` batches in flight), ``batches`` in all; the pipelined throughput row."""
    per = [batches // k + (i < batches % k) for i in range(k)]
    errors: list[BaseException] = []

    def run(count: int) -> None:
        try:
            for _ in range(count):
                send_batch()
        except BaseException as e:   # reported after the join
            errors.append(e)
    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in per]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return batches / (time.perf_counter() - t0)


def warm_up(send_batch, send_one) -> None:
    """The same untimed warm-up for every system: one batch, then single sends."""
    send_batch()
    for _ in range(WARM_UP_SENDS):
        send_one()


def ping_pong(consumer_loop, send, m: int) -> list[float]:
    """Send one message at a time; the latency is send start -> consumer got it."""
    import queue
    got: "queue.Queue[float]" = queue.Queue()
    stop = threading.Event()
    t = threading.Thread(target=consumer_loop, args=(stop, got), daemon=True)
    t.start()
    time.sleep(0.3)                          # let the consumer enter its long poll
    out = []
    try:
        for _ in track(range(m), "latency sends"):
            t0 = time.perf_counter()
            send()
            out.append(got.get(timeout=10) - t0)
    finally:
        stop.set()
        t.join(10)
    return out


# ---------------------------------------------------------------- redis
def redis_command(binary: str, port: int, folder: str) -> list[str]:
    """redis-server on 127.0.0.1:``port`` as every benchmark runs it: an append-only file
    in ``folder`` fsynced every second (its durability nearest ASYNC_FLUSH), no snapshots."""
    return [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", folder, "--save", "",
            "--appendonly", "yes", "--appendfsync", "everysec", "--protected-mode", "no"]


def xadd_pipelined(r, stream: str, n: int) -> None:
    """``n`` XADDs of one ``BODY`` each to ``stream`` as one pipeline, the replies read
    (Redis's batched send)."""
    pipe = r.pipeline(transaction=False)
    for _ in range(n):
        pipe.xadd(stream, {"b": BODY})
    pipe.execute()


def bench_redis(tmp: str, n: int, batch: int, m: int) -> dict | None:
    binary = ensure_apt("redis-server", "redis-server")
    if not binary or not ensure_pip("redis", "redis", "hiredis"):
        return None
    import redis
    port = free_port()
    with process(redis_command(binary, port, tmp), port):
        r = redis.Redis(port=port)
        r.ping()

        def pipelined(stream: str) -> None:
            xadd_pipelined(r, stream, batch)
        for t in ("tput", "lat"):
            warm_up(lambda: pipelined(t), lambda: r.xadd(t, {"b": BODY}))
        t0 = time.perf_counter()
        for _ in track(range(n // batch), "throughput sends", unit="batches"):
            pipelined("tput")
        tput = (n // batch) * batch / (time.perf_counter() - t0)
        tput_k = in_flight(lambda: pipelined("tput"), n // batch) * batch   # own pipeline each
        lat = []
        for _ in track(range(m), "latency sends"):
            t = time.perf_counter()
            r.xadd("lat", {"b": BODY})
            lat.append(time.perf_counter() - t)
        r.xgroup_create("e2e", "g", id="$", mkstream=True)
        rc = redis.Redis(port=port)

        def recv(stop, got):
            while not stop.is_set():
                for _, entries in rc.xreadgroup("g", "c1", {"e2e": ">"}, count=16, block=2000) or []:
                    for eid, _ in entries:
                        got.put(time.perf_counter())
                        rc.xack("e2e", "g", eid)
        e2e = ping_pong(recv, lambda: r.xadd("e2e", {"b": BODY}), m)
        r.close()
        rc.close()
    return {"tput": tput, "tput_k": tput_k, "lat": lat, "e2e": e2e}


# ---------------------------------------------------------------- nats
def bench_nats(tmp: str, n: int, batch: int, m: int) -> dict | None:
    binary = ensure_apt("nats-server", "nats-server")
    if not binary or not ensure_pip("nats", "nats-py"):
        return None
    port = free_port()
    cmd = [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", os.path.join(tmp, "js")]
    with process(cmd, port):
        return asyncio.run(_nats(port, n, batch, m))


async def _nats(port: int, n: int, batch: int, m: int) -> dict:
    import nats
    from nats.js.api import StorageType
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    nc2 = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js, js2 = nc.jetstream(), nc2.jetstream()
        for s in ("tput", "lat", "e2e"):
            await js.add_stream(name=s.upper(), subjects=[s], storage=StorageType.FILE)
        for s in ("tput", "lat"):        # the same warm-up as the others (see warm_up)
            await asyncio.gather(*[await js.publish_async(s, BODY) for _ in range(batch)])
            for _ in range(WARM_UP_SENDS):
                await js.publish(s, BODY)
        t0 = time.perf_counter()
        for _ in track(range(n // batch), "throughput sends", unit="batches"):
            futs = [await js.publish_async("tput", BODY) for _ in range(batch)]
            await asyncio.gather(*futs)
        tput = (n // batch) * batch / (time.perf_counter() - t0)
        t0 = time.perf_counter()          # k batches in flight: bursts of k * batch
        burst = IN_FLIGHT * batch
        for _ in range(n // burst):
            futs = [await js.publish_async("tput", BODY) for _ in range(burst)]
            await asyncio.gather(*futs)
        tput_k = (n // burst) * burst / (time.perf_counter() - t0)
        lat = []
        for _ in track(range(m), "latency sends"):
            t = time.perf_counter()
            await js.publish("lat", BODY)
            lat.append(time.perf_counter() - t)
        psub = await js2.pull_subscribe("e2e", durable="d")
        got: asyncio.Queue = asyncio.Queue()
        stop = asyncio.Event()

        async def recv():
            while not stop.is_set():
                try:
                    msgs = await psub.fetch(16, timeout=2)
                except nats.errors.TimeoutError:
                    continue
                for x in msgs:
                    got.put_nowait(time.perf_counter())
                    await x.ack()
        task = asyncio.create_task(recv())
        await asyncio.sleep(0.3)
        e2e = []
        for _ in track(range(m), "latency sends"):
            t0 = time.perf_counter()
            await js.publish("e2e", BODY)
            e2e.append(await asyncio.wait_for(got.get(), 10) - t0)
        stop.set()
        await asyncio.wait_for(task, 10)
    finally:
        await nc.close()
        await nc2.close()
    return {"tput": tput, "tput_k": tput_k, "lat": lat, "e2e": e2e}


# ---------------------------------------------------------------- grpc floor
FLOOR_SERVER = """
import sys, threading
from concurrent import futures
import grpc
arrived = threading.Condition()
pending = [0]                           # "messages" sent and not yet received
def send(request, context):
    with arrived:
        pending[0] += 1
        arrived.notify_all()
    return b""
def poll(request, context):             # a long poll answered like ReceiveMessage
    with arrived:
        if not arrived.wait_for(lambda: pending[0] > 0, timeout=2):
            return
        pending[0] = 0
    yield b"t" * 12                      # delivery timestamp
    yield b"m" * 1100                    # the message
    yield b"s" * 4                       # status
def receive32(request, context):        # a receive of 32 waiting messages
    yield b"t" * 12
    for _ in range(32):
        yield b"m" * 1100
    yield b"s" * 4
server = grpc.server(futures.ThreadPoolExecutor(max_workers=128))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Floor", {
    "Empty": grpc.unary_unary_rpc_method_handler(lambda request, context: b""),
    "Send": grpc.unary_unary_rpc_method_handler(send),
    "Poll": grpc.unary_stream_rpc_method_handler(poll),
    "Receive32": grpc.unary_stream_rpc_method_handler(receive32)}),))
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
server.start()
server.wait_for_termination()
"""


AIO_FLOOR_SERVER = """
import asyncio, sys
import grpc
async def main():
    server = grpc.aio.server()
    async def empty(request, context):
        return b""
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Floor", {
        "Empty": grpc.unary_unary_rpc_method_handler(empty)}),))
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""
# The least durable work a Python RocketMQ gRPC broker does for a SendMessage
# (``durable_send``, of the request's bytes; ``fd``: the file it appends to): the request
# parsed (upb: its message ids), its bytes appended with their length and CRC32C in one
# write (the file's blocks allocated 8 MiB ahead, as sparkmq's active segment's are), and
# the answer of an entry a message (status, message id, queue offset), serialized; no
# checks, no columns, no index. ``DURABLE_UNARY_SERVER`` serves it on the broker's kind
# of server (grpc.aio); bench_instructions counts it (``floorgrpc-1``).
DURABLE_SEND = textwrap.dedent("""
    import os, struct
    import crc32c
    from rocketmq.grpc_protocol import definition_pb2 as pb, service_pb2 as spb
    from sparkmq.log.fs import preallocate
    OK = pb.Status(code=pb.OK, message="OK")
    HEAD = struct.Struct("<II")
    stored = written = allocated = 0
    def durable_send(data):
        global stored, written, allocated
        ids = [m.system_properties.message_id
               for m in spb.SendMessageRequest.FromString(data).messages]
        if written + len(data) + 8 > allocated:
            if preallocate(fd, allocated, 8 << 20):
                allocated += 8 << 20
        os.write(fd, HEAD.pack(len(data), crc32c.crc32c(data)) + data)
        written += len(data) + 8
        first, stored = stored, stored + len(ids)
        return spb.SendMessageResponse(status=OK, entries=[
            spb.SendResultEntry(status=OK, message_id=i, offset=first + k)
            for k, i in enumerate(ids)]).SerializeToString()
""")
DURABLE_UNARY_SERVER = """
import asyncio, os, sys
import grpc
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
""" + DURABLE_SEND + """
async def main():
    server = grpc.aio.server()
    async def send(data, context):
        return durable_send(data)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "apache.rocketmq.v2.MessagingService",
        {"SendMessage": grpc.unary_unary_rpc_method_handler(send)}),))
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""
def _patched_broker(patch: str) -> str:
    """Code for ``python -c``: ``patch`` run, then sparkmq's broker daemon (argv: its own)."""
    return patch + 'import runpy, sys\nsys.argv[0] = "sparkmq.broker"\n' \
        'runpy.run_module("sparkmq.broker", run_name="__main__")\n'


# sparkmq's broker daemon whose SendMessage handler (``send_encoded``) answers every call
# with the bytes of its first answer, stored once: the broker's gRPC server, its
# servicer and its event loop as they are, without the send's own work (``--paired``:
# the row less the durable floor's is what sparkmq's server costs beside the floor's;
# the broker's raw call less this row, the send's handler).
CANNED_BROKER = _patched_broker("""
from sparkmq.broker import grpc_service
send = grpc_service.MessagingServicer.send_encoded
first = []
def canned(self, request, context):
    if not first:
        first.append(send(self, request, context))
    return first[0]
grpc_service.MessagingServicer.send_encoded = canned
""")
# ``--ceiling``: sparkmq's broker daemon whose sends are stored by ``ceiling_store()``
# (bench_instructions counts its parts: ``grpcceilN-1``).
CEILING_BROKER = _patched_broker(f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from bench_broker import ceiling_store
from sparkmq.broker import batchsend
batchsend.BatchSender.store = ceiling_store()
""")


def ceiling_store(parts: int = 0):
    """``BatchSender.store`` as one native append would leave a send's store (not a
    broker's: it keeps no ConsumeQueue): its checks as they are, then the store time
    stamped, the IPC message written (C) and appended to the commit log, its queue offsets
    counted in a dict. No dispatch (ConsumeQueue, index), no visibility or arrival
    wake-ups, no lease, role or flush checks, no metrics: the work a native append would
    do in C or skip. With the first ``parts`` of that work added back, in this order:
    1 the rows' ``RowInfo`` (``check_segment_batch``); 2 the ConsumeQueue entries
    (``Dispatcher.dispatch``); 3 visibility and the arrival listeners (``after_visible``);
    4 the lease (before and after), disk-space, closed and replica checks; 5 the replica
    status (``replicated``) and the send metrics."""
    import numpy as np
    from sparkmq.broker import batchsend
    from sparkmq.log import segment
    from sparkmq.log.status import BatchAppendResult, PutMessageStatus
    counted: dict = {}

    def store(self, rows, topics):
        st, n = self.broker.store, len(rows)
        ap = st.appender
        if parts >= 4:
            ap.require_space()
            ap.hold_lease()
        info = ap.batches.check_segment_batch(rows, limits_checked=True, built=rows)[1] \
            if parts >= 1 else None
        with st.append_lock:
            ts = rows.stamp(ap._store_ts())
            if parts >= 4:
                if st.closed:
                    raise RuntimeError("store closed")
                st.require_not_replica()
            offset = st.commitlog.append(rows, segment.message_bytes(rows, rows.c_array()))
            if parts >= 2:
                qos, updates = st.dispatcher.dispatch(rows, offset, info, ts)
                st.dispatcher.dispatched_offset = st.commitlog.written_offset
            else:
                key = (rows.topic, rows.queue)
                end = counted[key] = counted.get(key, 0) + n
                qos, updates = np.arange(end - n, end, dtype=np.int64), []
        if parts >= 4:
            ap.hold_lease(written=True)
        if parts >= 3:
            st.dispatcher.after_visible(updates)
        r = BatchAppendResult(PutMessageStatus.PUT_OK, offset, qos,
                              None if info is None else info.queue_ids, n)
        stored = batchsend.Stored(r, PutMessageStatus.PUT_OK, 0, n)
        if parts >= 5:
            stored.status = self.broker.sender.replicated(r)
            self.broker.metrics.count_sent(topics[0], n, rows.nbytes)
        return stored
    return store


PAIRED_BLOCK = 200


def paired_sync(tmp: str, rounds: int, ceiling: bool = False) -> None:
    """``--paired``: see the module docstring."""
    import grpc
    from sparkmq.client import Message, Producer
    calls, pids = {}, {}
    with contextlib.ExitStack() as stack:
        for name, code in (("empty unary, thread pool", FLOOR_SERVER),
                           ("empty unary, grpc.aio", AIO_FLOOR_SERVER)):
            port = free_port()
            server = stack.enter_context(process([sys.executable, "-c", code, str(port)], port))
            ch = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{port}"))
            call = ch.unary_unary("/floor.Floor/Empty", request_serializer=bytes,
                                  response_deserializer=bytes)
            calls[name], pids[name] = (lambda c: lambda: c(b""))(call), server.pid
        conf, port, _ = broker_conf(tmp, flushIntervalCommitLog=500, defaultTopicQueueNums=4)
        broker = stack.enter_context(
            process([sys.executable, "-m", "sparkmq.broker", "-c", conf], port))
        p = Producer(f"127.0.0.1:{port}", request_timeout_s=30)
        stack.callback(p.shutdown)
        calls["sparkmq sync send"] = lambda: p.send(Message("lat", BODY))
        pids["sparkmq sync send"] = broker.pid
        # the request sparkmq's Producer sends, as a raw call (the same bytes, headers and
        # timeout, the answer parsed; bench_instructions' ``stub-1``): to the broker (the
        # row less the producer's own work) and to the durable floor. (One request, so one
        # message id sent again each call: stored each time, as a resend is.)
        from rocketmq.grpc_protocol import service_pb2 as spb
        data = p._request([Message("lat", BODY)]).data

        def raw(server_port: int):
            ch = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{server_port}"))
            send = ch.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
                                  request_serializer=None,
                                  response_deserializer=spb.SendMessageResponse.FromString)
            return lambda: send(data, timeout=30, metadata=p.conns.metadata)
        # each row below to a broker of its own (its own store, only its own calls), as the
        # producer's: a broker that served two rows (the producer's and the raw call)
        # read 0.04-0.14 of the floor above the same tree serving one row, in four runs
        # (2026-11-29; bench/README.md). The broker as it is (code ""), then patched by
        # ``code`` (CANNED_BROKER, CEILING_BROKER)
        for name, code in (("sparkmq broker, raw call", ""),
                           ("sparkmq, answer canned", CANNED_BROKER),
                           ("sparkmq, append ceiling", CEILING_BROKER if ceiling else None)):
            if code is not None:
                sub = os.path.join(tmp, name.split(", ")[1].replace(" ", "-"))
                os.makedirs(sub)
                conf, port, _ = broker_conf(sub, flushIntervalCommitLog=500,
                                            defaultTopicQueueNums=4)
                own = stack.enter_context(process(
                    [sys.executable, *(("-c", code) if code else ("-m", "sparkmq.broker")),
                     "-c", conf], port))
                calls[name], pids[name] = raw(port), own.pid
        port = free_port()
        server = stack.enter_context(process(
            [sys.executable, "-c", DURABLE_UNARY_SERVER, str(port),
             os.path.join(tmp, "durable.log")], port))
        calls["durable floor, grpc.aio"] = raw(port)
        pids["durable floor, grpc.aio"] = server.pid
        for fn in calls.values():
            warm_up(fn, fn)
        names = list(calls)
        lat: dict[str, list] = {k: [] for k in names}
        cpu = dict.fromkeys(names, 0.0)
        mine = dict.fromkeys(names, 0.0)     # this (the client's) process's CPU
        for r in track(range(rounds), "paired rounds"):
            for k in names[r % len(names):] + names[:r % len(names)]:
                fn, t0, c0 = calls[k], cpu_s(pids[k]), time.process_time()
                for _ in range(PAIRED_BLOCK):
                    t = time.perf_counter()
                    fn()
                    lat[k].append(time.perf_counter() - t)
                cpu[k] += cpu_s(pids[k]) - t0
                mine[k] += time.process_time() - c0
    floor = pct(lat[names[0]], 0.5)
    print(f"# sync send, paired: {rounds} rounds of {PAIRED_BLOCK} calls each; 1 KiB")
    print(f"{'':<28}{'p50 (ms)':>10}{'p99 (ms)':>10}{'p50 / floor':>13}"
          f"{'server CPU (us)':>17}{'client CPU (us)':>17}")
    for k in names:
        print(f"{k:<28}{pct(lat[k], 0.5):>10.3f}{pct(lat[k], 0.99):>10.3f}"
              f"{pct(lat[k], 0.5) / floor:>13.2f}{cpu[k] / len(lat[k]) * 1e6:>17.0f}"
              f"{mine[k] / len(lat[k]) * 1e6:>17.0f}")


def bench_grpc_floor(tmp: str, n: int, batch: int, m: int) -> dict:
    """Python gRPC with no work behind it, in a server process like the broker's: the
    least any Python gRPC broker can take. ``lat``: empty unary calls; ``e2e``: a
    unary "send" wakes a long-polling server-streaming "receive" (3 stream messages,
    like ReceiveMessage) whose client then makes an empty unary "ack"."""
    import grpc
    port = free_port()
    ident = bytes
    with process([sys.executable, "-c", FLOOR_SERVER, str(port)], port) as server, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as ch, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as ch2:
        call = ch.unary_unary("/floor.Floor/Empty", request_serializer=ident,
                              response_deserializer=ident)
        send = ch.unary_unary("/floor.Floor/Send", request_serializer=ident,
                              response_deserializer=ident)
        poll = ch2.unary_stream("/floor.Floor/Poll", request_serializer=ident,
                                response_deserializer=ident)
        ack = ch2.unary_unary("/floor.Floor/Empty", request_serializer=ident,
                              response_deserializer=ident)
        warm_up(lambda: call(b""), lambda: call(b""))
        lat = []
        for _ in track(range(m), "latency sends"):
            t = time.perf_counter()
            call(b"")
            lat.append(time.perf_counter() - t)

        def recv(stop, got):
            while not stop.is_set():
                if list(poll(b"", timeout=5)):
                    got.put(time.perf_counter())
                    ack(b"")
        e2e = ping_pong(recv, lambda: send(b""), m)
        receive32 = ch2.unary_stream("/floor.Floor/Receive32", request_serializer=ident,
                                     response_deserializer=ident)
        calls = max(50, m // 2)
        for _ in range(10):
            list(receive32(b""))
        t0 = cpu_s(server.pid)
        for _ in range(calls):
            assert len(list(receive32(b""))) == RECEIVE_BATCH + 2
        rcv_cpu = (cpu_s(server.pid) - t0) / calls * 1000.0
    return {"lat": lat, "e2e": e2e, "tput": send_floor(n, batch), "rcv_cpu": rcv_cpu}


SEND_FLOOR_SERVER = """
import json, sys
from concurrent import futures
import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb, service_pb2 as spb
# argv: port, entries, workers, extra server options as JSON ([[name, value], ...])
port, entries, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = [tuple(x) for x in json.loads(sys.argv[4])]
answer = spb.SendMessageResponse(status=pb.Status(code=pb.OK, message="OK"))
for i in range(entries):        # what the broker answers for a stored batch
    answer.entries.add(status=pb.Status(code=pb.OK, message="OK"),
                       message_id="%032X" % (0xC0FFEE0000 + i), offset=1_000_000 + i)
def send(request, context):     # parsed by the deserializer below; only checked here
    if len(request.messages) != entries:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "wrong batch size")
    return answer
limit = 64 << 20
server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=[
    ("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
    ("grpc.so_reuseport", 0), *extra])
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
    "apache.rocketmq.v2.MessagingService", {"SendMessage": grpc.unary_unary_rpc_method_handler(
        send, request_deserializer=spb.SendMessageRequest.FromString,
        response_serializer=spb.SendMessageResponse.SerializeToString)}),))
server.add_insecure_port("127.0.0.1:" + port)
server.start()
server.wait_for_termination()
"""


def send_floor(n: int, batch: int, workers: int = 128, server_options=(),
               channel_options=()) -> float:
    """msg/s of sequential SendMessage calls carrying the SAME request the sparkmq
    Producer builds for a batch of ``batch`` 1 KiB messages, to a Python gRPC server
    (thread pool and options like the broker's) that parses the request and answers a
    canned ``batch``-entry response, which the client parses: the throughput floor of
    any Python gRPC broker speaking the RocketMQ 5.x protocol. The request is built (and
    serialized) once; the answer is parsed every time."""
    import json

    import grpc
    from rocketmq.grpc_protocol import service_pb2 as spb

    from sparkmq.client import Message, Producer
    maker = Producer("127.0.0.1:1")             # no connection: only builds requests
    try:
        request = maker._request([Message("tput", BODY) for _ in range(batch)])
    finally:
        maker.shutdown()
    data = request.data if hasattr(request, "data") else request.SerializeToString()
    port = free_port()
    cmd = [sys.executable, "-c", SEND_FLOOR_SERVER, str(port), str(batch), str(workers),
           json.dumps([list(o) for o in server_options])]
    with process(cmd, port), grpc.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20), *channel_options]) as ch:
        send = ch.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
                              request_serializer=None,        # the request's bytes as built
                              response_deserializer=spb.SendMessageResponse.FromString)
        meta = (("x-mq-client-id", "floor"), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "v2"))
        for _ in range(1 + WARM_UP_SENDS // 10):
            send(data, timeout=30, metadata=meta)
        t0 = time.perf_counter()
        for _ in track(range(n // batch), "throughput sends", unit="batches"):
            r = send(data, timeout=30, metadata=meta)
            if len(r.entries) != batch:
                raise RuntimeError(f"floor server answered {len(r.entries)} entries")
        return (n // batch) * batch / (time.perf_counter() - t0)


FLOOR_VARIANTS = [   # (label, server thread pool size, server options, channel options)
    ("as the broker (128 workers)", 128, (), ()),
    ("compression off (explicit)", 128, [("grpc.default_compression_algorithm", 0)],
     [("grpc.default_compression_algorithm", 0)]),
    ("default 4 MiB message limits", 128, [("grpc.max_receive_message_length", 4 << 20)],
     [("grpc.max_receive_message_length", 4 << 20)]),
    ("grpc.so_reuseport=1", 128, [("grpc.so_reuseport", 1)], ()),
    ("4 workers", 4, (), ()),
    ("optimization_target=throughput", 128, [("grpc.optimization_target", "throughput")],
     [("grpc.optimization_target", "throughput")]),
    ("optimization_target=latency", 128, [("grpc.optimization_target", "latency")],
     [("grpc.optimization_target", "latency")]),
]


def floor_variants(tmp: str, n: int, batch: int, repeat: int) -> None:
    """``--floor``: the send floor under each gRPC setting in FLOOR_VARIANTS, and Redis's
    batched throughput in the same run (alternated ``repeat`` times), as ratios to Redis."""
    from google.protobuf.internal import api_implementation
    import grpc
    print(f"# protobuf backend: {api_implementation.Type()}; grpcio {grpc.__version__}")
    rows: dict[str, list[float]] = {}
    for run in range(repeat):
        with tempfile.TemporaryDirectory(prefix="bench-redis-", dir=tmp) as rt:
            red = bench_redis(rt, n, batch, 20)
        redis_tput = red["tput"] if red else None
        rows.setdefault("redis (msg/s)", []).append(redis_tput or 0.0)
        k = run % len(FLOOR_VARIANTS)            # rotate: no setting always runs first
        for label, workers, sopts, copts in FLOOR_VARIANTS[k:] + FLOOR_VARIANTS[:k]:
            v = send_floor(n, batch, workers, sopts, copts)
            rows.setdefault(label, []).append(v)
            print(f"# run {run + 1}: {label:<34} {v:>9.0f} msg/s"
                  + (f"  {v / redis_tput:.2f} of redis" if redis_tput else ""), flush=True)
    print(f"{'grpc send floor':<36}{'msg/s (min..max)':>22}{'of redis':>16}")
    reds = rows.pop("redis (msg/s)")
    print(f"{'redis pipeline':<36}{min(reds):>10.0f}..{max(reds):<10.0f}")
    for label, vals in rows.items():
        rat = [v / r for v, r in zip(vals, reds) if r]
        print(f"{label:<36}{min(vals):>10.0f}..{max(vals):<10.0f}"
              + (f"{min(rat):>7.2f}..{max(rat):.2f}" if rat else ""))


# ---------------------------------------------------------------- report
ROWS = [("batched throughput (msg/s)", "tput", None),
        (f"{IN_FLIGHT} batches in flight (msg/s)", "tput_k", None),
        ("sync send p50 (ms)", "lat", 0.50), ("sync send p99 (ms)", "lat", 0.99),
        ("end-to-end p50 (ms)", "e2e", 0.50), ("end-to-end p99 (ms)", "e2e", 0.99),
        (f"receive of {RECEIVE_BATCH}: CPU (ms)", "rcv_cpu", None)]


def value(res: dict | None, key: str, q: float | None) -> float | None:
    if res is None or key not in res:
        return None
    return res[key] if q is None else pct(res[key], q)


def ratios(results: dict[str, dict | None]) -> dict[tuple[str, str], float]:
    """(metric label, peer) -> sparkmq / peer."""
    out = {}
    for label, key, q in ROWS:
        ours = value(results["sparkmq"], key, q)
        for peer, res in results.items():
            theirs = value(res, key, q)
            if peer != "sparkmq" and ours is not None and theirs:
                out[(label, peer)] = ours / theirs
    return out


def report(results: dict[str, dict | None]) -> None:
    peers = [k for k, v in results.items() if k != "sparkmq" and v is not None]
    head = f"{'metric':<28}{'sparkmq':>12}" + "".join(f"{p:>12}{'ratio':>8}" for p in peers)
    print(head)
    print("-" * len(head))
    r = ratios(results)
    for label, key, q in ROWS:
        line = f"{label:<28}{value(results['sparkmq'], key, q):>12.2f}"
        for p in peers:
            v = value(results[p], key, q)
            line += (f"{v:>12.2f}{r[(label, p)]:>8.2f}" if (label, p) in r
                     else f"{'-':>12}{'-':>8}")
        print(line)
    print("ratio = sparkmq / peer (throughput: higher is better; latency: lower is better)")
    for k, v in results.items():
        if v is None:
            print(f"# {k}: not run (see above)")


def report_ranges(runs: list[dict[str, dict | None]]) -> None:
    """Min-max of each ratio over the runs (the machine is shared: single runs vary)."""
    per_run = [ratios(res) for res in runs]
    keys = sorted({k for r in per_run for k in r}, key=lambda k: ([x[0] for x in ROWS].index(k[0]), k[1]))
    print(f"ratio ranges over {len(runs)} runs (sparkmq / peer):")
    for k in keys:
        vals = [r[k] for r in per_run if k in r]
        print(f"  {k[0]:<28} vs {k[1]:<11} {min(vals):6.2f} .. {max(vals):6.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (about a minute)")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=1, help="run everything N times")
    ap.add_argument("--floor", action="store_true",
                    help="only the gRPC send floor under several gRPC settings, against Redis")
    ap.add_argument("--paired", type=int, metavar="ROUNDS",
                    help="only the sync-send row, paired with the empty unary call")
    ap.add_argument("--ceiling", action="store_true",
                    help="with --paired: a row for a send stored as a native append would "
                         "leave it (CEILING_BROKER)")
    args = ap.parse_args(argv)
    n, m = (20_000, 300) if args.quick else (100_000, 2_000)
    if args.paired:
        with tempfile.TemporaryDirectory(prefix="bench-paired-") as tmp:
            paired_sync(tmp, args.paired, args.ceiling)
        return 0
    if args.floor:
        with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
            floor_variants(tmp, n, args.batch, args.repeat)
        return 0
    print(f"# 1 KiB messages; throughput: {n} msgs in batches of {args.batch}; "
          f"latencies over {m} sends; {os.cpu_count()} cores")
    fns = {"sparkmq": bench_sparkmq, "redis": bench_redis, "nats": bench_nats,
           "grpc floor": bench_grpc_floor}
    runs = []
    for run in track(range(args.repeat), "runs"):
        results: dict[str, dict | None] = {}
        for name, fn in fns.items():
            with tempfile.TemporaryDirectory(prefix=f"bench-{name.replace(' ', '-')}-") as tmp:
                t = time.perf_counter()
                try:
                    results[name] = fn(tmp, n, args.batch, m)
                except Exception as e:     # a peer system missing or failing: its rows say so
                    if name == "sparkmq":
                        raise
                    print(f"# {name} failed: {e!r}; skipped")
                    results[name] = None
                print(f"# run {run + 1}: {name} done in {time.perf_counter() - t:.1f} s",
                      flush=True)
        report(results)
        runs.append(results)
    if len(runs) > 1:
        report_ranges(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
