"""The golden store of reader version 3 (tests/golden/v3, made once by
tests/golden/make_golden.py): format-2 files with checkpoints in parts (manifests naming
sidecars under ``_log/_sidecars/``). Today's code must keep reading it exactly, read-only.

The same content as tests/golden/v1 (tests/log/test_golden.py): topics Orders and
Events, 48 messages, compaction, group G1 and its offsets, 17 versions with checkpoints
5, 10 and 15 — the later ones reusing sidecars of the earlier ones by name.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.storetools import GOLDEN_FIELDS, read_only_copy
from sparkmq import Snapshot, Store
from sparkmq.log import format as fmt
from sparkmq.log.actions import Sidecar, parse_actions

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "v3"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
FIELDS = GOLDEN_FIELDS



@pytest.fixture
def golden(tmp_path):
    with read_only_copy(GOLDEN / "store", tmp_path) as copy:
        yield copy


def _manifest(version: int) -> list:
    rel = fmt.checkpoint_file(version)
    return parse_actions((GOLDEN / "store" / rel).read_bytes(), rel)


def test_the_golden_store_is_what_its_manifest_says():
    assert (EXPECTED["format_version"], EXPECTED["reader_version"]) == (2, 3)
    first = [a for a in _manifest(5) if isinstance(a, Sidecar)]
    last = [a for a in _manifest(15) if isinstance(a, Sidecar)]
    assert first and last and set(first) & set(last)        # a sidecar reused by name
    assert _manifest(15)[0].min_reader_version == 3
    assert len(EXPECTED["messages"]) == 48


def test_every_message_reads_back_exactly(golden):
    with Store.open(golden, mode="r") as store:
        for want in EXPECTED["messages"]:
            m = store.read(want["topic"], want["queue_id"], want["queue_offset"], 1)[0]
            got = {f: getattr(m, f) for f in FIELDS}
            got.update(body=m.body.decode(), keys=list(m.keys), properties=dict(m.properties))
            assert got == want
        assert store.consumer_offsets("G1") == {("Orders", 0): 3, ("Orders", 1): 2,
                                                ("Events", 0): 1}
        assert store.subscription_groups()["G1"]["retryMaxTimes"] == 3


def test_every_version_loads_and_equals_a_replay_without_checkpoints(golden, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(golden, plain)
    for p in (plain / "_log").glob("*.checkpoint.json"):
        p.unlink()
    (plain / "_log" / "_last_checkpoint").unlink()
    for v in (5, 10, 15, 16):
        a, b = Snapshot.load(golden, version=v), Snapshot.load(str(plain), version=v)
        assert a.version == b.version == v
        assert a.consumer_offsets("G1") == b.consumer_offsets("G1")
        assert [a.max_offset("Orders", q) for q in range(3)] == \
            [b.max_offset("Orders", q) for q in range(3)]
