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
   Redis pipeline of XADDs, JetStream B publish_async then wait for the acks);
2. sync-send latency p50/p99: one message at a time, wait for the store's answer;
3. end-to-end latency p50/p99: send one message, a long-polling consumer thread (its
   own connection) receives and acks it; the next is sent after it arrived.

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
import threading
import time

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
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    try:
        try:
            wait_port(port)
        except RuntimeError:
            p.kill()
            raise RuntimeError(f"{cmd[0]} did not start: {p.stderr.read().decode()[-500:]}")
        yield p
    finally:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] * 1000.0


# ---------------------------------------------------------------- sparkmq
def bench_sparkmq(tmp: str, n: int, batch: int, m: int) -> dict:
    from sparkmq.client import Message, Producer, SimpleConsumer
    port, admin = free_port(), free_port()
    conf = os.path.join(tmp, "broker.properties")
    with open(conf, "w") as f:
        f.write(f"brokerName=bench\nbrokerId=0\nflushDiskType=ASYNC_FLUSH\n"
                f"flushIntervalCommitLog=500\nstorePathRootDir={tmp}/sparkmq\n"
                f"namesrvAddr=\nbrokerIP1=127.0.0.1\nlistenPort={port}\nadminPort={admin}\n"
                f"autoCreateTopicEnable=true\ndefaultTopicQueueNums=4\n")
    with process([sys.executable, "-m", "sparkmq.broker", "-c", conf], port):
        ep = f"127.0.0.1:{port}"
        p = Producer(ep, request_timeout_s=30)
        c = SimpleConsumer(ep, "bench", {"e2e": "*"})
        try:
            p.send(Message("tput", BODY))        # create topics, warm up channels
            p.send(Message("lat", BODY))
            p.send(Message("e2e", b"warm"))
            for x in c.receive(8, wait_s=2):
                c.ack(x)
            t0 = time.perf_counter()
            for _ in range(n // batch):
                p.send_batch([Message("tput", BODY) for _ in range(batch)])
            tput = (n // batch) * batch / (time.perf_counter() - t0)
            lat = []
            for _ in range(m):
                t = time.perf_counter()
                p.send(Message("lat", BODY))
                lat.append(time.perf_counter() - t)

            def recv(stop, got):
                while not stop.is_set():
                    for x in c.receive(16, invisible_duration_s=30, wait_s=2):
                        got.put(time.perf_counter())
                        c.ack(x)
            e2e = ping_pong(recv, lambda: p.send(Message("e2e", BODY)), m)
        finally:
            c.close()
            p.shutdown()
    return {"tput": tput, "lat": lat, "e2e": e2e}


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
        for _ in range(m):
            t0 = time.perf_counter()
            send()
            out.append(got.get(timeout=10) - t0)
    finally:
        stop.set()
        t.join(10)
    return out


# ---------------------------------------------------------------- redis
def bench_redis(tmp: str, n: int, batch: int, m: int) -> dict | None:
    binary = ensure_apt("redis-server", "redis-server")
    if not binary or not ensure_pip("redis", "redis", "hiredis"):
        return None
    import redis
    port = free_port()
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp, "--save", "",
           "--appendonly", "yes", "--appendfsync", "everysec", "--protected-mode", "no"]
    with process(cmd, port):
        r = redis.Redis(port=port)
        r.ping()
        t0 = time.perf_counter()
        for _ in range(n // batch):
            pipe = r.pipeline(transaction=False)
            for _ in range(batch):
                pipe.xadd("tput", {"b": BODY})
            pipe.execute()
        tput = (n // batch) * batch / (time.perf_counter() - t0)
        lat = []
        for _ in range(m):
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
    return {"tput": tput, "lat": lat, "e2e": e2e}


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
        t0 = time.perf_counter()
        for _ in range(n // batch):
            futs = [await js.publish_async("tput", BODY) for _ in range(batch)]
            await asyncio.gather(*futs)
        tput = (n // batch) * batch / (time.perf_counter() - t0)
        lat = []
        for _ in range(m):
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
        for _ in range(m):
            t0 = time.perf_counter()
            await js.publish("e2e", BODY)
            e2e.append(await asyncio.wait_for(got.get(), 10) - t0)
        stop.set()
        await asyncio.wait_for(task, 10)
    finally:
        await nc.close()
        await nc2.close()
    return {"tput": tput, "lat": lat, "e2e": e2e}


# ---------------------------------------------------------------- report
def report(results: dict[str, dict | None]) -> None:
    ours = results["sparkmq"]
    rows = [("batched throughput (msg/s)", "tput", None, True),
            ("sync send p50 (ms)", "lat", 0.50, False), ("sync send p99 (ms)", "lat", 0.99, False),
            ("end-to-end p50 (ms)", "e2e", 0.50, False), ("end-to-end p99 (ms)", "e2e", 0.99, False)]
    peers = [k for k, v in results.items() if k != "sparkmq" and v is not None]
    head = f"{'metric':<28}{'sparkmq':>12}" + "".join(f"{p:>12}{'ratio':>8}" for p in peers)
    print(head)
    print("-" * len(head))
    for label, key, q, higher_better in rows:
        def val(res):
            return res[key] if q is None else pct(res[key], q)
        line = f"{label:<28}{val(ours):>12.2f}"
        for p in peers:
            v = val(results[p])
            line += f"{v:>12.2f}{val(ours) / v:>8.2f}"
        print(line)
    print("ratio = sparkmq / peer (throughput: higher is better; latency: lower is better)")
    for k, v in results.items():
        if v is None:
            print(f"# {k}: not run (see above)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (about a minute)")
    ap.add_argument("--batch", type=int, default=100)
    args = ap.parse_args(argv)
    n, m = (20_000, 300) if args.quick else (100_000, 2_000)
    print(f"# 1 KiB messages; throughput: {n} msgs in batches of {args.batch}; "
          f"latencies over {m} sends")
    results: dict[str, dict | None] = {}
    for name, fn in (("sparkmq", bench_sparkmq), ("redis", bench_redis), ("nats", bench_nats)):
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
            t = time.perf_counter()
            try:
                results[name] = fn(tmp, n, args.batch, m)
            except Exception as e:
                if name == "sparkmq":
                    raise
                print(f"# {name} failed: {e!r}; skipped")
                results[name] = None
            print(f"# {name}: done in {time.perf_counter() - t:.1f} s", flush=True)
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
