"""sparkmq's Arrow Flight path against Redis Streams and against the Flight transport floor,
in the same run (issue 16 item 6).

Rows (1 KiB messages):
- batched throughput: batches of ``--batch`` messages over one DoPut stream, each batch
  acknowledged before the next, with the server process's CPU per batch then (every
  thread, from /proc's schedstat) against the durable floor's (ratio to Redis's
  pipelined XADD of the same batches,
  from bench_broker.py's Redis run, and to the floor: the same puts to a Flight server
  in another process that acks without storing; the floor's own ratio to Redis is the
  most any Python Flight server could reach on this machine; and to the durable floor:
  the same server storing each batch with a store's least work, its IPC message with a
  CRC32C appended to a file and an ack of offsets, no checks, columns or index);
- the same batches on 4 DoPut streams at once (concurrent producers; batches waiting
  together are one append), against the durable floor's 4 streams;
- sync send p50: a one-message batch written and its ack read (ratio to the floor: the
  same round trip against a Flight server that acks without storing, in another process;
  the durable floor's p50 beside it);
- send -> long-poll consumer p50: a DoGet waiting with pollMs, then a one-message send
  (ratio to the floor round trip, and to the same shape against the floor server: its
  put wakes a waiting DoGet);
- send -> followed read p50: a one-message send and its batch on a followed DoGet opened
  once (docs/PROTOCOL.md; ratio to the floor round trip and to the same shape against
  the floor server, whose put wakes a streaming DoGet);
- sparkmq's own clients against the same broker, over Flight (``transport="flight"``)
  and over gRPC (``transport="grpc"``), ratio Flight / gRPC: ``Producer.send_batch``
  throughput, ``Producer.send`` p50, and ``PullConsumer.pull`` throughput reading what
  the batches stored (4 queues, 1,000 messages a pull).

    .venv/bin/python bench/bench_flight.py [--quick] [--paired ROUNDS [--pin] [--broker-floor]]

``--paired ROUNDS``: only the two rows a noisy host moves most, measured in alternation
instead of one system after another: sparkmq's broker, Redis and the two floor servers run
at once, and each round times a slice of the batched puts (and of the one-message round
trips) on each in turn, the order rotating; printed is each ratio's median over the
rounds and its range. A host whose speed drifts over a run moves every system in a round
alike, where the sequential run (a minute apart) can move one alone. It also prints each
Flight server's process CPU (every thread) per one-message round trip, summed over the
rounds: what the sync row is made of, steadier than its wall time. ``--pin``: every
server's threads on CPU 0 and the clients on CPU 1, as servers on cores of their own.
``--broker-floor``: one more server in the rounds, sparkmq's broker with its Flight put
replaced by the durable floor's (bench/floor_put_broker.py): the two rows it reaches are
what the broker's process (its Flight server, threads and services) leaves for a put that
costs what the floor's does.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STREAMS = 4                 # concurrent producers' DoPut streams in the "at once" row
# this tree's sparkmq first, not an installed one: a worktree's bench measures its own
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench_broker import (BODY, bench_redis, broker_conf, ensure_apt,  # noqa: E402
                          ensure_pip, free_port, pct, process, redis_command, wait_port,
                          xadd_pipelined)
from bench_ha import pin_threads, process_cpu_s  # noqa: E402
from sparkmq.progress import track  # noqa: E402

# The durable floor's put: a store's least work per batch (also timed in process by
# bench_cold.py, which runs this code with its own ``fd``).
DURABLE = textwrap.dedent("""
    import os
    import crc32c, numpy as np, pyarrow as pa
    from sparkmq.log.fs import preallocate
    EOS = b"\\xff\\xff\\xff\\xff\\x00\\x00\\x00\\x00"
    ACKS = pa.schema([("queue_id", pa.int32()), ("queue_offset", pa.int64())])
    OPTIONS = pa.ipc.IpcWriteOptions()
    stored = written = allocated = 0
    def durable(batch):
        \"\"\"A store's least work: the batch as an IPC message with its CRC32C, appended
        to a file (``fd``, its blocks allocated 8 MiB ahead as sparkmq's active segment's
        are), and an ack of offsets; no checks, no added columns, no index.\"\"\"
        global stored, written, allocated
        sink = pa.BufferOutputStream()
        pa.ipc.RecordBatchStreamWriter(sink, batch.schema, options=OPTIONS).write_batch(batch)
        data = sink.getvalue()
        crc32c.crc32c(data)
        if written + len(data) > allocated:
            ahead = max(8 << 20, written + len(data) - allocated)
            if preallocate(fd, allocated, ahead):
                allocated += ahead
        os.write(fd, data)
        written += len(data)
        n = batch.num_rows
        ack = pa.RecordBatch.from_arrays([pa.array(np.zeros(n, np.int32)),
                                          pa.array(np.arange(stored, stored + n))], schema=ACKS)
        stored += n
        return pa.py_buffer(b"".join((ACKS.serialize(), ack.serialize(), EOS)))
