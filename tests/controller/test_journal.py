"""The controller's Raft journal (``sparkmq/controller/journal.py``): what Raft assumes
durable (acknowledged entries, the term, the vote) survives a power cut; its file is
pysyncobj's format both ways; it behaves as pysyncobj's journal does under every change
Raft makes to it; a damaged journal is refused with a message that says what to do."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, strategies as st
from pysyncobj.journal import FileJournal, MemoryJournal

from helpers.net import free_port
from helpers.powercut import PowerCut
from helpers.waiting import wait_until
from sparkmq.controller.journal import DurableJournal
from sparkmq.controller.state import ControllerState
from sparkmq.errors import InvalidConfigError

SECRET = "controller-test-secret-0123456789"


def _ready(nodes: list[ControllerState], until, what: str) -> list[ControllerState]:
    """``nodes`` once ``until()`` holds; if it never does, they are stopped first."""
    try:
        wait_until(until, what)
    except BaseException:
        for n in nodes:
            n.destroy()
        raise
    return nodes


def _one_node(addr: str, journal: str) -> ControllerState:
    state = ControllerState(addr, [], secret=SECRET, journal_path=journal)
    return _ready([state], state.isReady, "a one-node Raft ready")[0]


@pytest.mark.integration
def test_a_destroyed_node_has_stopped_before_destroy_returns(tmp_path):
    # pysyncobj's destroy only asks the tick thread to stop: its last tick could save the
    # term and vote after the caller went on, as the three-controller power cut below
    # once found (a file of that save gone from under the restore). Ours waits for it.
    node = _one_node(f"127.0.0.1:{free_port()}", str(tmp_path / "c.journal"))
    assert node.tick_thread_alive()
    node.destroy()
    assert not node.tick_thread_alive()


@pytest.mark.integration
@pytest.mark.parametrize("compacted", [False, True])
def test_a_power_cut_keeps_every_acknowledged_command_and_the_term(tmp_path, compacted):
    """A one-node controller (its own majority) elects a group's master; then the power
    goes: only what was fsynced is left. Every command it acknowledged, the term it was
    in, and (after a log compaction) the dump that replaced the older entries come back.
    pysyncobj's own journal fsyncs none of them: the group came back with no master."""
    root = tmp_path / "c"
    root.mkdir()
    addr, journal = f"127.0.0.1:{free_port()}", str(root / "raft.journal")
    cut = PowerCut()
    try:
        state = _one_node(addr, journal)
        try:
            state.heartbeat("g", 1, "e1", "h1", 10, 1, True, sync=True, timeout=5)
            state.heartbeat("g", 2, "e2", "h2", 10, 1, sync=True, timeout=5)
            assert state.alter_sync_state_set("g", 1, 1, 1, [1, 2], sync=True, timeout=5)["ok"]
            if compacted:
                state.forceLogCompaction()
                wait_until(lambda: state.getStatus()["log_len"] <= 2, "the log compacted")
            assert state.elect("g", 2, 1, sync=True, timeout=5)["ok"]
            before, term = state.view("g"), state.getStatus()["raft_term"]
            image = cut.image(str(root))             # the power goes now
        finally:
            state.destroy()
    finally:
        cut.remove()
    PowerCut.restore(str(root), image)
    again = _one_node(addr, journal)
    try:
        assert again.view("g") == before
        assert again.getStatus()["raft_term"] >= term
    finally:
        again.destroy()


@pytest.mark.integration
def test_three_controllers_cut_at_once_come_back_with_the_elected_master(tmp_path):
    """A majority (here all three) of the controllers lose power at the same instant
    after a failover was committed: once they restart from what they had fsynced, the
    group's master, epochs and SyncStateSet are the ones they had agreed on."""
    root = tmp_path / "controllers"
    root.mkdir()
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    journals = [str(root / f"c{i}.journal") for i in range(3)]

    def start() -> list[ControllerState]:
        nodes = [ControllerState(a, [p for p in addrs if p != a], secret=SECRET,
                                 journal_path=j) for a, j in zip(addrs, journals)]
        return _ready(nodes, lambda: any(n._isLeader() for n in nodes), "a Raft leader")
    cut = PowerCut()
    try:
        nodes = start()
        try:
            leader = next(n for n in nodes if n._isLeader())
            leader.heartbeat("g", 1, "e1", "h1", 10, 1, True, sync=True, timeout=5)
            leader.heartbeat("g", 2, "e2", "h2", 10, 1, sync=True, timeout=5)
            assert leader.alter_sync_state_set("g", 1, 1, 1, [1, 2], sync=True,
                                               timeout=5)["ok"]
            assert leader.elect("g", 2, 1, sync=True, timeout=5)["ok"]
            before = leader.view("g")
            image = cut.image(str(root))             # the power goes, everywhere at once
        finally:
            for n in nodes:
                n.destroy()
    finally:
        cut.remove()
    PowerCut.restore(str(root), image)
    nodes = start()
    try:
        for n in nodes:       # (each applies the committed log as it learns the commit)
            wait_until(lambda n=n: n.view("g") == before, "the agreed group on every node")
    finally:
        for n in nodes:
            n.destroy()


