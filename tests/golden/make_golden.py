"""Make the golden store of the current protocol version: tests/golden/v<READER_VERSION>/
(v1: format 1; v3: format 2 with reader version 3, checkpoints in parts).

Usage: python tests/golden/make_golden.py [OUT_DIR]   (default: tests/golden/v<READER_VERSION>, replaced)

Writes ``store/`` (a small store exercising every part of the format) and
``expected.json`` (what the writer reported: every message's topic, queue, queue
offset, message id, body, tags, keys, properties, group, type and store time; the
versions and their commit times; consumer offsets). tests/log/test_golden.py reads the
store back, read-only, and compares. Run it once per format version and commit what it
made together with this script; never regenerate an existing version's store (a later
format must keep reading the old one).

Deterministic where the API allows: an injected clock (store times, commit times), fixed
queue ids or message groups, fixed hosts and born times. The store id, topic ids and the
writer lease's owner are random (uuid) by design, so the bytes differ between runs but
everything expected.json records does not.

Content: topics ``Orders`` (3 queues) and ``Events`` (2 queues); messages with tags,
keys, properties, message groups (FIFO type), a delayed one (delivery time, DELAY type)
and a transactional one (transaction id, TRANSACTION type); 4 KiB CommitLog segments so
the log rolls several times; published ConsumeQueue and Index side files, a compaction
of them, then more published side files; a subscription group config and consumer offsets of group ``G1``;
about twenty log versions with a checkpoint (every 5 versions).
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE.parent)]   # the repository's sparkmq; helpers

from helpers.clock import Clock  # noqa: E402
from sparkmq import Message, Store  # noqa: E402
from sparkmq.log import format as fmt  # noqa: E402

START_MS = 1_700_000_000_000
STEP_MS = 1_000
SEGMENT_BYTES = 4096


def orders(round_no: int) -> list[Message]:
    """Six orders: two per queue, tags by parity, a key each, properties."""
    out = []
    for i in range(6):
        n = round_no * 6 + i
        out.append(Message("Orders", f"order-{n:03d}|".encode() + b"o" * (40 + n),
                           tags="paid" if n % 2 == 0 else "new", keys=[f"order-{n}"],
                           properties={"n": str(n), "region": "eu" if n % 3 else "us"},
                           queue_id=i % 3, born_timestamp=START_MS + n, born_host="10.0.0.1:5000"))
    return out


def events(round_no: int) -> list[Message]:
    """Four events in message groups (FIFO): a group always lands on one queue."""
    out = []
    for i in range(4):
        n = round_no * 4 + i
        out.append(Message("Events", f"event-{n:03d}|".encode() + b"e" * 60,
                           tags="click", keys=[f"user-{n % 3}", f"event-{n}"],
                           message_group=f"user-{n % 3}", message_type=fmt.MESSAGE_TYPE_FIFO,
                           born_timestamp=START_MS + n, born_host="10.0.0.2:5000"))
    return out


def special(clock: Clock) -> list[Message]:
    """A delayed message and a transactional one (stored values; the broker acts on them)."""
    return [Message("Orders", b"delayed-1", tags="later", keys=["delayed-1"], queue_id=0,
                    delivery_timestamp=clock() + 60_000, message_type=fmt.MESSAGE_TYPE_DELAY,
                    born_timestamp=START_MS, born_host="10.0.0.1:5000"),
            Message("Orders", b"tx-1", tags="tx", keys=["tx-1"], queue_id=1,
                    transaction_id="tx-0001", message_type=fmt.MESSAGE_TYPE_TRANSACTION,
                    properties={"TRAN_MSG": "true"},
                    born_timestamp=START_MS, born_host="10.0.0.1:5000")]


def record(results, messages, clock) -> list[dict]:
    return [{"topic": m.topic, "queue_id": r.queue_id, "queue_offset": r.queue_offset,
             "message_id": r.message_id, "body": m.body.decode(), "tags": m.tags,
             "keys": list(m.keys), "properties": dict(m.properties),
             "message_group": m.message_group, "message_type": m.message_type,
             "delivery_timestamp": m.delivery_timestamp, "transaction_id": m.transaction_id,
             "store_timestamp": clock()}
            for r, m in zip(results, messages)]


def make(out: Path) -> dict:
    clock = Clock(START_MS)
    store_url = str(out / "store")
    store = Store.open(store_url, clock_ms=clock, start_services=False,
                       mappedFileSizeCommitLog=SEGMENT_BYTES, checkpointInterval=5,
                       compact_after_files=100, storeHost="127.0.0.1:10911",
                       brokerName="broker-a")
    messages: list[dict] = []
    versions: list[dict] = []

    def step():
        clock.advance(STEP_MS)

    def mark(label: str):
        versions.append({"label": label, "version": store.version,
                         "timestamp_ms": store.state.timestamp_ms})

    try:
        store.create_topic("Orders", read_queue_nums=3, write_queue_nums=3)
        store.create_topic("Events", read_queue_nums=2, write_queue_nums=2)
        for round_no in range(4):                 # no compaction on publish (100 files)
            step()
            batch = orders(round_no)
            messages += record(store.append(batch), batch, clock)
            batch = events(round_no)
            messages += record(store.append(batch), batch, clock)
            store.flush()
            store.publish()
            mark(f"round-{round_no}")
        step()
        batch = special(clock)
        messages += record(store.append(batch), batch, clock)
        store.flush()
        store.publish()
        mark("special")
        step()
        store.compact()
        mark("compacted")
        step()
        batch = orders(4)
        messages += record(store.append(batch), batch, clock)
        store.flush()
        store.publish()
        mark("round-4")
        step()
        store.create_group("G1", retry_max_times=3)
        store.commit_consumer_offsets("G1", {("Orders", 0): 3, ("Orders", 1): 2,
                                             ("Events", 0): 1})
        mark("offsets")
    finally:
        store.close()
    return {"format_version": fmt.FORMAT_VERSION, "reader_version": fmt.READER_VERSION, "segment_bytes": SEGMENT_BYTES,
            "messages": messages, "versions": versions,
            "consumer_offsets": {"G1": [["Orders", 0, 3], ["Orders", 1, 2], ["Events", 0, 1]]}}


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else HERE / f"v{fmt.READER_VERSION}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    expected = make(out)
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