""")

FLOOR = DURABLE + textwrap.dedent("""
    import sys, threading
    import pyarrow.flight as fl
    ACK = pa.py_buffer(b"ok")
    ONE = pa.table({"body": [b"x" * 1024]})
    arrived = threading.Event()
    class Floor(fl.FlightServerBase):
        def do_put(self, context, descriptor, reader, writer):
            for chunk in reader:
                writer.write(ACK if fd is None else durable(chunk.data))
                arrived.set()
        def do_get(self, context, ticket):      # a long poll woken by the next put
            arrived.clear()
            if ticket.ticket == b"follow":      # or a stream: one batch per put
                def follow():
                    while not context.is_cancelled():
                        if arrived.wait(1):
                            arrived.clear()
                            yield ONE
                return fl.GeneratorStream(ONE.schema, follow())
            arrived.wait(5)
            return fl.RecordBatchStream(ONE)
    fd = None
    if len(sys.argv) > 2:                    # the durable floor: a file to append to
        fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    Floor(f"grpc+tcp://127.0.0.1:{sys.argv[1]}").serve()
""")


def _put_throughput_cpu(pid: int, port: int, n: int, big) -> tuple[float, float]:
    """``_put_throughput``, and the server process's CPU per batch in us (all its
    threads: the Flight handler, gRPC's own, the services)."""
    before = process_cpu_s(pid)
    tput = _put_throughput(port, n, big)
    return tput, (process_cpu_s(pid) - before) * 1e6 / (n // big.num_rows)


def _put_round_trips(port: int, m: int, batch) -> list[float]:
    import pyarrow.flight as fl
    client = fl.FlightClient(f"grpc+tcp://127.0.0.1:{port}")
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("send"), batch.schema)
    out = []
    for i in range(m + 50):
        t = time.perf_counter()
        writer.write_batch(batch)
        reader.read()
        if i >= 50:                           # the first 50: warm-up
            out.append(time.perf_counter() - t)
    writer.done_writing()
    writer.close()
    return out


def _batch(topic: str, n: int):
    import pyarrow as pa
    return pa.RecordBatch.from_pydict({"topic": [topic] * n, "body": [BODY] * n})


def _put_throughput(port: int, n: int, big) -> float:
    """Messages a second through one DoPut stream, each batch acked before the next."""
    import pyarrow.flight as fl
    client = fl.FlightClient(f"grpc+tcp://127.0.0.1:{port}")
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("send"), big.schema)
    batches = n // big.num_rows
    t0 = time.perf_counter()
    for _ in track(range(batches), "throughput puts", unit="batches"):
        writer.write_batch(big)
        reader.read()
    tput = batches * big.num_rows / (time.perf_counter() - t0)
    writer.done_writing()
    writer.close()
    return tput


