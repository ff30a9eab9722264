"""NameServer: route registry (injected clock) and the HTTP/JSON server."""
from __future__ import annotations

import json
import os
import urllib.request

import pytest

from helpers.net import free_port
from helpers.clock import Clock
from helpers.waiting import wait_until
from sparkmq.namesrv import BrokerRegistration, NameServer, NameServerClient, RouteRegistry
from sparkmq.namesrv.signing import SECRET_ENV, sign


def reg(name="broker-a", bid=0, port=8081, topics=None) -> dict:
    return {"cluster": "C", "brokerName": name, "brokerId": bid, "role": "ASYNC_MASTER",
            "endpoint": f"127.0.0.1:{port}",
            "topics": topics if topics is not None else {"T": {"readQueueNums": 2,
                                                               "writeQueueNums": 2, "perm": 6}}}


def test_route_lists_every_queue_across_broker_groups():
    r = RouteRegistry(clock_ms=Clock(1_000_000))
    r.register(BrokerRegistration.from_json(reg("broker-a", port=1)))
    r.register(BrokerRegistration.from_json(reg("broker-b", port=2, topics={
        "T": {"readQueueNums": 3, "writeQueueNums": 3, "perm": 6},
        "Other": {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6}})))
    route = r.route("T")
    assert [(q["brokerName"], q["queueId"]) for q in route] == [
        ("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1), ("broker-b", 2)]
    assert {q["endpoint"] for q in route} == {"127.0.0.1:1", "127.0.0.1:2"}
    assert [q["brokerName"] for q in r.route("Other")] == ["broker-b"]
    assert r.route("Missing") == []
    assert r.clusters() == {"C": ["broker-a", "broker-b"]}


def test_silent_broker_is_dropped_after_120_s_and_heartbeat_keeps_it():
    clock = Clock(1_000_000)
    r = RouteRegistry(clock_ms=clock)
    r.register(BrokerRegistration.from_json(reg("broker-a")))
    r.register(BrokerRegistration.from_json(reg("broker-b")))
    clock.now_ms += 100_000
    r.register(BrokerRegistration.from_json(reg("broker-b")))   # b heartbeats, a is silent
    clock.now_ms += 20_000                                          # a: 120 s silent
    assert {q["brokerName"] for q in r.route("T")} == {"broker-b"}
    assert r.expire() == ["broker-a#0"]
    assert [b.broker_name for b in r.brokers()] == ["broker-b"]
    clock.now_ms += 99_999                                          # b: 119.999 s silent
    assert [b.broker_name for b in r.brokers()] == ["broker-b"]
    clock.now_ms += 1
    assert r.route("T") == [] and r.expire() == ["broker-b#0"]


def test_reregistration_replaces_the_topic_list():
    r = RouteRegistry(clock_ms=Clock(1_000_000))
    r.register(BrokerRegistration.from_json(reg(topics={"A": {"readQueueNums": 1,
                                                              "writeQueueNums": 1}})))
    r.register(BrokerRegistration.from_json(reg(topics={"B": {"readQueueNums": 1,
                                                              "writeQueueNums": 1}})))
    assert r.route("A") == [] and len(r.route("B")) == 1


def test_malformed_registration_is_refused():
    with pytest.raises(ValueError, match="malformed"):
        BrokerRegistration.from_json({"brokerName": "x"})


@pytest.mark.integration
def test_http_server_registration_route_and_expiry():
    clock = Clock(1_000_000)
    with NameServer(port=free_port(), clock_ms=clock) as ns:
        client = NameServerClient(ns.address)
        assert client.register(reg("broker-a", port=11)) == {ns.address: True}
        assert client.register(reg("broker-b", port=12)) == {ns.address: True}
        route = client.route("T")
        assert {q["brokerName"] for q in route} == {"broker-a", "broker-b"} and len(route) == 4
        assert client.route("Missing") == []
        assert {b["brokerName"] for b in client.brokers()} == {"broker-a", "broker-b"}
        clock.now_ms += 120_000
        assert client.route("T") == []
        client.register(reg("broker-b", port=12))
        assert {q["brokerName"] for q in client.route("T")} == {"broker-b"}
        client.unregister("broker-b", 0)
        assert client.route("T") == []
        with urllib.request.urlopen(f"http://{ns.address}/health", timeout=3) as resp:
            assert resp.read() == b"ok"


def signed(body: bytes) -> dict:
    """The headers of a registration signed with the session's cluster secret."""
    return sign(os.environ[SECRET_ENV], "POST", "/brokers/register", body)


@pytest.mark.integration
def test_bad_requests_get_400_and_the_server_keeps_serving():
    with NameServer(port=free_port()) as ns:
        req = urllib.request.Request(f"http://{ns.address}/brokers/register", data=b"{not json",
                                     method="POST", headers=signed(b"{not json"))
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=3)
        assert e.value.code == 400
        body = json.dumps({"brokerName": "x"}).encode()
        req = urllib.request.Request(f"http://{ns.address}/brokers/register",
                                     data=body, method="POST", headers=signed(body))
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=3)
        assert e.value.code == 400
        assert NameServerClient(ns.address).register(reg()) == {ns.address: True}


