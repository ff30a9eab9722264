"""Retention planning cost (log/retention.py) against a reference in the same run.

A store with many topics sharing small segments; every message is expired. Timed:

- **plan, default topics**: ``Store.retention_plan(force_hour=True)`` when every topic is on
  the broker default (segments judged from the cached per-segment summary; first pass
  builds the summaries, the second reuses them);
- **plan, N own topics**: the same with ``retentionMs`` set on N topics (a binary search per
  queue of those topics over the ConsumeQueue Parquet files);
- **plan + apply**: ``run_retention(force_hour=True)`` (plan, publish, one RETENTION commit).

**Reference**: the pass before per-topic retention on the same store in the same run: one
read of the last batch of every sealed segment (its newest ``store_timestamp``), plus, when
segments go, its binary search of every queue's new floor (``retention.queue_floors_at``).

    .venv/bin/python bench/bench_retention.py [--quick] [--dir DIR]
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc

from sparkmq import Store
from sparkmq.log import segment as seg
from sparkmq.log.retention import queue_floors_at
from sparkmq.progress import track

HOUR_MS = 3_600_000


class Clock:
    def __init__(self, ms: int):
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def build(url: str, clock: Clock, topics: int, queues: int, messages: int) -> Store:
    s = Store.open(url, clock_ms=clock, start_services=False,
                   mappedFileSizeCommitLog=1 << 20)
    for t in range(topics):
        s.create_topic(f"T{t}", read_queue_nums=queues, write_queue_nums=queues)
    per_batch = 100
    body = b"x" * 200
    for i in track(range(messages // per_batch), "appends", unit="batches"):
        t = i % topics
        s.append_batch(pa.table({"topic": [f"T{t}"] * per_batch,
                                 "queue_id": pa.array([j % queues for j in range(per_batch)],
                                                      pa.int32()),
                                 "body": [body] * per_batch}))
        clock.ms += 10
    s.flush()
    return s


def old_rule(s: Store) -> int:
    n = 0
    for ref in s.commitlog.segments():
        if not ref.sealed:
            break
        buf = s.sfs.read_buffer(ref.path, cache=True)
        res = seg.scan(buf)
        if res.positions:
            b = seg.read_batch_at(buf, res.positions[-1])
            pc.max(b.column("store_timestamp").cast(pa.int64()))
        n += 1
    return n


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in track(range(repeat), "runs"):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir")
    args = ap.parse_args()
    topics, queues, messages = (50, 4, 100_000) if args.quick else (200, 4, 400_000)
    root = tempfile.mkdtemp(prefix="sparkmq-bench-retention-", dir=args.dir)
    try:
        clock = Clock(1_800_000_000_000)
        s = build(f"{root}/store", clock, topics, queues, messages)
        young = timed(lambda: s.retention_plan(force_hour=True))      # nothing expired yet
        young_ref = timed(lambda: old_rule(s))
        clock.ms += 100 * HOUR_MS
        nseg = old_rule(s)
        last_end = [r for r in s.commitlog.segments() if r.sealed][-1].end_offset
        ref = timed(lambda: (old_rule(s), queue_floors_at(s, last_end, {})))
        first = timed(lambda: s.retention_plan(force_hour=True), repeat=1)
        cached = timed(lambda: s.retention_plan(force_hour=True))
        own = max(1, topics // 10)
        for t in range(own):
            s.update_topic(f"T{t}", retention_ms=HOUR_MS)
        with_own = timed(lambda: s.retention_plan(force_hour=True))
        detail = timed(lambda: s.retention_plan(force_hour=True, detail=True), repeat=1)
        t0 = time.perf_counter()
        removed = s.run_retention(force_hour=True)
        apply_s = time.perf_counter() - t0
        s.close()
        print(f"store: {topics} topics x {queues} queues, {messages:,} messages, "
              f"{nseg} sealed segments of 1 MiB")
        print(f"{'nothing expired: plan':<55} {young * 1000:9.1f} ms   "
              f"x{young / young_ref:6.1f} of its reference ({young_ref * 1000:.1f} ms)")
        rows = [("reference: old pass (segment rule + per-queue search)", ref),
                ("plan, default topics, first (builds summaries)", first),
                ("plan, default topics, cached summaries", cached),
                (f"plan, {own} topics with own retention", with_own),
                ("plan with detail (admin: every queue probed)", detail),
                (f"run_retention: plan + commit ({len(removed)} segments)", apply_s)]
        for name, sec in rows:
            print(f"{name:<55} {sec * 1000:9.1f} ms   x{sec / ref:6.1f} of reference")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
