"""Bit-flip fault suite (issue 12 item 7, the bit-flip part): flip one bit at every byte of
each batch message's prefix and metadata in a small store's sealed segment, and at sampled
bytes of its bodies, schema message, ConsumeQueue file, checkpoint and newest commit; for each flip read
the store in a SUBPROCESS three ways (Store.read, Store.read_table, Snapshot.read_table)
and require: the process did not crash (no signal), and each read served the right bodies
or raised an error - 0 wrong bodies served.

Flips run in chunks, one subprocess per chunk on its own copy of the store; the child
reports each flip as it finishes it, so a crash is pinned on the first unreported flip and
the rest of the chunk runs in a new child. The figures are printed (pytest -s shows them).
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys

import pytest

CHUNK = 500
FILE_STRIDE = 3          # every 3rd byte of the ConsumeQueue file, checkpoint and commit
BODY_STRIDE = 11         # every 11th byte of message bodies and of the schema message
READS = ("Store.read", "Store.read_table", "Snapshot.read_table")


# ------------------------------------------------------------------ the child
def _served(how: str, url: str) -> list[tuple[int, bytes]]:
    from sparkmq import Snapshot, Store
    if how == "Snapshot.read_table":
        t = Snapshot.load(url).read_table("t", 0, 0, columns=["queue_offset", "body"])
        return list(zip(t.column("queue_offset").to_pylist(), t.column("body").to_pylist()))
    with Store.open(url, mode="r", create=False) as s:
        if how == "Store.read":
            return [(m.queue_offset, m.body) for m in s.read("t", 0, 0, 1000)]
        t = s.read_table("t", 0, 0, columns=["queue_offset", "body"])
        return list(zip(t.column("queue_offset").to_pylist(), t.column("body").to_pylist()))


def _outcome(how: str, url: str, expected: dict[int, bytes]) -> str:
    try:
        got = _served(how, url)
    except Exception as exc:                       # a clean error: the process lives on
        return "error:" + type(exc).__name__
    if any(expected.get(off) != body for off, body in got):
        return "WRONG"
    return "ok" if len(got) == len(expected) else "fewer"


def child(url: str, rel: str, positions: list[int], expected: dict[int, bytes]) -> None:
    """Flip bit ``pos % 8`` of byte ``pos`` of ``rel``, read three ways, flip back; one JSON
    line per position on stdout."""
    path = os.path.join(url, rel)
    with open(path, "r+b") as f:
        for pos in positions:
            f.seek(pos)
            old = f.read(1)[0]
            f.seek(pos)
            f.write(bytes([old ^ (1 << (pos % 8))]))
            f.flush()
            outcomes = [_outcome(how, url, expected) for how in READS]
            f.seek(pos)
            f.write(bytes([old]))
            f.flush()
            print(json.dumps([pos, outcomes]), flush=True)


# ------------------------------------------------------------------ the parent
def _make_store(url: str) -> dict[int, bytes]:
    from sparkmq import Message, Store
    expected = {}
    with Store.open(url, start_services=False, checkpointInterval=3) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        for i in range(2):
            got = s.append([Message("t", b"body-%d-%d|" % (i, j) + bytes([65 + i]) * 40,
                                    keys=[f"k{i}-{j}"], queue_id=0) for j in range(3)])
            s.flush()
        s.commitlog.roll()
        s.flush()
    with Store.open(url, mode="r") as s:
        for m in s.read("t", 0, 0, 1000):
            expected[m.queue_offset] = m.body
    assert len(expected) == 6, got
    return expected


def _segment_positions(path: str) -> list[int]:
    """Every byte of each batch message's prefix and metadata, every BODY_STRIDE-th byte of
    the schema message and of the batch bodies, and the end-of-stream marker."""
    import struct
    import pyarrow as pa
    from sparkmq.log import segment as seg
    data = open(path, "rb").read()
    res = seg.scan(pa.py_buffer(data))
    out = set(range(0, seg.HEADER_SIZE, BODY_STRIDE)) | set(range(len(data) - 8, len(data)))
    for p, n in zip(res.positions, res.lengths):
        meta_end = p + 8 + struct.unpack_from("<i", data, p + 4)[0]
        out |= set(range(p, meta_end)) | set(range(meta_end, p + n, BODY_STRIDE))
    return sorted(out)


def _run(url: str, rel: str, positions: list[int], expected_file: str, work: str) -> dict:
    """{position: outcomes or "CRASH <signal>"} for every position."""
    results: dict[int, object] = {}
    todo = list(positions)
    while todo:
        chunk, todo = todo[:CHUNK], todo[CHUNK:]
        copy = os.path.join(work, "copy")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(url, copy)
        proc = subprocess.run([sys.executable, __file__, copy, rel, json.dumps(chunk),
                               expected_file], capture_output=True, text=True, timeout=600)
        done = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[")]
        for pos, outcomes in done:
            results[pos] = outcomes
        if proc.returncode != 0:
            if len(done) >= len(chunk):
                raise AssertionError(f"child failed after its work: {proc.stderr[-2000:]}")
            crashed = chunk[len(done)]
            if proc.returncode > 0:
                raise AssertionError(f"child failed at {rel} byte {crashed}: "
                                     f"{proc.stderr[-2000:]}")
            results[crashed] = f"CRASH signal {-proc.returncode}"
            todo = chunk[len(done) + 1:] + todo
    return results


@pytest.mark.slow
@pytest.mark.integration
def test_no_bit_flip_serves_a_wrong_body_or_crashes_a_reader(tmp_path):
    from sparkmq.log import format as fmt
    url = str(tmp_path / "store")
    expected = _make_store(url)
    expected_file = str(tmp_path / "expected.json")
    with open(expected_file, "w") as f:
        json.dump({str(k): v.decode("latin-1") for k, v in expected.items()}, f)
    log_names = sorted(os.listdir(os.path.join(url, fmt.LOG_DIR)))
    checkpoint = [n for n in log_names if fmt.parse_checkpoint_file(n) is not None][-1]
    commit = [n for n in log_names if fmt.parse_commit_file(n) is not None][-1]
    cq = sorted(os.listdir(os.path.join(url, fmt.CONSUMEQUEUE_DIR)))[0]
    segment = fmt.segment_file(0)
    targets = {
        "segment": (segment, _segment_positions(os.path.join(url, segment))),
        "consumequeue": (f"{fmt.CONSUMEQUEUE_DIR}/{cq}", None),
        "checkpoint": (f"{fmt.LOG_DIR}/{checkpoint}", None),
        "commit": (f"{fmt.LOG_DIR}/{commit}", None),
    }
    figures, wrong, crashes = {}, [], []
    for name, (rel, positions) in targets.items():
        if positions is None:
            positions = list(range(0, os.path.getsize(os.path.join(url, rel)), FILE_STRIDE))
        results = _run(url, rel, positions, expected_file, str(tmp_path))
        tally = collections.Counter()
        for pos, outcomes in results.items():
            if isinstance(outcomes, str):
                crashes.append((rel, pos, outcomes))
                tally["CRASH"] += 1
                continue
            for how, o in zip(READS, outcomes):
                tally[o] += 1
                if o == "WRONG":
                    wrong.append((rel, pos, how))
        figures[name] = (len(results), dict(tally))
    cases = sum(n for n, _ in figures.values())
    print(f"\nbit-flip suite: {cases} flips x {len(READS)} reads, each in a subprocess; "
          f"{len(wrong)} wrong bodies served, {len(crashes)} crashed processes")
    for name, (n, tally) in figures.items():
        print(f"  {name:<13} {n:>5} flips  {tally}")
    assert not crashes, f"reader processes crashed: {crashes[:10]}"
    assert not wrong, f"wrong bodies served: {wrong[:10]}"


if __name__ == "__main__":
    _url, _rel, _positions, _expected_file = sys.argv[1:5]
    with open(_expected_file) as _f:
        _expected = {int(k): v.encode("latin-1") for k, v in json.load(_f).items()}
    child(_url, _rel, json.loads(_positions), _expected)