def test_each_entry_the_term_and_the_vote_are_durable_when_the_call_returns(tmp_path):
    """Raft sends an acknowledgement or a vote right after these calls return: a power
    cut then must leave them (pysyncobj's journal keeps the term and vote on a timer or a
    rename without a sync, and its entries in a memory map it syncs only on close)."""
    path = str(tmp_path / "raft.journal")
    cut = PowerCut()
    try:
        j = DurableJournal(path)
        j.add(b"one", 1, 1)
        j.add(b"two", 2, 3)
        j.deleteEntriesFrom(1)
        j.add(b"three", 2, 4)
        j.setCurrentTerm(4, "n2")
        image = cut.image(str(tmp_path))
        j._destroy()
    finally:
        cut.remove()
    PowerCut.restore(str(tmp_path), image)
    j = DurableJournal(path)
    try:
        assert [j[i] for i in range(len(j))] == [(b"one", 1, 1), (b"three", 2, 4)]
        assert (j.getCurrentTerm(), j.getVotedForNodeId()) == (4, "n2")
    finally:
        j._destroy()


@pytest.mark.parametrize("writer, reader", [(DurableJournal, FileJournal),
                                            (FileJournal, DurableJournal)])
def test_the_file_is_pysyncobjs_format_both_ways(tmp_path, writer, reader):
    path = str(tmp_path / "raft.journal")
    entries = [(b"\x00", 1, 1), (b"command-two", 2, 1), (b"three" * 50, 3, 2)]
    j = writer(path)
    for e in entries:
        j.add(*e)
    j.setCurrentTerm(2, "n1")
    j._destroy()
    j = reader(path)
    assert [j[i] for i in range(len(j))] == entries
    assert (j.getCurrentTerm(), j.getVotedForNodeId()) == (2, "n1")
    j._destroy()


_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.binary(max_size=40)),
    st.tuples(st.just("from"), st.integers(0, 12)),
    st.tuples(st.just("to"), st.integers(0, 12)),
    st.tuples(st.just("clear"), st.none())), max_size=25)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_it_behaves_as_pysyncobjs_journal_and_reopens_as_it_was(tmp_path_factory, ops):
    """Every change Raft makes (append, drop a conflicting tail, compact, clear) against
    pysyncobj's memory journal as the model, and the file reopened after each."""
    path = str(tmp_path_factory.mktemp("j") / "raft.journal")
    model, j, idx = MemoryJournal(), DurableJournal(path), 0
    try:
        for op, arg in ops:
            if op == "add":
                idx += 1
                model.add(arg, idx, 1)
                j.add(arg, idx, 1)
            elif op == "from":
                model.deleteEntriesFrom(arg)
                j.deleteEntriesFrom(arg)
            elif op == "to":
                model.deleteEntriesTo(arg)
                j.deleteEntriesTo(arg)
            else:
                model.clear()
                j.clear()
            want = [model[i] for i in range(len(model))]
            assert [j[i] for i in range(len(j))] == want
            j._destroy()
            j = DurableJournal(path)
            assert [j[i] for i in range(len(j))] == want
    finally:
        j._destroy()


def test_a_damaged_journal_is_refused_saying_what_to_do(tmp_path):
    path = str(tmp_path / "raft.journal")
    j = DurableJournal(path)
    j.add(b"command", 1, 1)
    j._destroy()
    size = os.path.getsize(path)
    os.truncate(path, size - 3)                 # the record's tail gone
    with pytest.raises(InvalidConfigError, match="damaged.*move the journal away"):
        DurableJournal(path)
    with open(path, "r+b") as f:
        f.write(b"not a journal")
    with pytest.raises(InvalidConfigError, match="not a pysyncobj journal"):
        DurableJournal(path)
    os.truncate(path, 0)            # a creation cut short: a new, empty journal
    j = DurableJournal(path)
    assert len(j) == 0
    j.add(b"first", 1, 1)
    j._destroy()
    j = DurableJournal(path)
    try:
        assert [j[i] for i in range(len(j))] == [(b"first", 1, 1)]
    finally:
        j._destroy()
    with open(path + ".meta", "wb") as f:
        f.write(b"\x80\x04garbage")
    with pytest.raises(InvalidConfigError, match="term and vote.*damaged"):
        DurableJournal(path)
