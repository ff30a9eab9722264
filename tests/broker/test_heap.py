"""The daemons' garbage collector (sparkmq.heap): a broker daemon freezes its start-up
heap, so the collector's full passes no longer visit it, and /metrics counts the
collector's collections and the time they held the process."""
from __future__ import annotations

import gc
import re
import subprocess
import sys
import urllib.request

import pytest

from helpers.daemons import ROOT, spawn
from helpers.net import free_port
from helpers.waiting import wait_until
from sparkmq import heap


def _sample(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert m, f"no {name}{labels} in /metrics"
    return float(m.group(1))


@pytest.mark.integration
def test_a_broker_daemon_freezes_its_start_up_heap(tmp_path, procs):
    grpc_port, admin_port = free_port(), free_port()
    spawn(["sparkmq.broker", "-p", str(grpc_port), "--admin-port", str(admin_port),
           "--store", str(tmp_path / "store")], f"http://127.0.0.1:{admin_port}/health", procs)

    def metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=10) as r:
            return r.read().decode()
    # the daemon freezes its heap once started, after /health answers (its admin server
    # is part of the start): a read of /metrics between the two finds none frozen yet
    wait_until(lambda: _sample(metrics(), "sparkmq_gc_frozen_objects") > 0,
               "the broker daemon to freeze its start-up heap")
    text = metrics()
    # modules, classes and functions: tens of thousands of objects in any broker
    assert _sample(text, "sparkmq_gc_frozen_objects") > 10_000
    for g in "012":
        assert _sample(text, "python_gc_collections_total", f'{{generation="{g}"}}') >= 0
        assert _sample(text, "sparkmq_gc_pause_seconds_total", f'{{generation="{g}"}}') >= 0


_PROBE = """
import gc, os, signal, sys, threading
sys.path.insert(0, "tests")
from helpers.waiting import wait_until
def probe():            # once the daemon froze its heap: report, then stop it
    try:
        wait_until(gc.get_freeze_count, "the daemon to freeze its start-up heap")
        print("frozen", gc.get_freeze_count(), flush=True)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=probe, daemon=True).start()
from sparkmq.{module} import main
sys.exit(main({argv!r}))
"""


@pytest.mark.integration
@pytest.mark.parametrize("module", ["namesrv", "controller"])
def test_the_namesrv_and_controller_daemons_freeze_their_start_up_heap(module, tmp_path):
    if module == "namesrv":
        argv = ["-p", str(free_port())]
    else:
        conf = tmp_path / "controller.properties"
        conf.write_text(f"controllerDLegerSelfId=n0\n"
                        f"controllerDLegerPeers=n0-127.0.0.1:{free_port()}\n"
                        f"controllerListenPort={free_port()}\n"
                        f"controllerStorePath={tmp_path / 'c0'}\n")
        argv = ["-c", str(conf)]
    out = subprocess.run([sys.executable, "-c", _PROBE.format(module=module, argv=argv)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    frozen = [int(line.split()[1]) for line in out.splitlines() if line.startswith("frozen")]
    assert frozen and frozen[0] > 10_000, out


def test_settle_leaves_the_collector_only_what_is_made_afterwards():
    # in a child: freezing is process-wide, and this test process's heap is pytest's
    code = ("import gc; from sparkmq import heap; before = len(gc.get_objects()); "
            "frozen = heap.settle(); print(before, frozen, len(gc.get_objects()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    before, frozen, after = map(int, out)
    assert frozen >= before * 0.9 and after < before * 0.05


def test_the_collectors_pauses_are_counted_per_generation():
    heap.watch()
    heap.watch()                          # idempotent: one callback, not two
    assert gc.callbacks.count(heap._on_collection) == 1
    counters, gauges = heap.metric_families()
    pause = dict((lab["generation"], v) for lab, v in
                 counters["sparkmq_gc_pause_seconds_total"][1])
    runs = dict((lab["generation"], v) for lab, v in counters["python_gc_collections_total"][1])
    gc.collect()
    counters, _ = heap.metric_families()
    pause2 = dict((lab["generation"], v) for lab, v in
                  counters["sparkmq_gc_pause_seconds_total"][1])
    runs2 = dict((lab["generation"], v) for lab, v in counters["python_gc_collections_total"][1])
    assert runs2["2"] == runs["2"] + 1
    assert pause2["2"] > pause["2"]       # a full pass over pytest's heap takes some time
    assert gauges["sparkmq_gc_frozen_objects"][1] == [({}, gc.get_freeze_count())]
