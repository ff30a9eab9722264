"""Broker memory under small sends (issue 18 item 4): sequential sends of 10 x 1 KiB
messages, each to the next of 1,000 topics, for a fixed time; the broker's RSS sampled
every few seconds. Two brokers in the same run: with the default byte budget
(``memoryConsumeQueueBytes`` 64 MiB) and, as the reference, with it lifted (only the
entry cap, as before the budget existed).

Printed: RSS after warm-up (a third of the run), at the end, and the growth between them
(target: within 10 % with the budget), and the same for the anonymous part (RssAnon: the
heap, without file-backed pages such as the memory-mapped segments, which the kernel may
drop at will).

    .venv/bin/python bench/bench_memory.py            # quick: 60 s per broker
    .venv/bin/python bench/bench_memory.py --full     # 300 s per broker
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_broker import process  # noqa: E402
from bench_broker import broker_conf  # noqa: E402
from bench_polls import rss_kib  # noqa: E402
from sparkmq.progress import track  # noqa: E402

TOPICS = 1000
BODY = b"x" * 1024


def run(tmp: str, seconds: float, extra: dict) -> list[tuple[float, int, int, int]]:
    """(elapsed s, messages sent, broker RSS KiB, its anonymous part KiB) samples of one
    broker's run."""
    from sparkmq.client import Message, Producer
    conf, port, _ = broker_conf(tmp, defaultTopicQueueNums=8, **extra)
    samples = []
    with process([sys.executable, "-m", "sparkmq.broker", "-c", conf], port) as broker:
        p = Producer(f"127.0.0.1:{port}", request_timeout_s=30)
        try:
            for t in range(TOPICS):                     # create the topics first
                p.send(Message(f"T{t}", b"c"))
            sent, i = 0, 0
            t0 = next_sample = time.monotonic()
            while True:
                now = time.monotonic()
                if now >= next_sample:
                    samples.append((now - t0, sent, rss_kib(broker.pid),
                                    rss_kib(broker.pid, "RssAnon")))
                    next_sample += max(1.0, seconds / 30)
                if now - t0 >= seconds:
                    break
                p.send_batch([Message(f"T{i % TOPICS}", BODY, keys=[f"k{sent + j}"])
                              for j in range(10)])
                sent += 10
                i += 1
        finally:
            p.shutdown()
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the default length (60 s each)")
    ap.add_argument("--full", action="store_true", help="300 s per broker")
    args = ap.parse_args()
    seconds = 300.0 if args.full else 60.0
    cases = [("byte budget (default)", {}),
             ("budget lifted (reference)", {"memoryConsumeQueueBytes": 1 << 40})]
    print(f"# broker RSS, sequential sends of 10 x 1 KiB to {TOPICS} topics x 8 queues, "
          f"{seconds:.0f} s per broker")
    print(f"{'case':<28} {'messages':>9} {'RSS warm MiB':>13} {'RSS end MiB':>12} "
          f"{'growth':>7} {'MiB/100k msgs':>14} {'anon warm':>10} {'anon end':>9} "
          f"{'anon growth':>12}")
    for label, extra in track(cases, "cases"):
        with tempfile.TemporaryDirectory() as tmp:
            samples = run(tmp, seconds, extra)
        warm = next(s for s in samples if s[0] >= seconds / 3)
        end = samples[-1]
        per = (end[2] - warm[2]) / 1024 / max(1, end[1] - warm[1]) * 100_000
        print(f"{label:<28} {end[1]:>9} {warm[2] / 1024:>13.1f} {end[2] / 1024:>12.1f} "
              f"{end[2] / warm[2]:>7.2f} {per:>14.1f} {warm[3] / 1024:>10.1f} "
              f"{end[3] / 1024:>9.1f} {end[3] / warm[3]:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
