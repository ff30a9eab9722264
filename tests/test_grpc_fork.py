"""A process with busy gRPC channels that imports sparkmq can fork and exec children (as
pyspark starts Spark's JVM: ``Popen(preexec_fn=...)``) without any of them dying before
its exec. grpcio >= 1.80's fork handlers killed ~1-2 % of such children here (one CI run
lost every Spark test of a worker: "Java gateway process exited"; grpc/grpc#43055):
sparkmq turns them off unless the process set ``GRPC_ENABLE_FORK_SUPPORT`` itself."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.net import free_port

pytestmark = pytest.mark.integration

CHILD = """
import os, subprocess, sys, threading
import sparkmq                                  # before gRPC starts, as an application does
import grpc
from concurrent import futures
print(os.environ.get("GRPC_ENABLE_FORK_SUPPORT"), flush=True)
server = grpc.server(futures.ThreadPoolExecutor(4))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
    "e", {"m": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}),))
server.add_insecure_port("127.0.0.1:%d" % int(sys.argv[1]))
server.start()
call = grpc.insecure_channel("127.0.0.1:%d" % int(sys.argv[1])).unary_unary("/e/m")
done = threading.Event()
def busy():                                     # RPCs in flight at every fork
    while not done.is_set():
        call(b"x", timeout=5)
threads = [threading.Thread(target=busy) for _ in range(2)]
for t in threads:
    t.start()
died = sum(subprocess.Popen(["/bin/true"], preexec_fn=lambda: None).wait() != 0
           for _ in range(int(sys.argv[2])))
done.set()
for t in threads:
    t.join()
server.stop(None)
print(died, flush=True)
"""


def _run(*args: str, **env) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", *args], env={**base, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_children_forked_beside_busy_grpc_channels_all_reach_their_exec():
    # without the setting ~1-2 % of these children died here: 400 forks all failing to
    # show it would be a chance of well under 1 %
    setting, died = _run(CHILD, str(free_port()), "400")
    assert setting == "false" and died == "0"


def test_a_process_that_chose_its_fork_setting_keeps_it():
    show = "import os, sparkmq; print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))"
    assert _run(show, GRPC_ENABLE_FORK_SUPPORT="true") == ["true"]
