"""Stores on an S3 API endpoint (issue 15 item 5): moto's server started by the test, s3fs as
the filesystem (as s3fs's own tests do). A long-lived reader process sees the newest
committed version however fsspec caches listings, while another process appends."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from helpers.net import free_port
from helpers.waiting import wait_until

pytestmark = pytest.mark.integration

s3fs = pytest.importorskip("s3fs", reason="s3fs is a test extra")
moto_server = pytest.importorskip("moto.server", reason="moto[server] is a test extra")


@pytest.fixture(scope="module")
def s3():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port())
    server.start()
    endpoint = f"http://127.0.0.1:{server._port}"
    opts = {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"}}
    import boto3
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1") \
        .create_bucket(Bucket="sparkmq-test")
    yield opts
    server.stop()


WRITER = textwrap.dedent("""
    import json, sys
    from sparkmq import Message, Store
    url, opts, start, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    with Store.open(url, mode="w", storage_options=opts, start_services=False) as s:
        if "T" not in s.topics():
            s.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        s.append([Message("T", f"m{i}".encode()) for i in range(start, start + n)])
        s.publish(force=True)
""")


def _write(url: str, opts: dict, start: int, n: int) -> None:
    import json
    subprocess.run([sys.executable, "-c", WRITER, url, json.dumps(opts), str(start), str(n)],
                   check=True, timeout=120)


def test_a_long_lived_reader_sees_every_new_version(s3):
    from sparkmq import Snapshot
    url = "s3://sparkmq-test/store-a"
    _write(url, s3, 0, 25)
    first = Snapshot.load(url, storage_options=s3)      # lists _log/ (fsspec caches it)
    assert first.max_offset("T", 0) == 25
    _write(url, s3, 25, 25)                              # another process appends
    wait_until(lambda: Snapshot.load(url, storage_options=s3).max_offset("T", 0) == 50,
               "the new version", timeout_s=10)
    newest = Snapshot.load(url, storage_options=s3)
    assert newest.version > first.version
    assert [m.body for m in newest.read("T", 0, 0, 100)] == \
        [f"m{i}".encode() for i in range(50)]


def test_two_processes_append_and_read(s3):
    from sparkmq import Snapshot
    url = "s3://sparkmq-test/store-b"
    for k in range(3):
        _write(url, s3, 10 * k, 10)
        assert Snapshot.load(url, storage_options=s3).max_offset("T", 0) == 10 * (k + 1)
