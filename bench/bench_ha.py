"""Replication benchmark: SYNC_MASTER / ASYNC_MASTER / no replica, and replica catch-up.

    .venv/bin/python bench/bench_ha.py [--quick] [--dir DIR] [--repeat N] [--no-broker]
        [--broker-only] [--pin]

1. send throughput of a master ``Store`` (ASYNC_FLUSH, 1 KiB messages, columnar
   ``append_batch`` of ``--batch`` messages, ``--threads`` sender threads) in
   three modes, in the same run:
   - ``none``: no HA service;
   - ``async``: an ``HAService`` streaming to a replica process, no waiting
     (ASYNC_MASTER);
   - ``sync``: each append then waits in ``HAService.wait_replicated`` for the
     replica's ack of its bytes (SYNC_MASTER; the broker's send path).
   The replica is a separate process (``--replica-child``: its own store,
   ``ReplicaLog`` + ``HAClient``), as it would be on another machine.
   - ``async-null`` / ``sync-null``: the same against a replica process that only
     receives and acks (writes nothing, dispatches nothing): the master's own
     cost of replicating, without the replica's work on the same 2 cores/disk.
   ratio = mode / none in msgs/s (target for sync: >= 0.8), and CPU ratio = the
   master process's CPU per message in ``none`` / in the mode (user + system time
   of the master's threads; the replica process is left out): the throughput ratio
   the master would see on cores of its own, as on two machines (target for
   sync-null: >= 0.9). Modes are rotated between runs (none is not always first).
1b. the same question through a broker subprocess (``--no-broker`` skips it),
   bench_broker.py-style: one Producer making sequential sync ``send_batch`` calls of
   100 x 1 KiB, then single sync sends; ``none`` (ASYNC_MASTER, no HA port) against
   SYNC_MASTER with the ack-only replica (``sync-null``) and with the full replica
   (``sync``); msgs/s ratio, the broker process's CPU per message and its ratio
   (none / mode: the two-machine figure), and what a sync send's p50 gains. Once over
   the RocketMQ gRPC path and once over Arrow Flight (``Producer(transport=...)``).
   The broker's CPU is the sum of its threads' run times (schedstat, ns). ``--pin``:
   the broker's threads on one CPU, the producer and the replica on the other, as the
   broker would have cores of its own (the steadiest form of the two-machine figure).
   The same run gives the link's floor: one stored batch's bytes sent raw over loopback
   to a process asleep in ``recv``, and its 16-byte answer read, as CPU of the sending
   thread (pinned like the broker), and the best CPU ratio that leaves replication:
   none's CPU a batch / (that + the floor).
2. catch-up: a master store with ``--catchup-mib`` of messages (several
   segments); a replica process started on an empty folder follows it until its
   offset equals the master's, then fsyncs; timed from its start to that point
   (process start-up excluded: the child reports when it is ready): "caught up"
   is every byte written and fsynced, what the replica acks (RocketMQ's slave);
   the time until every batch is also dispatched (readable) is printed too. Two limits:
   copying the same segment files with ``shutil.copyfile`` plus fsync of each
   (in-kernel copy, no network), and a raw stream: the same files sent over
   loopback TCP with ``os.sendfile`` to a process that writes and fsyncs them
   (no framing, no ConsumeQueue/Index). ratio = limit time / catch-up time
   (target >= 0.7).

Every figure is repeated ``--repeat`` times (default 2); the range is printed.
Data lives in a fresh folder under /tmp (or --dir), deleted at the end. On one
machine the replica shares the master's disk and cores, which a real replica
does not: ``--replica-dir /dev/shm`` puts the replica's store (and the copy
targets) on another "disk", leaving only the shared cores.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa

from sparkmq.ha.master import HAService
from sparkmq.log.store import Store
from sparkmq.progress import track

SECRET = "bench-secret-0123456789"
TOPIC = "bench"
BODY_BYTES = 1024
MIB = 1 << 20


def make_batch(n: int) -> pa.Table:
    body = np.frombuffer(os.urandom(BODY_BYTES), np.uint8)
    bodies = pa.array([body.tobytes()] * n, pa.binary())
    return pa.table({"topic": pa.array([TOPIC] * n), "body": bodies})


# ---------------------------------------------------------------- the replica child
def replica_child(url: str, port: int) -> None:
    """Follow the master at 127.0.0.1:port into ``url``: print READY, start following
    at the first line on stdin, then answer each line with the replica's written
    offset (``fsync`` first flushes; ``dispatched``: the dispatched offset instead,
    up to which its ConsumeQueue/Index are built and reads see messages); EOF stops."""
    from sparkmq.ha.replica import HAClient, ReplicaLog
    store = Store.open(url, replica=True, mappedFileSizeCommitLog=64 * MIB)
    rlog = ReplicaLog(store)
    print("READY", flush=True)
    sys.stdin.readline()
    client = HAClient(rlog, broker_name="bench", broker_id=1, secret=SECRET,
                      master_address=lambda: f"127.0.0.1:{port}").start()
    print(rlog.offset, flush=True)
    for line in sys.stdin:
        if line.strip() == "fsync":
            store.commitlog.flush(sync=True)
        if line.strip() == "dispatched":
            print(getattr(rlog, "dispatched_offset", rlog.offset), flush=True)
            continue
        print(rlog.offset, flush=True)
    client.stop()
    store.close()


def null_replica_child(port: int) -> None:
    """A replica that only receives and acks (no write, no dispatch): what streaming
    costs the master, without the replica's own work on the same machine."""
    import socket
    from sparkmq.ha.protocol import new_nonce, proof, recv_frame, recv_header, send_frame
    print("READY", flush=True)
    sys.stdin.readline()
    sock = socket.create_connection(("127.0.0.1", port))
    challenge, _ = recv_frame(sock)
    send_frame(sock, {"type": "hello", "brokerName": "bench", "brokerId": 1,
                      "nonce": new_nonce(), "offset": 0, "epochs": [],
                      "proof": proof(SECRET, "replica", challenge["nonce"], "bench")})
    recv_frame(sock)
    state = {"offset": 0}

    def loop():
        sink = memoryview(bytearray(1 << 20))     # payloads dropped into one buffer
        try:
            while True:
                header, left = recv_header(sock)
                size = left
                while left:
                    n = sock.recv_into(sink[:min(left, len(sink))])
                    if n == 0:
                        raise ConnectionError("master closed the connection")
                    left -= n
                if header["type"] == "data":
                    state["offset"] = header["offset"] + size
                    send_frame(sock, {"type": "ack", "offset": state["offset"]})
        except (OSError, ConnectionError):
            pass
    threading.Thread(target=loop, daemon=True).start()
    print(0, flush=True)
    for _ in sys.stdin:
        print(state["offset"], flush=True)


