"""Store benchmark: sparkmq's append and read paths against plain pyarrow, in one run.

    .venv/bin/python bench/bench_store.py [--quick] [--dir DIR] [--skip-memory]
                                          [--only append read memory]

1. append of 1 KiB messages in batches of 1, 100 and 1000 per call, ASYNC_FLUSH
   and SYNC_FLUSH. Columnar ``Store.append_batch`` for every batch size, and
   ``Store.append(list[Message])`` for batches of 100 (the object path).
   The limit: pyarrow writing the same record batches (SEGMENT_SCHEMA, the
   same bytes) as one IPC stream (``pa.ipc.new_stream`` on ``pa.OSFile``) to
   a file in the same directory. ASYNC limit: ``os.fdatasync`` once at the end.
   SYNC limit: ``os.fdatasync`` after every batch. sparkmq's time covers the
   append calls plus ``Store.flush()`` at the end (fsync + publish to _log);
   opening and closing the store are not timed.
2. range read of one queue (all columns) via ``Store.read_table`` and
   ``Store.iter_batches`` on a store reopened with mode="r" (cold ConsumeQueue
   from Parquet, batches memory-mapped), against the limit:
   ``pa.ipc.open_stream(pa.memory_map(segment)).read_all()`` over the same
   segment files (no queue_offset/physical_offset/message_id columns).
   Then the checksum's cost: the same ``read_table`` with every batch's CRC32C
   checked and with the check off (``checksum.VERIFY = False``), alternated five
   times each in one run, on a fresh reader (cold: every batch checked) and on one
   reader (warm: each batch checked once); those rows' "limit" is the unchecked
   read, so their ratio is unchecked / checked time (target >= 0.9).
3. memory: a 2 GiB append (1 KiB messages, batches of 1000, default 1 GiB
   segments, so it rolls) in a subprocess; reports its peak RSS (VmHWM: the
   child's own high-water mark; ru_maxrss would include the parent's RSS).
   --quick: 256 MiB with 128 MiB segments.

MB/s counts body bytes (1 KiB per message) on both sides. ratio = sparkmq /
limit (1.0 = as fast as pyarrow alone). Data lives in a fresh folder under
/tmp (or --dir), deleted at the end.
"""
from __future__ import annotations

import argparse
import glob
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from sparkmq.log import checksum
from sparkmq.log import format as fmt
from sparkmq.log.message import Message
from sparkmq.log.store import Store
from sparkmq.progress import track

BODY_BYTES = 1024
TOPIC = "bench"
MIB = 1 << 20

# messages per (batch size, flush mode); SYNC batch 1 is one fdatasync per message
FULL_COUNTS = {(1, "ASYNC_FLUSH"): 20_000, (100, "ASYNC_FLUSH"): 200_000,
               (1000, "ASYNC_FLUSH"): 500_000, (1, "SYNC_FLUSH"): 2_000,
               (100, "SYNC_FLUSH"): 100_000, (1000, "SYNC_FLUSH"): 300_000}
QUICK_COUNTS = {k: max(k[0], v // 10) for k, v in FULL_COUNTS.items()}
FULL_READ = 200_000
QUICK_READ = 50_000
FULL_MEMORY_BYTES = 2 << 30
QUICK_MEMORY_BYTES = 256 << 20


def make_batch(n: int, seed: int = 0) -> pa.RecordBatch:
    """``n`` messages of the segment schema with random 1 KiB bodies, queue 0."""
    rng = np.random.default_rng(seed)
    bodies = rng.integers(0, 256, n * BODY_BYTES, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (n + 1) * BODY_BYTES, BODY_BYTES, dtype=np.int32)
    body = pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.tobytes()),
                                                        pa.py_buffer(bodies)])
    now = int(time.time() * 1000)
    ts = pa.array(np.full(n, now, np.int64)).cast(fmt.TS)
    cols = {"topic": pa.array([TOPIC] * n, pa.string()),
            "queue_id": pa.array(np.zeros(n, np.int32)),
            "body": body, "born_timestamp": ts, "store_timestamp": ts,
            "store_host": pa.array(["127.0.0.1:10911"] * n, pa.string()),
            "reconsume_times": pa.array(np.zeros(n, np.int32)),
            "message_type": pa.array(np.zeros(n, np.int8))}
    arrays = [cols.get(f.name, pa.nulls(n, f.type)) for f in fmt.SEGMENT_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=fmt.SEGMENT_SCHEMA)


