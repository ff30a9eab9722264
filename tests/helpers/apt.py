"""Debian packages a test needs, installed by the suite itself on a fresh machine (as
root, where apt-get exists): one installer at a time across the test workers
(pytest-xdist runs two), and apt waits for dpkg's lock rather than failing at once."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from typing import Callable

LOCK = "/tmp/sparkmq-tests-apt.lock"
WAIT = ["-o", "DPkg::Lock::Timeout=600"]


def ensure_packages(packages: list[str], present: Callable[[], bool], *,
                    update: bool = False, timeout_s: float = 1800) -> bool:
    """Install ``packages`` unless ``present()`` (checked again once this worker holds
    the lock: another may have installed them meanwhile); whether ``present()`` holds
    at the end. Nothing is tried without root or apt-get."""
    if present():
        return True
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not present():
            if update:
                subprocess.run(["apt-get", *WAIT, "update", "-qq"], env=env,
                               capture_output=True, timeout=timeout_s)
            subprocess.run(["apt-get", *WAIT, "install", "-y", "-qq", *packages], env=env,
                           capture_output=True, timeout=timeout_s)
    return present()