class Child:
    def __init__(self, url: str, port: int, *, null: bool = False):
        args = ["--null-replica-child", str(port)] if null else \
            ["--replica-child", url, str(port)]
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.strip() == "READY", line

    def go(self) -> None:
        """Start following (the process is up and its store open)."""
        self.offset("go")

    def offset(self, cmd: str = "?") -> int:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def wait_offset(child: Child, target: int, timeout_s: float = 600, cmd: str = "?") -> None:
    deadline = time.monotonic() + timeout_s
    while child.offset(cmd) < target:
        if time.monotonic() > deadline:
            raise TimeoutError("replica did not catch up")
        time.sleep(0.002)


# ---------------------------------------------------------------- 1. throughput
def send_run(root: str, mode: str, *, messages: int, batch: int, threads: int,
             replica_root: str | None = None) -> tuple[float, float]:
    """(messages per second, the master process's CPU microseconds per message) for
    ``mode`` in none|async|sync|async-null|sync-null. The CPU figure (user + system
    time of this process, all threads, over the timed sends) leaves out the replica
    process, which on two machines would not share the master's cores."""
    master_url = os.path.join(root, f"m-{mode}-{time.monotonic_ns()}")
    store = Store.open(master_url, mappedFileSizeCommitLog=64 * MIB)
    store.create_topic(TOPIC, read_queue_nums=4, write_queue_nums=4)
    ha = child = None
    if mode != "none":
        ha = HAService(store, broker_name="bench", secret=SECRET).start()
        child = Child(os.path.join(replica_root or root, f"r-{mode}-{time.monotonic_ns()}"),
                      ha.port, null=mode.endswith("-null"))
        child.go()
        deadline = time.monotonic() + 30
        while not ha.replicas() and time.monotonic() < deadline:
            time.sleep(0.01)
    table = make_batch(batch)
    per_thread = messages // threads // batch
    failures = []

    def sender():
        for _ in range(per_thread):
            r = store.append_batch(table)
            if mode.startswith("sync"):
                st = ha.wait_replicated(r.batch_offset + 1, 5000)
                if st.value != "PUT_OK":
                    failures.append(st)

    workers = [threading.Thread(target=sender) for _ in range(threads)]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if child is not None:
        wait_offset(child, store.commitlog.written_offset)   # not timed: drain before stop
        child.close()
        ha.stop()
    store.close()
    assert not failures, failures
    sent = per_thread * threads * batch
    return sent / elapsed, cpu * 1e6 / sent


