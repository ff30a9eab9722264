"""Daemon processes for integration tests: NameServers, brokers and replicas run as
``python -m <module> ...`` on 127.0.0.1, and the JSON calls to their admin HTTP ports
(with the session's admin token, SPARKMQ_ADMIN_TOKEN).

``spawn`` starts one and waits (bounded) until its ``/health`` answers 200; a process
that exits or does not come up in time is killed and the test fails with its output.
``stop_process`` sends SIGTERM and waits (bounded), then SIGKILLs; ``kill9`` is the crash.
The ``procs`` fixture (conftest.py) stops every process a test spawned into it.

A daemon's stdout and stderr go to an unnamed temporary file, not to a pipe: a pipe
nobody reads fills up and blocks a chatty daemon in the middle of a test.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

from helpers.waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30


def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200 within 1 s."""
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def admin_headers() -> dict[str, str]:
    """The admin token header of the session's brokers (SPARKMQ_ADMIN_TOKEN, conftest.py)."""
    return {"Authorization": f"Bearer {os.environ['SPARKMQ_ADMIN_TOKEN']}"}


def get_json(url: str) -> dict:
    """GET a broker admin URL with the admin token; the JSON answer."""
    req = urllib.request.Request(url, headers=admin_headers())
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def post_json(url: str, body: dict) -> dict:
    """POST JSON to a broker admin URL with the admin token; the JSON answer."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **admin_headers()})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:        # say what the broker answered
        raise AssertionError(f"POST {url} {body}: HTTP {e.code}: "
                             f"{e.read().decode(errors='replace')}") from None


def output(proc: subprocess.Popen) -> str:
    """What ``proc`` has written to stdout/stderr so far (spawned by ``spawn``)."""
    out = getattr(proc, "output_file", None)
    if out is None or out.closed:
        return ""
    fd = out.fileno()          # pread: the daemon shares the file offset, leave it alone
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def spawn(args: list[str], health_url: str, procs: list | None = None,
          timeout_s: float = START_TIMEOUT_S, env: dict | None = None) -> subprocess.Popen:
    """Start ``python -m *args`` in the repository root (environment ``env``, default
    this process's) and wait until ``health_url`` answers; append it to ``procs`` (the
    test's ``procs`` fixture) so it is stopped."""
    out = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env,
                            stdout=out, stderr=subprocess.STDOUT)
    proc.output_file = out
    if procs is not None:
        procs.append(proc)
    try:
        wait_until(lambda: proc.poll() is not None or http_ok(health_url),
                   f"{health_url} to answer", timeout_s=timeout_s, interval_s=0.1)
        problem = None if proc.poll() is None else f"exited with {proc.returncode}"
    except AssertionError:
        problem = f"did not answer {health_url} within {timeout_s} s"
    if problem:
        kill9(proc)
        raise AssertionError(f"{' '.join(args)} {problem}; its output:\n{output(proc)}")
    return proc


def kill9(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` (a crash) and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(STOP_TIMEOUT_S)


def stop_process(proc: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM (a clean stop), wait up to ``timeout_s``, else SIGKILL; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill9(proc)
        return proc.returncode
    finally:
        out = getattr(proc, "output_file", None)
        if out is not None:
            out.close()


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Stop every process of ``procs``: SIGTERM to all (newest first), then reap each."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        stop_process(p)
