"""The sparkmq command: inspection subcommands against a real store, and the demo."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparkmq import Message, Store
from sparkmq.cli import main


@pytest.fixture
def filled(tmp_path):
    url = str(tmp_path / "s")
    with Store.open(url, start_services=False) as store:
        store.create_topic("Alpha", read_queue_nums=2, write_queue_nums=2)
        res = store.append([Message("Alpha", f"m{i}".encode(), keys=[f"k{i}"], queue_id=i % 2)
                            for i in range(10)])
    return url, res


def test_topics_lists_queues_with_offsets(filled, capsys):
    url, _ = filled
    assert main(["topics", url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["topic"], r["queue"], r["min"], r["max"]) for r in rows} == {
        ("Alpha", 0, 0, 5), ("Alpha", 1, 0, 5)}


def test_log_shows_versions(filled, capsys):
    url, _ = filled
    assert main(["log", url, "--limit", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ops = [r["operation"] for r in rows]
    assert ops[0] == "CREATE STORE" and "CREATE TOPIC" in ops and ops[-1] == "RELEASE LEASE"
    assert [r["version"] for r in rows] == list(range(len(rows)))


def test_print_by_offset_id_and_key(filled, capsys):
    url, res = filled
    assert main(["print", url, "-t", "Alpha", "-q", "1", "-o", "2", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "Alpha/1@2" in out and "'m5'" in out and "Alpha/1@3" in out and "'m7'" in out
    assert main(["print", url, "--id", res[4].message_id]) == 0
    assert "'m4'" in capsys.readouterr().out
    assert main(["print", url, "-t", "Alpha", "--key", "k9"]) == 0
    assert "'m9'" in capsys.readouterr().out


def test_errors_are_one_clear_line(tmp_path, capsys):
    assert main(["topics", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert "SPARKMQ_STORE_NOT_FOUND" in err and "Traceback" not in err
    url = str(tmp_path / "s2")
    assert main(["create-topic", url, "../evil"]) == 1
    assert "SPARKMQ_INVALID_NAME" in capsys.readouterr().err


@pytest.mark.integration
def test_demo_without_spark_runs_end_to_end(tmp_path):
    store = tmp_path / "demo"
    out = subprocess.run([sys.executable, "-m", "sparkmq.cli", "demo", "--no-spark",
                          "--store", str(store), "--messages", "2000"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "appended 2000 messages" in out.stdout
    assert "order-42 -> [('order 42'" in out.stdout
    with Store.open(str(store), mode="r") as s:
        assert sum(hi - lo for lo, hi in s.queue_ranges("Orders").values()) == 1000
        assert sum(hi - lo for lo, hi in s.queue_ranges("Payments").values()) == 1000


@pytest.mark.integration
def test_output_into_a_closed_pipe_stops_quietly(tmp_path):
    """``sparkmq print ... | head -1``: the reader goes away; no traceback."""
    url = str(tmp_path / "s")
    with Store.open(url, start_services=False) as store:
        store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
        store.append([Message("T", b"x" * 200) for _ in range(2000)])
    proc = subprocess.Popen([sys.executable, "-m", "sparkmq.cli", "print", url, "-t", "T",
                             "-n", "2000", "--body-chars", "200"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()                          # more than a pipe buffer is still to come
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 1
    assert first and "Traceback" not in err and "BrokenPipe" not in err, err
