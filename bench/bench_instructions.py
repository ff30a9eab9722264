"""Instructions per request, counted by valgrind (callgrind), against the durable floor's put
in the same run: a measure this shared machine's noise does not move.

    .venv/bin/python bench/bench_instructions.py [--quick] [--only NAME ...]

Each workload runs in its own process under ``valgrind --tool=callgrind
--separate-threads=yes``, twice: after 20 warm-up calls and the heap frozen (as the broker
daemon freezes its own: ``sparkmq.heap``), ``K`` calls and ``K + extra`` calls. The main
thread's instruction count of the second run less the first's, divided by
``extra``, is one call's cost: start-up, imports and warm-up cancel out, and the broker's
own threads (flush, services) are counted apart. Every worker hashes strings with the same
seed (``PYTHONHASHSEED=0`` unless the caller sets one): with a random seed a dict's layout
differs from process to process, and one workload's count moved by up to 2 % from run to
run (the floor's put: 134.7 and 137.5 k; with the seed fixed 138.23 and 138.26 k).

Workloads (1 KiB bodies, ASYNC_FLUSH):

- ``floor-1`` / ``floor-100``: the durable floor's put (bench_flight's ``DURABLE``: the
  batch's IPC message, its CRC32C, a ``write``, an ack of offsets) of 1 and 100 rows;
  ``floorgrpc-1``: the RocketMQ durable floor's SendMessage of one plain message
  (bench_broker's ``DURABLE_SEND``: the request parsed, its bytes and their CRC32C in one
  ``write``, the answer serialized), the ``/ floor put`` of ``grpc-1``;
- ``flight-1`` / ``flight-100``: sparkmq's Flight put (``FlightService._send``) of 1 and
  100 rows; ``flightq-1``: of one row whose producer named its queue (a ``queue_id``
  column, as bench_flight's send -> long-poll row sends);
- ``grpc-1`` / ``grpc-100``: a RocketMQ SendMessage of 1 and 100 plain messages
  (``send_encoded``: parse to answer);
- ``grpcread-1``, ``grpccheck-1``, ``grpcstore-1``: ``grpc-1`` up to the end of each of
  its phases: the request read into columns (``_wire.scan_plain``, ``PlainColumns``); then
  held to the rules (``BatchSender.check_columns``: the segment batch composed, the limits,
  the role); then stored (``BatchSender.store``, alone, as on the gRPC loop). ``grpc-1``
  less ``grpcstore-1`` is the answer and the wake-ups;
- ``grpcceil0-1`` .. ``grpcceil5-1`` (only with ``--only``): ``grpc-1`` with
  ``BatchSender.store`` as one native append would leave it (bench_broker's
  ``ceiling_store``), 0, then with the first 1 .. 5 of the parts it leaves out added back;
- ``get-1``: sparkmq's Flight read of one message at a queue's tail
  (``FlightService._read``: a woken long poll's DoGet, before its reply is written);
- ``follow-1``: a one-row Flight put with the producer's own id (as sparkmq's Producer
  sends it) to one of a topic's 16 queues, then the batch it becomes on a followed DoGet
  of all 16 in the consumer's view (``FlightService._followed``, one turn: what OMB's
  consumer costs the broker a message, its reply's write aside);
- ``round``: what a long poll's delivery costs the broker: a one-row Flight put, the pop
  of that message (``PopService.pop``), its conversion to the protocol message and its ack;
- ``producer-1``: what sparkmq's ``Producer.send`` of one plain message costs the caller's
  thread (default transport, to an in-process broker serving no Flight: RocketMQ gRPC;
  the broker's threads are not counted); ``stub-1``: the gRPC call it makes, of the same
  request bytes with its headers and timeout (``Connections.call_encoded``), without the
  producer's own work; ``producerf-1``: ``Producer.send`` over Arrow Flight
  (``transport="flight"``, to a broker serving it).

Printed: instructions per call and, for the puts, the ratio to the floor's put of as many
rows. valgrind counts a ``rep movsb`` copy one instruction per byte, so a 100 KiB body copy
weighs ~100 k here though it takes a few us: compare like with like.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_cold import _Context, grpc_send, in_process_broker, plain_request  # noqa: E402

WORKLOADS = ("floor-1", "floor-100", "floorgrpc-1", "flight-1", "flight-100", "flightq-1",
             "grpc-1", "grpc-100", "grpcread-1", "grpccheck-1", "grpcstore-1", "get-1", "follow-1",
             "round",
             "producer-1", "stub-1", "producerf-1")
CEILING_PARTS = tuple(f"grpcceil{k}-1" for k in range(6))     # (not run by default)


def _rows(n: int):
    import pyarrow as pa
    return pa.RecordBatch.from_pydict({"topic": ["instr"] * n, "body": [b"x" * 1024] * n})


def _floor(tmp: str, code: str, name: str, arg):
    """(call, stop) of a durable floor: ``code`` (bench_flight's ``DURABLE``,
    bench_broker's ``DURABLE_SEND``) run with ``fd`` a file in ``tmp``, its function
    ``name`` called on ``arg``."""
    fd = os.open(os.path.join(tmp, "floor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    floor = {"fd": fd}
    exec(code, floor)
    fn = floor[name]
    return (lambda: fn(arg)), (lambda: os.close(fd))


def _workload(name: str, tmp: str):
    """(call, stop) for workload ``name``."""
    kind, _, rows = name.partition("-")
    if kind == "floor":
        from bench_flight import DURABLE
        return _floor(tmp, DURABLE, "durable", _rows(int(rows)))
    if kind == "floorgrpc":
        from bench_broker import DURABLE_SEND
        return _floor(tmp, DURABLE_SEND, "durable_send", plain_request("instr-grpc", int(rows)))
    # a writer lease of an hour. valgrind runs one thread at a time, ~50x slower: the
    # publish service's renewals of the 30 s lease lag, and an append that finds it
    # lapsing renews it itself (``Appender.hold_lease``: a publish, side tables sorted and
    # written, on the counted thread). Some runs did and some did not: 0.58 against
    # 0.78 M a 100-row Flight put, one tree, 2026-11-28 (callgrind: the difference was
    # the publish's sort and Parquet encoding)
    if kind in ("producer", "stub", "producerf"):
        return _client(tmp, kind)
    broker, ctx = in_process_broker(tmp, lease_timeout_ms=3_600_000), _Context()
    if kind in ("flight", "flightq"):
        import pyarrow as pa
        batch = _rows(int(rows))
        if kind == "flightq":        # the producer names the queue (bench_flight's e2e row)
            batch = batch.append_column("queue_id", pa.array([0] * len(batch), pa.int32()))
        return (lambda: broker.flight._send(ctx, batch)), broker.stop
    if kind == "grpc":
        return grpc_send(broker, plain_request("instr-grpc", int(rows)), ctx), broker.stop
    if kind.startswith("grpcceil"):
        from bench_broker import ceiling_store
        from sparkmq.broker import batchsend
        batchsend.BatchSender.store = ceiling_store(int(kind[len("grpcceil"):]))
        return grpc_send(broker, plain_request("instr-grpc", int(rows)), ctx), broker.stop
    if kind in ("grpcread", "grpccheck", "grpcstore"):
        return _grpc_phase(broker, kind, plain_request("instr-grpc", int(rows))), broker.stop
    if kind == "get":                # the message read: one put to queue 0
        import pyarrow as pa
        broker.flight._send(ctx, _rows(1).append_column("queue_id", pa.array([0], pa.int32())))
        end = broker.store.max_offset("instr", 0)
        return (lambda: broker.flight._read("instr", 0, end - 1, 1, 0)), broker.stop
    if kind == "follow":             # OMB's shape: 16 queues on one followed read
        import pyarrow as pa
        broker.store.create_topic("instr-follow", read_queue_nums=16, write_queue_nums=16)
        one = pa.RecordBatch.from_pydict({
            "topic": ["instr-follow"], "body": [b"x" * 1024],
            "queue_id": pa.array([0], pa.int32()), "unique_key": ["0" * 32]})
        broker.flight._send(ctx, one)
        follower = broker.flight._followed(_Following(), "instr-follow",
                                           dict.fromkeys(range(16), 0), 1000, True, None,
                                           lambda: None)

        def follow():            # (one message behind the puts: never waits)
            broker.flight._send(ctx, one)
            next(follower)
        return follow, broker.stop
    from sparkmq.broker.pop import TagFilter
    from sparkmq.broker.protocol import message_to_pb
    one, every = _rows(1), TagFilter("*")

    def round_():
        broker.flight._send(ctx, one)
        for d in broker.pop.pop("G", "instr", batch_size=32, invisible_ms=30_000,
                                tag_filter=every):
            message_to_pb(d.message, d).SerializeToString()
            broker.receiver.ack("G", d.receipt_handle, "instr")
    return round_, broker.stop


class _Following(_Context):
    """A followed DoGet's call context, never cancelled."""

    def is_cancelled(self) -> bool:
        return False


def _grpc_phase(broker, kind: str, data: bytes):
    """``grpc-1``'s SendMessage of request bytes ``data`` up to the end of phase ``kind``
    (see the module docstring)."""
    from sparkmq.broker.grpc_service import request_reader
    from sparkmq.broker.plainsend import plain_columns
    from sparkmq.broker.replicawait import HELD
    read, core = request_reader("SendMessage"), broker.batch_sender

    def checked():
        plain = plain_columns(read(data))
        return core.check_columns(plain, plain.n, [plain.topic], body_sizes=plain.body_sizes,
                                  body_extent=plain.body_extent, source=plain.exported())

    def stored():
        rows = checked()
        HELD.loop = True             # (as ``grpc_send``: the gRPC loop's sends, alone)
        try:
            core.store(rows, [rows.topic])
        finally:
            HELD.loop = False
    checked()                        # (the topic created, before a read-only phase runs)
    return {"grpcread": lambda: plain_columns(read(data)), "grpccheck": checked,
            "grpcstore": stored}[kind]


def _client(tmp: str, kind: str):
    """(call, stop) of ``producer-1``, ``stub-1`` or ``producerf-1``: the client's side
    of a sync send, on this (the counted) thread; the broker's gRPC loop and Flight
    handlers run on threads of their own."""
    from rocketmq.grpc_protocol import service_pb2 as spb
    from sparkmq.client import Message, Producer
    flight = kind == "producerf"
    broker = in_process_broker(tmp, lease_timeout_ms=3_600_000,
                               flightEnable="true" if flight else "false")
    p = Producer(broker.endpoint, transport="flight" if flight else "auto")
    m = Message("instr-client", b"x" * 1024)

    def stop():
        p.shutdown()
        broker.stop()
    if kind != "stub":
        return (lambda: p.send(m)), stop
    data = p._request([m]).data          # (a plain message: the encoded request)
    return (lambda: p.conns.call_encoded(broker.endpoint, "SendMessage", data,
                                         spb.SendMessageResponse)), stop


def worker(name: str, calls: int) -> None:
    tmp = tempfile.mkdtemp(prefix="bench-instr-")
    try:
        call, stop = _workload(name, tmp)
        try:
            for _ in range(20):
                call()
            # the heap frozen, as the broker daemon freezes its own after start
            # (sparkmq.heap.settle): else a full collector pass (tens of ms: by estimate tens
            # of M instructions, not measured apart) may land in one of the two runs only
            gc.collect()
            gc.freeze()
            for _ in range(calls):
                call()
        finally:
            # on a thread of its own, not counted: the broker's stop publishes what the
            # publish service has not yet (side tables sorted and written), an amount that
            # varies run to run (flight-100 gave 0.57 and 0.74 M a put by it, one tree)
            stopping = threading.Thread(target=stop)
            stopping.start()
            stopping.join()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _main_thread_instructions(valgrind: str, name: str, calls: int) -> int:
    tmp = tempfile.mkdtemp(prefix="bench-instr-cg-")
    try:
        out = os.path.join(tmp, "cg.out")
        subprocess.run([valgrind, "--tool=callgrind", "--separate-threads=yes",
                        f"--callgrind-out-file={out}", sys.executable, __file__,
                        "--worker", name, str(calls)],
                       check=True, capture_output=True, cwd=ROOT,
                       env={"PYTHONHASHSEED": "0", **os.environ, "PYTHONPATH": ROOT})
        with open(out + "-01") as f:       # thread 1: the calls
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        raise RuntimeError(f"no totals in {out}-01")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (200 more, not 1,000)")
    ap.add_argument("--only", nargs="+", choices=WORKLOADS + CEILING_PARTS,
                    default=list(WORKLOADS))
    ap.add_argument("--worker", nargs=2, metavar=("NAME", "CALLS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return 0
    from bench_broker import ensure_apt
    valgrind = ensure_apt("valgrind", "valgrind")
    if valgrind is None:
        return 1
    base, extra = 100, 200 if args.quick else 1000
    per_call = {}
    for name in args.only:
        lo = _main_thread_instructions(valgrind, name, base)
        hi = _main_thread_instructions(valgrind, name, base + extra)
        per_call[name] = (hi - lo) / extra
        print(f"# {name}: {per_call[name] / 1e6:.3f} M instructions a call", flush=True)
    print(f"\n{'workload':<14}{'M instructions/call':>22}{'/ floor put':>14}")
    for name, v in per_call.items():
        floor = per_call.get(("floorgrpc-" if name.startswith("grpc") else "floor-")
                             + name.partition("-")[2])
        put = name.partition("-")[0] in ("flight", "flightq", "grpc")
        ratio = f"{v / floor:14.1f}" if floor and put else ""
        print(f"{name:<14}{v / 1e6:>22.3f}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
