"""The daemon starter the process tests share (tests/helpers/daemons.py): a real
NameServer process comes up, stops cleanly or dies by kill -9; one that cannot start
fails the test with its own output and is not left behind; the ports tests pick never
repeat."""
from __future__ import annotations

import signal
import socket

import pytest

from helpers.net import _ephemeral_low, free_port
from helpers.daemons import get_json, kill9, spawn, stop_process

pytestmark = pytest.mark.integration


def test_spawn_waits_for_health_then_stop_and_kill9(procs):
    port = free_port()
    ns = spawn(["sparkmq.namesrv", "-p", str(port)], f"http://127.0.0.1:{port}/health", procs)
    assert procs == [ns] and ns.poll() is None
    assert get_json(f"http://127.0.0.1:{port}/brokers")["brokers"] == []
    assert stop_process(ns) == 0                          # SIGTERM: a clean exit
    port2 = free_port()
    ns2 = spawn(["sparkmq.namesrv", "-p", str(port2)], f"http://127.0.0.1:{port2}/health", procs)
    kill9(ns2)
    assert ns2.returncode == -signal.SIGKILL


def test_a_daemon_that_cannot_start_fails_with_its_output(tmp_path, procs):
    conf = tmp_path / "bad.properties"
    conf.write_text("brokerRole=BOSS\n")
    with pytest.raises(AssertionError, match="(?s)exited with.*brokerRole"):
        spawn(["sparkmq.broker", "-c", str(conf)], f"http://127.0.0.1:{free_port()}/health",
              procs)
    assert [p.poll() is not None for p in procs] == [True]


def test_free_port_never_hands_a_port_out_twice_and_stays_below_the_ephemeral_range():
    # 1,000 picks from ~16k ports repeat ~30 times by chance: the record must stop it
    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)
    # nor one two above another: a broker's Flight port (listenPort + 2) would take it
    assert not {p + 2 for p in ports} & set(ports)
    assert all(1024 <= p < _ephemeral_low() for p in ports)
    with socket.socket() as s:                  # what it returns is bindable on loopback
        s.bind(("127.0.0.1", ports[-1]))


def test_two_xdist_workers_pick_ports_from_ranges_that_do_not_meet(monkeypatch):
    """A port one worker picked is free until its server binds it: the other worker must
    not pick it meanwhile (a master's health check once read another worker's gRPC)."""
    picked = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        picked[worker] = {free_port() for _ in range(200)}
    assert max(picked["gw0"]) < min(picked["gw1"])
    assert all(1024 <= p < _ephemeral_low() for p in picked["gw0"] | picked["gw1"])
