"""The writer lease names its holder by a random token and judges it gone by its pid only
from the same process scope (host, boot, PID namespace) — issue 12 item 5: two writers in
different PID namespaces on one hostname must not both open a store."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from sparkmq import Store
from sparkmq.log.actions import Lease
from sparkmq.log.lease import LEASE_CRASHED, LEASE_LIVE, lease_status, process_scope

OPEN_IN_CHILD = """
import sys
from sparkmq import Store
from sparkmq.errors import StoreLockedError
try:
    Store.open(sys.argv[1], start_services=False).close()
except StoreLockedError as e:
    print("LOCKED", e); sys.exit(3)
print("OPENED")
"""


def _in_new_pid_namespace(url: str) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-p", "-f", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"this machine does not allow a new PID namespace: {probe.stderr!r}")
    return subprocess.run(["unshare", "-p", "-f", sys.executable, "-c", OPEN_IN_CHILD, url],
                          capture_output=True, text=True, timeout=120)


def test_a_writer_in_another_pid_namespace_is_refused_while_the_holder_lives(local_store_url):
    with Store.open(local_store_url, start_services=False) as holder:
        holder.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        child = _in_new_pid_namespace(local_store_url)
        # (its pid namespace cannot see the holder's pid: judging by pid, it took over)
        assert child.returncode == 3 and "LOCKED" in child.stdout, child.stdout + child.stderr
        assert not holder.lease.fenced
        holder.create_topic("U", read_queue_nums=1, write_queue_nums=1)   # still the writer
    child = _in_new_pid_namespace(local_store_url)                         # released: free
    assert child.returncode == 0 and "OPENED" in child.stdout, child.stdout + child.stderr


def test_a_pid_is_judged_only_from_the_same_scope():
    dead_pid = 2 ** 22 + 7                 # above pid_max: no such process anywhere
    here = f"{process_scope().split('/')[0]}:{dead_pid}:tok"
    mine = Lease(owner=here, epoch=1, expires_time=1 << 50, scope=process_scope())
    other = Lease(owner=here, epoch=1, expires_time=1 << 50,
                  scope=process_scope().rsplit("/", 1)[0] + "/pid:[1]")
    assert lease_status(mine, 0) == LEASE_CRASHED        # same scope: its process is gone
    assert lease_status(other, 0) == LEASE_LIVE          # another namespace: until expiry
    assert lease_status(other, (1 << 50) + 1) == LEASE_CRASHED


def test_the_lease_records_the_holders_scope(local_store_url):
    with Store.open(local_store_url, start_services=False) as s:
        assert s.state.lease.scope == process_scope()
        assert s.token in s.state.lease.owner