def _put_throughput_streams(port: int, n: int, big, streams: int) -> float:
    """Messages a second through ``streams`` DoPut streams at once (a thread each, each
    batch acked before that stream's next): concurrent producers."""
    per = n // streams
    threads = [threading.Thread(target=_put_throughput, args=(port, per, big))
               for _ in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return streams * (per // big.num_rows) * big.num_rows / (time.perf_counter() - t0)


def bench_floor(n: int, batch_n: int, m: int) -> dict:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", FLOOR, str(port)])
    try:
        wait_port(port)
        one = _batch("lat", 1)
        _put_throughput(port, 20 * batch_n, _batch("tput", batch_n))     # warm-up
        return {"lat": _put_round_trips(port, m, one), "e2e": _floor_e2e(port, m, one),
                "follow": _follow_e2e(port, m, one, b"follow"),
                "tput": _put_throughput(port, n, _batch("tput", batch_n))}
    finally:
        p.kill()
        p.wait()


def bench_durable_floor(tmp: str, n: int, batch_n: int, m: int) -> dict:
    """The same puts to the floor server storing each batch (``durable`` in FLOOR)."""
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", FLOOR, str(port), os.path.join(tmp, "log")])
    try:
        wait_port(port)
        _put_throughput(port, 20 * batch_n, _batch("tput", batch_n))     # warm-up
        big = _batch("tput", batch_n)
        lat = _put_round_trips(port, m, _batch("lat", 1))
        tput, cpu = _put_throughput_cpu(p.pid, port, n, big)
        return {"lat": lat, "tput": tput, "cpu": cpu,
                "tput4": _put_throughput_streams(port, n, big, STREAMS)}
    finally:
        p.kill()
        p.wait()


def bench_sparkmq_flight(tmp: str, n: int, batch_n: int, m: int) -> dict:
    import pyarrow as pa
    import pyarrow.flight as fl
    flight = free_port()
    conf, port, _ = broker_conf(tmp, flushIntervalCommitLog=500, defaultTopicQueueNums=4,
                                flightEnable="true", flightPort=flight)
    with process([sys.executable, "-m", "sparkmq.broker", "-c", conf], port) as broker:
        wait_port(flight)
        client = fl.FlightClient(f"grpc+tcp://127.0.0.1:{flight}")
        big, one = _batch("tput", batch_n), _batch("lat", 1)
        e2e_one = pa.RecordBatch.from_pydict({"topic": ["e2e"], "body": [BODY],
                                              "queue_id": pa.array([0], pa.int32())})
        _put_round_trips(flight, 1, big)                   # creates the topics
        _put_round_trips(flight, 1, e2e_one)
        tput, cpu = _put_throughput_cpu(broker.pid, flight, n, big)
        tput4 = _put_throughput_streams(flight, n, big, STREAMS)
        lat = _put_round_trips(flight, m, one)
        e2e = _e2e(client, flight, e2e_one, m)
        follow = _follow_e2e(flight, m, e2e_one, json.dumps(
            {"topic": "e2e", "follow": [[0, 1 << 62]]}).encode())
        clients = {t: _bench_clients(f"127.0.0.1:{port}", t, n, batch_n, m)
                   for t in ("flight", "grpc")}
    return {"tput": tput, "cpu": cpu, "tput4": tput4, "lat": lat, "e2e": e2e,
            "follow": follow, "clients": clients}


def _bench_clients(endpoint: str, transport: str, n: int, batch_n: int, m: int) -> dict:
    """sparkmq's Producer and PullConsumer over ``transport`` (topics of their own)."""
    from sparkmq.client import Message, Producer, PullConsumer
    topic = f"client-{transport}"
    with Producer(endpoint, transport=transport) as p:
        batch = [Message(topic, BODY) for _ in range(batch_n)]
        for _ in range(20):                                   # warm-up (and the topic)
            p.send_batch(batch)
        t0 = time.perf_counter()
        for _ in range(n // batch_n):
            p.send_batch(batch)
        tput = (n // batch_n) * batch_n / (time.perf_counter() - t0)
        one = Message(f"{topic}-lat", BODY)
        lat = []
        for i in range(m + 50):
            t = time.perf_counter()
            p.send(one)
            if i >= 50:
                lat.append(time.perf_counter() - t)
        assert set(p.sent_over) == {"flight", "grpc"} and p.sent_over[transport] > 0
        other = "grpc" if transport == "flight" else "flight"
        assert p.sent_over[other] == 0, p.sent_over
    pc = PullConsumer(endpoint, "bench", transport=transport)
    try:
        read, t0 = 0, time.perf_counter()
        for q in pc.queues(topic):
            off = 0
            while True:
                msgs, nxt = pc.pull(q, off, max_messages=1000)
                read += len(msgs)
                if nxt == off:
                    break
                off = nxt
        pull = read / (time.perf_counter() - t0)
        assert pc.pulled_over[transport] == read
    finally:
        pc.close()
    return {"tput": tput, "lat": lat, "pull": pull}


def _e2e(client, port: int, one, m: int) -> list[float]:
    import pyarrow.flight as fl
    import pyarrow as pa
    out = []
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("send"), one.schema)
    # the consumer's own connection, kept across polls as a consumer keeps it (and as
    # _floor_e2e's poller does: until 2026-11-28 each poll here opened a new client)
    poller = fl.FlightClient(f"grpc+tcp://127.0.0.1:{port}")
    for _ in track(range(m), "round trips"):
        writer.write_batch(one)               # the offset the next message will get
        a = pa.ipc.open_stream(reader.read()).read_all()
        offset = a.column("queue_offset")[0].as_py() + 1
        ticket = fl.Ticket(json.dumps({"topic": "e2e", "queue": 0, "offset": offset,
                                       "max": 1, "pollMs": 5000}).encode())
        took = _put_waking(writer, reader, one,
                           lambda: poller.do_get(ticket).read_all().num_rows)
        if took is not None:
            out.append(took)
    writer.done_writing()
    writer.close()
    return out


def _put_waking(writer, reader, one, get) -> float | None:
    """Seconds from a one-message put to the return of ``get()``, a DoGet started 20 ms
    before the put (so waiting in the server); None if it returned no rows."""
    got = {}

    def poll():
        got["t"] = time.perf_counter() if get() else None
    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.02)                          # the poll is waiting
    t0 = time.perf_counter()
    writer.write_batch(one)
    reader.read()
    th.join(10)
    return got["t"] - t0 if got.get("t") else None


def _floor_e2e(port: int, m: int, one) -> list[float]:
    """``_e2e``'s shape against the floor server: a DoGet waiting in the server, then a
    one-message put whose handler wakes it; no store. The transport's own floor for
    send -> long-poll: two calls (the put's stream message and a whole DoGet)."""
    import pyarrow.flight as fl
    client = fl.FlightClient(f"grpc+tcp://127.0.0.1:{port}")
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("send"), one.schema)
    poller = fl.FlightClient(f"grpc+tcp://127.0.0.1:{port}")
    out = [_put_waking(writer, reader, one,
                       lambda: poller.do_get(fl.Ticket(b"wait")).read_all().num_rows)
           for _ in track(range(m), "floor round trips")]
    writer.done_writing()
    writer.close()
    return out


def _follow_e2e(port: int, m: int, one, ticket: bytes) -> list[float]:
    """A one-message put, then the batch it becomes on a followed DoGet opened before
    (one call for the whole run); ``ticket``: the follow (sparkmq: from the queue's end)."""
    import pyarrow.flight as fl
    client = fl.FlightClient(f"grpc+tcp://127.0.0.1:{port}")
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("send"), one.schema)
    if ticket != b"follow":                   # sparkmq: follow from the next offset
        writer.write_batch(one)
        import pyarrow as pa
        t = json.loads(ticket)
        t["follow"][0][1] = pa.ipc.open_stream(reader.read()).read_all().column(
            "queue_offset")[0].as_py() + 1
        ticket = json.dumps(t).encode()
    stream = fl.FlightClient(f"grpc+tcp://127.0.0.1:{port}").do_get(fl.Ticket(ticket))
    time.sleep(0.05)                          # the stream is open and waiting
    out = []
    for _ in track(range(m), "followed round trips"):
        t0 = time.perf_counter()
        writer.write_batch(one)
        reader.read()
        stream.read_chunk()
        out.append(time.perf_counter() - t0)
    stream.cancel()
    writer.done_writing()
    writer.close()
    return out