def open_store(path: str, flush: str, **extra) -> Store:
    store = Store.open(path, flushDiskType=flush, **extra)
    store.create_topic(TOPIC, read_queue_nums=1, write_queue_nums=1, exist_ok=True)
    return store


# ---------------------------------------------------------------- append
def limit_append(path: str, batches: list[pa.RecordBatch], sync_each: bool) -> float:
    """Seconds for pyarrow to write ``batches`` as one IPC stream (+ fdatasync)."""
    t0 = time.perf_counter()
    with pa.OSFile(path, "wb") as sink:
        writer = pa.ipc.new_stream(sink, fmt.SEGMENT_SCHEMA)
        fd = os.open(path, os.O_RDONLY)
        try:
            for b in batches:
                writer.write_batch(b)
                if sync_each:
                    sink.flush()
                    os.fdatasync(fd)
            writer.close()
            sink.flush()
            os.fdatasync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def store_append_batch(path: str, batches: list[pa.RecordBatch], flush: str) -> float:
    store = open_store(path, flush)
    try:
        t0 = time.perf_counter()
        for b in batches:
            res = store.append_batch(b)
            assert res.status.name == "PUT_OK", res.status
        store.flush()
        return time.perf_counter() - t0
    finally:
        store.close()


def store_append_objects(path: str, batches: list[pa.RecordBatch], flush: str) -> float:
    groups = [[Message(TOPIC, body, queue_id=0, born_host=None)
               for body in b.column("body").to_pylist()] for b in batches]
    store = open_store(path, flush)
    try:
        t0 = time.perf_counter()
        for g in groups:
            res = store.append(g)
            assert res[-1].ok, res[-1].status
        store.flush()
        return time.perf_counter() - t0
    finally:
        store.close()


