"""A request's server work back to back and spaced apart: what this machine's caches cost.

    .venv/bin/python bench/bench_cold.py [--quick] [--gaps-ms 0.5 20] [--topics N]

The latency rows of bench_broker and bench_flight time one request at a time, a few ms
apart. On a shared virtual machine the CPU caches lose what a process touched within a few
ms even while it runs (other tenants share them), so a request's cost then depends on how
many cache lines its code and data touch, not only on its instructions. This measures that
in process, each call timed alone (``perf_counter``), p50 of back-to-back calls against p50
of calls ``--gaps-ms`` apart (each gap spent spinning, so the CPU never idles; 0.5 ms is
about a sync send's turn on the client, 20 ms the send -> long-poll rows' wait):

- the machine: a sum over 64 KiB of numpy memory (no allocation, ~1,000 cache lines);
- the durable floor's put (bench_flight's third server: a one-row batch as its IPC message,
  its CRC32C, a ``write``, an ack of offsets);
- sparkmq's Flight put of one row (``FlightService._send``, ASYNC_FLUSH: checks, segment
  batch, append, dispatch, ack);
- sparkmq's RocketMQ SendMessage of one message (``send_encoded``: parse to answer);
- sparkmq's Flight read of one message at a queue's tail (``FlightService._read``: what a
  woken long poll's DoGet does before its reply is written);
- sparkmq's RocketMQ pop (``PopService.pop``: what a ReceiveMessage does before its replies
  are made) of the one message a send just stored, and of 32 that 32 sends stored (the
  sends made first and not timed).

It prints each row's spaced/back-to-back factors and sparkmq's cost over the floor's at
each spacing: a ratio that holds back to back but not spaced says the footprint, not the
instruction count, is what a latency target meets here.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# this tree's sparkmq first, not an installed one: a worktree's bench measures its own
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench_broker import free_port  # noqa: E402


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def p50_us(fn, calls: int, gap_s: float) -> float:
    """p50 of ``fn``'s calls, each timed alone (or, where ``fn`` returns a Python float,
    the seconds it timed itself: a pop times itself, not the puts it makes first; not a
    numpy float, which the machine's row returns as its sum)."""
    times = []
    for _ in range(calls):
        if gap_s:
            spin(gap_s)
        t = time.perf_counter()
        timed = fn()
        times.append(timed if type(timed) is float else time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2] * 1e6