def _redis_pipeline(port: int, batch: int):
    """A call that sends ``batch`` XADDs to Redis on ``port`` as one pipeline and reads
    the replies (bench_broker.py's pipelined send)."""
    import redis
    r = redis.Redis(port=port)
    r.ping()
    return lambda: xadd_pipelined(r, "tput", batch)


def _timed(call, times: int) -> float:
    """Seconds ``times`` calls of ``call`` take."""
    t0 = time.perf_counter()
    for _ in range(times):
        call()
    return time.perf_counter() - t0


class _FlightPut:
    """A call that puts ``batch`` on one DoPut stream to ``port`` and reads its ack;
    ``close`` ends the stream."""

    def __init__(self, port: int, batch):
        import pyarrow.flight as fl
        self.batch = batch
        self.writer, self.reader = fl.FlightClient(f"grpc+tcp://127.0.0.1:{port}").do_put(
            fl.FlightDescriptor.for_path("send"), batch.schema)

    def __call__(self) -> None:
        self.writer.write_batch(self.batch)
        self.reader.read()

    def close(self) -> None:
        self.writer.done_writing()
        self.writer.close()


def paired(tmp: str, rounds: int, n: int, batch_n: int, m: int, pin: bool,
           broker_floor: bool = False) -> int:
    """``--paired``: see the module docstring."""
    import statistics
    redis_bin = ensure_apt("redis-server", "redis-server")
    if not redis_bin or not ensure_pip("redis", "redis", "hiredis"):
        print("redis-server is not available: --paired needs it", file=sys.stderr)
        return 1
    flight, rport = free_port(), free_port()
    conf, port, _ = broker_conf(tmp, flushIntervalCommitLog=500, defaultTopicQueueNums=4,
                                flightEnable="true", flightPort=flight)
    floors = {"empty": free_port(), "durable": free_port()}
    procs = [subprocess.Popen([sys.executable, "-c", FLOOR, str(floors["empty"])]),
             subprocess.Popen([sys.executable, "-c", FLOOR, str(floors["durable"]),
                               os.path.join(tmp, "floor.log")])]
    try:
        with contextlib.ExitStack() as stack:
            broker = stack.enter_context(process(
                [sys.executable, "-m", "sparkmq.broker", "-c", conf], port))
            red = stack.enter_context(process(redis_command(redis_bin, rport, tmp), rport))
            servers = [broker.pid, red.pid, *(p.pid for p in procs)]
            if broker_floor:    # the same broker, its put replaced by the durable floor's
                os.makedirs(os.path.join(tmp, "bf"))
                floors["broker"] = free_port()
                bf_conf, bf_port, _ = broker_conf(
                    os.path.join(tmp, "bf"), flushIntervalCommitLog=500,
                    defaultTopicQueueNums=4, flightEnable="true", flightPort=floors["broker"])
                servers.append(stack.enter_context(process(
                    [sys.executable, os.path.join(HERE, "floor_put_broker.py"),
                     os.path.join(tmp, "bf", "floor.log"), "-c", bf_conf], bf_port)).pid)
            for p in [flight, *floors.values()]:
                wait_port(p)
            if pin:     # every server on CPU 0, this process (the clients) on CPU 1
                for pid in servers:
                    pin_threads(pid, 0)
                os.sched_setaffinity(0, {1})
            big, one = _batch("tput", batch_n), _batch("lat", 1)
            batched = {"sparkmq": _FlightPut(flight, big), "redis": _redis_pipeline(
                rport, batch_n), "durable floor": _FlightPut(floors["durable"], big)}
            single = {"sparkmq": _FlightPut(flight, one),
                      "empty floor": _FlightPut(floors["empty"], one),
                      "durable floor": _FlightPut(floors["durable"], one)}
            pids = {"sparkmq": broker.pid, "empty floor": procs[0].pid,
                    "durable floor": procs[1].pid}
            if broker_floor:
                batched["broker floor"] = _FlightPut(floors["broker"], big)
                single["broker floor"] = _FlightPut(floors["broker"], one)
                pids["broker floor"] = servers[-1]
            for call in [*batched.values(), *single.values()]:
                _timed(call, 50)                          # warm-up (and the topics made)
            per_round, lat_round = n // batch_n // rounds, m // rounds
            tput = {k: [] for k in batched}
            lat = {k: [] for k in single}
            cpu = dict.fromkeys(single, 0.0)     # each server's CPU over its round trips
            for r in track(range(rounds), "paired rounds"):
                names = list(batched)[r % len(batched):] + list(batched)[:r % len(batched)]
                for k in names:
                    tput[k].append(per_round * batch_n / _timed(batched[k], per_round))
                for k in list(single)[r % len(single):] + list(single)[:r % len(single)]:
                    samples, before = [], process_cpu_s(pids[k])
                    for _ in range(lat_round):
                        samples.append(_timed(single[k], 1))
                    cpu[k] += process_cpu_s(pids[k]) - before
                    lat[k].append(statistics.median(samples))
            for call in [*batched.values(), *single.values()]:
                if isinstance(call, _FlightPut):
                    call.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()

    def row(label: str, num: list[float], den: list[float]) -> None:
        ratios = sorted(a / b for a, b in zip(num, den))
        print(f"{label:<52}{statistics.median(ratios):>8.2f}  "
              f"({ratios[0]:.2f}-{ratios[-1]:.2f})")
    print(f"# 1 KiB messages, batches of {batch_n}; {rounds} rounds in alternation, "
          f"{per_round} batches and {lat_round} one-message round trips per system a round"
          + ("; servers pinned to CPU 0, clients to CPU 1" if pin else ""))
    print(f"{'ratio (median over rounds, range)':<52}{'median':>8}")
    row("batched: sparkmq flight / Redis pipelined", tput["sparkmq"], tput["redis"])
    row("batched: durable floor / Redis pipelined", tput["durable floor"], tput["redis"])
    row("batched: sparkmq flight / durable floor", tput["sparkmq"], tput["durable floor"])
    row("sync send p50: sparkmq flight / empty round trip", lat["sparkmq"],
        lat["empty floor"])
    row("sync send p50: durable floor / empty round trip", lat["durable floor"],
        lat["empty floor"])
    if broker_floor:
        row("batched: broker with the floor's put / Redis", tput["broker floor"],
            tput["redis"])
        row("sync send p50: broker with the floor's put / RT", lat["broker floor"],
            lat["empty floor"])
    # what the sync row's ratio is made of, steadier than its wall time on a shared host:
    # the server process's CPU (every thread) per one-message round trip
    trips = rounds * lat_round
    print(f"{'server CPU per one-message round trip (us)':<52}"
          + "  ".join(f"{k} {cpu[k] / trips * 1e6:.0f}" for k in single))
    print(f"{'  sparkmq less the durable floor (us)':<52}"
          f"{(cpu['sparkmq'] - cpu['durable floor']) / trips * 1e6:8.0f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--paired", type=int, metavar="ROUNDS",
                    help="only the batched and sync rows, ROUNDS rounds in alternation")
    ap.add_argument("--pin", action="store_true",
                    help="with --paired: every server on CPU 0, the clients on CPU 1")
    ap.add_argument("--broker-floor", action="store_true",
                    help="with --paired: also sparkmq's broker with its put replaced by the "
                         "durable floor's (bench/floor_put_broker.py)")
    args = ap.parse_args(argv)
    n, m = (20_000, 200) if args.quick else (100_000, 1_000)
    if args.paired:
        with tempfile.TemporaryDirectory(prefix="bench-paired-") as tmp:
            return paired(tmp, args.paired, 4 * n, args.batch, 4 * m, args.pin,
                          args.broker_floor)
    with tempfile.TemporaryDirectory(prefix="bench-flight-") as tmp:
        ours = bench_sparkmq_flight(tmp, n, args.batch, m)
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as tmp:
        red = bench_redis(tmp, n, args.batch, 50)
    floor = bench_floor(n, args.batch, m)
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        durable = bench_durable_floor(tmp, n, args.batch, m)
    fp50 = pct(floor["lat"], 0.5)                     # ms
    print(f"# 1 KiB messages, batches of {args.batch}, {os.cpu_count()} cores")
    print(f"{'metric':<34}{'sparkmq flight':>16}{'reference':>16}{'ratio':>8}")
    if red:
        print(f"{'batched throughput (msg/s)':<34}{ours['tput']:>16.0f}"
              f"{red['tput']:>16.0f}{ours['tput'] / red['tput']:>8.2f}  (vs Redis pipelined)")
        print(f"{'  floor: empty server (msg/s)':<34}{floor['tput']:>16.0f}"
              f"{red['tput']:>16.0f}{floor['tput'] / red['tput']:>8.2f}  (vs Redis pipelined)")
        print(f"{'  floor: durable write (msg/s)':<34}{durable['tput']:>16.0f}"
              f"{red['tput']:>16.0f}{durable['tput'] / red['tput']:>8.2f}  (vs Redis pipelined)")
    print(f"{'batched throughput (msg/s)':<34}{ours['tput']:>16.0f}{floor['tput']:>16.0f}"
          f"{ours['tput'] / floor['tput']:>8.2f}  (vs the same puts, empty Flight server)")
    if ours["cpu"] and durable["cpu"]:
        print(f"{'server CPU per batched put (us)':<34}{ours['cpu']:>16.0f}"
              f"{durable['cpu']:>16.0f}{ours['cpu'] / durable['cpu']:>8.2f}"
              "  (vs the durable floor's: every thread of the server)")
    print(f"{f'{STREAMS} streams at once (msg/s)':<34}{ours['tput4']:>16.0f}"
          f"{durable['tput4']:>16.0f}{ours['tput4'] / durable['tput4']:>8.2f}"
          f"  (vs the durable floor, {STREAMS} streams)")
    lat = pct(ours["lat"], 0.5)
    print(f"{'sync send p50 (ms)':<34}{lat:>16.3f}{fp50:>16.3f}{lat / fp50:>8.2f}"
          "  (vs empty Flight round trip)")
    dl50 = pct(durable["lat"], 0.5)
    print(f"{'  floor: durable write p50 (ms)':<34}{dl50:>16.3f}{fp50:>16.3f}{dl50 / fp50:>8.2f}"
          "  (vs empty Flight round trip)")
    if ours["e2e"]:
        e2e = pct(ours["e2e"], 0.5)
        print(f"{'send -> long-poll p50 (ms)':<34}{e2e:>16.3f}{fp50:>16.3f}"
              f"{e2e / fp50:>8.2f}  (vs empty Flight round trip)")
        fe50 = pct(floor["e2e"], 0.5)
        print(f"{'send -> long-poll p50 (ms)':<34}{e2e:>16.3f}{fe50:>16.3f}"
              f"{e2e / fe50:>8.2f}  (vs the same shape, empty server: put wakes a DoGet)")
        fo50, ff50 = pct(ours["follow"], 0.5), pct(floor["follow"], 0.5)
        print(f"{'send -> followed read p50 (ms)':<34}{fo50:>16.3f}{fp50:>16.3f}"
              f"{fo50 / fp50:>8.2f}  (vs empty Flight round trip)")
        print(f"{'send -> followed read p50 (ms)':<34}{fo50:>16.3f}{ff50:>16.3f}"
              f"{fo50 / ff50:>8.2f}  (vs the same shape, empty server: put wakes a stream)")
    fc, gc = ours["clients"]["flight"], ours["clients"]["grpc"]
    print(f"{'metric':<34}{'client flight':>16}{'client gRPC':>16}{'ratio':>8}")
    print(f"{'Producer.send_batch (msg/s)':<34}{fc['tput']:>16.0f}{gc['tput']:>16.0f}"
          f"{fc['tput'] / gc['tput']:>8.2f}")
    fl50, gl50 = pct(fc["lat"], 0.5), pct(gc["lat"], 0.5)
    print(f"{'Producer.send p50 (ms)':<34}{fl50:>16.3f}{gl50:>16.3f}{fl50 / gl50:>8.2f}")
    print(f"{'PullConsumer.pull (msg/s)':<34}{fc['pull']:>16.0f}{gc['pull']:>16.0f}"
          f"{fc['pull'] / gc['pull']:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
