"""How costs grow with a deployment (issue 18 item 7): each cost at x4 steps and its growth
factor per x4 (linear growth is 4.0; flat is 1.0).

- ``Snapshot.load`` of the newest version at growing log lengths (versions);
- ``Store.open``, ``Snapshot.load``, creating a topic, and a cold read of one queue at
  growing topic counts (8 queues each, one message per queue);
- checkpoints in parts (issue 18 item 2): at 50,000 topics x 8 queues, after 1,000 commits
  each changing one topic's consumer offsets, the time to write a checkpoint, the bytes it
  writes against the state's size, and ``Snapshot.load`` (``--checkpoint-topics``).

    .venv/bin/python bench/bench_scale.py            # quick: about two minutes
    .venv/bin/python bench/bench_scale.py --full     # the issue's sizes (long)
    .venv/bin/python bench/bench_scale.py --issue    # --full, then every other cost of
                                                     # issue 18 in the same run (~40 min)

``--issue`` runs, after this script's own rows, the benches that measure the rest of
issue 18 item 7 as subprocesses, one after the other, each printing its own table:
``bench_polls.py`` (sync sends while 0, 100, 500 and 2,000 consumers long-poll),
``bench_memory.py --full`` (broker RSS over 300 s of small sends to 1,000 topics) and
``bench_delay.py --parked-only`` at 0.2M and 2M parked delayed messages.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparkmq import Message, Snapshot, Store  # noqa: E402
from sparkmq.progress import track  # noqa: E402


def best(fn, runs: int = 5) -> float:
    out = []
    for _ in track(range(runs), "runs"):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def versions_case(tmp: str, steps: list[int]) -> list[tuple[int, float]]:
    """``Snapshot.load`` of the newest version of a log of each length in ``steps``:
    one real commit (a consumer offset) per version, every commit file kept (the
    default logRetentionMs keeps 30 days). The log is built with ``os.fsync`` turned
    into a no-op (setup only: 1M fsynced commits take ~12 minutes here; the loads
    measured read the same files either way)."""
    url = os.path.join(tmp, "versions")
    rows = []
    real_fsync = os.fsync
    with Store.open(url, mode="w", start_services=False) as s:
        s.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        for target in track(steps, "steps"):
            os.fsync = lambda fd: None
            try:
                for _ in track(range(target - s.state.version), "commits", every_s=10):
                    # one small commit per version
                    s.commit_consumer_offsets("G", {("T", 0): s.state.version % 7})
            finally:
                os.fsync = real_fsync
            files = len(os.listdir(os.path.join(url, "_log")))
            # the lease holder's hourly log cleanup lists _log/ (nothing is old enough
            # to delete here): what that costs at this length
            cleanup = best(lambda: s.txlog.cleanup_log(), 1)
            rows.append((target, best(lambda: Snapshot.load(url)), files, cleanup))
    return rows


def topics_case(tmp: str, steps: list[int]) -> list[tuple[int, dict]]:
    url = os.path.join(tmp, "topics")
    rows = []
    made = 0
    s = Store.open(url, mode="w", start_services=False)
    try:
        for target in track(steps, "steps"):
            t = time.perf_counter()
            while made < target:
                s.create_topic(f"T{made}", read_queue_nums=8, write_queue_nums=8)
                made += 1
            create_ms = (time.perf_counter() - t) / (target - (rows[-1][0] if rows else 0)) * 1000
            s.append([Message(f"T{made - 1}", b"x") for _ in range(8)])
            s.publish(force=True)
            s.close()
            open_s = best(lambda: Store.open(url, mode="r").close(), 3)
            load_s = best(lambda: Snapshot.load(url), 3)
            cold_s = best(lambda: Snapshot.load(url).read_table(f"T{made - 1}", 0, 0), 3)
            start_s = best(lambda: broker_start(tmp, url), 1)
            rows.append((target, {"create_ms": create_ms, "open": open_s, "load": load_s,
                                  "cold_read": cold_s, "broker_start": start_s}))
            s = Store.open(url, mode="w", start_services=False)
    finally:
        s.close()
    return rows


def broker_start(tmp: str, url: str) -> float:
    """Seconds from ``Broker.start()`` to serving, on the store at ``url`` (then stopped)."""
    from sparkmq.broker import Broker, BrokerConfig
    import socket

    def free() -> int:
        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            return so.getsockname()[1]
    cfg = BrokerConfig.from_properties({
        "brokerName": "scale", "storePathRootDir": url, "listenPort": str(free()),
        "adminPort": str(free()), "adminTokenFile": os.path.join(tmp, "scale.token")})
    t = time.perf_counter()
    b = Broker(cfg).start()
    took = time.perf_counter() - t
    b.stop()
    return took


def checkpoint_case(tmp: str, topics: int, commits: int = 1_000) -> dict:
    """Checkpoint cost at ``topics`` x 8 queues: the topics in one commit, then
    ``commits`` commits of one group's offsets of one topic (8 queues) each."""
    from sparkmq.log import format as fmt
    from sparkmq.log.actions import ConsumerOffset, Sidecar, TopicConfig, parse_actions
    from sparkmq.log.fs import StoreFS
    from sparkmq.log.txlog import TransactionLog
    url = os.path.join(tmp, "checkpoints")
    Store.open(url, mode="w", start_services=False).close()
    tl = TransactionLog(StoreFS(url))
    st = tl.commit(lambda s: [TopicConfig(id=i, name=f"T{i}", read_queue_nums=8, write_queue_nums=8)
                         for i in range(topics)], operation="CREATE TOPIC")
    writes: list[tuple[float, dict]] = []
    real = TransactionLog.write_checkpoint

    def timed(self, state):
        t = time.perf_counter()
        stats = real(self, state)
        writes.append((time.perf_counter() - t, stats))
        return stats
    TransactionLog.write_checkpoint = timed
    try:
        for n in track(range(commits), "commits"):
            tid = (n * 7919) % topics
            st = tl.commit(lambda s, tid=tid, n=n: [
                ConsumerOffset(group="G", topic_id=tid, queue_id=q, offset=n) for q in range(8)],
                operation="COMMIT OFFSETS", state=st)
    finally:
        TransactionLog.write_checkpoint = real
    last = tl._last_checkpoint()
    rel = fmt.checkpoint_file(last)
    state_bytes = StoreFS(url).size(rel) + sum(
        a.size for a in parse_actions(StoreFS(url).read_bytes(rel), rel)
        if isinstance(a, Sidecar))
    steady = writes[1:] or writes           # the first one after the bulk commit writes all
    return {"topics": topics, "commits": commits, "checkpoints": len(writes),
            "write_s": sum(t for t, _ in steady) / len(steady),
            "bytes": sum(st["bytes"] for _, st in steady) / len(steady),
            "first_bytes": writes[0][1]["bytes"], "state_bytes": state_bytes,
            "load_s": best(lambda: Snapshot.load(url), 3)}


