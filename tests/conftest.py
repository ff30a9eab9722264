"""Shared fixtures.

Markers: unmarked tests are fast unit tests; ``spark`` needs the shared local
SparkSession; ``integration`` starts real processes/servers on 127.0.0.1;
``slow`` takes more than a few seconds.
"""
from __future__ import annotations

import os
import socket
import sys
import uuid

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")     # bind only to loopback


@pytest.fixture(params=["local", "memory"])
def store_url(request, tmp_path):
    """A fresh store URL on each fsspec backend the suite covers."""
    if request.param == "local":
        return str(tmp_path / "store")
    return f"memory://sparkmq-test-{uuid.uuid4().hex}"


@pytest.fixture
def local_store_url(tmp_path):
    return str(tmp_path / "store")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
