"""Fixtures for the compatibility suites: the official Node.js RocketMQ 5 client
(``rocketmq-client-nodejs``, pinned in ``node/package.json``) installed into
``tests/compat/node/node_modules`` once per session, and ``run_node`` to drive one of its
scenarios (``node/scenario.js``) against a broker."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).parent / "node"
PACKAGE = "rocketmq-client-nodejs"


def _installed_ok() -> bool:
    """node_modules holds the pinned client and is not older than the lock file."""
    want = json.loads((NODE_DIR / "package.json").read_text())["dependencies"][PACKAGE]
    got = NODE_DIR / "node_modules" / PACKAGE / "package.json"
    stamp = NODE_DIR / "node_modules" / ".package-lock.json"      # written by npm ci/install
    lock = NODE_DIR / "package-lock.json"
    if not got.exists() or not stamp.exists():
        return False
    if json.loads(got.read_text())["version"] != want:
        return False
    return not lock.exists() or stamp.stat().st_mtime >= lock.stat().st_mtime


@pytest.fixture(scope="session")
def node_client():
    """The path of ``node``, with the pinned client installed (``npm ci`` from the lock
    file, ``npm install`` without one) if node_modules is missing or outdated. A failed
    install fails the tests; only a missing ``node`` skips them (pytestmark there)."""
    node = shutil.which("node")
    assert node, "node is not on PATH (the module should have been skipped)"
    with open(NODE_DIR / ".install.lock", "w") as lock:        # one installer at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed_ok():
            npm = shutil.which("npm")
            assert npm, "node is on PATH but npm is not: cannot install " + PACKAGE
            cmd = [npm, "ci" if (NODE_DIR / "package-lock.json").exists() else "install",
                   "--no-audit", "--no-fund"]
            r = subprocess.run(cmd, cwd=NODE_DIR, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                pytest.fail(f"{' '.join(cmd)} failed (rc {r.returncode}):\n"
                            f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}", pytrace=False)
            assert _installed_ok(), f"{' '.join(cmd)} ran but {PACKAGE} is not installed"
    return node


@pytest.fixture(scope="session")
def run_node(node_client, tmp_path_factory):
    """``run_node(scenario, endpoint, timeout=120, **args)``: runs ``node scenario.js``
    with ``args`` (+ ``endpoint``) as JSON and returns its JSON result. It fails the test
    when the script fails or a client's shutdown did not finish within its cap.
    HOME is a temporary directory: the client writes its log file under
    ``~/logs/rocketmq`` whatever logger it is given."""
    home = tmp_path_factory.mktemp("node-home")

    def run(scenario: str, endpoint: str, timeout: float = 120, **args) -> dict:
        args["endpoint"] = endpoint
        env = dict(os.environ, HOME=str(home))
        r = subprocess.run([node_client, "scenario.js", scenario, json.dumps(args)],
                           cwd=NODE_DIR, capture_output=True, text=True, timeout=timeout,
                           env=env)
        lines = r.stdout.strip().splitlines()
        assert r.returncode == 0 and lines, (
            f"node scenario {scenario} failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n"
            f"{r.stderr[-5000:]}")
        result = json.loads(lines[-1])
        assert [s["outcome"] for s in result["shutdown"]] == ["ok"] * len(result["shutdown"]), \
            result["shutdown"]
        return result
    return run
