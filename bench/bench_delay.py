"""Delayed-message benchmark: a real broker on 127.0.0.1 driven over its gRPC MessagingService.

1. Baseline: send throughput of normal 1 KiB messages (batches of 100 per SendMessage) with no
   delayed message parked.
2. Park N delayed messages (delivery timestamps spread uniformly over SPREAD seconds, starting
   LEAD seconds from now); measure the same send throughput with them parked but none due,
   then while the scheduler delivers.
3. Wait until all N are delivered; lateness = store time of the delivered copy - due time;
   measure the idle send throughput again. Ratios are against the mean of the two idle runs
   (the store grows during the run, and this shared machine drifts).
4. Parked count (issue 18 item 6): park P messages due in 10..70 minutes (half delivery
   timestamps, half delay level 17 = 1 h; 64-byte bodies) over gRPC, stop the broker, then
   restart it in a fresh process and report its start time and RSS (VmRSS after start and a
   few seconds running), against a broker over a store with 0 parked in the same run.

    .venv/bin/python bench/bench_delay.py            # 100,000 over 60 s; 2,000,000 parked
    .venv/bin/python bench/bench_delay.py --quick    # 10,000 over 10 s; 200,000 parked
    .venv/bin/python bench/bench_delay.py --parked-only --parked 2000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from helpers.net import free_port  # noqa: E402

from sparkmq.broker import Broker, BrokerConfig  # noqa: E402
from sparkmq.progress import track  # noqa: E402

BATCH = 100
BODY = b"x" * 1024


def message(topic: str, due_ms: int | None = None) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=topic), body=BODY)
    sp = m.system_properties
    if due_ms is None:
        sp.message_type = pb.NORMAL
    else:
        sp.message_type = pb.DELAY
        sp.delivery_timestamp.FromMilliseconds(int(due_ms))
    return m


def send_all(stub, msgs: list[pb.Message]) -> float:
    """Send in batches; returns messages per second."""
    t0 = time.perf_counter()
    for i in track(range(0, len(msgs), BATCH), "sends", unit="batches"):
        resp = stub.SendMessage(spb.SendMessageRequest(messages=msgs[i:i + BATCH]), timeout=60)
        if resp.status.code != pb.Code.OK:
            raise RuntimeError(f"send failed: {resp.status}")
    return len(msgs) / (time.perf_counter() - t0)


def broker_config(root: str) -> BrokerConfig:
    return BrokerConfig.from_properties({
        "storePathRootDir": os.path.join(root, "store"), "listenPort": str(free_port()),
        "adminPort": str(free_port()), "flushDiskType": "ASYNC_FLUSH",
        "autoCreateTopicEnable": "true", "defaultTopicQueueNums": "4"})


def park_over_grpc(root: str, n: int) -> float:
    """Park ``n`` messages (module docstring, step 4) into a new store under ``root``;
    returns messages per second. Batches are built as they are sent (no list of ``n``)."""
    broker = Broker(broker_config(root)).start()
    try:
        broker.store.create_topic("Parked")
        broker.store.create_topic("Other")
        stub = MessagingServiceStub(grpc.insecure_channel(broker.endpoint))
        rng = np.random.default_rng(11)
        t0 = time.perf_counter()
        now_ms = int(time.time() * 1000)
        for i in range(0, n, 500):
            batch = []
            for j in range(i, min(n, i + 500)):
                m = pb.Message(topic=pb.Resource(name="Parked"), body=b"p" * 64)
                if j % 2:
                    m.system_properties.message_type = pb.NORMAL
                    m.user_properties["DELAY"] = "17"
                else:
                    m.system_properties.message_type = pb.DELAY
                    m.system_properties.delivery_timestamp.FromMilliseconds(
                        now_ms + int(rng.uniform(600_000, 4_200_000)))
                batch.append(m)
            resp = stub.SendMessage(spb.SendMessageRequest(messages=batch), timeout=60)
            if resp.status.code != pb.Code.OK:
                raise RuntimeError(f"send failed: {resp.status}")
        rate = n / max(1e-9, time.perf_counter() - t0)
        if n:
            deadline = time.time() + 600
            while broker.schedule.pending_count() < n and time.time() < deadline:
                time.sleep(0.2)
    finally:
        broker.stop()
    return rate


_RESTART = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
from helpers.net import free_port
from sparkmq.broker import Broker, BrokerConfig
def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
before = rss_mib()
cfg = BrokerConfig.from_properties({
    "storePathRootDir": sys.argv[1], "listenPort": str(free_port()),
    "adminPort": str(free_port()), "flushDiskType": "ASYNC_FLUSH"})
t0 = time.perf_counter()
b = Broker(cfg).start()
start_s = time.perf_counter() - t0
after_start = rss_mib()
time.sleep(3)
print(json.dumps({"start_s": start_s, "rss_before": before, "rss_started": after_start,
                  "rss_running": rss_mib(), "pending": b.schedule.pending_count()}))
b.stop()
"""


