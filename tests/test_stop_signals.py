"""A daemon's stop on SIGINT/SIGTERM (sparkmq.lifecycle.StopSignals): its handlers only
record the signal, so one that arrives at any moment ends the wait. (The daemons used to
set a ``threading.Event`` from the handler: a signal that came while the main thread was
inside that event's ``wait``, holding its lock, deadlocked the daemon.)"""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from helpers.daemons import ROOT

_CHILD = """
import os, signal, sys, threading
from sparkmq.lifecycle import StopSignals
stop = StopSignals()
delay = float(sys.argv[1])
def send():
    threading.Event().wait(delay)
    os.kill(os.getpid(), int(sys.argv[2]))
threading.Thread(target=send, daemon=True).start()
print("stopped by", stop.wait(poll_s=float(sys.argv[3])), flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("delay", [0.0, 0.001, 0.05])
def test_a_signal_at_any_moment_ends_the_wait(sig, delay):
    out = subprocess.run([sys.executable, "-c", _CHILD, str(delay), str(int(sig)), "0.2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["stopped", "by", str(int(sig))]


def test_a_signal_only_another_thread_sees_ends_the_wait_within_its_poll():
    """The main thread's sleep is not interrupted by a signal a thread that does not
    block it took; the wait looks again every ``poll_s``."""
    child = """
import os, signal, sys, threading
from sparkmq.lifecycle import StopSignals
stop = StopSignals()
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])   # this (main) thread: not it
def taker():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    os.kill(os.getpid(), signal.SIGTERM)                      # delivered to this thread
    threading.Event().wait(60)
threading.Thread(target=taker, daemon=True).start()
print("stopped by", stop.wait(poll_s=0.05), flush=True)
"""
    out = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["stopped", "by", str(int(signal.SIGTERM))]
