"""The cluster console (``sparkmq console --namesrv``, ``sparkmq.console.cluster``)
against a real in-process NameServer and two real brokers: the page lists both brokers,
a topic present on both with each broker's max offsets, and a group's lag summed over
both; with a login required nothing is shown without the token; in Chromium, log in and
take a screenshot."""
from __future__ import annotations

import os

import pytest

from helpers.console import call
from helpers.net import free_port
from sparkmq.console.cluster import ClusterConsole
from sparkmq.errors import SparkMQError
from sparkmq.log.message import Message
from sparkmq.namesrv import NameServer

pytestmark = [pytest.mark.integration]


@pytest.fixture
def cluster(make_broker):
    """A NameServer; broker-a and broker-b registered with it, topic Shared on both
    (3 and 5 messages), group Readers with committed offsets on both."""
    with NameServer(port=free_port()) as ns:
        a = make_broker("broker-a", namesrvAddr=ns.address, autoCreateTopicEnable="false")
        b = make_broker("broker-b", namesrvAddr=ns.address, autoCreateTopicEnable="false")
        for broker, n in ((a, 3), (b, 5)):
            broker.admin.create_topic({"name": "Shared", "queueNums": 2})
            broker.store.append([Message(topic="Shared", body=b"m", queue_id=i % 2)
                                 for i in range(n)])
            broker.store.commit_consumer_offsets("Readers", {("Shared", 0): 1})
            broker.register_once()
        a.admin.create_topic({"name": "OnlyA", "queueNums": 1})
        yield ns, a, b


def expected_offsets(broker) -> str:
    ranges = sorted(broker.store.queue_ranges("Shared").items())
    return " ".join(f"{q}:{hi}" for (_, q), (_, hi) in ranges)


def expected_lag(broker) -> int:
    return sum(hi - (1 if q == 0 else 0)
               for (_, q), (_, hi) in broker.store.queue_ranges("Shared").items()
               if q == 0)


def test_the_cluster_page_lists_both_brokers_and_a_shared_topic(cluster, html_table, html_rows):
    all_rows = html_rows
    ns, a, b = cluster
    with ClusterConsole(ns.address, a.admin_token, port=0) as console:
        status, headers, body = call(console.url, "GET", "/console")
    assert status == 200, body
    assert "script-src" not in headers["Content-Security-Policy"] and "<script" not in body
    header, _, _ = html_table(body, "brokers")
    by_name = {r[1]: r for r in all_rows(body, "brokers")}
    assert set(by_name) == {"broker-a", "broker-b"}
    for broker in (a, b):
        row = by_name[broker.config.broker_name]
        assert row[header.index("Id")] == "0" and row[header.index("State")] == "running"
        assert row[header.index("Role")] == broker.role
        assert row[header.index("Epoch")] == str(broker.store.epoch)
        assert f'href="{broker.admin_url}/console"' in body
    rows = {(r[0], r[1]): r for r in all_rows(body, "topics")}
    assert rows[("Shared", "broker-a")][4] == expected_offsets(a) != ""
    assert rows[("Shared", "broker-b")][4] == expected_offsets(b)
    assert rows[("Shared", "broker-a")][5] == "3" and rows[("Shared", "broker-b")][5] == "5"
    assert ("OnlyA", "broker-a") in rows and ("OnlyA", "broker-b") not in rows
    header, groups, _ = html_table(body, "groups")
    assert groups["Readers"][header.index("Lag (all brokers)")] == str(
        expected_lag(a) + expected_lag(b))
    assert groups["Readers"][header.index("Brokers")] == "broker-a, broker-b"


def test_a_broker_that_refuses_the_token_is_shown_with_why(cluster, html_table, html_rows):
    all_rows = html_rows
    ns, a, b = cluster
    with ClusterConsole(ns.address, "not-the-token", port=0) as console:
        status, _, body = call(console.url, "GET", "/console")
    assert status == 200
    header, _, _ = html_table(body, "brokers")
    brokers = all_rows(body, "brokers")
    assert all("wrong or missing admin token" in r[header.index("State")]
               for r in brokers) and len(brokers) == 2


def test_with_a_login_required_nothing_is_shown_without_the_token(cluster):
    ns, a, b = cluster
    with ClusterConsole(ns.address, a.admin_token, port=0, require_login=True) as console:
        status, headers, body = call(console.url, "GET", "/console")
        assert status == 401 and "broker-a" not in body and 'name="token"' in body
        status, _, body = call(console.url, "GET", "/console",
                               headers={"Authorization": "Bearer wrong"})
        assert status == 401 and "broker-a" not in body
        status, _, body = call(console.url, "GET", "/console",
                               headers={"Authorization": f"Bearer {a.admin_token}"})
        assert status == 200 and "broker-a" in body
        status, headers, _ = call(console.url, "POST", "/console/login",
                                  form={"token": a.admin_token},
                                  headers={"Origin": console.url})
        assert status == 303 and a.admin_token not in headers["Set-Cookie"]
        cookie = headers["Set-Cookie"].split(";", 1)[0]
        assert call(console.url, "GET", "/console", headers={"Cookie": cookie})[0] == 200
        assert call(console.url, "POST", "/console/login", form={"token": a.admin_token},
                    headers={"Origin": "http://evil.example"})[0] == 403


def test_beyond_loopback_it_refuses_to_start_without_a_token(monkeypatch, capsys):
    monkeypatch.delenv("SPARKMQ_ADMIN_TOKEN", raising=False)
    with pytest.raises(SparkMQError, match="needs a login"):
        ClusterConsole("127.0.0.1:1", None, host="0.0.0.0", port=0)
    from sparkmq.cli import main
    assert main(["console", "--namesrv", "127.0.0.1:1", "--host", "0.0.0.0",
                 "--port", "0"]) == 1
    assert "needs a login" in capsys.readouterr().err


def test_in_a_browser_log_in_and_see_the_cluster(cluster, page, tmp_path):
    ns, a, b = cluster
    with ClusterConsole(ns.address, a.admin_token, port=0, require_login=True) as console:
        response = page.goto(console.url + "/console")
        assert response.status == 401
        page.fill("input[name=token]", a.admin_token)
        with page.expect_navigation():
            page.click("button:has-text('Log in')")
        assert page.url == console.url + "/console"
        names = page.eval_on_selector_all("#brokers tbody tr", "rows => rows.map("
                                          "r => r.cells[1].innerText.trim())")
        assert sorted(names) == ["broker-a", "broker-b"]
        shared = page.eval_on_selector_all("#topics tbody tr", "rows => rows.map("
                                           "r => Array.from(r.cells).map(c => c.innerText))")
        assert {(r[0], r[1]) for r in shared} >= {("Shared", "broker-a"), ("Shared", "broker-b")}
        shot = tmp_path / "cluster-console.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 0 and os.path.getsize(shot) > 1000


@pytest.mark.integration
def test_the_console_daemon_stops_cleanly_on_sigterm(procs):
    from helpers.daemons import spawn, stop_process
    port, ns = free_port(), NameServer(host="127.0.0.1", port=free_port()).start()
    try:
        p = spawn(["sparkmq.cli", "console", "--namesrv", ns.address, "--port", str(port)],
                  f"http://127.0.0.1:{port}/console", procs)
        assert stop_process(p) == 0      # stopped in order, not killed by the signal
    finally:
        ns.stop()
