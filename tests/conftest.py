"""Shared fixtures.

Markers: unmarked tests are fast unit tests; ``spark`` needs the shared local
SparkSession; ``integration`` starts real processes/servers on 127.0.0.1;
``slow`` takes more than a few seconds.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import sys
import uuid

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")     # bind only to loopback
# (sparkmq/__init__.py sets it too; here before any plugin or helper starts gRPC: one CI
# run lost every Spark test of a worker when the JVM's forked launcher died, grpc#43055)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# One admin token for the session's brokers (in-process and spawned) and their callers
# (helpers.daemons, the CLI, the Spark committer), as an operator would export it;
# tests of the token file itself remove it (tests/broker/test_admin_auth.py).
os.environ.setdefault("SPARKMQ_ADMIN_TOKEN", secrets.token_urlsafe(32))
# Likewise the cluster secret NameServers and brokers sign registrations with
# (sparkmq/namesrv/signing.py; otherwise ~/.sparkmq/cluster.secret would be made).
os.environ.setdefault("SPARKMQ_CLUSTER_SECRET", secrets.token_urlsafe(32))


@pytest.fixture(autouse=True, scope="module")
def _no_event_loop_left_running():
    """A module must not leave an event loop set as running on the main thread (later
    modules' ``asyncio.run`` would refuse: it failed a test in CI once)."""
    yield
    loop = asyncio._get_running_loop()
    if loop is not None:
        pytest.fail(f"this module left {loop!r} set as the main thread's running loop: "
                    "stop what started it (a fixture's teardown) within the module")


@pytest.fixture(params=["local", "memory"])
def store_url(request, tmp_path):
    """A fresh store URL on each fsspec backend the suite covers."""
    if request.param == "local":
        return str(tmp_path / "store")
    return f"memory://sparkmq-test-{uuid.uuid4().hex}"


@pytest.fixture
def local_store_url(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def procs():
    """The daemon processes a test starts (``helpers.daemons.spawn(..., procs)``), in
    start order; every one still running is stopped (SIGTERM, then SIGKILL) afterwards."""
    from helpers.daemons import stop_processes

    started: list = []
    yield started
    stop_processes(started)


@pytest.fixture
def make_broker(tmp_path):
    """``make(name="broker-a", **props)`` starts an in-process ``Broker`` on free ports
    (``helpers.brokers.broker_config``); every one is stopped after the test."""
    from helpers.brokers import broker_config
    from sparkmq.broker import Broker

    started = []

    def make(name="broker-a", **props):
        b = Broker(broker_config(tmp_path, name, **props)).start()
        started.append(b)
        return b
    yield make
    for b in started:
        b.stop()


@pytest.fixture
def clients():
    """``start(client)`` starts an official RocketMQ client; all are shut down after."""
    started = []

    def start(c):
        c.startup()
        started.append(c)
        return c
    yield start
    for c in reversed(started):
        try:
            c.shutdown()
        except Exception:
            pass
        _stop_client_metrics(c)


@pytest.fixture
def tx_broker(tmp_path):
    """``(make, clock)``: ``make(**props)`` starts a broker with topic ``T`` and 6 s
    transaction timeout/check interval on the manual ``clock``; stopped after."""
    import time

    from helpers.brokers import broker_config
    from helpers.clock import Clock
    from sparkmq.broker import Broker

    clock = Clock(int(time.time() * 1000))
    started = []

    def make(**props):
        b = Broker(broker_config(tmp_path, transactionTimeOut=6000,
                                 transactionCheckInterval=6000, **props), clock_ms=clock).start()
        started.append(b)
        if "T" not in b.store.topics():
            b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        return b
    yield make, clock
    for b in started:
        b.stop()


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test session (stopped at the end)."""
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]")
               .appName("sparkmq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .getOrCreate())
    from sparkmq.datasource import register
    register(session)
    yield session
    session.stop()


# tier markers that a fixture implies: a test using the fixture must carry the marker
_FIXTURE_TIERS = {"spark": "spark", "procs": "integration", "make_broker": "integration",
                  "tx_broker": "integration", "clients": "integration"}


def pytest_collection_modifyitems(items):
    """Refuse to run a test that starts Spark (``spark`` fixture) without the ``spark``
    marker, or starts daemons/brokers/clients (``procs``, ``make_broker``, ``tx_broker``,
    ``clients``) without ``integration``: ``-m "not spark and not integration"`` must
    never start one."""
    wrong = []
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        for fixture in getattr(item, "fixturenames", ()):
            tier = _FIXTURE_TIERS.get(fixture)
            if tier and tier not in marks:
                wrong.append(f"{item.nodeid} uses {fixture} but is not marked {tier}")
    if wrong:
        raise pytest.UsageError("tier markers missing:\n" + "\n".join(wrong))


def _stop_client_metrics(client) -> None:
    """Shut an official client's meter provider down while its broker still runs: the
    client's own shutdown leaves it running, and at exit it would export to a broker
    that is gone (seconds of retries per client)."""
    metrics = getattr(client, "client_metrics", None)
    stop = getattr(metrics, "_ClientMetrics__meter_provider_shutdown", None)
    if stop is not None:
        try:
            stop()
        except Exception:
            pass


@pytest.fixture(scope="session")
def tls_pair(tmp_path_factory):
    """A self-signed (cert path, key path) for 127.0.0.1 and localhost."""
    from sparkmq.tls import make_self_signed
    return make_self_signed(str(tmp_path_factory.mktemp("tls")), ["127.0.0.1", "localhost"])
