"""Run every benchmark script (bench/bench_*.py) in turn, one subprocess each.

    .venv/bin/python bench/run_all.py [--quick] [--only NAME ...]

Scripts are found by glob, so a new ``bench/bench_<name>.py`` is picked up
without editing this file. Each runs with the same Python interpreter and
gets ``--quick`` passed through. The output of each script is printed as it
comes; a summary of exit codes and wall times follows. Exit code: 0 if every
script succeeded, else 1.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 3600


def discover() -> list[str]:
    return sorted(glob.glob(os.path.join(BENCH_DIR, "bench_*.py")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to every script")
    ap.add_argument("--only", nargs="*", default=None,
                    help="run only these scripts (names like 'store' or 'bench_store.py')")
    args = ap.parse_args()
    scripts = discover()
    if args.only:
        wanted = {n.removeprefix("bench_").removesuffix(".py") for n in args.only}
        scripts = [s for s in scripts
                   if os.path.basename(s).removeprefix("bench_").removesuffix(".py") in wanted]
    summary = []
    for script in scripts:
        name = os.path.basename(script)
        cmd = [sys.executable, script] + (["--quick"] if args.quick else [])
        print(f"=== {name}: {' '.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(cmd, timeout=TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        summary.append((name, rc, time.perf_counter() - t0))
    print("=== summary")
    for name, rc, secs in summary:
        print(f"{name:<30} exit {rc!s:<8} {secs:8.1f} s")
    return 0 if all(rc == 0 for _, rc, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