# ---------------------------------------------------------------- 1b. through a broker
BROKER_MODES = ("none", "sync-null", "sync")
BROKER_TRANSPORTS = ("grpc", "flight")    # the RocketMQ path; the Flight path (its puts
                                         # wait for the replica on pyarrow's threads)


def broker_run(root: str, mode: str, *, batches: int, batch: int, singles: int,
               transport: str = "grpc") -> dict:
    """bench_broker.py-style sync sends through a broker subprocess: ``none`` =
    ASYNC_MASTER without an HA port (no replica); ``sync-null`` = SYNC_MASTER with the
    ack-only replica process; ``sync`` = SYNC_MASTER with the full replica process.
    Returns msgs/s of sequential ``Producer.send_batch`` of ``batch`` messages, the
    broker process's CPU microseconds per message over them, and the single sync
    sends' latencies (s). ``transport``: the Producer's ("grpc" or "flight", the broker's
    Flight port on for the latter)."""
    from bench_broker import free_port, process     # this script's folder is on sys.path
    from sparkmq.client import Message, Producer
    port, admin, ha_port = free_port(), free_port(), free_port()
    folder = os.path.join(root, f"broker-{mode}-{time.monotonic_ns()}")
    conf = os.path.join(root, f"broker-{mode}.properties")
    with open(conf, "w") as f:
        f.write(f"brokerName=bench\nbrokerId=0\nflushDiskType=ASYNC_FLUSH\n"
                f"flushIntervalCommitLog=500\nstorePathRootDir={folder}\nnamesrvAddr=\n"
                f"brokerIP1=127.0.0.1\nlistenPort={port}\nadminPort={admin}\n"
                f"autoCreateTopicEnable=true\ndefaultTopicQueueNums=4\n"
                + (f"flightEnable=true\nflightPort={free_port()}\n" if transport == "flight"
                   else "flightEnable=false\n")
                + ("brokerRole=ASYNC_MASTER\n" if mode == "none" else
                   f"brokerRole=SYNC_MASTER\nhaListenPort={ha_port}\nhaSecret={SECRET}\n"))
    with process([sys.executable, "-m", "sparkmq.broker", "-c", conf], port) as broker:
        child = None
        if mode != "none":
            child = Child(os.path.join(root, f"broker-replica-{time.monotonic_ns()}"),
                          ha_port, null=mode == "sync-null")
            child.go()
        p = Producer(f"127.0.0.1:{port}", request_timeout_s=30, transport=transport)
        try:
            deadline = time.monotonic() + 30
            while True:                 # until the replica is attached (SYNC_MASTER)
                try:
                    p.send(Message(TOPIC, b"warm"))
                    break
                except Exception:  # ReplicaNotAvailable until the replica attaches
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            body = os.urandom(BODY_BYTES)
            for _ in range(20):
                p.send_batch([Message(TOPIC, body) for _ in range(batch)])
            if PIN:
                pin_threads(broker.pid, PIN["broker"])
            t0, cpu0 = time.perf_counter(), process_cpu_s(broker.pid)
            for _ in range(batches):
                p.send_batch([Message(TOPIC, body) for _ in range(batch)])
            tput = batches * batch / (time.perf_counter() - t0)
            cpu_us = (process_cpu_s(broker.pid) - cpu0) * 1e6 / (batches * batch)
            lat = []
            for _ in range(singles):
                t = time.perf_counter()
                p.send(Message(TOPIC, body))
                lat.append(time.perf_counter() - t)
        finally:
            p.shutdown()
            if child is not None:
                child.close()
    return {"tput": tput, "lat": sorted(lat), "cpu": cpu_us}


