#!/usr/bin/env python
"""OpenMessaging-Benchmark-shaped workload: sparkmq (gRPC and Arrow Flight) against
Redis Streams and NATS JetStream in the same run (issue 16 item 7).

    .venv/bin/python bench/bench_omb.py [--quick] [--only sparkmq-grpc redis ...]

OMB's standard shape: one topic, 16 queues, 1 KiB payloads, one producer at a fixed
rate, one consumer in ANOTHER PROCESS; end-to-end latency p50/p99/p99.9 at fixed rates,
then the highest rate whose p99 stays under 10 ms.

- **Open-loop pacing.** Message i of a run is *scheduled* at ``start + i / rate``; the
  producer (one thread) sends, in one call, every message whose time has come (at
  most ``MAX_BATCH``), then sleeps until the next one is due. A send that takes longer
  than the interval makes the next call carry more messages; it never moves the
  schedule. Latency = receive time - SCHEDULED time (CLOCK_MONOTONIC, same host,
  stamped in the first 8 bytes of the body), so a producer falling behind shows as
  latency: coordinated omission is not hidden (OMB measures from the actual send and
  reports the lag apart as "publish delay"). A message not received in time is
  infinitely late.
- **One call in flight** per producer for every system: sparkmq ``Producer.send_batch``
  (one SendMessage / one Flight DoPut batch, to one queue, queues round robin),
  a Redis pipeline of XADDs, NATS ``publish_async`` of each due message then wait
  for all acks. All three batch what is due, nothing else.
- **Topology per system:**
  * ``sparkmq-grpc``: broker subprocess (ASYNC_FLUSH, as bench_broker.py), topic of
    16 queues; sparkmq.client ``Producer(transport="grpc")`` (the official ``rocketmq``
    client has no batch send) and a ``PushConsumer`` (one long-polling ReceiveMessage
    poller, 8 consume threads, an ack per message, as RocketMQ 5 consumers do).
  * ``sparkmq-flight``: the same broker with ``flightEnable=true``;
    ``Producer(transport="flight")`` and a ``PullConsumer(transport="flight")``
    following the 16 queues on ONE stream (``PullConsumer.follow``: a followed DoGet,
    one call for the whole run, as a Kafka consumer's fetch session), offsets committed
    at most once a second.
  * ``redis``: redis-server (appendonly, fsync everysec, as bench_broker.py); ONE
    stream: OMB's Redis driver ignores partitions (``createTopic`` does nothing, the
    topic is one stream key) and a Redis stream is Redis's unit of order, so 16 streams
    would be 16 topics to Redis. Consumer: XREADGROUP BLOCK, one XACK per read.
  * ``nats``: nats-server -js, file storage; ONE stream with ONE subject: OMB's NATS
    JetStream driver does the same (``createTopic`` adds a stream whose subject is the
    topic, partitions ignored). Consumer: a durable push subscription, an ack per
    message (as OMB's driver).
  * ``floor``: no broker: the producer writes to a TCP socket the consumer process
    reads; same pacing, processes and clock: what the machine gives anyone right now.
- Servers start through bench_broker.py's helpers (``process``, ``ensure_apt``/``ensure_pip``).

Each system: a 1 s warm-up run, the fixed rates, then the search: rates from
``--start-rate`` times ``--factor`` while p99 < 10 ms and every message arrived (divided
while failing), then ``--bisect`` geometric bisections between the last pass and the
first failure. A run id in each body keeps a late message out of other runs.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_broker import (broker_conf, ensure_apt, ensure_pip, free_port,  # noqa: E402
                          process, redis_command, wait_port)
from sparkmq.progress import track  # noqa: E402

TOPIC = "omb"
QUEUES = 16
PAYLOAD_BYTES = 1024
HEADER = struct.Struct("<qi")        # scheduled send time (monotonic ns), run id
FILLER = os.urandom(PAYLOAD_BYTES - HEADER.size)
MAX_BATCH = 500                      # messages per producer call, at most
P99_BOUND_MS = 10.0
DRAIN_MAX_S = 120.0                  # a run's backlog is waited out up to this long
SYSTEMS = ("sparkmq-grpc", "sparkmq-flight", "redis", "nats", "floor")


def payload(scheduled_ns: int, run: int) -> bytes:
    return HEADER.pack(scheduled_ns, run) + FILLER


# ---------------------------------------------------------------- servers
@contextlib.contextmanager
def start_server(system: str, tmp: str):
    """Yield the connection info (a JSON-able dict) of a fresh server for ``system``
    until the block ends; None when its binary or client cannot be installed."""
    if system == "floor":
        yield {"port": free_port()}
        return
    if system.startswith("sparkmq"):
        flight = free_port()
        conf, port, _ = broker_conf(tmp, brokerName="omb", defaultTopicQueueNums=QUEUES,
                                    **({"flightEnable": "true", "flightPort": flight}
                                       if system == "sparkmq-flight" else {}))
        with process([sys.executable, "-m", "sparkmq.broker", "-c", conf], port):
            if system == "sparkmq-flight":
                wait_port(flight)
            yield {"endpoint": f"127.0.0.1:{port}"}
        return
    name, pip = ("redis-server", ("redis", "redis", "hiredis")) if system == "redis" else \
        ("nats-server", ("nats", "nats-py"))
    binary = ensure_apt(name, name)
    if not binary or not ensure_pip(*pip):
        yield None
        return
    port = free_port()
    cmd = redis_command(binary, port, tmp) if system == "redis" else \
        [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", os.path.join(tmp, "js")]
    with process(cmd, port):
        yield {"port": port}


# ---------------------------------------------------------------- producers
class SparkmqSender:
    def __init__(self, info: dict, transport: str):
        from sparkmq.client import Message, Producer
        self._message = Message
        self.producer = Producer(info["endpoint"], transport=transport, request_timeout_s=30)

    def send(self, bodies: list[bytes]) -> None:
        m = self._message
        self.producer.send_batch([m(TOPIC, b) for b in bodies])

    def close(self) -> None:
        self.producer.shutdown()


class RedisSender:
    def __init__(self, info: dict):
        import redis
        self.r = redis.Redis(port=info["port"])
        self.r.ping()

    def send(self, bodies: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for b in bodies:
            pipe.xadd(TOPIC, {"payload": b})
        pipe.execute()

    def after_run(self) -> None:
        """Not timed: drop what was read (Redis keeps streams in memory: GBs otherwise)."""
        self.r.xtrim(TOPIC, maxlen=0)

    def close(self) -> None:
        self.r.close()


class NatsSender:
    """nats-py is asyncio: ``send`` hands the batch to its loop's thread and waits."""

    def __init__(self, info: dict):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc, self.js = self._run(self._connect(info["port"]))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _connect(self, port: int):
        import nats
        from nats.js.api import StorageType
        nc = await nats.connect(f"nats://127.0.0.1:{port}", pending_size=64 << 20)
        js = nc.jetstream()
        await js.add_stream(name=TOPIC.upper(), subjects=[TOPIC], storage=StorageType.FILE)
        return nc, js

    async def _publish(self, bodies: list[bytes]) -> None:
        futs = [await self.js.publish_async(TOPIC, b) for b in bodies]
        await asyncio.gather(*futs)

    def send(self, bodies: list[bytes]) -> None:
        self._run(self._publish(bodies))

    def close(self) -> None:
        self._run(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class FloorSender:
    """No broker: the due messages written to a TCP socket the consumer process reads
    (no ack); connects at the first send, once the consumer listens."""

    def __init__(self, info: dict):
        self.port, self.sock = info["port"], None

    def send(self, bodies: list[bytes]) -> None:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(b"".join(bodies))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def make_sender(system: str, info: dict):
    if system == "floor":
        return FloorSender(info)
    if system == "sparkmq-grpc":
        return SparkmqSender(info, "grpc")
    if system == "sparkmq-flight":
        return SparkmqSender(info, "flight")
    return RedisSender(info) if system == "redis" else NatsSender(info)


def paced_run(sender, rate: float, seconds: float, run: int) -> dict:
    """Send ``rate * seconds`` messages on an open-loop schedule (module docstring)."""
    total = max(1, int(rate * seconds))
    interval_ns = 1e9 / rate
    start = time.monotonic_ns() + 20_000_000
    sent = calls = biggest = 0
    acked: list[float] = []           # per message: ack time - scheduled time (ms)
    while sent < total:
        now = time.monotonic_ns()
        due = min(total, int((now - start) / interval_ns) + 1) - sent
        if due <= 0:
            time.sleep((start + sent * interval_ns - now) / 1e9)
            continue
        k = min(due, MAX_BATCH)
        first = start + sent * interval_ns
        sender.send([payload(int(first + j * interval_ns), run) for j in range(k)])
        ack_ms = (time.monotonic_ns() - first) / 1e6
        acked.extend(ack_ms - j * interval_ns / 1e6 for j in range(k))
        sent += k
        calls += 1
        biggest = max(biggest, k)
    elapsed = (time.monotonic_ns() - start) / 1e9
    acked.sort()
    return {"sent": total, "calls": calls, "biggest": biggest,
            "pub50": acked[len(acked) // 2], "pub99": acked[int(0.99 * len(acked))],
            "achieved": total / elapsed if elapsed > 0 else float("inf")}


# ---------------------------------------------------------------- consumer child
class Received:
    """Latencies (ns) per run id, appended from any consumer thread. A run that misses
    messages is answered only once the consumer has been quiet for 1 s (at most
    ``DRAIN_MAX_S``): its backlog must not delay the next run."""

    def __init__(self):
        self.by_run: dict[int, list[int]] = {}
        self.last_ns = 0

    def note(self, body: bytes, now_ns: int) -> None:
        self.last_ns = now_ns
        scheduled, run = HEADER.unpack_from(body)
        lat = self.by_run.get(run)
        (lat if lat is not None else self.by_run.setdefault(run, [])).append(now_ns - scheduled)

    def summary(self, run: int, expected: int, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while len(self.by_run.get(run, ())) < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        got = sorted(self.by_run.pop(run, []))
        deadline = time.monotonic() + DRAIN_MAX_S
        while len(got) < expected and time.monotonic() < deadline and \
                time.monotonic_ns() - self.last_ns < 1e9:
            time.sleep(0.1)
        padded = got + [math.inf] * max(0, expected - len(got))

        def q(p: float) -> float:
            return padded[min(len(padded) - 1, int(p * len(padded)))] / 1e6
        return {"received": len(got), "p50": q(0.50), "p99": q(0.99), "p999": q(0.999),
                "max": padded[-1] / 1e6 if padded else math.inf}


def consume_sparkmq_grpc(info: dict, rec: Received, stop: threading.Event) -> None:
    from sparkmq.client import ConsumeResult, PushConsumer

    def listener(m):
        rec.note(m.body, time.monotonic_ns())
        return ConsumeResult.SUCCESS
    pc = PushConsumer(info["endpoint"], "omb", {TOPIC: "*"}, listener, consume_threads=8,
                      batch_size=32, wait_s=1.0)
    print("READY", flush=True)
    stop.wait()
    pc.shutdown()


def consume_sparkmq_flight(info: dict, rec: Received, stop: threading.Event) -> None:
    from sparkmq.client import PullConsumer
    pc = PullConsumer(info["endpoint"], "omb", transport="flight")
    queues = pc.queues(TOPIC)
    assert len(queues) == QUEUES, queues
    follow = pc.follow({q: pc.query_offset(q, "END") for q in queues}, max_messages=512)
    offsets: dict = {}

    def read() -> None:
        for q, msgs, nxt in follow:
            now = time.monotonic_ns()
            for m in msgs:
                rec.note(m.body, now)
            offsets[q] = nxt

    def commit() -> None:           # once a second, off the reading thread (as Kafka's
        while not stop.wait(1.0):   # consumers commit asynchronously), all queues at once
            if offsets:
                pc.commit_offsets(dict(offsets))
    threads = [threading.Thread(target=f, daemon=True) for f in (read, commit)]
    for t in threads:
        t.start()
    print("READY", flush=True)
    stop.wait()
    follow.close()
    for t in threads:
        t.join(5)
    pc.close()


def consume_redis(info: dict, rec: Received, stop: threading.Event) -> None:
    import redis
    r = redis.Redis(port=info["port"])
    r.xgroup_create(TOPIC, "omb", id="$", mkstream=True)
    print("READY", flush=True)
    while not stop.is_set():
        for _, entries in r.xreadgroup("omb", "c1", {TOPIC: ">"}, count=512, block=1000) or []:
            now = time.monotonic_ns()
            for _, fields in entries:
                rec.note(fields[b"payload"], now)
            if entries:
                r.xack(TOPIC, "omb", *[eid for eid, _ in entries])
    r.close()


def consume_nats(info: dict, rec: Received, stop: threading.Event) -> None:
    async def main():
        import nats
        from nats.js.api import DeliverPolicy
        nc = await nats.connect(f"nats://127.0.0.1:{info['port']}")
        js = nc.jetstream()

        async def cb(msg):
            rec.note(msg.data, time.monotonic_ns())
            await msg.ack()
        await js.subscribe(TOPIC, durable="omb", cb=cb, manual_ack=True,
                           deliver_policy=DeliverPolicy.NEW,
                           pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
        print("READY", flush=True)
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await nc.close()
    asyncio.run(main())


def consume_floor(info: dict, rec: Received, stop: threading.Event) -> None:
    with socket.create_server(("127.0.0.1", info["port"])) as srv:
        print("READY", flush=True)
        srv.settimeout(0.5)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(0.5)
                buf = bytearray()
                while not stop.is_set():
                    try:
                        data = conn.recv(1 << 20)
                    except socket.timeout:
                        continue
                    if not data:
                        break
                    now = time.monotonic_ns()
                    buf += data
                    whole = len(buf) - len(buf) % PAYLOAD_BYTES
                    for at in range(0, whole, PAYLOAD_BYTES):
                        rec.note(bytes(buf[at:at + HEADER.size]), now)
                    del buf[:whole]


CONSUMERS = {"sparkmq-grpc": consume_sparkmq_grpc, "sparkmq-flight": consume_sparkmq_flight,
             "redis": consume_redis, "nats": consume_nats, "floor": consume_floor}


def consumer_child(system: str, info: dict) -> None:
    """``--consumer-child``: stdin ``RUN EXPECTED TIMEOUT_S`` -> a JSON summary; EOF stops."""
    rec, stop = Received(), threading.Event()
    t = threading.Thread(target=CONSUMERS[system], args=(info, rec, stop), daemon=True)
    t.start()
    for line in sys.stdin:
        run, expected, timeout_s = line.split()
        print(json.dumps(rec.summary(int(run), int(expected), float(timeout_s))), flush=True)
    stop.set()
    t.join(10)


class Consumer:
    """The consumer child process of one system."""

    def __init__(self, system: str, info: dict):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--consumer-child", system,
             json.dumps(info)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.proc.kill()
            raise RuntimeError(f"{system} consumer did not start: {line!r}")

    def summary(self, run: int, expected: int, timeout_s: float) -> dict:
        self.proc.stdin.write(f"{run} {expected} {timeout_s}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


# ---------------------------------------------------------------- one system
def bench_system(system: str, tmp: str, rates: list[float], seconds: float,
                 search: dict) -> dict | None:
    out: dict = {"fixed": {}, "search": []}
    run_ids = iter(range(1, 10_000))
    with start_server(system, tmp) as info:
        if info is None:
            return None
        sender = make_sender(system, info)
        try:
            if system != "floor":                           # creates the topic/stream
                sender.send([payload(time.monotonic_ns(), 0)])
            consumer = Consumer(system, info)
            try:
                def measure(rate: float, secs: float) -> dict:
                    run = next(run_ids)
                    prod = paced_run(sender, rate, secs, run)
                    res = consumer.summary(run, prod["sent"], timeout_s=max(5.0, secs))
                    if hasattr(sender, "after_run"):
                        sender.after_run()
                    return {"rate": rate, **prod, **res}
                measure(rates[0], 1.0)                                # warm-up
                for rate in track(rates, f"{system} fixed rates", unit="rates"):
                    out["fixed"][rate] = measure(rate, seconds)
                out["search"] = search_max(measure, **search)
            finally:
                consumer.close()
        finally:
            sender.close()
    return out


def passes(r: dict) -> bool:
    return r["received"] >= r["sent"] and r["p99"] < P99_BOUND_MS


def search_max(measure, *, start: float, factor: float, bisect: int, seconds: float,
               ceiling: float) -> list[dict]:
    """Runs of the max-rate search (module docstring), in the order made. A failing step
    runs once more and passes if either run does: on a shared machine one stall of
    another job's must not end a system's search."""
    tried: list[dict] = []

    def attempt(rate: float) -> dict:
        r = measure(rate, seconds)
        if not passes(r):
            again = measure(rate, seconds)
            r = again if passes(again) else r
        print(f"#   {rate:>9,.0f} msg/s: p99 {r['p99']:8.2f} ms, received {r['received']}/"
              f"{r['sent']} -> {'pass' if passes(r) else 'FAIL'}", file=sys.stderr, flush=True)
        tried.append(r)
        return r
    rate = start
    while True:                               # up while passing (down while failing)
        r = attempt(rate)
        ok = [t["rate"] for t in tried if passes(t)]
        bad = [t["rate"] for t in tried if not passes(t)]
        if ok and bad and min(bad) > max(ok):
            break
        if ok and rate * factor > ceiling:
            return tried
        if not ok and rate / factor < 50:
            return tried
        rate = rate * factor if passes(r) else rate / factor
    for _ in range(bisect):
        lo = max(t["rate"] for t in tried if passes(t))
        hi = min(t["rate"] for t in tried if not passes(t) and t["rate"] > lo)
        attempt(round(math.sqrt(lo * hi)))
    return tried


def best_rate(res: dict) -> float | None:
    ok = [t["rate"] for t in res["search"] if passes(t)]
    return max(ok) if ok else None


# ---------------------------------------------------------------- report
def report(results: dict[str, dict | None], rates: list[float]) -> None:
    done = [s for s in SYSTEMS if results.get(s)]
    refs = [p for p in ("redis", "nats") if results.get(p)]
    print("\nend-to-end latency (ms, receive - scheduled send) at fixed rates; ratio = "
          "sparkmq / peer (lower is better); ack50/ack99: the producer's send acknowledged "
          "- scheduled (OMB's publish latency + publish delay); recv: received/sent")
    head = f"{'rate':>8} {'pct':<6}" + "".join(f"{s:>16}" for s in done) + \
        "".join(f"{'grpc/' + p:>13}{'flight/' + p:>14}" for p in refs)
    print(head + "\n" + "-" * len(head))
    for rate in rates:
        for key, label in (("p50", "p50"), ("p99", "p99"), ("p999", "p99.9")):
            line = f"{rate:>8,.0f} {label:<6}"
            for s in done:
                line += f"{results[s]['fixed'][rate][key]:>16.2f}"
            for p in refs:
                ref = results[p]["fixed"][rate][key]
                for s, w in (("sparkmq-grpc", 13), ("sparkmq-flight", 14)):
                    v = results.get(s) and results[s]["fixed"][rate][key]
                    line += f"{v / ref:>{w}.2f}" if v and ref and math.isfinite(v / ref) \
                        else f"{'-':>{w}}"
            print(line)
        for key, label in (("pub50", "ack50"), ("pub99", "ack99")):
            print(f"{rate:>8,.0f} {label:<6}" + "".join(
                f"{results[s]['fixed'][rate][key]:>16.2f}" for s in done))
        print(f"{rate:>8,.0f} {'recv':<6}" + "".join(
            f"{'%d/%d' % (r['received'], r['sent']):>16}"
            for r in (results[s]["fixed"][rate] for s in done)))
    print(f"\nhighest rate with p99 < {P99_BOUND_MS:g} ms and every message received "
          "(msg/s; ratio = system / peer, higher is better; p50/p99/p99.9 at that rate; "
          "0 = not even the lowest rate tried)")
    head = f"{'system':<16}{'max rate':>10}{'p50':>8}{'p99':>8}{'p99.9':>8}" + \
        "".join(f"{'of ' + p:>10}" for p in refs) + "   runs (rate:p99)"
    print(head + "\n" + "-" * len(head))
    for s in done:
        best = best_rate(results[s])
        at = next((t for t in results[s]["search"] if t["rate"] == best), None)
        line = f"{s:<16}{best or 0:>10,.0f}"
        line += "".join(f"{at[k]:>8.2f}" for k in ("p50", "p99", "p999")) if at \
            else f"{'-':>8}" * 3
        for p in refs:
            ref = best_rate(results[p])
            line += f"{best / ref:>10.2f}" if best and ref and s != "floor" else f"{'-':>10}"
        runs = " ".join(f"{t['rate']:,.0f}:{t['p99']:.1f}" for t in
                        sorted(results[s]["search"], key=lambda t: t["rate"]))
        print(line + "   " + runs)
    for s in SYSTEMS:
        if s in results and results[s] is None:
            print(f"# {s}: not run (see above)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs (a few minutes)")
    ap.add_argument("--only", nargs="*", choices=SYSTEMS)
    ap.add_argument("--rates", type=float, nargs="*", help="fixed rates (msg/s)")
    ap.add_argument("--seconds", type=float, help="length of a fixed-rate run")
    ap.add_argument("--search-seconds", type=float)
    ap.add_argument("--start-rate", type=float, default=1000)
    ap.add_argument("--factor", type=float)
    ap.add_argument("--bisect", type=int)
    ap.add_argument("--ceiling", type=float, default=200_000)
    ap.add_argument("--consumer-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.consumer_child:
        consumer_child(args.consumer_child[0], json.loads(args.consumer_child[1]))
        return 0
    rates = args.rates or ([1000, 4000] if args.quick else [1000, 4000, 10000])
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    search = {"start": args.start_rate, "ceiling": args.ceiling,
              "factor": args.factor or (2.0 if args.quick else 1.5),
              "bisect": args.bisect if args.bisect is not None else (1 if args.quick else 3),
              "seconds": args.search_seconds or (2.0 if args.quick else 5.0)}
    systems = args.only or list(SYSTEMS)
    print(f"# OMB-shaped: {QUEUES} queues (Redis/NATS: one stream, as OMB's drivers), "
          f"{PAYLOAD_BYTES} B, open-loop producer (<= {MAX_BATCH} due messages a call), "
          f"consumer process; runs {seconds:g} s, search {search['seconds']:g} s; "
          f"{os.cpu_count()} cores")
    results: dict[str, dict | None] = {}
    for system in systems:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"bench-omb-{system}-") as tmp:
            try:
                results[system] = bench_system(system, tmp, rates, seconds, search)
            except Exception as e:  # a peer that fails is reported and skipped, not ours
                if system.startswith("sparkmq"):
                    raise
                print(f"# {system} failed: {e!r}; skipped")
                results[system] = None
        print(f"# {system} done in {time.perf_counter() - t0:.0f} s", flush=True)
    report(results, rates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
