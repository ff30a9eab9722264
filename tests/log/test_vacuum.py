"""Deletion of removed files (persisted deletionTimestamp + deletedFileRetentionMs)
and vacuum of unreferenced files, on real files."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from sparkmq import Store
from sparkmq.admin import main as admin_main
from sparkmq.errors import InvalidConfigError
from sparkmq.log import format as fmt
from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TOMBSTONE_EXTRA_MS, TransactionLog

from helpers.clock import Clock
from helpers.storetools import SMALL_SEGMENT_BYTES, msg

T0_MS = 1_700_000_000_000
HOUR_MS = 3_600_000


def _open(url, clock=None, **conf):
    return Store.open(url, clock_ms=clock, start_services=False,
                      mappedFileSizeCommitLog=SMALL_SEGMENT_BYTES, **conf)


def _fill(store, n=60, topic="t"):
    for i in range(n):
        store.append([msg(topic, b"m%05d" % i + b"." * 300, 0)])
    store.flush()


def _store_with_removed_segments(url, clock, **conf):
    """A store (left open) whose two oldest segments were just removed by retention."""
    s = _open(url, clock, **conf)
    s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
    _fill(s)
    paths = [r.path for r in s.commitlog.segments()[:2]]
    assert s.remove_segments(paths) == paths
    return s, paths


def test_removed_files_are_deleted_after_the_configured_delay(store_url):
    clock = Clock()
    s, removed = _store_with_removed_segments(store_url, clock, deletedFileRetentionMs=5_000)
    sfs = s.sfs
    clock.now_ms += 4_999
    assert s.delete_removed_files() == [] and all(sfs.exists(p) for p in removed)
    clock.now_ms += 1
    assert sorted(s.delete_removed_files()) == sorted(removed)
    assert not any(sfs.exists(p) for p in removed)
    assert s.delete_removed_files() == []          # once
    assert s.min_offset("t", 0) > 0 and s.max_offset("t", 0) == 60
    s.close()


def test_removed_files_of_a_writer_closed_before_the_delay_go_with_the_next_writer(store_url):
    clock = Clock()
    s, removed = _store_with_removed_segments(store_url, clock)
    s.close()                                      # the delay (60 s) has not passed
    sfs = StoreFS(store_url)
    assert all(sfs.exists(p) for p in removed)
    clock.now_ms += 30_000
    with _open(store_url, clock):                  # still young: kept
        pass
    assert all(sfs.exists(p) for p in removed)
    clock.now_ms += 30_000
    with _open(store_url, clock):
        pass
    assert not any(sfs.exists(p) for p in removed)


def test_tombstones_survive_checkpoints_until_well_past_their_delay(store_url):
    clock = Clock()
    s, removed = _store_with_removed_segments(store_url, clock, checkpointInterval=2)
    for i in range(6):                             # several checkpoints after the remove
        s.create_topic(f"x{i}")
    s.close()
    tl = TransactionLog(StoreFS(store_url))
    fresh = tl.snapshot()                          # built from a checkpoint
    assert tl._last_checkpoint() > tl.snapshot().version - 2
    assert set(removed) <= set(fresh.tombstones)
    # a checkpoint written long after the delay no longer carries them
    clock.now_ms += 60_000 + TOMBSTONE_EXTRA_MS + 1
    with _open(store_url, clock, checkpointInterval=2) as s2:
        for i in range(3):
            s2.create_topic(f"y{i}")
    assert not set(removed) & set(TransactionLog(StoreFS(store_url)).snapshot().tombstones)


def test_a_removed_path_added_again_is_not_deleted(store_url):
    """A replica truncation removes segments whose names its master later re-creates:
    the new add clears the tombstone."""
    clock = Clock()
    s, removed = _store_with_removed_segments(store_url, clock)
    add = {"path": removed[0], "kind": "segment", "baseOffset": 0, "size": 0, "sealed": True,
           "modificationTime": clock.now_ms}
    s._commit(lambda st: [{"add": add}], "TEST READD")
    clock.now_ms += 120_000
    assert s.delete_removed_files() == [removed[1]]
    assert s.sfs.exists(removed[0]) and not s.sfs.exists(removed[1])
    s.close()


_KILLED_WRITER = r"""
import json, sys, time
from sparkmq import Message, Store
s = Store.open(sys.argv[1], start_services=False, mappedFileSizeCommitLog=8192)
s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
for i in range(60):
    s.append([Message("t", b"m%05d" % i + b"." * 300, queue_id=0)])
