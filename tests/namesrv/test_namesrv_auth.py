"""NameServer writes need the cluster secret: the fencing attack of issue 13 (a fake
registration, then epoch 999) is refused; stale, replayed and wrongly signed requests
too; a refused master learns nothing reusable; short secrets are refused."""
from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request

import pytest

from helpers.clock import Clock
from helpers.net import free_port
from sparkmq.errors import InvalidConfigError
from sparkmq.namesrv import NameServer, NameServerClient
from sparkmq.namesrv.signing import SECRET_ENV, RequestVerifier, resolve_secret, sign

SECRET = "cluster-secret-for-this-test-0123456789"
REGISTER = "/brokers/register"


def registration(epochs, port=8081) -> dict:
    return {"cluster": "C", "brokerName": "broker-a", "brokerId": 0, "role": "ASYNC_MASTER",
            "endpoint": f"127.0.0.1:{port}", "epochs": epochs,
            "topics": {"T": {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6}}}


def post(ns: NameServer, path: str, body: dict, headers: dict | None = None,
         raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{ns.address}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.integration
def test_the_fencing_attack_is_refused(tmp_path):
    kv = tmp_path / "kv.json"
    real = [{"epoch": 1, "storeId": "store-a", "startOffset": 0}]
    with NameServer(port=free_port(), kv_config_path=str(kv), cluster_secret=SECRET) as ns:
        master = NameServerClient(ns.address, cluster_secret=SECRET)
        assert master.register(registration(real)) == {ns.address: True}
        # the attacker: a fake registration, then one with epoch 999 pointing nowhere
        dead = free_port()
        fake = registration([{"epoch": 1, "storeId": "forged", "startOffset": 0}], dead)
        status, answer = post(ns, REGISTER, fake)
        assert status == 401 and "epoch" not in answer and "master" not in answer
        takeover = registration([{"epoch": 999, "storeId": "forged", "startOffset": 0}], dead)
        assert post(ns, REGISTER, takeover)[0] == 401
        wrong = sign("a-different-secret-0123456789", "POST", REGISTER,
                     json.dumps(takeover).encode())
        assert post(ns, REGISTER, takeover, wrong)[0] == 401
        assert post(ns, "/brokers/unregister", {"brokerName": "broker-a", "brokerId": 0})[0] == 401
        # nothing changed: the real master still registers, unfenced, and is routed to
        assert ns.registry.master_epoch("broker-a") == {"epoch": 1, "storeId": "store-a"}
        assert master.register(registration(real)) == {ns.address: True}
        assert master.fenced_by == {}
        assert {q["endpoint"] for q in master.route("T")} == {"127.0.0.1:8081"}
    assert json.loads(kv.read_text())["masters"]["broker-a"]["epoch"] == 1


@pytest.mark.integration
def test_replayed_stale_and_tampered_requests_are_refused():
    with NameServer(port=free_port(), cluster_secret=SECRET) as ns:
        body = json.dumps(registration([])).encode()
        headers = sign(SECRET, "POST", REGISTER, body)
        assert post(ns, REGISTER, {}, headers, raw=body)[0] == 200
        status, answer = post(ns, REGISTER, {}, headers, raw=body)          # replay
        assert status == 401 and "replayed" in answer["error"]
        old = sign(SECRET, "POST", REGISTER, body, timestamp_ms=1_000)
        assert post(ns, REGISTER, {}, old, raw=body)[0] == 401               # stale
        moved = registration([], port=9)
        fresh = sign(SECRET, "POST", REGISTER, body)
        assert post(ns, REGISTER, moved, fresh)[0] == 401                   # body swapped
        assert post(ns, "/brokers/unregister", {}, fresh, raw=body)[0] == 401  # path swapped


@pytest.mark.integration
def test_a_fenced_master_learns_nothing_reusable():
    with NameServer(port=free_port(), cluster_secret=SECRET) as ns:
        client = NameServerClient(ns.address, cluster_secret=SECRET)
        old = [{"epoch": 1, "storeId": "store-a", "startOffset": 0}]
        client.register(registration(old + [{"epoch": 2, "storeId": "store-b",
                                             "startOffset": 10}]))
        body = json.dumps(registration(old)).encode()
        status, answer = post(ns, REGISTER, {}, sign(SECRET, "POST", REGISTER, body), raw=body)
        assert status == 409 and answer["fenced"] is True
        text = json.dumps(answer)
        assert "store-b" not in text and "epoch" not in text


def test_nonce_memory_is_bounded_and_ages_out():
    clock = Clock(10_000_000)
    v = RequestVerifier(SECRET, window_ms=1_000, max_nonces=2, clock_ms=clock)

    def signed():
        return sign(SECRET, "POST", REGISTER, b"{}", timestamp_ms=clock.now_ms)
    assert v.refusal("POST", REGISTER, b"{}", signed()) is None
    assert v.refusal("POST", REGISTER, b"{}", signed()) is None
    assert "too many" in v.refusal("POST", REGISTER, b"{}", signed())
    clock.now_ms += 2_001
    assert v.refusal("POST", REGISTER, b"{}", signed()) is None


def test_short_secrets_are_refused_and_the_default_file_is_private(tmp_path, monkeypatch):
    with pytest.raises(InvalidConfigError, match="at least 16"):
        NameServer(port=0, cluster_secret="short")
    monkeypatch.setenv(SECRET_ENV, "tooshort")
    with pytest.raises(InvalidConfigError, match="SPARKMQ_CLUSTER_SECRET"):
        resolve_secret()
    monkeypatch.delenv(SECRET_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    made = resolve_secret()
    path = tmp_path / ".sparkmq" / "cluster.secret"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and resolve_secret() == made


def test_a_request_signed_before_a_restart_is_refused_after_it():
    clock = Clock(10_000_000)
    before = RequestVerifier(SECRET, clock_ms=clock)
    captured = sign(SECRET, "POST", REGISTER, b"{}", timestamp_ms=clock.now_ms)
    assert before.refusal("POST", REGISTER, b"{}", captured) is None
    clock.now_ms += 5_000                        # a restart: the nonces seen are forgotten
    after = RequestVerifier(SECRET, clock_ms=clock)
    refused = after.refusal("POST", REGISTER, b"{}", captured)
    assert "5000 ms before this server started" in refused and "sign it again" in refused
    fresh = sign(SECRET, "POST", REGISTER, b"{}", timestamp_ms=clock.now_ms)
    assert after.refusal("POST", REGISTER, b"{}", fresh) is None


@pytest.mark.integration
def test_an_unregistration_captured_before_a_restart_is_not_replayed_after_it():
    port = free_port()
    with NameServer(port=port, cluster_secret=SECRET) as ns:
        master = NameServerClient(ns.address, cluster_secret=SECRET)
        assert master.register(registration([])) == {ns.address: True}
        body = json.dumps({"brokerName": "broker-a", "brokerId": 0,
                           "cluster": "C"}).encode()
        captured = sign(SECRET, "POST", "/brokers/unregister", body)   # seen on the wire
        assert post(ns, "/brokers/unregister", {}, captured, raw=body)[0] == 200
    with NameServer(port=port, cluster_secret=SECRET) as ns:          # restarted
        assert master.register(registration([])) == {ns.address: True}
        status, answer = post(ns, "/brokers/unregister", {}, captured, raw=body)
        assert status == 401 and "before this server started" in answer["error"]
        assert {q["endpoint"] for q in master.route("T")} == {"127.0.0.1:8081"}
