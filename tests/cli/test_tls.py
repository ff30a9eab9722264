"""``sparkmq tls selfsigned`` makes a development pair; a broker serves its admin port
over HTTPS with it, and the CLI and the Spark committer reach it trusting that
certificate."""
from __future__ import annotations

import json
import os
import ssl
import stat
import urllib.error
import urllib.request

import pytest
from cryptography import x509

from helpers.brokers import broker_config
from sparkmq import admin, cli
from sparkmq.broker import Broker
from sparkmq.errors import InvalidConfigError
from sparkmq.log.actions import Lease
from sparkmq.log.committer import BrokerCommitter


def test_selfsigned_pair(tmp_path, capsys):
    out = tmp_path / "tls"
    assert cli.main(["tls", "selfsigned", "--out", str(out), "--host", "127.0.0.1",
                     "--host", "broker.local"]) == 0
    assert "adminTlsCertFile=" in capsys.readouterr().out
    assert stat.S_IMODE(os.stat(out / "tls.key").st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["broker.local"]
    assert cli.main(["tls", "selfsigned", "--out", str(out)]) == 1      # never overwrites
    assert "exists" in capsys.readouterr().err


@pytest.mark.integration
def test_admin_port_over_https(tmp_path, monkeypatch, capsys):
    out = tmp_path / "tls"
    assert cli.main(["tls", "selfsigned", "--out", str(out), "--host", "127.0.0.1"]) == 0
    capsys.readouterr()
    cert, key = str(out / "tls.crt"), str(out / "tls.key")
    b = Broker(broker_config(tmp_path, adminTlsCertFile=cert, adminTlsKeyFile=key)).start()
    try:
        assert b.admin_url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=cert)
        req = urllib.request.Request(b.admin_url + "/status",
                                     headers={"Authorization": f"Bearer {b.admin_token}"})
        with urllib.request.urlopen(req, timeout=10, context=trusted) as r:
            assert json.loads(r.read())["state"] == "running"
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(req, timeout=10)                 # not trusted by default
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{b.admin_port}/health", timeout=10)
        # the CLI with --tls-ca, the committer with SPARKMQ_ADMIN_CA
        assert admin.main(["--broker", b.admin_url, "--tls-ca", cert, "--json",
                           "broker", "status"]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "running"
        monkeypatch.setenv("SPARKMQ_ADMIN_CA", cert)
        assert BrokerCommitter(b.config.store_path, Lease(owner="test", epoch=1, endpoint=b.admin_url)).commit(
            []).num_messages == 0
    finally:
        b.stop()


def test_tls_needs_both_files(tmp_path):
    with pytest.raises(InvalidConfigError, match="adminTlsKeyFile"):
        broker_config(tmp_path, adminTlsCertFile="x.crt")
    b = Broker(broker_config(tmp_path, adminTlsCertFile=str(tmp_path / "missing.crt"),
                             adminTlsKeyFile=str(tmp_path / "missing.key")))
    with pytest.raises(InvalidConfigError, match="sparkmq tls selfsigned"):
        b.start()
