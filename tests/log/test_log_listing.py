"""Loading a snapshot touches the newest checkpoint and the commits after it, never a
listing of the whole ``_log/`` (issue 18 item 3): the ``_last_checkpoint`` pointer,
then one existence probe per newer version. Counted, not timed."""
from __future__ import annotations

import pytest

from sparkmq import Message, Snapshot, Store
from sparkmq.log.fs import StoreFS


@pytest.fixture
def counted(monkeypatch):
    calls = {"list": 0, "exists": 0}
    real_list, real_exists = StoreFS.list_names, StoreFS.exists

    def list_names(self, rel):
        calls["list"] += 1
        return real_list(self, rel)

    def exists(self, rel):
        calls["exists"] += 1
        return real_exists(self, rel)
    monkeypatch.setattr(StoreFS, "list_names", list_names)
    monkeypatch.setattr(StoreFS, "exists", exists)
    return calls


def _store(url: str, versions: int) -> None:
    with Store.open(url, mode="w", start_services=False) as s:
        s.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        while s.state.version < versions:
            s.append([Message("T", b"x")])
            s.publish(force=True)


@pytest.mark.parametrize("versions", [40, 160])
def test_a_load_lists_nothing_and_probes_only_past_the_checkpoint(tmp_path, counted, versions):
    url = str(tmp_path / "s")
    _store(url, versions)
    counted.update(list=0, exists=0)
    snap = Snapshot.load(url)
    assert snap.version >= versions and snap.max_offset("T", 0) > 0
    assert counted["list"] == 0
    assert counted["exists"] <= 10 + 3          # the checkpoint interval, not the log size


def test_without_the_pointer_a_load_still_finds_the_newest_version(tmp_path):
    import os
    url = str(tmp_path / "s")
    _store(url, 25)
    newest = Snapshot.load(url).version
    os.remove(os.path.join(url, "_log", "_last_checkpoint"))
    assert Snapshot.load(url).version == newest


def test_checkpoints_stay_every_10_versions_and_write_only_changed_parts(tmp_path, monkeypatch):
    """Issue 18 item 2: a checkpoint writes only the parts changed since the previous
    one (checkpoint.py), so the interval stays checkpointInterval (10) however big the
    state, and what one writes is bounded by the changes, not by the state."""
    from sparkmq.log import checkpoint, txlog
    monkeypatch.setattr(checkpoint, "ENTRIES_PER_PART", 64)
    written = []
    real = txlog.TransactionLog.write_checkpoint

    def counted(self, state):
        stats = real(self, state)
        written.append((state.version, stats["entries"]))
        return stats
    monkeypatch.setattr(txlog.TransactionLog, "write_checkpoint", counted)
    with Store.open(str(tmp_path / "s"), mode="w", start_services=False) as s:
        v0 = s.state.version
        for i in range(1500):
            s.create_topic(f"T{i}", read_queue_nums=1, write_queue_nums=1)
        commits = s.state.version - v0
    assert [v for v, _ in written] == list(range(10, s.state.version + 1, 10))
    assert len(written) >= commits // 10
    # one topic per commit: at most 10 changed buckets (of at most 2 x 64 entries) per
    # checkpoint, where re-encoding the state would write up to 1,500 topics each time
    late = [n for v, n in written if v > 500]
    assert max(late) <= 10 * 2 * 64 and sum(late) / len(late) < 1500 / 2
