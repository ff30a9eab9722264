"""Freshness benchmark: send-ack -> ``foreachBatch`` latency of a sparkmq stream, against
Spark's own micro-batch floor, in one run.

    .venv/bin/python bench/bench_freshness.py [--quick] [--rate N] [--seconds S]
                                              [--flush ASYNC_FLUSH|SYNC_FLUSH]
                                              [--publish-min-gap-ms G]
                                              [--driver-read-max-messages N]

1. a broker subprocess (``python -m sparkmq.broker``, default publish settings unless
   ``--publish-min-gap-ms``; ``publishMinGapMs`` at or above ``publishIntervalMs``
   turns fast publishing off: the behaviour before it) takes synchronous sends at
   ``--rate`` messages/s with no stream reading: the ``_log/`` commits per second
   of a store nobody streams from;
2. Spark's floor: a local Spark stream of Spark's built-in ``socket`` source (held in
   the driver's memory, no Python worker), default trigger, ``foreachBatch`` recording
   for each line (written at ``--rate`` lines/s) its arrival time minus the time the
   line was written;
3. sparkmq: ``spark.readStream.format("sparkmq")`` of the broker's store, default
   trigger, the same ``foreachBatch``; latency = arrival minus the send's ack; and the
   ``_log/`` commits per second while it runs.

Prints p50/p90/p99 for both, their ratios (sparkmq / floor) and the difference, the
time each query took from ``start()`` to its first batch, the p50 of each part of a
trigger (Spark's progress ``durationMs``) for both, and the commit rates.
``--quick``: 20 s per phase (under 2 minutes in all).
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_broker import free_port, wait_port  # noqa: E402
from bench_spark import spark_session  # noqa: E402

PARTITIONS = 2




def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


class Recorder:
    """``foreachBatch`` target: arrival time (driver clock) of every id seen."""

    def __init__(self, column: str):
        self.column = column
        self.arrived: dict[int, float] = {}
        self.first_batch_s: float | None = None

    def __call__(self, df, batch_id) -> None:
        rows = df.select(self.column).collect()
        now = time.time()
        if self.first_batch_s is None:
            self.first_batch_s = now
        for r in rows:
            raw = r[0]
            text = raw.decode() if isinstance(raw, (bytes, bytearray)) else str(raw)
            if text.isdigit():
                self.arrived.setdefault(int(text), now)


def paced(rate: float, seconds: float, send) -> dict[int, float]:
    """Call ``send(i)`` at ``rate``/s for ``seconds``; i -> time it returned (ack)."""
    sent: dict[int, float] = {}
    t0 = time.monotonic()
    for i in range(int(rate * seconds)):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        send(i)
        sent[i] = time.time()
    return sent


def latencies(sent: dict[int, float], rec: Recorder, settle_s: float = 5.0) -> list[float]:
    """Arrival minus ack of every send that arrived; send ``i`` carries id ``i + 1`` (id 0
    is the line or message that starts the query)."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and sum(i + 1 in rec.arrived for i in sent) < len(sent):
        time.sleep(0.05)
    return [(rec.arrived[i + 1] - t) * 1000.0 for i, t in sent.items() if i + 1 in rec.arrived]


def run_query(spark, df, rec: Recorder, checkpoint: str, feed):
    t0 = time.time()
    q = df.writeStream.foreachBatch(rec).option("checkpointLocation", checkpoint).start()
    try:
        deadline = time.monotonic() + 120
        while rec.first_batch_s is None and time.monotonic() < deadline:
            if q.exception() is not None:
                raise RuntimeError(f"query failed: {q.exception()}")
            time.sleep(0.02)
        start_ms = ((rec.first_batch_s or time.time()) - t0) * 1000.0
        lat = feed()
        TRIGGERS.append(trigger_ms(q.recentProgress))
        return start_ms, lat
    finally:
        q.stop()


#: per query run (floor, then sparkmq): p50 ms of each part of a trigger that read rows
TRIGGERS: list[dict[str, float]] = []
PARTS = ("triggerExecution", "walCommit", "addBatch", "commitOffsets", "latestOffset")


def trigger_ms(progress) -> dict[str, float]:
    """p50 of Spark's ``durationMs`` parts over the micro-batches that read rows (the
    last 100 Spark keeps)."""
    rows = [p.durationMs for p in progress if p.numInputRows]
    return {k: pct([float(d.get(k, 0)) for d in rows], .5) for k in PARTS}