def growth(values: list[float]) -> str:
    return " ".join(f"{b / a:5.2f}" if a > 0 else "  -  " for a, b in zip(values, values[1:]))


def print_versions(v) -> None:
    if v:
        print(f"{'Snapshot.load vs versions':<34}" + "".join(f"{r[0]:>10}" for r in v))
        print(f"{'  files in _log/':<34}" + "".join(f"{r[2]:>10}" for r in v))
        print(f"{'  ms':<34}" + "".join(f"{r[1] * 1000:>10.3f}" for r in v)
              + f"   growth per step {growth([r[1] for r in v])}")
        print(f"{'  hourly log cleanup (s)':<34}" + "".join(f"{r[3]:>10.3f}" for r in v)
              + f"   growth per step {growth([r[3] for r in v])}", flush=True)


def print_topics(t) -> None:
    if t:
        print(f"{'costs vs topics (x8 queues)':<34}" + "".join(f"{n:>10}" for n, _ in t))
    for key, unit in (("open", "s"), ("load", "s"), ("create_ms", "ms"), ("cold_read", "s"),
                      ("broker_start", "s")) if t else ():
        vals = [r[key] for _, r in t]
        print(f"{'  ' + key + ' (' + unit + ')':<34}" + "".join(f"{x:>10.4f}" for x in vals)
              + f"   growth {growth(vals)}")
    sys.stdout.flush()


def print_checkpoints(c) -> None:
    if c:
        print(f"checkpoints at {c['topics']} topics x 8 queues after {c['commits']} commits: "
              f"{c['checkpoints']} checkpoints (every 10 versions), "
              f"write {c['write_s'] * 1000:.1f} ms and {c['bytes'] / 1024:.1f} KiB each "
              f"(state {c['state_bytes'] / 1024:.0f} KiB; the first, after the bulk commit, "
              f"{c['first_bytes'] / 1024:.0f} KiB); Snapshot.load {c['load_s']:.3f} s",
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--issue", action="store_true",
                    help="--full, then bench_polls, bench_memory --full and bench_delay "
                         "--parked-only at 0.2M and 2M (issue 18's every target, one run)")
    ap.add_argument("--topics", type=int, nargs="+", default=None,
                    help="topic counts to measure (x4 steps read best), e.g. 781 3125 12500 50000; "
                         "0 alone skips them")
    ap.add_argument("--versions", type=int, nargs="+", default=None,
                    help="log lengths of the Snapshot.load row (default 1k 16k 256k 1M with "
                         "--full); 0 alone skips it")
    ap.add_argument("--checkpoint-topics", type=int, default=50_000,
                    help="topics (x8 queues) of the checkpoint row; 0 skips it")
    args = ap.parse_args(argv)
    args.full = args.full or args.issue
    version_steps = args.versions or ([1_000, 16_000, 256_000, 1_000_000] if args.full
                                      else [250, 1_000, 4_000])
    topic_steps = args.topics or ([781, 3_125, 12_500, 50_000] if args.full else [50, 200, 800])
    print("# growth factor per x4 step: 4.0 = linear, 1.0 = flat", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        t = topics_case(tmp, topic_steps) if topic_steps != [0] else []
        print_topics(t)
        c = checkpoint_case(tmp, args.checkpoint_topics) if args.checkpoint_topics else None
        print_checkpoints(c)
        v = versions_case(tmp, version_steps) if version_steps != [0] else []
        print_versions(v)       # before the (slow) removal of a million files
    sys.stdout.flush()
    if args.issue:
        here = os.path.dirname(os.path.abspath(__file__))
        for script, *more in (["bench_polls.py"], ["bench_memory.py", "--full"],
                              ["bench_delay.py", "--parked-only", "--parked", "200000"],
                              ["bench_delay.py", "--parked-only", "--parked", "2000000"]):
            print(f"\n# {script} {' '.join(more)}", flush=True)
            rc = subprocess.call([sys.executable, os.path.join(here, script), *more])
            if rc:
                print(f"# {script} failed with exit status {rc}", flush=True)
                return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