s.flush()
paths = [r.path for r in s.commitlog.segments()[:2]]
s.remove_segments(paths)
print(json.dumps(paths), flush=True)
time.sleep(120)   # the point: stay alive holding the lease until the test kills us
"""


def _run_killed_writer(url) -> list[str]:
    """A real writer process that removes two segments and is SIGKILLed before the
    delay: returns the removed paths (still on disk)."""
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, url],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
    assert line, "the writer process printed nothing"
    removed = json.loads(line)
    assert all(os.path.exists(os.path.join(url, p)) for p in removed)
    return removed


@pytest.mark.integration
def test_removed_files_of_a_sigkilled_writer_are_deleted_by_the_next_writer(local_store_url):
    removed = _run_killed_writer(local_store_url)
    now = int(time.time() * 1000)
    with _open(local_store_url, Clock(now + 60_000)) as s:     # the delay has passed
        assert s.recovered_from_crash
        assert s.max_offset("t", 0) == 60
    assert not any(os.path.exists(os.path.join(local_store_url, p)) for p in removed)


@pytest.mark.integration
def test_removed_files_of_a_sigkilled_writer_are_deleted_by_vacuum(local_store_url):
    removed = _run_killed_writer(local_store_url)
    future = Clock(int(time.time() * 1000) + 2 * HOUR_MS)
    with Store.open(local_store_url, mode="r", clock_ms=future) as s:   # no lease needed
        result = s.vacuum(retention_ms=HOUR_MS)
    assert sorted(result.files) == sorted(removed)
    assert not any(os.path.exists(os.path.join(local_store_url, p)) for p in removed)
    with Store.open(local_store_url, mode="r") as s:           # nothing readable was lost
        assert s.max_offset("t", 0) == 60


# ---------------------------------------------------------------- vacuum
def _age(url, rel, hours):
    t = time.time() - hours * 3600
    os.utime(os.path.join(url, rel), (t, t))


@pytest.fixture
def vac_store(local_store_url):
    """A closed store with a referenced segment and CQ/Index files, all aged 10 h,
    and orphans: an old staged segment, an old side file, a young staged segment,
    an unpublished broker-named tail segment, and a file the store did not make."""
    url = local_store_url
    with _open(url) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        _fill(s, 30)
        s.append([msg("t", b"k", 0, keys=["key1"])])
        s.flush()
        end = s.state.address_end()
    sfs = StoreFS(url)
    state = TransactionLog(sfs).snapshot()
    live = set(state.segments) | set(state.consumequeue_files) | set(state.index_files)
    orphans = {
        "old_staged": f"{fmt.COMMITLOG_DIR}/w-job1-0-{uuid.uuid4().hex}.arrow",
        "old_side": f"{fmt.CONSUMEQUEUE_DIR}/{uuid.uuid4().hex}.parquet",
        "young_staged": f"{fmt.COMMITLOG_DIR}/w-job2-0-{uuid.uuid4().hex}.arrow",
        "tail": fmt.segment_file(end + 10_000),
        "foreign": f"{fmt.INDEX_DIR}/notes.txt",
    }
    for rel in orphans.values():
        sfs.write(rel, b"x" * 100)
    for rel in list(live) + [orphans[k] for k in ("old_staged", "old_side", "tail", "foreign")]:
        _age(url, rel, 10)
    return url, live, orphans


def _on_disk(url):
    sfs = StoreFS(url)
    return {f"{d}/{n}" for d in (fmt.COMMITLOG_DIR, fmt.CONSUMEQUEUE_DIR, fmt.INDEX_DIR)
            for n in sfs.list_names(d)}


def test_vacuum_deletes_old_orphans_only(vac_store):
    url, live, orphans = vac_store
    assert live and any(p.startswith(fmt.INDEX_DIR) for p in live)
    before = _on_disk(url)
    with Store.open(url, mode="r") as s:
        dry = s.vacuum(retention_ms=2 * HOUR_MS, dry_run=True)
        assert _on_disk(url) == before                      # a dry run deletes nothing
        result = s.vacuum(retention_ms=2 * HOUR_MS)
    assert sorted(dry.files) == sorted(result.files) == sorted(
        [orphans["old_staged"], orphans["old_side"]])
    assert result.total_bytes == 200 and result.kept_young == 1 and not result.dry_run
    assert _on_disk(url) == before - {orphans["old_staged"], orphans["old_side"]}
    assert live <= _on_disk(url)                            # referenced: kept, however old
    with Store.open(url, mode="r") as s:
        assert s.max_offset("t", 0) == 31 and s.query_by_key("t", "key1")


def test_vacuum_deletes_old_temporary_files_of_the_log_only(vac_store):
    """A process killed between writing a commit's (or ``_last_checkpoint``'s) temporary
    file and its link or rename leaves a ``.tmp-*`` file in ``_log/``: an old one goes,
    a young one (a write under way) and every log file stay."""
    url, _, _ = vac_store
    sfs = StoreFS(url)
    old, young = (f"{fmt.LOG_DIR}/.tmp-{uuid.uuid4().hex}" for _ in range(2))
    for rel in (old, young):
        sfs.write(rel, b"{}")
    _age(url, old, 10)
    log_files = set(sfs.list_names(fmt.LOG_DIR)) - {old.split("/")[1], young.split("/")[1]}
    for name in log_files:
        if not name.startswith("_"):
            _age(url, f"{fmt.LOG_DIR}/{name}", 10)
    with Store.open(url, mode="r") as s:
        result = s.vacuum(retention_ms=2 * HOUR_MS)
    assert old in result.files and young not in result.files
    left = set(sfs.list_names(fmt.LOG_DIR))
    assert old.split("/")[1] not in left and young.split("/")[1] in left
    assert log_files <= left
    with Store.open(url, mode="r") as s:
        assert s.max_offset("t", 0) == 31


def test_vacuum_on_a_writable_store_keeps_its_unpublished_segments(vac_store):
    url, live, orphans = vac_store
    with _open(url) as s:
        s.append([msg("t", b"unpublished", 0)])       # written, not published
        active = s.commitlog.segments()[-1].path
        _age(url, active, 10)
        result = s.vacuum(retention_ms=HOUR_MS)
        assert active not in result.files and StoreFS(url).exists(active)
    assert orphans["old_staged"] in result.files and live <= _on_disk(url)


def test_vacuum_refuses_a_short_retention_unless_forced(vac_store):
    url, live, orphans = vac_store
    with Store.open(url, mode="r") as s:
        with pytest.raises(InvalidConfigError, match="safe minimum of 1 h"):
            s.vacuum(retention_ms=HOUR_MS - 1)
        result = s.vacuum(retention_ms=0, force=True)
    assert orphans["young_staged"] in result.files and live <= _on_disk(url)
    assert orphans["tail"] not in result.files and orphans["foreign"] not in result.files


def test_admin_vacuum(vac_store, capsys):
    url, live, orphans = vac_store
    before = _on_disk(url)
    assert admin_main(["vacuum", url, "--retain-hours", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would delete {orphans['old_staged']}" in out and "would delete 2 files" in out
    assert _on_disk(url) == before
    assert admin_main(["vacuum", url, "--retain-hours", "0.5"]) == 1
    assert "below the safe minimum" in capsys.readouterr().err
    assert _on_disk(url) == before
    assert admin_main(["--json", "vacuum", url, "--retain-hours", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(report["files"]) == sorted([orphans["old_staged"], orphans["old_side"]])
    assert not report["dryRun"] and _on_disk(url) == before - set(report["files"])
    assert admin_main(["vacuum"]) == 1
    assert "needs the store" in capsys.readouterr().err
