"""A process that commits N versions to a store's transaction log.

Usage: python commit_worker.py URL WORKER_ID N GO_FILE

Creates GO_FILE.ready<ID> once imported, then waits (bounded, 30 s) for GO_FILE to exist so that several workers start
together, then runs N ``TransactionLog.commit`` calls whose build function
adds one unique ``txn`` action (appId ``w<ID>-<i>``). Prints one JSON line:
{"worker": id, "versions": [...], "builds": total build calls}.
"""
from __future__ import annotations

import json
import os
import sys

from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TransactionLog
from waiting import wait_until   # run as a script: its folder, tests/helpers, is on sys.path


def main() -> int:
    url, worker, n, go_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    log = TransactionLog(StoreFS(url), checkpoint_interval_versions=7)
    open(f"{go_file}.ready{worker}", "w").close()
    try:
        wait_until(lambda: os.path.exists(go_file), "the go signal", timeout_s=30,
                   interval_s=0.001)
    except AssertionError:
        print(json.dumps({"worker": worker, "error": "no go signal"}), flush=True)
        return 2
    builds = 0
    versions = []
    for i in range(n):
        def build(state, i=i):
            nonlocal builds
            builds += 1
            return [{"txn": {"appId": f"w{worker}-{i}", "version": i, "seenVersion": state.version}}]
        state = log.commit(build, operation="WORKER", retries=1000)
        versions.append(state.version)
    print(json.dumps({"worker": worker, "versions": versions, "builds": builds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
