"""Delayed-message benchmark: a real broker on 127.0.0.1 driven over its gRPC MessagingService.

1. Baseline: send throughput of normal 1 KiB messages (batches of 100 per SendMessage) with no
   delayed message parked.
2. Park N delayed messages (delivery timestamps spread uniformly over SPREAD seconds, starting
   LEAD seconds from now); measure the same send throughput with them parked but none due,
   then while the scheduler delivers.
3. Wait until all N are delivered; lateness = store time of the delivered copy - due time;
   measure the idle send throughput again. Ratios are against the mean of the two idle runs
   (the store grows during the run, and this shared machine drifts).

    .venv/bin/python bench/bench_delay.py            # 100,000 over 60 s
    .venv/bin/python bench/bench_delay.py --quick    # 10,000 over 10 s
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import grpc
import numpy as np
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import free_port  # noqa: E402

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--count", type=int)
    ap.add_argument("--spread-s", type=float)
    args = ap.parse_args(argv)
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
    return 0 if late.size == n and (late >= 0).all() else 1


if __name__ == "__main__":
    sys.exit(main())
