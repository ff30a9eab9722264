"""Progress of long work (issue 17 item 3): a tqdm bar on a terminal, log lines
otherwise; recovery at start and vacuum report through it."""
from __future__ import annotations

import io
import logging

from sparkmq import Message, Store
from sparkmq.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_and_a_log_gets_lines(caplog):
    tty = _Tty()
    with Progress(100, "work", stream=tty) as p:
        p.advance(40)
        p.advance(60)
    assert "work:" in tty.getvalue() and "it/s" in tty.getvalue()       # tqdm's bar
    caplog.set_level(logging.INFO, logger="sparkmq.progress")
    with Progress(10, "quiet work", stream=io.StringIO(), every_s=0) as p:
        for _ in range(10):
            p.advance()
    lines = [r.getMessage() for r in caplog.records if r.name == "sparkmq.progress"]
    assert lines and lines[-1].startswith("quiet work: 10/10 it (100 %)")


def test_recovery_at_open_reports_progress(tmp_path, caplog, monkeypatch):
    import sparkmq.progress as progress
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    import subprocess
    import sys
    import textwrap
    url = str(tmp_path / "s")
    crash = textwrap.dedent(f"""
        import os
        from sparkmq import Message, Store
        s = Store.open({url!r}, mode="w", start_services=False)
        s.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        s.append([Message("T", b"x" * 100) for _ in range(50)])
        os._exit(0)            # a crash: the tail is not published
    """)
    subprocess.run([sys.executable, "-c", crash], check=True, timeout=120)
    caplog.set_level(logging.INFO, logger="sparkmq.progress")
    with Store.open(url, mode="w", start_services=False) as again:
        assert again.max_offset("T", 0) == 50
    lines = [r.getMessage() for r in caplog.records if r.name == "sparkmq.progress"]
    assert any(line.startswith(f"recover {url}") for line in lines)


def test_a_retention_run_reports_progress_in_log_lines(tmp_path, caplog, monkeypatch):
    """Not on a terminal (pytest's captured stderr), a retention pass that removes
    segments logs where it is, like vacuum."""
    import datetime as dt

    import sparkmq.progress as progress
    from helpers.clock import Clock
    from helpers.storetools import SMALL_SEGMENT_BYTES
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    clock = Clock(int(dt.datetime(2030, 1, 15, 1, 0).timestamp() * 1000))
    url = str(tmp_path / "s")
    with Store.open(url, clock_ms=clock, start_services=False,
                    mappedFileSizeCommitLog=SMALL_SEGMENT_BYTES, fileReservedTime=1) as s:
        s.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        for i in range(60):
            s.append([Message("T", b"%05d" % i + b"." * 300, queue_id=0)])
        s.flush()
        clock.now_ms += 3 * 3600 * 1000                   # all expired (1 h)
        caplog.set_level(logging.INFO, logger="sparkmq.progress")
        removed = s.run_retention(force_hour=True)
    assert len(removed) > 1
    lines = [r.getMessage() for r in caplog.records if r.name == "sparkmq.progress"]
    mine = [line for line in lines if line.startswith(f"retention {url}: files")]
    assert mine, lines
    done, total = mine[-1][len(f"retention {url}: files: "):].split(" ", 1)[0].split("/")
    assert done == total and int(total) >= 2 * len(removed)


def test_track_draws_a_bar_on_a_terminal_and_prints_lines_elsewhere(monkeypatch):
    """What the bench scripts wrap their loops in: a bar on a terminal, else a line on
    stderr now and then (none for a loop quicker than the interval)."""
    import sparkmq.progress as progress
    tty, plain = _Tty(), io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", tty)
    assert list(progress.track(range(5), "sends")) == [0, 1, 2, 3, 4]
    assert "sends:" in tty.getvalue() and "it/s" in tty.getvalue()
    monkeypatch.setattr(progress.sys, "stderr", plain)
    assert sum(progress.track(iter(range(4)), "reads", total=4, every_s=0)) == 6
    assert plain.getvalue().splitlines()[-1].startswith("reads: 4/4 it (100 %)")
    quiet = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", quiet)
    list(progress.track(range(3), "quick", every_s=60))
    assert quiet.getvalue() == ""