@pytest.mark.integration
def test_several_nameservers_are_independent_and_a_dead_one_is_skipped():
    with NameServer(port=free_port()) as a, NameServer(port=free_port()) as b:
        dead = f"127.0.0.1:{free_port()}"
        client = NameServerClient(f"{dead};{a.address};{b.address}", timeout_s=2)
        assert client.register(reg()) == {dead: False, a.address: True, b.address: True}
        assert len(client.route("T")) == 2
        assert len(NameServerClient(b.address).route("T")) == 2
        NameServerClient(a.address).unregister("broker-a", 0)
        assert NameServerClient(a.address).route("T") == []
        assert len(NameServerClient(b.address).route("T")) == 2   # b never heard of it


def test_master_fencing_survives_a_restart_with_kv_config_path(tmp_path):
    path = str(tmp_path / "ns" / "kvConfig.json")
    old = [{"epoch": 1, "storeId": "store-a"}]
    new = old + [{"epoch": 2, "storeId": "store-b"}]        # the replica promoted itself

    def master(epochs):
        return BrokerRegistration.from_json({**reg(), "epochs": epochs})
    r = RouteRegistry(clock_ms=Clock(1_000_000), kv_config_path=path)
    assert r.register(master(old)) is None
    assert r.register(master(new)) is None
    assert json.load(open(path))["masters"]["broker-a"] == {"epoch": 2, "storeId": "store-b"}
    # a restarted NameServer still refuses the old master; without the file it would not
    again = RouteRegistry(clock_ms=Clock(1_000_000), kv_config_path=path)
    assert again.register(master(old)) == {"fenced": True,
                                           "master": {"epoch": 2, "storeId": "store-b"}}
    assert again.register(master(new)) is None
    assert RouteRegistry(clock_ms=Clock(1_000_000)).register(master(old)) is None


def test_a_corrupt_kv_config_file_is_refused_with_what_to_do(tmp_path, capsys):
    from sparkmq.errors import InvalidConfigError
    from sparkmq.namesrv import main
    path = tmp_path / "kvConfig.json"
    path.write_text('{"masters": {"broker-a": {"epoch": "two"}}}')
    with pytest.raises(InvalidConfigError, match="repair or remove"):
        RouteRegistry(kv_config_path=str(path))
    assert main(["-p", str(free_port()), "--kv-config-path", str(path)]) == 1
    assert "repair or remove" in capsys.readouterr().err
    assert path.read_text() == '{"masters": {"broker-a": {"epoch": "two"}}}'   # untouched


def test_a_client_that_stops_part_way_is_dropped_and_holds_no_thread():
    """A request whose body never comes (Content-Length more than is sent: a stuck or
    slow client) is dropped after the server's request timeout, on every HTTP server of
    sparkmq (``HttpServerThread``), while other clients are answered meanwhile."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler

    from sparkmq.lifecycle import HttpServerThread

    class Echo(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            pass

    server = HttpServerThread("127.0.0.1", 0, Echo, "test-http", request_timeout_s=0.5).start()
    before = threading.active_count()
    try:
        stuck = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        stuck.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part")
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}/", data=b"ok",
                                     method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:   # served meanwhile
            assert resp.read() == b"ok"
        assert stuck.recv(100) == b""          # the server closed the stuck connection
        stuck.close()
        wait_until(lambda: threading.active_count() <= before, "the handler thread to end")
    finally:
        server.stop()