def restart_in_child(root: str) -> dict:
    """Start a broker over ``root``'s store in a fresh process: start time, RSS."""
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
    out = subprocess.run([sys.executable, "-c", _RESTART, os.path.join(root, "store"), tests],
                         check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def parked_count_row(parked: int) -> None:
    """Step 4: RSS and start time of a broker with ``parked`` messages vs 0."""
    rows = {}
    for n in (0, parked):
        root = tempfile.mkdtemp(prefix=f"bench-parked-{n}-")
        try:
            rate = park_over_grpc(root, n)
            rows[n] = restart_in_child(root)
            rows[n]["rate"] = rate
        finally:
            shutil.rmtree(root, ignore_errors=True)
    z, p = rows[0], rows[parked]
    print(f"parked count: 0 parked: start {z['start_s']:.2f} s, RSS {z['rss_started']:.0f} MiB "
          f"started / {z['rss_running']:.0f} MiB running; {parked:,} parked (sent at "
          f"{p['rate']:,.0f} msg/s, {p['pending']:,} pending after restart): start "
          f"{p['start_s']:.2f} s, RSS {p['rss_started']:.0f} / {p['rss_running']:.0f} MiB; "
          f"added by parking: {p['rss_running'] - z['rss_running']:+.0f} MiB RSS, "
          f"{p['start_s'] - z['start_s']:+.2f} s start")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--count", type=int)
    ap.add_argument("--spread-s", type=float)
    ap.add_argument("--parked", type=int, help="parked count of step 4 (0.2M quick, 2M full)")
    ap.add_argument("--parked-only", action="store_true", help="run step 4 only")
    args = ap.parse_args(argv)
    parked = args.parked if args.parked is not None else (
        200_000 if args.quick else 2_000_000)
    if args.parked_only:
        parked_count_row(parked)
        return 0
    n = args.count or (10_000 if args.quick else 100_000)
    spread_s = args.spread_s or (10.0 if args.quick else 60.0)
    # parking all of them, and the "parked, none due" measurement, end before the first is due
    lead_s = 5.0 + n / 3_000 + (10.0 if args.quick else 20.0)
    normal_n = 20_000 if args.quick else 50_000
    tmp = tempfile.mkdtemp(prefix="bench-delay-")
    cfg = BrokerConfig.from_properties({
        "storePathRootDir": os.path.join(tmp, "store"), "listenPort": str(free_port()),
        "adminPort": str(free_port()), "flushDiskType": "ASYNC_FLUSH",
        "autoCreateTopicEnable": "true", "defaultTopicQueueNums": "4"})
    broker = Broker(cfg).start()
    try:
        for t in ("Delayed", "Plain"):
            broker.store.create_topic(t)
        ch = grpc.insecure_channel(broker.endpoint)
        stub = MessagingServiceStub(ch)
        send_all(stub, [message("Plain") for _ in range(2_000)])          # warm-up
        base = send_all(stub, [message("Plain") for _ in range(normal_n)])

        start_ms = int(time.time() * 1000) + int(lead_s * 1000)
        dues = start_ms + np.sort(np.random.default_rng(7).uniform(0, spread_s * 1000, n))
        park_rate = send_all(stub, [message("Delayed", d) for d in dues])
        parked = send_all(stub, [message("Plain") for _ in range(normal_n)])
        if time.time() * 1000 >= start_ms:
            print("warning: parking outlasted the lead time; lateness includes send time")
        while time.time() * 1000 < start_ms:
            time.sleep(0.01)
        during = send_all(stub, [message("Plain") for _ in range(normal_n)])
        deadline = time.time() + spread_s + 120
        while broker.schedule.pending_count() and time.time() < deadline:
            time.sleep(0.2)
        after = send_all(stub, [message("Plain") for _ in range(normal_n)])   # idle again
        late = []
        for q in range(4):
            t = broker.store.read_table("Delayed", q, 0, columns=["store_timestamp",
                                                                 "delivery_timestamp"])
            st = t.column("store_timestamp").cast("int64").to_numpy()
            dt = t.column("delivery_timestamp").cast("int64").to_numpy()
            late.append(st - dt)
        late = np.concatenate(late) if late else np.array([])
        ch.close()
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"delayed messages: {n} due over {spread_s:.0f} s; delivered {late.size}; "
          f"early: {int((late < 0).sum())}")
    if late.size:
        print(f"lateness ms: p50 {np.percentile(late, 50):.0f}  p99 {np.percentile(late, 99):.0f}"
              f"  max {late.max():.0f}")
    print(f"parking send rate: {park_rate:,.0f} msg/s")
    idle = (base + after) / 2          # before and after: the store grows during the run
    print(f"send throughput, 1 KiB x{BATCH}/request: idle scheduler {base:,.0f} msg/s before, "
          f"{after:,.0f} after (mean {idle:,.0f}); {n} parked, none due yet {parked:,.0f} "
          f"msg/s (ratio {parked / idle:.2f}); while delivering {during:,.0f} msg/s; ratio "
          f"{during / idle:.2f}")
    parked_count_row(parked)
    return 0 if late.size == n and (late >= 0).all() else 1


if __name__ == "__main__":
    sys.exit(main())
