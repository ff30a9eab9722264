"""A first run without set-up, as an operator starts it: a NameServer and a broker
daemon of one user on one machine, no SPARKMQ_* variables. They share the cluster
secret file made at the first start; the broker makes its admin token, prints it once
and keeps it 0600 beside its store, where ``sparkmq admin`` finds it."""
from __future__ import annotations

import json
import os
import stat

import pytest

from helpers.daemons import output, spawn
from helpers.net import free_port
from helpers.waiting import wait_until
from sparkmq import admin
from sparkmq.namesrv import NameServerClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_namesrv_and_broker_daemons_need_no_set_up(tmp_path, procs, monkeypatch, capsys):
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARKMQ_ADMIN_TOKEN", "SPARKMQ_CLUSTER_SECRET")}
    env["HOME"] = str(tmp_path / "home")
    ns_port, grpc_port, admin_port = free_port(), free_port(), free_port()
    spawn(["sparkmq.namesrv", "-p", str(ns_port)], f"http://127.0.0.1:{ns_port}/health",
          procs, env=env)
    store = tmp_path / "broker-a"
    broker = spawn(["sparkmq.broker", "-n", f"127.0.0.1:{ns_port}", "-p", str(grpc_port),
                    "--admin-port", str(admin_port), "--store", str(store)],
                   f"http://127.0.0.1:{admin_port}/health", procs, env=env)
    ns = NameServerClient(f"127.0.0.1:{ns_port}")
    wait_until(lambda: [b["brokerName"] for b in ns.brokers() or []] == ["broker-a"],
               "the broker's signed registration to be accepted")
    secret_file = tmp_path / "home" / ".sparkmq" / "cluster.secret"
    assert stat.S_IMODE(os.stat(secret_file).st_mode) == 0o600
    token_file = store / "admin.token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = token_file.read_text().strip()
    # (the token itself: the log's "made an admin token" line comes before the banner)
    wait_until(lambda: token in output(broker), "the daemon to print its token")
    assert output(broker).count(token) >= 1 and "admin token" in output(broker)
    monkeypatch.delenv("SPARKMQ_ADMIN_TOKEN")
    url = f"http://127.0.0.1:{admin_port}"
    assert admin.main(["--broker", url, "--store", str(store), "--json", "broker", "status"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "running"
    assert admin.main(["--broker", url, "--token", "wrong", "broker", "status"]) == 1
    assert "401" in capsys.readouterr().err
