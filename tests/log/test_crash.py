"""Crash test with real processes: a SYNC_FLUSH writer is SIGKILLed at random
times, round after round; every append that returned must survive with the
same offset and body, and no partial batch may ever be visible."""
from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.waiting import wait_until

from sparkmq import Snapshot, Store

WRITER = Path(__file__).parent.parent / "helpers" / "crash_writer.py"
TOPIC, QUEUES = "crash", 2
BODY_RE = re.compile(rb"^r(\d+)-s(\d+)-i(\d+)-n(\d+)\|x*$")
ROUNDS = 8


def _read_lines(proc, until_s: float, want_lines: int, lines: list[str], buf: bytearray) -> None:
    """Collect whole stdout lines until ``want_lines`` or the deadline (bounded)."""
    fd = proc.stdout.fileno()
    while time.monotonic() < until_s and len(lines) < want_lines:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf.extend(chunk)
        *whole, rest = bytes(buf).split(b"\n")
        lines.extend(w.decode() for w in whole)
        buf[:] = rest


def _run_round(url: str, rnd: int, rng: random.Random, flush_type: str = "SYNC_FLUSH",
               ) -> tuple[dict, list[dict]]:
    """Start a writer, let it append for a random while, SIGKILL it.

    Returns its start report and the acknowledged messages."""
    proc = subprocess.Popen([sys.executable, str(WRITER), url, str(rnd), flush_type],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    buf = bytearray()
    try:
        _read_lines(proc, time.monotonic() + 60, 1, lines, buf)       # started and recovered
        assert lines, f"writer did not start: {proc.stderr.read().decode()[-2000:]}"
        _read_lines(proc, time.monotonic() + rng.uniform(0.05, 0.8), 1 << 30, lines, buf)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    _read_lines(proc, time.monotonic() + 5, 1 << 30, lines, buf)       # what was printed before
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, "the writer must die by SIGKILL, not finish"
    start = json.loads(lines[0])
    acked = [m for line in lines[1:] for m in json.loads(line)]
    return start, acked


def _check_whole_batches(rows: list[tuple[int, int, bytes]]) -> None:
    """Every batch (round, seq) is present with all of its n messages, or absent."""
    seen: dict[tuple[int, int], set[int]] = {}
    size: dict[tuple[int, int], int] = {}
    for _q, _o, body in rows:
        m = BODY_RE.match(body)
        assert m, f"a message body is damaged: {body[:60]!r}"
        r, s, i, n = (int(g) for g in m.groups())
        seen.setdefault((r, s), set()).add(i)
        size[(r, s)] = n
    for key, idx in seen.items():
        assert idx == set(range(size[key])), f"partial batch visible: {key} has {sorted(idx)}"


def _all_rows(reader) -> list[tuple[int, int, bytes]]:
    rows = []
    for q in range(QUEUES):
        lo = reader.min_offset(TOPIC, q)
        t = reader.read_table(TOPIC, q, lo, columns=["queue_offset", "body"])
        offsets = t.column("queue_offset").to_pylist()
        assert offsets == list(range(lo, lo + len(offsets))), "queue offsets have a gap"
        rows += [(q, o, b) for o, b in zip(offsets, t.column("body").to_pylist())]
    return rows


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("flush_type,rounds", [("SYNC_FLUSH", ROUNDS), ("ASYNC_FLUSH", 3)])
def test_sigkill_writer_loses_no_acknowledged_append(tmp_path, flush_type, rounds):
    """SYNC_FLUSH: acknowledged means fsynced. ASYNC_FLUSH: acknowledged means
    written to the OS, which a killed process (unlike a lost machine) keeps."""
    url = str(tmp_path / "store")
    rng = random.Random(int(os.environ.get("SPARKMQ_CRASH_SEED", "20261123")))
    acked: dict[tuple[int, int], dict] = {}
    for rnd in range(rounds):
        start, new = _run_round(url, rnd, rng, flush_type)
        for q in range(QUEUES):   # the new writer recovered every earlier acknowledged append
            known = [o for (qq, o) in acked if qq == q]
            assert start["start"][str(q)] >= (max(known) + 1 if known else 0), (rnd, q)
        if rnd > 0:
            assert start["recovered"]
        for m in new:
            assert m["s"] == "PUT_OK"
            key = (m["q"], m["o"])
            assert key not in acked, f"offset {key} acknowledged twice"
            acked[key] = m
        snap = Snapshot.load(url)          # what other processes see: whole batches only
        _check_whole_batches(_all_rows(snap))
    assert len(acked) > rounds, "the writers acknowledged too few appends to test anything"
    print(f"crash test {flush_type}: {rounds} SIGKILLs, {len(acked)} acknowledged messages")
    with Store.open(url, start_services=False) as store:
        assert store.recovered_from_crash
        rows = _all_rows(store)
        stored = {(q, o): b for q, o, b in rows}
        for (q, o), m in acked.items():
            assert stored.get((q, o)) == m["b"].encode(), f"acknowledged {q}/{o} lost or changed"
        for m in list(acked.values())[:: max(1, len(acked) // 50)]:
            got = store.lookup(m["id"])
            assert got is not None and got.body == m["b"].encode()
            assert (got.queue_id, got.queue_offset) == (m["q"], m["o"])
        _check_whole_batches(rows)
        assert len({b for _q, _o, b in rows}) == len(rows), "a message is stored twice"


def _reader_sees_topic(url: str) -> bool:
    with Store.open(url, mode="r") as reader:
        return TOPIC in reader.topic_names()


@pytest.mark.integration
def test_live_writer_in_another_process_holds_the_lease(tmp_path):
    """While a writer process lives, a second writer gets StoreLockedError and a
    reader is welcome; once it is SIGKILLed, the next writer recovers at once
    (the lease names a dead pid) without waiting for the lease to expire."""
    from sparkmq.errors import StoreLockedError
    url = str(tmp_path / "store")
    proc = subprocess.Popen([sys.executable, str(WRITER), url, "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    buf = bytearray()
    try:
        _read_lines(proc, time.monotonic() + 60, 3, lines, buf)
        assert len(lines) >= 3, proc.stderr.read().decode()[-2000:] if proc.poll() else lines
        with pytest.raises(StoreLockedError, match="held by writer"):
            Store.open(url, start_services=False)
        wait_until(lambda: _reader_sees_topic(url), f"a reader to see topic {TOPIC}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
    with Store.open(url, start_services=False) as store:
        assert store.recovered_from_crash
        _check_whole_batches(_all_rows(store))
