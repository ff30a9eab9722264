"""Write faults (issue 12 items 3 and 7): a file layer that fails the Nth write of a
small workload with ENOSPC or EIO — after writing part of the bytes, as a full disk
does — and the store afterwards: the failed append is refused, the segment is as
before it, later appends are acked, and after a restart every acked message reads
back with its body (checked in a separate process: 0 lost, 0 wrong, 0 crashed)."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import types

import pytest

from sparkmq import Message, Store
from sparkmq.errors import StoreIOError
from sparkmq.log import segment as seg

WORKLOAD = 12          # appends of one message each

READ_BACK = """
import json, sys
from sparkmq import Store
out = {}
with Store.open(sys.argv[1], mode="r", create=False) as s:
    for m in s.read("T", 0, 0, 1000):
        out[m.queue_offset] = m.body.decode()
print(json.dumps(out))
"""


class FailingOS(types.SimpleNamespace):
    """``os`` for the segment module, whose ``fail_at``-th ``write`` writes half of its
    bytes and the next ``write`` raises ``code`` (a disk filling up mid-batch)."""

    def __init__(self, fail_at: int, code: int):
        super().__init__(**{n: getattr(os, n) for n in dir(os) if not n.startswith("__")})
        self.calls, self.fail_at, self.code, self.torn = 0, fail_at, code, False
        self.write = self._write

    def _write(self, fd, data):
        self.calls += 1
        if self.torn:
            self.torn = False
            raise OSError(self.code, os.strerror(self.code))
        if self.calls == self.fail_at and len(data) > 1:
            self.torn = True
            return os.write(fd, bytes(data[:len(data) // 2]))
        return os.write(fd, data)


def _run(url: str, fail_at: int, code: int, monkeypatch) -> tuple[dict[int, str], int]:
    """The workload with the fault; returns (acked offset -> body, refused appends)."""
    acked, refused = {}, 0
    with Store.open(url, start_services=False) as store:
        store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        faulty = FailingOS(fail_at, code)
        monkeypatch.setattr(seg, "os", faulty)
        for i in range(WORKLOAD):
            body = f"message-{i:03d}-" + "x" * (50 + 7 * i)
            try:
                r = store.append([Message("T", body.encode(), queue_id=0)])[0]
            except StoreIOError as e:
                assert e.errno == code and "commitlog" in str(e)
                refused += 1
                continue
            acked[r.queue_offset] = body
        monkeypatch.undo()
        store.flush()
    return acked, refused


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_a_failed_write_at_every_position_loses_and_corrupts_nothing(tmp_path, monkeypatch,
                                                                      code, capsys):
    cases = lost = wrong = crashed = refused_total = 0
    for n in range(1, WORKLOAD + 1):
        url = str(tmp_path / f"s{n}")
        acked, refused = _run(url, n, code, monkeypatch)
        cases += 1
        refused_total += refused
        assert refused == 1 and len(acked) == WORKLOAD - 1
        assert sorted(acked) == list(range(WORKLOAD - 1))     # offsets stay dense
        got = subprocess.run([sys.executable, "-c", READ_BACK, url], capture_output=True,
                             text=True, timeout=120)
        if got.returncode != 0:
            crashed += 1
            continue
        back = {int(k): v for k, v in json.loads(got.stdout).items()}
        lost += sum(1 for off in acked if off not in back)
        wrong += sum(1 for off, body in acked.items() if back.get(off) not in (None, body))
    with capsys.disabled():
        print(f"\nwrite faults ({errno.errorcode[code]}): {cases} cases, {refused_total} appends "
              f"refused, {lost} acked lost, {wrong} wrong bodies, {crashed} crashed readers")
    assert (lost, wrong, crashed) == (0, 0, 0)


def test_the_segment_is_cut_back_to_the_last_whole_batch(tmp_path, monkeypatch):
    url = str(tmp_path / "s")
    with Store.open(url, start_services=False) as store:
        store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        store.append([Message("T", b"first", queue_id=0)])
        path = store.sfs.local_path(store.commitlog.active.rel_path)
        before = os.path.getsize(path)
        monkeypatch.setattr(seg, "os", FailingOS(1, errno.ENOSPC))
        with pytest.raises(StoreIOError, match="ENOSPC"):
            store.append([Message("T", b"second" * 100, queue_id=0)])
        monkeypatch.undo()
        assert os.path.getsize(path) == before == store.commitlog.active.size
        assert store.append([Message("T", b"third", queue_id=0)])[0].queue_offset == 1
    with Store.open(url, start_services=False, create=False) as again:
        assert [m.body for m in again.read("T", 0, 0, 10)] == [b"first", b"third"]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 4 MiB tmpfs (needs root and a kernel that lets this process mount)."""
    where = tmp_path / "fs"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the injected-fault cases cover the rest")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this machine does not allow mounting a tmpfs: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_real_full_tmpfs_refuses_appends_then_takes_them_after_space_is_freed(small_tmpfs,
                                                                               capsys):
    url = str(small_tmpfs / "store")
    filler = small_tmpfs / "filler"
    acked, refused = {}, 0
    with Store.open(url, start_services=False) as store:
        store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
        filler.write_bytes(b"\0" * (free - 256 * 1024))        # leave 256 KiB
        i = 0
        while refused < 3:                                        # until the disk is full
            body = f"m{i:05d}-".encode() + b"y" * 3000
            i += 1
            try:
                acked[store.append([Message("T", body, queue_id=0)])[0].queue_offset] = body
            except StoreIOError as e:
                assert e.errno == errno.ENOSPC
                refused += 1
        filler.unlink()                                           # space is back
        for j in range(20):
            body = f"after-{j:03d}-".encode() + b"z" * 3000
            acked[store.append([Message("T", body, queue_id=0)])[0].queue_offset] = body
    got = subprocess.run([sys.executable, "-c", READ_BACK, url], capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    back = {int(k): v.encode() for k, v in json.loads(got.stdout).items()}
    lost = sum(1 for off in acked if off not in back)
    wrong = sum(1 for off, body in acked.items() if back.get(off) not in (None, body))
    with capsys.disabled():
        print(f"\nreal tmpfs: {len(acked)} acked, {refused} refused with ENOSPC, {lost} lost, "
              f"{wrong} wrong bodies")
    assert (lost, wrong) == (0, 0) and sorted(back) == sorted(acked)


def test_a_close_whose_fsync_fails_is_closed_and_the_next_writer_recovers(tmp_path,
                                                                          monkeypatch):
    """``close`` flushes first; an fsync that fails (EIO) goes to the caller, but the store
    is closed all the same (a second close does nothing, an append is refused as closed,
    its files are let go), and the next writer recovers every appended message, as
    after a crash."""
    from sparkmq import ASYNC_FLUSH
    from sparkmq.errors import StoreClosedError
    url = str(tmp_path / "s")
    store = Store.open(url, start_services=False, flushDiskType=ASYNC_FLUSH)
    store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    store.append([Message("T", f"m{i}".encode()) for i in range(3)])
    faulty = FailingOS(0, errno.EIO)

    def fdatasync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    faulty.fdatasync = fdatasync
    monkeypatch.setattr(seg, "os", faulty)
    with pytest.raises(StoreIOError) as e:
        store.close()
    assert e.value.errno == errno.EIO
    monkeypatch.setattr(seg, "os", os)
    assert store.closed and store.commitlog.active is None     # its segment's fd let go
    store.close()                                  # a no-op now
    with pytest.raises(StoreClosedError):
        store.append([Message("T", b"late")])
    with Store.open(url, start_services=False) as again:
        assert again.recovered_from_crash
        assert [m.body for m in again.read("T", 0, 0, 10)] == [b"m0", b"m1", b"m2"]


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EIO])
def test_a_folder_sync_the_file_system_does_not_support_is_let_pass(tmp_path, monkeypatch, code):
    """Some FUSE and network file systems answer a folder's fsync with EINVAL (or EBADF,
    ENOTSUP): that says they do not sync folders, not that a write failed, so a store
    works there as it did before folders were synced (PostgreSQL's fsync_fname lets the
    same pass). EIO on a folder's fsync refuses the operation, naming the file."""
    import stat

    from sparkmq import durable
    real = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        return real(fd)
    faulty = types.SimpleNamespace(**{n: getattr(os, n) for n in dir(os)
                                      if not n.startswith("__")})
    faulty.fsync = fsync
    monkeypatch.setattr(durable, "os", faulty)      # (every folder's fsync)
    url = str(tmp_path / "s")
    if code == errno.EIO:
        with pytest.raises(StoreIOError) as e:
            Store.open(url, start_services=False)
        assert e.value.errno == errno.EIO and e.value.path
        return
    with Store.open(url, start_services=False, mappedFileSizeCommitLog=4096) as store:
        store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        for i in range(8):                               # rolls: new segments, side tables
            store.append([Message("T", b"x" * 1500 + b"%d" % i)])
        store.flush()
    with Store.open(url, mode="r", create=False) as reader:
        assert len(reader.read("T", 0, 0, 100)) == 8
