"""Concurrent writers of one transaction log: put-if-absent gives every
version exactly one winner, and the commit loop loses no commit."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers.waiting import wait_until

from sparkmq.log import format as fmt
from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TransactionLog, decode_actions

WORKER = Path(__file__).parent.parent / "helpers" / "commit_worker.py"
COMMITS_PER_WRITER = 100


def _create(url):
    log = TransactionLog(StoreFS(url), checkpoint_interval_versions=7)
    log.create([{"protocol": {"minReaderVersion": 1, "minWriterVersion": 1}},
                {"metaData": {"storeId": "concurrent"}}])
    return log


def _check_log(log: TransactionLog, writers: int, n: int) -> None:
    versions = log.versions()
    assert versions == list(range(writers * n + 1)), "versions must be contiguous"
    app_ids = []
    for v in versions[1:]:
        actions = decode_actions(log.sfs.read_bytes(fmt.commit_file(v)), f"v{v}")
        txns = [a["txn"] for a in actions if "txn" in a]
        assert len(txns) == 1, f"version {v} holds {len(txns)} commits"
        assert txns[0]["seenVersion"] == v - 1      # built on the state just before it
        app_ids.append(txns[0]["appId"])
    expected = {f"w{w}-{i}" for w in range(writers) for i in range(n)}
    assert len(app_ids) == len(set(app_ids)) and set(app_ids) == expected
    state = TransactionLog(log.sfs).snapshot()
    assert set(state.txns) == expected
    # every writer's own commits are in its order
    for w in range(writers):
        mine = [a for a in app_ids if a.startswith(f"w{w}-")]
        assert mine == [f"w{w}-{i}" for i in range(n)]


def _wait_ready(go: Path, writers: int, procs, timeout_s: float = 60) -> None:
    def ready() -> bool:
        assert all(p.poll() is None for p in procs), "a worker died before starting"
        return all(Path(f"{go}.ready{w}").exists() for w in range(writers))
    wait_until(ready, "the workers to start", timeout_s=timeout_s)


@pytest.mark.integration
def test_two_processes_commit_concurrently(tmp_path):
    url = str(tmp_path / "store")
    log = _create(url)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(WORKER), url, str(w), str(COMMITS_PER_WRITER),
                               str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(2)]
    try:
        _wait_ready(go, 2, procs)
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    reports = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    _check_log(log, 2, COMMITS_PER_WRITER)
    won = sorted(v for r in reports for v in r["versions"])
    assert won == list(range(1, 2 * COMMITS_PER_WRITER + 1))   # each version won by one
    assert sum(r["builds"] for r in reports) >= 2 * COMMITS_PER_WRITER
    print("build calls (commits + retries):", [r["builds"] for r in reports])


def test_threads_commit_concurrently(store_url):
    """The same race inside one process, on every backend (memory:// included)."""
    log = _create(store_url)
    writers, n = 4, 15
    barrier = threading.Barrier(writers)
    errors = []

    def run(w):
        try:
            mine = TransactionLog(StoreFS(store_url), checkpoint_interval_versions=7)
            barrier.wait(10)
            for i in range(n):
                mine.commit(lambda s, i=i: [{"txn": {"appId": f"w{w}-{i}", "version": i,
                                                     "seenVersion": s.version}}],
                            operation="THREAD", retries=1000)
        except Exception as exc:   # reported below
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    _check_log(log, writers, n)
    names = log.sfs.list_names(fmt.LOG_DIR)
    assert not [n for n in names if n.startswith(".tmp-")]   # no temp files left behind