def bench_append(root: str, counts: dict, rows: list) -> None:
    for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        for size in (1, 100, 1000):
            n = counts[(size, flush)]
            template = make_batch(size, seed=size)
            batches = [template] * (n // size)
            msgs = len(batches) * size
            d = tempfile.mkdtemp(dir=root)
            t_lim = limit_append(os.path.join(d, "limit.arrow"), batches, flush == "SYNC_FLUSH")
            t_sm = store_append_batch(os.path.join(d, "store"), batches, flush)
            rows.append(_row(f"append_batch x{size} {flush}", msgs, t_sm, t_lim))
            if size == 100:
                t_obj = store_append_objects(os.path.join(d, "store-obj"), batches, flush)
                rows.append(_row(f"append(list[Message]) x{size} {flush}", msgs, t_obj, t_lim))
            shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- read
def bench_read(root: str, n: int, rows: list) -> None:
    d = tempfile.mkdtemp(dir=root)
    path = os.path.join(d, "store")
    store = open_store(path, "ASYNC_FLUSH")
    template = make_batch(1000, seed=7)
    for _ in track(range(n // 1000), "appends", unit="batches"):
        store.append_batch(template)
    store.close()
    msgs = (n // 1000) * 1000
    segs = sorted(glob.glob(os.path.join(path, fmt.COMMITLOG_DIR, "*.arrow")))

    def limit() -> float:
        t0 = time.perf_counter()
        total = 0
        for s in segs:
            total += pa.ipc.open_stream(pa.memory_map(s, "r")).read_all().num_rows
        assert total == msgs, (total, msgs)
        return time.perf_counter() - t0

    reader = Store.open(path, mode="r")
    try:
        def read_table() -> float:
            t0 = time.perf_counter()
            t = reader.read_table(TOPIC, 0, 0)
            assert t.num_rows == msgs, t.num_rows
            return time.perf_counter() - t0

        def iter_batches() -> float:
            t0 = time.perf_counter()
            total = sum(b.num_rows for b in reader.iter_batches(TOPIC, 0, 0))
            assert total == msgs, total
            return time.perf_counter() - t0

        limit()   # warm the page cache for both sides
        t_lim = best_of(limit)
        rows.append(_row("read_table one queue", msgs, best_of(read_table), t_lim))
        rows.append(_row("iter_batches one queue", msgs, best_of(iter_batches), t_lim))
    finally:
        reader.close()
    checksum_cost(rows, msgs, path)
    shutil.rmtree(d, ignore_errors=True)


def checksum_cost(rows: list, msgs: int, path: str) -> None:
    """The same range read with the batch checksums checked and with the check turned off
    (``checksum.VERIFY``), alternated in one run; each row's ratio is unchecked time /
    checked time (1.0 = checking is free; the target is >= 0.9). "cold": a reader opened
    anew for each read, so every batch is checksummed; "warm": one reader, which checks
    a batch once and remembers it (``checksum.VerifiedBatches``)."""
    def timed(reader) -> float:
        t0 = time.perf_counter()
        assert reader.read_table(TOPIC, 0, 0).num_rows == msgs
        return time.perf_counter() - t0

    def cold() -> float:
        with Store.open(path, mode="r") as reader:
            return timed(reader)

    times: dict[tuple[str, bool], list[float]] = {}
    try:
        with Store.open(path, mode="r") as warm_reader:
            for _ in range(5):
                for check in (False, True):
                    checksum.VERIFY = check
                    times.setdefault(("cold", check), []).append(cold())
                    times.setdefault(("warm", check), []).append(timed(warm_reader))
    finally:
        checksum.VERIFY = True
    for kind in ("cold", "warm"):
        rows.append(_row(f"read_table checked/unchecked {kind}", msgs,
                         min(times[(kind, True)]), min(times[(kind, False)])))


def fixed_cost(root: str, calls: int = 3000) -> str:
    """The fixed CPU cost of one ``append_batch`` (issue 16 item 4; target <= 150 us): a
    one-row batch already in SEGMENT_SCHEMA appended ``calls`` times (ASYNC_FLUSH),
    ``time.process_time`` per call, against the floor of any append of it in the same
    run: the same batch written as an Arrow IPC stream message to a file (pyarrow's
    serialization plus one ``write``)."""
    d = tempfile.mkdtemp(dir=root)
    store = open_store(os.path.join(d, "store"), "ASYNC_FLUSH")
    one = make_batch(1, seed=11)
    try:
        for _ in range(300):
            store.append_batch(one)
        t0 = time.process_time()
        for _ in range(calls):
            store.append_batch(one)
        ours = (time.process_time() - t0) / calls
    finally:
        store.close()
    with open(os.path.join(d, "floor.arrow"), "wb") as f:
        sink = pa.PythonFile(f, mode="w")
        writer = pa.ipc.new_stream(sink, one.schema)
        for _ in range(300):
            writer.write_batch(one)
        t0 = time.process_time()
        for _ in range(calls):
            writer.write_batch(one)
            f.flush()
        floor = (time.process_time() - t0) / calls
        writer.close()
    shutil.rmtree(d, ignore_errors=True)
    return (f"one-row append_batch: {ours * 1e6:.0f} us CPU per call (target <= 150); "
            f"IPC write floor {floor * 1e6:.0f} us; ratio {ours / floor:.1f}x")


def best_of(fn, repeat: int = 3) -> float:
    return min(fn() for _ in range(repeat))


# ---------------------------------------------------------------- memory
def memory_child(path: str, total_bytes: int, segment_bytes: int) -> None:
    """Run in a subprocess: append ``total_bytes`` of 1 KiB messages; print peak RSS."""
    store = open_store(path, "ASYNC_FLUSH", mappedFileSizeCommitLog=segment_bytes)
    template = make_batch(1000, seed=3)
    n_batches = total_bytes // (1000 * BODY_BYTES)
    t0 = time.perf_counter()
    for _ in track(range(n_batches), "appends", unit="batches"):
        store.append_batch(template)
    store.flush()
    elapsed = time.perf_counter() - t0
    segments = len(store.commitlog.segments())
    store.close()
    print(f"{peak_rss_mib():.0f} {n_batches * 1000} {elapsed:.3f} {segments} {rss_split()}")


def peak_rss_mib() -> float:
    """This process's peak resident set (MiB): ``VmHWM`` of /proc/self/status.

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries the high-water mark
    of the address space a process had before ``exec`` into it, so a child
    started by a big parent (fork/vfork + exec) reports at least the parent's RSS.
    ``VmHWM`` belongs to the child's own address space.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


def rss_split() -> str:
    """Current anonymous / file-backed RSS (Linux /proc), to tell heap from mapped pages."""
    try:
        with open("/proc/self/status") as f:
            kv = dict(line.split(":", 1) for line in f if line.startswith(("RssAnon", "RssFile")))
        return "anon={}MiB,file={}MiB".format(
            *(int(kv[k].split()[0]) // 1024 for k in ("RssAnon", "RssFile")))
    except (OSError, KeyError, ValueError):
        return "n/a"


def bench_memory(root: str, total_bytes: int, segment_bytes: int) -> str:
    d = tempfile.mkdtemp(dir=root)
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", os.path.join(d, "store"),
             str(total_bytes), str(segment_bytes)],
            capture_output=True, text=True, timeout=1800, check=True).stdout.split()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    peak, msgs, secs, segments = float(out[0]), int(out[1]), float(out[2]), int(out[3])
    split = out[4] if len(out) > 4 else "n/a"
    return (f"memory: appended {total_bytes / MIB:.0f} MiB ({msgs} msgs, batches of 1000, "
            f"{segment_bytes / MIB:.0f} MiB segments, {segments} segments) in {secs:.1f} s "
            f"({total_bytes / MIB / secs:.0f} MB/s); peak RSS {peak:.0f} MiB "
            f"(target < 400 MiB: {'OK' if peak < 400 else 'MISSED'}); RSS after close {split}")


# ---------------------------------------------------------------- report
def _row(name: str, msgs: int, t_sm: float, t_lim: float) -> tuple:
    mb = msgs * BODY_BYTES / MIB
    return (name, msgs, mb / t_sm, msgs / t_sm, mb / t_lim, msgs / t_lim, t_lim / t_sm)


def print_table(rows: list) -> None:
    head = ("case", "msgs", "sparkmq MB/s", "sparkmq msg/s", "limit MB/s", "limit msg/s",
            "ratio")
    print(f"{head[0]:<38} {head[1]:>8} {head[2]:>13} {head[3]:>14} {head[4]:>11} "
          f"{head[5]:>12} {head[6]:>6}")
    for name, msgs, smb, smsg, lmb, lmsg, ratio in rows:
        print(f"{name:<38} {msgs:>8} {smb:>13.1f} {smsg:>14.0f} {lmb:>11.1f} "
              f"{lmsg:>12.0f} {ratio:>6.2f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--memory-child":
        memory_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small run (about a tenth)")
    ap.add_argument("--dir", default=None, help="parent folder for the data (default /tmp)")
    ap.add_argument("--skip-memory", action="store_true", help="skip the memory run")
    ap.add_argument("--only", nargs="+", choices=("append", "read", "memory"),
                    default=("append", "read", "memory"), help="run only these parts")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="sparkmq-bench-", dir=args.dir)
    try:
        rows: list = []
        if "append" in args.only:
            bench_append(root, QUICK_COUNTS if args.quick else FULL_COUNTS, rows)
        if "read" in args.only:
            bench_read(root, QUICK_READ if args.quick else FULL_READ, rows)
        print(f"sparkmq store benchmark ({'quick' if args.quick else 'full'}); "
              f"pyarrow {pa.__version__}; {os.cpu_count()} cores; data in {root}")
        print_table(rows)
        if "append" in args.only:
            print(fixed_cost(root))
        if not args.skip_memory and "memory" in args.only:
            if args.quick:
                print(bench_memory(root, QUICK_MEMORY_BYTES, 128 * MIB))
            else:
                print(bench_memory(root, FULL_MEMORY_BYTES, 1 << 30))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
