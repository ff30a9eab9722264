"""A writer process for the SIGKILL crash test.

Usage: python crash_writer.py URL ROUND [FLUSH_DISK_TYPE]

Opens the store for writing under SYNC_FLUSH (or the given flushDiskType) (recovering from the previous
round's kill), prints ``{"start": {queue: max_offset}}``, then appends batches
of 1-3 messages in a loop and prints, after each append returns, one JSON line
per batch with every message's queue id, queue offset, message id and body.
stdout is flushed after every line, so a printed line means "the append
returned". Bodies are ``r<ROUND>-s<SEQ>-i<I>-n<N>|`` plus padding, so the
checker can tell whole batches from partial ones. The loop is bounded
(20,000 batches or 60 s); the test kills the process long before that.
"""
from __future__ import annotations

import json
import sys
import time

from sparkmq import SYNC_FLUSH, Message, Store

TOPIC = "crash"
QUEUES = 2


def main() -> int:
    url, rnd = sys.argv[1], int(sys.argv[2])
    flush_type = sys.argv[3] if len(sys.argv) > 3 else SYNC_FLUSH
    store = Store.open(url, flushDiskType=flush_type, mappedFileSizeCommitLog=8192,
                       publishIntervalMs=100)
    store.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, exist_ok=True)
    start = {q: store.max_offset(TOPIC, q) for q in range(QUEUES)}
    print(json.dumps({"start": start, "recovered": store.recovered_from_crash}), flush=True)
    deadline = time.monotonic() + 60
    for seq in range(20_000):
        if time.monotonic() > deadline:
            break
        n = 1 + seq % 3
        bodies = [(f"r{rnd}-s{seq}-i{i}-n{n}|" + "x" * (seq % 200)).encode() for i in range(n)]
        res = store.append([Message(TOPIC, b, queue_id=(seq + i) % QUEUES)
                            for i, b in enumerate(bodies)])
        line = [{"q": r.queue_id, "o": r.queue_offset, "id": r.message_id, "b": b.decode(),
                 "s": r.status.value} for r, b in zip(res, bodies)]
        print(json.dumps(line), flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
