"""The cyclic garbage collector under a broker's sends: what the store keeps of each send
and what a full pass of the collector over it costs (GIL held: every request waits).

    .venv/bin/python bench/bench_gc.py [--sends N] [--quick]

An in-process broker (ASYNC_FLUSH, 4 queues) takes ``N`` (default 100,000; ``--quick``
20,000) RocketMQ SendMessage calls of one plain 1 KiB message each, made as on the gRPC
server's loop (bench_cold's ``grpc_send``: the request's bytes to the answer's), after
its start-up heap was frozen as the daemon freezes it (``sparkmq.heap.settle``).
``gc.callbacks`` time every pass of the collector.

Printed: the time a send took, the collector's share of it per generation, every full
pass (the send it came at, its ms, as a multiple of a send's mean time), and the objects
the collector tracks at the end, by type: what the store keeps of the sends (the
in-memory ConsumeQueue's chunks, up to ``memoryConsumeQueueBytes``; the commit log's
cache of the batches, up to 64 MiB) is what a full pass visits.
"""
from __future__ import annotations

import argparse
import collections
import gc
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from bench_cold import _Context, grpc_send, in_process_broker, plain_request  # noqa: E402


def run(sends: int) -> None:
    from sparkmq import heap
    tmp = tempfile.mkdtemp(prefix="bench-gc-")
    broker = in_process_broker(tmp, flightEnable="false", lease_timeout_ms=3_600_000)
    try:
        send = grpc_send(broker, plain_request("gc", 1), _Context())
        for _ in range(100):
            send()
        heap.settle()
        paused = [0.0, 0.0, 0.0]
        full: list[tuple[int, float]] = []
        at = [0, 0.0]

        def timed(phase: str, info: dict) -> None:
            if phase == "start":
                at[1] = time.perf_counter()
                return
            took = time.perf_counter() - at[1]
            paused[info["generation"]] += took
            if info["generation"] == 2:
                full.append((at[0], took))
        gc.callbacks.append(timed)
        try:
            t0 = time.perf_counter()
            for i in range(sends):
                at[0] = i
                send()
            wall = time.perf_counter() - t0
        finally:
            gc.callbacks.remove(timed)
        mean = wall / sends
        print(f"{sends:,} sends: {mean * 1e6:.1f} us a send (in process, no network)")
        for g in range(3):
            print(f"  generation {g} passes: {paused[g] / sends * 1e6:.2f} us a send "
                  f"({paused[g] / wall:.1%} of the time)")
        print(f"  full passes: {len(full)}")
        for i, took in full:
            print(f"    at send {i:>7,}: {took * 1e3:6.1f} ms = {took / mean:6.0f} sends' time")
        kinds = collections.Counter(type(o).__name__ for o in gc.get_objects())
        print(f"  tracked objects at the end (the frozen start-up heap aside): "
              f"{sum(kinds.values()):,}")
        for name, count in kinds.most_common(5):
            print(f"    {name:<24}{count:>9,}")
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sends", type=int, default=None, help="sends (default 100,000)")
    ap.add_argument("--quick", action="store_true", help="20,000 sends")
    args = ap.parse_args(argv)
    run(args.sends or (20_000 if args.quick else 100_000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