def floor_phase(spark, rate: float, seconds: float, tmp: str):
    """Spark's socket source fed ``rate`` lines/s (a warm line first)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    conn: list = []
    threading.Thread(target=lambda: conn.append(srv.accept()[0]), daemon=True).start()
    df = spark.readStream.format("socket").option("host", "127.0.0.1") \
        .option("port", port).load()
    rec = Recorder("value")

    def feed():
        def send(i):
            conn[0].sendall(b"%d\n" % (i + 1))
        sent = paced(rate, seconds, send)
        return latencies(sent, rec)

    def start_feed():
        # the source connects at start(); a warm line makes the first batch
        deadline = time.monotonic() + 60
        while not conn and time.monotonic() < deadline:
            time.sleep(0.01)
        conn[0].sendall(b"warm\n0\n")
    threading.Timer(0.0, start_feed).start()
    try:
        rec.arrived.clear()
        start_ms, lat = run_query(spark, df, rec, os.path.join(tmp, "ck-floor"), feed)
    finally:
        if conn:
            conn[0].close()
        srv.close()
    return start_ms, lat


def broker(tmp: str, flush: str, gap_ms: int | None):
    port, admin = free_port(), free_port()
    store = os.path.join(tmp, "store")
    conf = os.path.join(tmp, "broker.properties")
    extra = f"publishMinGapMs={gap_ms}\n" if gap_ms is not None else ""
    with open(conf, "w") as f:
        f.write(f"brokerName=fresh\nbrokerId=0\nflushDiskType={flush}\n"
                f"storePathRootDir={store}\nnamesrvAddr=\nbrokerIP1=127.0.0.1\n"
                f"listenPort={port}\nadminPort={admin}\nautoCreateTopicEnable=true\n"
                f"defaultTopicQueueNums=2\n{extra}")
    p = subprocess.Popen([sys.executable, "-m", "sparkmq.broker", "-c", conf],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_port(port, timeout_s=60.0)
    except RuntimeError:
        p.kill()
        raise RuntimeError(f"broker did not start: {p.stderr.read().decode()[-800:]}")
    return p, f"127.0.0.1:{port}", store


def version(store: str) -> int:
    from sparkmq import Snapshot
    return Snapshot.load(store).version


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 s per phase")
    ap.add_argument("--rate", type=float, default=20.0, help="messages per second")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per phase")
    ap.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    ap.add_argument("--publish-min-gap-ms", type=int, default=None,
                    help="the broker's publishMinGapMs (default: its default; 1000 or more: "
                         "no fast publishing)")
    ap.add_argument("--driver-read-max-messages", type=int, default=None,
                    help="the stream's driverReadMaxMessages (default: the source's; 0: every "
                         "micro-batch read by executor tasks)")
    a = ap.parse_args(argv)
    seconds = a.seconds or (20.0 if a.quick else 60.0)
    from sparkmq.client import Message, Producer
    tmp = tempfile.mkdtemp(prefix="sparkmq-fresh-")
    proc = None
    try:
        proc, ep, store = broker(tmp, a.flush, a.publish_min_gap_ms)
        prod = Producer(ep, request_timeout_s=30)
        prod.send(Message("fresh", b"warm"))
        # 1. nobody streams: commits per second of the interval cadence
        idle_s = min(10.0, seconds)
        v0, t0 = version(store), time.monotonic()
        paced(a.rate, idle_s, lambda i: prod.send(Message("fresh", b"x")))
        time.sleep(1.2)
        no_reader_cps = (version(store) - v0) / (time.monotonic() - t0)
        spark = spark_session({"spark.driver.memory": "1g"})
        # 2. Spark's floor
        floor_start_ms, floor = floor_phase(spark, a.rate, seconds, tmp)
        # 3. sparkmq
        rec = Recorder("body")
        r = spark.readStream.format("sparkmq").option("startingOffsets", "latest") \
            .option("topic", "fresh")
        if a.driver_read_max_messages is not None:
            r = r.option("driverReadMaxMessages", str(a.driver_read_max_messages))
        df = r.load(store)
        marks: dict = {}

        def feed():
            time.sleep(2.0)   # the first trigger's marker reaches the broker's next look
            marks["v0"], marks["t0"] = version(store), time.monotonic()
            sent = paced(a.rate, seconds,
                         lambda i: prod.send(Message("fresh", b"%d" % (i + 1))))
            marks["v1"], marks["t1"] = version(store), time.monotonic()
            return latencies(sent, rec)

        # the first batch: one message sent as the query starts
        threading.Timer(1.0, lambda: prod.send(Message("fresh", b"0"))).start()
        mq_start_ms, mq = run_query(spark, df, rec, os.path.join(tmp, "ck-mq"), feed)
        stream_cps = (marks["v1"] - marks["v0"]) / (marks["t1"] - marks["t0"])
        prod.shutdown()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    n = int(a.rate * seconds)
    print(f"\nfreshness, {a.rate:g} msg/s for {seconds:g} s, {a.flush}, "
          f"publishMinGapMs={a.publish_min_gap_ms or 'default'}, driverReadMaxMessages="
          f"{'default' if a.driver_read_max_messages is None else a.driver_read_max_messages}, "
          "default trigger, "
          f"local[{PARTITIONS}]")
    print(f"{'':28}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'seen':>8}{'start ms':>10}")
    for name, lat, start in (("spark floor (socket source)", floor, floor_start_ms),
                             ("sparkmq (send-ack ->)", mq, mq_start_ms)):
        print(f"{name:28}{pct(lat, .5):9.0f}{pct(lat, .9):9.0f}{pct(lat, .99):9.0f}"
              f"{len(lat):>5}/{n:<3}{start:9.0f}")
    print(f"{'ratio sparkmq/floor':28}" + "".join(
        f"{pct(mq, q) / pct(floor, q):9.2f}" for q in (.5, .9, .99)))
    print(f"{'difference ms':28}" + "".join(
        f"{pct(mq, q) - pct(floor, q):9.0f}" for q in (.5, .9, .99)))
    if len(TRIGGERS) == 2:
        print("trigger p50 ms (Spark's durationMs, micro-batches with rows): " + "; ".join(
            f"{k} {TRIGGERS[0][k]:.0f}/{TRIGGERS[1][k]:.0f}" for k in PARTS) +
            "  (floor/sparkmq)")
    print(f"_log/ commits/s: no stream reading {no_reader_cps:.2f}, "
          f"while streaming {stream_cps:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
