"""Open long polls against sends (issue 18 item 1): a producer's sync send p50 while N
consumers long-poll an empty topic, as a ratio of the same send with no poll open, in the
same run; and the broker's memory per held poll (RSS of the broker process).

Before the asyncio server each poll held one of the 128 gRPC workers: 120 polls made
sends p50 6.2 ms, 140 stalled them (2 sends in 10 s). Now a poll is a suspended
coroutine; the broker runs with ``grpcThreadPoolNums=32`` here, so every N above 32 would
have stalled the old design.

    .venv/bin/python bench/bench_polls.py            # N = 0, 100, 500, 2000 (the issue's)
    .venv/bin/python bench/bench_polls.py --full     # and 5000
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_broker import broker_conf, process  # noqa: E402
from sparkmq.progress import track  # noqa: E402

WORKERS = 32
SENDS = 300


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory in KiB (``field``: VmRSS, or RssAnon for the heap
    without file-backed pages such as memory-mapped segments)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def open_polls(stub, n: int, seconds: int):
    from google.protobuf.duration_pb2 import Duration
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name="idle-group"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name="idle"), id=-1), batch_size=1,
        invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(seconds=seconds))
    return [stub.ReceiveMessage(req, timeout=seconds + 30,
                                metadata=[("x-mq-client-id", f"poller-{i}")]) for i in range(n)]


def held(admin: int, token: str) -> int:
    """Polls the broker holds (``longPollWaiting`` of its admin /status)."""
    import json
    import urllib.request
    req = urllib.request.Request(f"http://127.0.0.1:{admin}/status",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return int(json.load(r).get("longPollWaiting", 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the default sizes")
    ap.add_argument("--full", action="store_true", help="add N = 5000")
    args = ap.parse_args()
    steps = [0, 100, 500, 2000] + ([5000] if args.full else [])
    import grpc
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    from sparkmq.client import Message, Producer
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        conf, port, admin = broker_conf(tmp, grpcThreadPoolNums=WORKERS,
                                        maxLongPollingTimeMs=60000)
        with process([sys.executable, "-m", "sparkmq.broker", "-c", conf], port) as broker:
            ep = f"127.0.0.1:{port}"
            with open(os.path.join(tmp, "mq", "admin.token")) as f:
                token = f.read().strip()
            p = Producer(ep, request_timeout_s=30)
            channel = grpc.insecure_channel(ep)
            stub = MessagingServiceStub(channel)
            try:
                p.send(Message("idle", b"create"))       # the idle topic exists, then is drained
                for c in open_polls(stub, 1, 1):
                    list(c)
                for _ in range(50):
                    p.send(Message("lat", b"x" * 1024))
                for n in track(steps, "held polls steps"):
                    calls = open_polls(stub, n, 50)
                    deadline = time.monotonic() + 30
                    while held(admin, token) < n and time.monotonic() < deadline:
                        time.sleep(0.05)
                    holding = held(admin, token)
                    lat = []
                    for _ in track(range(SENDS), "sends"):
                        t = time.perf_counter()
                        p.send(Message("lat", b"x" * 1024))
                        lat.append(time.perf_counter() - t)
                    rows.append((n, holding, statistics.median(lat) * 1000,
                                 sorted(lat)[int(0.99 * len(lat))] * 1000, rss_kib(broker.pid)))
                    for c in calls:
                        c.cancel()
                    deadline = time.monotonic() + 30
                    while held(admin, token) > 0 and time.monotonic() < deadline:
                        time.sleep(0.05)
            finally:
                channel.close()
                p.shutdown()
    base_p50, base_rss = rows[0][2], rows[0][4]
    print(f"# sync send (1 KiB, ASYNC_FLUSH) while N long polls are open; broker with "
          f"grpcThreadPoolNums={WORKERS}; {SENDS} sends per row")
    base_p99 = rows[0][3]
    print(f"{'N polls':>8} {'held':>6} {'p50 ms':>8} {'p99 ms':>8} {'p50 / N=0':>10} "
          f"{'p99 / N=0':>10} {'RSS MiB':>8} {'KiB/poll':>9}")
    for n, holding, p50, p99, rss in rows:
        per = (rss - base_rss) / n if n else 0.0
        print(f"{n:>8} {holding:>6} {p50:>8.2f} {p99:>8.2f} {p50 / base_p50:>10.2f} "
              f"{p99 / base_p99:>10.2f} {rss / 1024:>8.1f} {per:>9.1f}")
    print("(target: p99 with 2,000 polls within 2x of none; every poll held: held = N)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