def process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` so far: the sum of its live threads' run times
    (``/proc/<pid>/task/*/schedstat``, nanoseconds; ``/proc/<pid>/stat``'s user + system
    ticks of 10 ms were ~5 % of a 300-batch window). A broker's threads do not exit while
    it is measured; where schedstat is missing, the ticks."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):     # no schedstat: the coarse ticks
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: ``--pin``: the broker's threads on this CPU, this process and its children on the other
PIN: dict[str, int] = {}


def pin_threads(pid: int, cpu: int) -> None:
    """Every thread of process ``pid`` to ``cpu`` (a thread started later keeps the
    affinity of the thread that starts it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:        # a thread that ended meanwhile
            pass


def broker_part(root: str, repeat: int, batches: int, batch: int, singles: int) -> None:
    print(f"1b. through a broker (bench_broker.py-style sync sends, one Producer): "
          f"{batches} x send_batch({batch} x {BODY_BYTES} B), then {singles} x send(1); "
          "none = ASYNC_MASTER without a replica, sync-null / sync = SYNC_MASTER with the "
          "ack-only / full replica process")
    mask = os.sched_getaffinity(0)
    if PIN:     # this process (the producer) and the replica it starts on the other CPU
        os.sched_setaffinity(0, {PIN["rest"]})
        print(f"   pinned: the broker on CPU {PIN['broker']}, the producer and the replica "
              f"on CPU {PIN['rest']}")
    try:
        floor_us = raw_link_floor(batch)
        print(f"   the raw link's floor: {floor_us:.1f} us of the sending thread's CPU a batch "
              f"({stored_batch_bytes(batch):,} B sent raw, 16 B acked, the receiver asleep "
              "in recv between batches)")
        for transport in BROKER_TRANSPORTS:
            print(f"   over {transport} (Producer(transport={transport!r}))")
            broker_modes(root, repeat, batches, batch, singles, transport, floor_us)
    finally:
        os.sched_setaffinity(0, mask)


def broker_modes(root: str, repeat: int, batches: int, batch: int, singles: int,
                 transport: str, floor_us: float) -> None:
    res: dict[str, list[dict]] = {m: [] for m in BROKER_MODES}
    for i in track(range(repeat), f"broker runs over {transport}"):
        k = i % len(BROKER_MODES)
        for m in BROKER_MODES[k:] + BROKER_MODES[:k]:
            res[m].append(broker_run(root, m, batches=batches, batch=batch, singles=singles,
                                     transport=transport))
    for m in BROKER_MODES:
        tput = [r["tput"] for r in res[m]]
        p50 = [r["lat"][len(r["lat"]) // 2] * 1e3 for r in res[m]]
        p99 = [r["lat"][int(0.99 * len(r["lat"]))] * 1e3 for r in res[m]]
        cpu = statistics.median(r["cpu"] for r in res[m])
        line = f"   {m:10s} {fmt_range(tput, ' msgs/s'):>26} {cpu:6.1f} us broker CPU/msg; " \
               f"send p50 {min(p50):.2f}-{max(p50):.2f} ms, p99 {min(p99):.2f}-{max(p99):.2f} ms"
        if m != "none":
            ratio = [r["tput"] / n["tput"] for r, n in zip(res[m], res["none"])]
            cpu_ratio = [n["cpu"] / r["cpu"] for r, n in zip(res[m], res["none"])]
            extra = [(r["lat"][len(r["lat"]) // 2] - n["lat"][len(n["lat"]) // 2]) * 1e3
                     for r, n in zip(res[m], res["none"])]
            line += f"  ratio {min(ratio):.2f}-{max(ratio):.2f} (median " \
                    f"{statistics.median(ratio):.2f}), CPU ratio {min(cpu_ratio):.2f}-" \
                    f"{max(cpu_ratio):.2f} (median {statistics.median(cpu_ratio):.2f}), " \
                    f"send p50 +{statistics.median(extra):.2f} ms"
        print(line)
    none_us = statistics.median(r["cpu"] for r in res["none"]) * batch
    print(f"   the best CPU ratio the raw link leaves: none's {none_us:.0f} us a batch / "
          f"({none_us:.0f} + {floor_us:.1f}) = {none_us / (none_us + floor_us):.2f}")


def raw_link_floor(batch: int) -> float:
    """The least one replicated batch can cost the sending thread on this machine: a raw
    ``sendall`` of one stored batch's bytes over loopback TCP to a process that reads it
    with a blocking ``recv`` (as a replica sleeps between batches) and answers 16 bytes,
    which the sender reads; no framing, no Python beyond the calls. Microseconds of the
    sending thread's CPU per round (median of three runs of 3,000), on the broker's CPU
    with ``--pin`` and the receiver on the other."""
    import socket
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    size = stored_batch_bytes(batch)
    rounds, warm = 3_000, 300
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--raw-ack-child",
                             str(lsock.getsockname()[1]), str(size), str(3 * (rounds + warm))],
                            stdin=subprocess.DEVNULL)
    mask = os.sched_getaffinity(0)
    conn = None
    try:
        conn, _ = lsock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if PIN:
            os.sched_setaffinity(0, {PIN["broker"]})
        data = os.urandom(size)
        ack = bytearray(16)

        def one_round() -> None:
            conn.sendall(data)
            got = 0
            while got < len(ack):
                n = conn.recv_into(memoryview(ack)[got:])
                if n == 0:
                    raise ConnectionError("the raw receiver closed")
                got += n
        runs = []
        for _ in range(3):
            for _ in range(warm):
                one_round()
            t0 = time.thread_time()
            for _ in range(rounds):
                one_round()
            runs.append((time.thread_time() - t0) * 1e6 / rounds)
    finally:
        if conn is not None:
            conn.close()           # (the receiver then ends)
        os.sched_setaffinity(0, mask)
        lsock.close()
        proc.wait(60)
    return statistics.median(runs)


def raw_ack_child(port: int, size: int, rounds: int) -> None:
    """Child of ``raw_link_floor``: read ``size`` bytes with blocking ``recv``, answer 16,
    ``rounds`` times."""
    import socket
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    view = memoryview(bytearray(size))
    for _ in range(rounds):
        got = 0
        while got < size:
            n = sock.recv_into(view[got:])
            if n == 0:
                return
            got += n
        sock.sendall(b"a" * 16)
    sock.close()


def stored_batch_bytes(batch: int) -> int:
    """CommitLog bytes of one stored batch of ``batch`` x BODY_BYTES messages."""
    root = tempfile.mkdtemp(prefix="sparkmq-bench-ha-size-")
    try:
        store = Store.open(root)
        store.create_topic(TOPIC)
        before = store.commitlog.written_offset
        store.append_batch(make_batch(batch))
        size = store.commitlog.written_offset - before
        store.close()
        return size
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- 2. catch-up
def fill_master(root: str, mib: int) -> tuple[Store, str]:
    url = os.path.join(root, "catchup-master")
    store = Store.open(url, mappedFileSizeCommitLog=32 * MIB)
    store.create_topic(TOPIC, read_queue_nums=4, write_queue_nums=4)
    table = make_batch(1000)
    for _ in track(range(mib * MIB // (1000 * BODY_BYTES)), "appends", unit="batches"):
        store.append_batch(table)
    store.flush()
    return store, url


def catchup_run(root: str, store: Store, ha: HAService, i: int) -> tuple[float, float]:
    """Seconds from the replica's start of following (process already up) to caught
    up = every byte written and fsynced (what it acks; RocketMQ's slave), and to
    every batch dispatched (its ConsumeQueue/Index built: readable)."""
    url = os.path.join(root, f"catchup-replica-{i}")
    child = Child(url, ha.port)
    t0 = time.perf_counter()
    child.go()
    wait_offset(child, store.commitlog.written_offset)
    child.offset("fsync")
    elapsed = time.perf_counter() - t0
    wait_offset(child, store.commitlog.written_offset, cmd="dispatched")
    dispatched = time.perf_counter() - t0
    child.close()
    shutil.rmtree(url)
    return elapsed, dispatched


def raw_copy_run(root: str, master_url: str, i: int) -> float:
    src = os.path.join(master_url, "commitlog")
    dst = os.path.join(root, f"rawcopy-{i}")
    os.makedirs(dst)
    t0 = time.perf_counter()
    for name in sorted(os.listdir(src)):
        out = os.path.join(dst, name)
        shutil.copyfile(os.path.join(src, name), out)
        fd = os.open(out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    elapsed = time.perf_counter() - t0
    shutil.rmtree(dst)
    return elapsed


def raw_sink(folder: str, port: int) -> None:
    """Child of ``raw_stream_run``: receive files over TCP (no framing beyond a name and
    a size), write them, fsync each; print DONE."""
    import socket
    import struct
    os.makedirs(folder)
    print("READY", flush=True)
    sys.stdin.readline()
    sock = socket.create_connection(("127.0.0.1", port))
    buf = bytearray(4 * MIB)
    view = memoryview(buf)
    while True:
        head = sock.recv(12, socket.MSG_WAITALL)
        if len(head) < 12:
            break
        name_len, size = struct.unpack("!IQ", head)
        name = sock.recv(name_len, socket.MSG_WAITALL).decode()
        fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        left = size
        while left:
            n = sock.recv_into(view[:min(left, len(buf))])
            os.write(fd, view[:n])
            left -= n
        os.fsync(fd)
        os.close(fd)
    print("DONE", flush=True)


def raw_stream_run(root: str, master_url: str, i: int) -> float:
    """The same segment files sent over loopback TCP (``os.sendfile``) to a process that
    writes and fsyncs them: the floor for any replication over this link."""
    import socket
    import struct
    src = os.path.join(master_url, "commitlog")
    dst = os.path.join(root, f"rawstream-{i}")
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--raw-sink", dst,
                             str(lsock.getsockname()[1])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    t0 = time.perf_counter()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    conn, _ = lsock.accept()
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        size = os.path.getsize(path)
        conn.sendall(struct.pack("!IQ", len(name), size) + name.encode())
        with open(path, "rb") as f:
            sent = 0
            while sent < size:
                sent += os.sendfile(conn.fileno(), f.fileno(), sent, size - sent)
    conn.close()
    assert proc.stdout.readline().strip() == "DONE"
    elapsed = time.perf_counter() - t0
    proc.wait(60)
    lsock.close()
    shutil.rmtree(dst)
    return elapsed


def print_modes(modes, rates: dict, cpus: dict) -> None:
    """Per mode: msgs/s and its ratio to ``none`` of the same run (min-max, median); the
    master's CPU per message and ``none``'s CPU / the mode's (what the master would
    sustain on cores of its own, the replica elsewhere)."""
    def span(xs: list[float]) -> str:
        return f"{min(xs):.2f}-{max(xs):.2f} (median {statistics.median(xs):.2f})"
    for m in modes:
        line = f"   {m:10s} {fmt_range(rates[m], ' msgs/s'):>26} " \
               f"{statistics.median(cpus[m]):6.2f} us CPU/msg"
        if m != "none":
            wall = [a / b for a, b in zip(rates[m], rates["none"])]
            cpu = [b / a for a, b in zip(cpus[m], cpus["none"])]
            line += f"  ratio {span(wall)}, CPU ratio {span(cpu)}"
        print(line)


def fmt_range(xs: list[float], unit: str = "") -> str:
    return f"{min(xs):,.0f}-{max(xs):,.0f}{unit}" if len(xs) > 1 else f"{xs[0]:,.0f}{unit}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--replica-dir", default=None,
                    help="folder for the replica stores and the copy targets, e.g. /dev/shm "
                         "(a second disk, as the replica's machine would have)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--catchup-only", action="store_true", help="skip the send throughput part")
    ap.add_argument("--no-broker", action="store_true", help="skip the through-a-broker part")
    ap.add_argument("--broker-only", action="store_true",
                    help="only the through-a-broker part (1b), with 1,000 batches (--quick: 300)")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--catchup-mib", type=int, default=None)
    ap.add_argument("--pin", action="store_true",
                    help="the through-a-broker part with the broker's threads on CPU 0 and "
                         "the producer and replica processes on CPU 1 (as the broker would "
                         "have cores of its own)")
    ap.add_argument("--replica-child", nargs=2, metavar=("URL", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--raw-sink", nargs=2, metavar=("DIR", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--null-replica-child", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--raw-ack-child", nargs=3, type=int, metavar=("PORT", "SIZE", "ROUNDS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.raw_ack_child:
        raw_ack_child(*args.raw_ack_child)
        return 0
    if args.null_replica_child:
        null_replica_child(args.null_replica_child)
        return 0
    if args.raw_sink:
        raw_sink(args.raw_sink[0], int(args.raw_sink[1]))
        return 0
    if args.replica_child:
        replica_child(args.replica_child[0], int(args.replica_child[1]))
        return 0
    if args.pin:
        if len(os.sched_getaffinity(0)) < 2:
            ap.error("--pin needs two CPUs")
        PIN["broker"], PIN["rest"] = sorted(os.sched_getaffinity(0))[:2]
    messages = args.messages or (160_000 if args.quick else 400_000)
    mib = args.catchup_mib or (64 if args.quick else 256)
    root = tempfile.mkdtemp(prefix="sparkmq-bench-ha-", dir=args.dir)
    dest = tempfile.mkdtemp(prefix="sparkmq-bench-ha-replica-", dir=args.replica_dir) \
        if args.replica_dir else root
    if args.replica_dir:
        print(f"replica stores and copy targets under {args.replica_dir} (another disk)")
    try:
        if not (args.catchup_only or args.broker_only):
            print(f"1. send throughput: {messages:,} x {BODY_BYTES} B messages, batches of "
                  f"{args.batch}, {args.threads} sender threads, ASYNC_FLUSH (msgs/s)")
            modes = ("none", "async", "sync", "async-null", "sync-null")
            rates: dict[str, list[float]] = {m: [] for m in modes}
            cpus: dict[str, list[float]] = {m: [] for m in modes}
            for i in track(range(args.repeat), "runs"):
                k = i % len(modes)                 # rotate: no mode always runs first
                for m in modes[k:] + modes[:k]:
                    rate, cpu = send_run(root, m, messages=messages, batch=args.batch,
                                         threads=args.threads, replica_root=dest)
                    rates[m].append(rate)
                    cpus[m].append(cpu)
            print_modes(modes, rates, cpus)
            if not args.no_broker:
                broker_part(root, args.repeat, batches=100 if args.quick else 400,
                            batch=100, singles=200 if args.quick else 1000)
        if args.broker_only:
            broker_part(root, args.repeat, batches=300 if args.quick else 1000,
                        batch=100, singles=200 if args.quick else 1000)
            return 0
        print(f"2. catch-up of {mib} MiB (32 MiB segments) from empty, against copyfile+fsync "
              "and against a raw TCP stream of the same files (sendfile -> write+fsync)")
        store, url = fill_master(root, mib)
        ha = HAService(store, broker_name="bench", secret=SECRET).start()
        size_mb = store.commitlog.written_offset / MIB
        cr, rr, ra, sr, sa, dr, da = [], [], [], [], [], [], []
        for i in range(args.repeat):
            raw = raw_copy_run(dest, url, i)
            stream = raw_stream_run(dest, url, i)
            cu, disp = catchup_run(dest, store, ha, i)
            dr.append(size_mb / disp)
            da.append(raw / disp)
            rr.append(size_mb / raw)
            sr.append(size_mb / stream)
            cr.append(size_mb / cu)
            ra.append(raw / cu)
            sa.append(stream / cu)
        ha.stop()
        store.close()
        print(f"   copyfile    {fmt_range(rr, ' MiB/s')}")
        print(f"   raw stream  {fmt_range(sr, ' MiB/s')}")
        print(f"   catch-up    {fmt_range(cr, ' MiB/s')}  ratio to copyfile "
              f"{min(ra):.2f}-{max(ra):.2f}, to raw stream {min(sa):.2f}-{max(sa):.2f}"
              "  (written + fsynced)")
        print(f"   dispatched  {fmt_range(dr, ' MiB/s')}  ratio to copyfile "
              f"{min(da):.2f}-{max(da):.2f}  (ConsumeQueue/Index built: readable)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(dest, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
