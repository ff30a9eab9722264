"""``sparkmq admin verify STORE``: every batch, side table and log file checked; a summary,
--json, a progress line per few seconds when not on a terminal; exit 1 on damage."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from sparkmq import Message, Store
from sparkmq.admin import main
from sparkmq.log import format as fmt
from sparkmq.log import segment as seg
from sparkmq.log.fs import StoreFS


def _store(url: str) -> str:
    """A store with 3 batches in one sealed segment; returns the segment's path."""
    with Store.open(url, start_services=False) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        for i in range(3):
            s.append([Message("t", b"b%d-%d" % (i, j) * 8, keys=[f"k{i}"], queue_id=0)
                      for j in range(4)])
        s.flush()
        s.commitlog.roll()
        s.flush()
        return s.commitlog.segments()[0].path


def _flip(path: str, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x04]))


def test_a_whole_store_verifies(local_store_url, capsys):
    _store(local_store_url)
    code = main(["verify", local_store_url])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "3 batches with 12 messages" in out.out and "OK: nothing damaged" in out.out
    assert "segment bytes checked" in out.err            # log lines when not on a terminal
    assert main(["verify", "--json", local_store_url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["batches"] == 3 and report["side_tables"] == 2


def test_damage_is_named_and_exits_non_zero(local_store_url, capsys):
    rel = _store(local_store_url)
    sfs = StoreFS(local_store_url)
    res = seg.scan(sfs.read_buffer(rel))
    second = res.positions[1]
    _flip(sfs.local_path(rel), second + res.lengths[1] - 16)           # a body byte
    cq = next(n for n in os.listdir(os.path.join(local_store_url, fmt.CONSUMEQUEUE_DIR)))
    cq_path = os.path.join(local_store_url, fmt.CONSUMEQUEUE_DIR, cq)
    with open(cq_path, "r+b") as f:
        f.truncate(os.path.getsize(cq_path) - 5)                       # footer cut
    code = main(["verify", "--json", local_store_url])
    out = capsys.readouterr()
    assert code == 1 and "damaged item(s)" in out.err
    report = json.loads(out.out)
    kinds = {(p["kind"], p["path"], p["position"]) for p in report["problems"]}
    assert ("batch", rel, second) in kinds
    assert ("consumequeue", f"{fmt.CONSUMEQUEUE_DIR}/{cq}", None) in kinds
    assert report["batches"] == 2                                       # the others are fine


def test_a_damaged_commit_is_named(local_store_url, capsys):
    _store(local_store_url)
    with open(os.path.join(local_store_url, fmt.commit_file(1)), "ab") as f:
        f.write(b"{not json\n")
    code = main(["verify", local_store_url])
    out = capsys.readouterr()
    assert code == 1
    assert f"DAMAGED commit {fmt.commit_file(1)}" in out.out


def test_the_command_line_entry_point(local_store_url):
    _store(local_store_url)
    done = subprocess.run([sys.executable, "-m", "sparkmq.cli", "admin", "verify",
                           local_store_url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "OK: nothing damaged" in done.stdout
