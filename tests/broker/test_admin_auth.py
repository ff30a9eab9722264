"""The admin endpoint's guard against a real broker: every route x {no token, wrong token,
cross-origin, cross-site fetch, non-JSON body, allowed} with the expected status; the token
file (made 0600 at the first start, kept across restarts, found by the CLI and the Spark
committer); the admin port on loopback apart from the gRPC address."""
from __future__ import annotations

import json
import os
import socket
import stat
import urllib.error
import urllib.request

import pytest

from helpers.brokers import broker_config
from sparkmq import admin
from sparkmq.admin_auth import TOKEN_ENV, TOKEN_FILE_NAME
from sparkmq.broker import Broker
from sparkmq.broker import admin_token_banner
from sparkmq.log.actions import Lease
from sparkmq.log.committer import BrokerCommitter

pytestmark = pytest.mark.integration

WRONG = "not-the-token"
EVIL = "http://evil.example"

# route -> (method, JSON body of an allowed call, status of the allowed call)
ROUTES = {
    "/health": ("GET", None, 200),
    "/status": ("GET", None, 200),
    "/metrics": ("GET", None, 200),
    "/admin/retention": ("GET", None, 200),
    "/admin/topics": ("POST", {"name": "Made", "queueNums": 1}, 200),
    "/admin/groups": ("POST", {"name": "MadeGroup"}, 200),
    "/admin/promote": ("POST", {}, 400),          # passes the guard; a master is no replica
    "/admin/adopt": ("POST", {"paths": "x"}, 400),  # passes the guard; paths must be a list
}
OPEN = {"/health", "/metrics"}     # liveness and Prometheus scrapes need no token

# case -> (token, extra headers, content type)
CASES = {
    "no-token": (None, {}, "application/json"),
    "wrong-token": (WRONG, {}, "application/json"),
    "cross-origin": ("TOKEN", {"Origin": EVIL}, "application/json"),
    "cross-site": ("TOKEN", {"Sec-Fetch-Site": "cross-site"}, "application/json"),
    "non-json": ("TOKEN", {}, "text/plain"),
    "allowed": ("TOKEN", {}, "application/json"),
}


def expected(route: str, case: str) -> int:
    method, _, allowed = ROUTES[route]
    if case in ("cross-origin", "cross-site"):
        return 403
    if case in ("no-token", "wrong-token"):
        return allowed if route in OPEN else 401
    if case == "non-json" and method == "POST":
        return 415
    return allowed


def call(url: str, method: str, body, *, token=None, headers=None,
         ctype="application/json") -> tuple[int, bytes]:
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    data = None
    if method == "POST":
        hdrs["Content-Type"] = ctype
        data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def guarded_broker(tmp_path_factory):
    b = Broker(broker_config(tmp_path_factory.mktemp("guard"))).start()
    yield b
    b.stop()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("route", list(ROUTES))
def test_every_admin_route_and_caller(guarded_broker, route, case):
    b = guarded_broker
    method, body, _ = ROUTES[route]
    token, headers, ctype = CASES[case]
    status, reply = call(b.admin_url + route, method, body,
                         token=b.admin_token if token == "TOKEN" else token,
                         headers=headers, ctype=ctype)
    assert status == expected(route, case), reply
    if status == 401:
        assert b"SPARKMQ_ADMIN_TOKEN" in reply       # says what to do


def test_refused_calls_change_nothing(guarded_broker):
    b = guarded_broker
    url = b.admin_url + "/admin/topics"
    attempts = [dict(token=None), dict(token=WRONG),
                dict(token=b.admin_token, headers={"Origin": EVIL}),
                dict(token=b.admin_token, ctype="text/plain")]
    for kw in attempts:
        assert call(url, "POST", {"name": "Sneaky", "perm": 0}, **kw)[0] in (401, 403, 415)
    assert "Sneaky" not in b.store.topics()


def test_own_origin_is_allowed(guarded_broker):
    b = guarded_broker
    for origin in (b.admin_url, f"http://localhost:{b.admin_port}"):
        assert call(b.admin_url + "/status", "GET", None, token=b.admin_token,
                    headers={"Origin": origin})[0] == 200


def test_token_file_made_0600_once_and_found_by_callers(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(TOKEN_ENV)
    conf = broker_config(tmp_path)
    b = Broker(conf).start()
    try:
        path = os.path.join(conf.store_path, TOKEN_FILE_NAME)
        assert b.admin_token_file == path
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert open(path).read().strip() == b.admin_token and len(b.admin_token) >= 32
        assert b.admin_token in admin_token_banner(b)
        first = b.admin_token
        # the CLI finds it beside --store; without any token it says what to do
        assert admin.main(["--broker", b.admin_url, "--store", conf.store_path, "--json",
                           "broker", "status"]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "running"
        assert admin.main(["--broker", b.admin_url, "broker", "status"]) == 1
        assert "SPARKMQ_ADMIN_TOKEN" in capsys.readouterr().err
        # the Spark committer's hand-off finds it beside the store it commits to
        committer = BrokerCommitter(conf.store_path, Lease(owner="test", epoch=1, endpoint=b.admin_url))
        assert committer.commit([]).num_messages == 0
    finally:
        b.stop()
    again = Broker(conf).start()                 # a restart keeps the token
    try:
        assert again.admin_token == first
    finally:
        again.stop()


def test_admin_port_on_loopback_apart_from_the_grpc_address(make_broker):
    b = make_broker(brokerIP1="127.0.0.2")       # gRPC on 127.0.0.2, admin left default
    assert b.endpoint.startswith("127.0.0.2:") and b.admin_url.startswith("http://127.0.0.1:")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", b.admin_port), timeout=2).close()
    other = make_broker("broker-b", adminListenAddress="127.0.0.2")
    assert call(other.admin_url + "/status", "GET", None, token=other.admin_token)[0] == 200
    assert other.admin_url.startswith("http://127.0.0.2:")


def test_metrics_can_require_the_token(make_broker):
    b = make_broker(adminMetricsAuthEnable="true")
    assert call(b.admin_url + "/metrics", "GET", None)[0] == 401
    assert call(b.admin_url + "/metrics", "GET", None, token=b.admin_token)[0] == 200
    assert call(b.admin_url + "/health", "GET", None)[0] == 200


def test_bearer_header_parsing():
    from sparkmq.admin_auth import bearer_matches
    assert bearer_matches("Bearer tok", "tok") and bearer_matches("bearer  tok ", "tok")
    for header in (None, "", "Bearer", "Basic tok", "Bearer tok2", "Bearertok"):
        assert not bearer_matches(header, "tok"), header