def durable_floor(tmp: str):
    """bench_flight's durable floor's put (its ``DURABLE`` code), in process."""
    import pyarrow as pa
    from bench_flight import DURABLE
    fd = os.open(os.path.join(tmp, "floor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    floor = {"fd": fd}
    exec(DURABLE, floor)
    batch = pa.RecordBatch.from_pydict({"topic": ["lat"], "body": [b"x" * 1024]})
    return (lambda: floor["durable"](batch)), (lambda: os.close(fd))


class _Context:
    """What the two services ask of a call's context, for calling them in process: as
    grpc.aio's context on its loop, where the broker's SendMessage runs, it has no
    ``add_callback`` (a send wakes its long polls in the call, as there)."""

    def peer(self):
        return "ipv4:127.0.0.1:1"

    def get_middleware(self, key):
        return None

    def invocation_metadata(self):
        return (("x-mq-client-id", "bench-cold"),)


def in_process_broker(tmp: str, **extra):
    """A broker on ``tmp`` (ASYNC_FLUSH, Flight on, topics auto-created with 4 queues),
    with ``extra`` properties."""
    from sparkmq.broker import Broker, BrokerConfig
    return Broker(BrokerConfig.from_properties({
        "brokerName": "cold", "storePathRootDir": os.path.join(tmp, "mq"),
        "listenPort": str(free_port()), "adminPort": str(free_port()),
        "flightPort": str(free_port()), "flushDiskType": "ASYNC_FLUSH",
        "autoCreateTopicEnable": "true", "defaultTopicQueueNums": "4",
        "flightEnable": "true", **extra})).start()


def plain_request(topic: str, n: int) -> bytes:
    """A serialized SendMessageRequest of ``n`` plain 1 KiB messages, as a client sends."""
    from rocketmq.grpc_protocol import definition_pb2 as pb, service_pb2 as spb
    msgs = []
    for i in range(n):
        m = pb.Message(topic=pb.Resource(name=topic), body=b"x" * 1024)
        m.system_properties.message_id = "01" + "%030d" % i
        m.system_properties.born_host = "10.0.0.1"
        m.system_properties.born_timestamp.FromMilliseconds(1_700_000_000_000)
        m.system_properties.message_type = pb.NORMAL
        msgs.append(m)
    return spb.SendMessageRequest(messages=msgs).SerializeToString()


def grpc_send(broker, data: bytes, ctx: _Context):
    """A call of ``broker``'s SendMessage on request bytes ``data``, from the server's
    request deserializer to the answer's bytes, made as on the gRPC server's loop (its
    thread marked so for the call: ``replicawait.merges``; a tree without the mark
    ignores it)."""
    from sparkmq.broker.grpc_service import MessagingServicer, request_reader
    from sparkmq.broker.replicawait import HELD
    servicer, read = MessagingServicer(broker), request_reader("SendMessage")

    def grpc():
        HELD.loop = True
        try:
            r = servicer.send_encoded(read(data), ctx)
        finally:
            HELD.loop = False
        if not isinstance(r, bytes):
            r.SerializeToString()
    return grpc


def sparkmq_puts(tmp: str, topics: int = 0):
    """(Flight put of one row, RocketMQ send of one message, Flight read of one message at
    a queue's tail, the two pops, stop) on an in-process broker holding ``topics`` other
    topics."""
    import pyarrow as pa
    broker, ctx = in_process_broker(tmp), _Context()
    for i in range(topics):
        broker.store.create_topic(f"other-{i}", read_queue_nums=4, write_queue_nums=4)
    one = pa.RecordBatch.from_pydict({"topic": ["lat"], "body": [b"x" * 1024]})

    def flight():
        broker.flight._send(ctx, one)

    def get():
        end = broker.store.max_offset("lat", 0)
        assert broker.flight._read("lat", 0, end - 1, 1, 0).num_rows == 1
    return (flight, grpc_send(broker, plain_request("lat-grpc", 1), ctx), get,
            pop_after_sends(broker, ctx, 1), pop_after_sends(broker, ctx, 32), broker.stop)


def pop_after_sends(broker, ctx, n: int):
    """A call that makes ``n`` one-message Flight sends, then times the RocketMQ pop of
    the ``n`` messages (``PopService.pop``: what a ReceiveMessage does before its replies
    are made), then acks them."""
    import pyarrow as pa
    from sparkmq.broker.pop import TagFilter
    topic, every = f"pop-{n}", TagFilter("*")
    one = pa.RecordBatch.from_pydict({"topic": [topic], "body": [b"x" * 1024],
                                      "queue_id": pa.array([0], pa.int32())})

    def call() -> float:
        for _ in range(n):
            broker.flight._send(ctx, one)
        t = time.perf_counter()
        got = broker.pop.pop("G", topic, batch_size=n, invisible_ms=30_000, tag_filter=every)
        took = time.perf_counter() - t
        assert len(got) == n, len(got)
        for d in got:
            broker.receiver.ack("G", d.receipt_handle, topic)
        return took
    return call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer spaced calls")
    ap.add_argument("--gaps-ms", type=float, nargs="+", default=[0.5, 20.0])
    ap.add_argument("--topics", type=int, default=0,
                    help="other topics the broker holds (a per-request cost that grows "
                         "with them shows here)")
    args = ap.parse_args(argv)
    import numpy as np
    spaced_calls = 60 if args.quick else 200
    tmp = tempfile.mkdtemp(prefix="bench-cold-")
    try:
        mem = np.ones(8192)
        floor, close_floor = durable_floor(tmp)
        flight, grpc, get, pop_1, pop_32, stop = sparkmq_puts(tmp, args.topics)
        rows = [("64 KiB numpy sum (the machine)", lambda: mem.sum()),
                ("durable floor put, one row", floor),
                ("sparkmq Flight put, one row", flight),
                ("sparkmq RocketMQ send, one message", grpc),
                ("sparkmq Flight read, one message", get),
                ("sparkmq RocketMQ pop, one message", pop_1),
                ("sparkmq RocketMQ pop of 32 (32 sends)", pop_32)]
        try:
            results = {}
            for name, fn in rows:
                for _ in range(200):                      # warm-up
                    fn()
                results[name] = [p50_us(fn, 2000, 0)] + [
                    p50_us(fn, spaced_calls, g / 1000) for g in args.gaps_ms]
        finally:
            stop()
            close_floor()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    heads = ["back to back"] + [f"{g:g} ms apart" for g in args.gaps_ms]
    print("\nserver work per request, p50 us (in process; x: over back to back)")
    print(f"{'':40s}" + "".join(f"{h:>20s}" for h in heads))
    for name, us in results.items():
        print(f"{name:40s}{us[0]:20.1f}" + "".join(f"{u:12.1f} (x{u / us[0]:4.1f})"
                                                  for u in us[1:]))
    floor = results["durable floor put, one row"]
    for name in ("sparkmq Flight put, one row", "sparkmq RocketMQ send, one message"):
        print(f"{name + ' / floor':40s}" + "".join(
            f"{u / f:20.2f}" for u, f in zip(results[name], floor)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
