"""Property test: the epoch history (``sparkmq/ha/epochs.py``) against a model of failovers.

The model is two or three brokers (store ids A, B, C) and a run of leadership changes
(hypothesis): the master writes; replicas attach (the handshake of ``connection.py``:
``consistent_end``, truncation, then the replica saves the master's whole list, as
``replica.py`` does), copy some of the master's bytes, drop or restart; the master is lost
and a replica, in sync or not (``sparkmq admin promote`` takes any), is promoted (the floor
and epoch of ``replica.promote``, then ``HAService.start``), while the deposed master keeps
the bytes nobody copied; a master crashes, loses an unflushed tail of its current epoch
and restarts with the next epoch of its lease. The histories are the real ones
(``epochs.append`` / ``save`` / ``load`` on a ``memory://`` store); each log is one tag per
byte: the (epoch, storeId) that wrote it, so two logs hold the same byte where tags match.

The truth is the common prefix of two logs. ``consistent_end(master history, replica
history, replica offset)`` must equal it, never more (the replica would keep bytes the
master lacks and append the master's after them: silent divergence), never less (it
would throw away good data): at every handshake, and after every step for every pair
(X, Y) as if X were promoted now and Y attached to it. The docstring's deliberate
exception (no common entry: 0, even for a non-empty replica) never arises between the
stores of one group; ``test_documented_edges`` pins it.

As in RocketMQ's controller mode (EpochFileCache.findConsistentPoint) the agreement ends
where either history moves on to another writer. Unlike RocketMQ, whose slave adds an
entry only when bytes of that epoch arrive (and cuts its entries with its log), a sparkmq
replica copies its master's whole list up front, so one promoted before it caught up with
the newest entry appends an entry starting below it: a list is in epoch order, not offset
order, and the agreement ends at the lowest start of the entries after the common one.

Malformed input: a replica's list comes off the wire; ``consistent_end`` returns an int
in [0, offset] or raises KeyError, TypeError or ValueError (``_handshake`` answers those
with agreement 0), nothing that would kill the connection's thread; ``load`` of an
unreadable file is [].
"""
from __future__ import annotations

import json
import uuid

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from sparkmq.ha import epochs
from sparkmq.log import format as fmt
from sparkmq.log.fs import StoreFS

BROKERS = ("A", "B", "C")


def entry(epoch: int, store_id: str, start: int) -> dict:
    return {"epoch": epoch, "storeId": store_id, "startOffset": start}


def common_prefix(a: list, b: list) -> int:
    """How many leading bytes two logs (lists of writer tags) share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def writer_at(history: list[dict], offset: int) -> tuple[int, str] | None:
    """The (epoch, storeId) a history says wrote ``offset``: the newest entry (list order)
    starting at or below it (a later entry may start below an earlier one)."""
    found = None
    for e in history:
        if e["startOffset"] <= offset:
            found = (e["epoch"], e["storeId"])
    return found


def runs(log: list) -> list[tuple]:
    """A log as (start, end, epoch, storeId) ranges, for failure messages."""
    out: list[tuple] = []
    for i, tag in enumerate(log):
        if out and out[-1][2:] == tag:
            out[-1] = (out[-1][0], i + 1, *tag)
        else:
            out.append((i, i + 1, *tag))
    return out


class Broker:
    """One broker's store: its epoch-history file, its log (one writer tag per byte), the
    epoch of its writer lease (``Store.open`` takes it with epoch + 1) and its HA client's
    state (following the master or not, the master epoch it saw)."""

    def __init__(self, name: str, sfs: StoreFS):
        self.name = name
        self.sfs = sfs
        self.log: list[tuple[int, str]] = []
        self.lease = 1
        self.following = False
        self.seen_epoch = 0

    def history(self) -> list[dict]:
        return epochs.load(self.sfs)


class Failovers(RuleBasedStateMachine):
    """Leadership changes between 2 or 3 brokers; see the module docstring."""

    def __init__(self):
        super().__init__()
        self.root = f"memory://sparkmq-epochs-model-{uuid.uuid4().hex}"
        self.brokers: dict[str, Broker] = {}
        self.master: Broker | None = None

    @initialize(n=st.integers(2, 3))
    def open_brokers(self, n):
        for name in BROKERS[:n]:
            self.brokers[name] = Broker(name, StoreFS(f"{self.root}/{name}"))
        self.master = self.brokers["A"]
        self._serve(self.master)

    # -- helpers -------------------------------------------------------------
    def _others(self) -> list[Broker]:
        return [b for b in self.brokers.values() if b is not self.master]

    def _idle(self) -> list[Broker]:
        return [b for b in self._others() if not b.following]

    def _following(self) -> list[Broker]:
        return [b for b in self._others() if b.following]

    def _serve(self, b: Broker) -> None:
        """``HAService.start``: record the store's epoch from its written offset."""
        before = b.history()
        after = epochs.append(b.sfs, b.lease, b.name, len(b.log))
        assert after == b.history()
        if before and (before[-1]["epoch"], before[-1]["storeId"]) == (b.lease, b.name):
            assert after == before            # already recorded (a promotion's entry)
        else:
            assert after == before + [entry(b.lease, b.name, len(b.log))]

    def _depose(self) -> None:
        """The master stops serving: every replica's link to it drops."""
        for b in self._others():
            b.following = False

    # -- rules ---------------------------------------------------------------
    @rule(n=st.integers(1, 6))
    def master_writes(self, n):
        self.master.log.extend([(self.master.lease, self.master.name)] * n)

    @precondition(lambda self: self._idle())
    @rule(pick=st.integers(0, 2))
    def replica_attaches(self, pick):
        idle = self._idle()
        r, m = idle[pick % len(idle)], self.master
        offset = len(r.log)
        mine, theirs = m.history(), r.history()
        agree = epochs.consistent_end(mine, theirs, offset)
        truth = common_prefix(m.log, r.log)
        assert agree == truth, (
            f"consistent_end says {agree}, the logs agree up to {truth} "
            f"({'diverged data kept' if agree > truth else 'good data dropped'}):\n"
            f"master {m.name} {mine}\n  log {runs(m.log)}\n"
            f"replica {r.name} {theirs}\n  log {runs(r.log)}")
        start = min(agree, len(m.log))       # the welcome's truncateTo, if below offset
        del r.log[start:]
        r.seen_epoch = m.lease
        epochs.save(r.sfs, mine)              # the replica copies the master's list
        r.following = True

    @precondition(lambda self: self._following())
    @rule(pick=st.integers(0, 2), n=st.integers(1, 8))
    def replica_copies(self, pick, n):
        following = self._following()
        r = following[pick % len(following)]
        at = len(r.log)
        r.log.extend(self.master.log[at:at + n])

    @precondition(lambda self: self._following())
    @rule(pick=st.integers(0, 2), restart=st.booleans())
    def replica_link_drops(self, pick, restart):
        following = self._following()
        r = following[pick % len(following)]
        r.following = False
        if restart:
            r.lease += 1

    @rule(pick=st.integers(0, 2))
    def replica_promoted(self, pick):
        """The master is lost; a replica (in sync or not) becomes the master."""
        others = self._others()
        new, old = others[pick % len(others)], self.master
        self._depose()
        old.lease += 1                        # it comes back later, opened as a replica
        # replica.promote: an epoch above the one it saw and every one in its history
        floor = max([new.seen_epoch] + [e["epoch"] for e in new.history()])
        new.lease = max(new.lease, floor) + 1
        epochs.append(new.sfs, new.lease, new.name, len(new.log))
        self.master = new
        self._serve(new)

    @rule(lost=st.integers(0, 6))
    def master_crashes(self, lost):
        """The master's machine crashes: it loses an unflushed tail (replicas may hold it)
        and restarts as master with the next epoch of its lease. Only bytes of its current
        epoch: recovery fsyncs the tail it seals, so an earlier epoch's bytes are durable."""
        m = self.master
        self._depose()
        floor = max(m.history()[-1]["startOffset"], len(m.log) - lost)
        del m.log[floor:]
        m.lease += 1
        self._serve(m)

    # -- invariants ----------------------------------------------------------
    @invariant()
    def histories_describe_the_logs(self):
        """What the model relies on: each store's history names the writer of each of its
        bytes, and its (epoch, storeId) keys are unique and in epoch order."""
        for b in self.brokers.values():
            hist = b.history()
            assert [e["epoch"] for e in hist] == sorted({e["epoch"] for e in hist})
            for at, tag in enumerate(b.log):
                assert writer_at(hist, at) == tag, (b.name, at, hist, runs(b.log))

    @invariant()
    def every_next_failover_would_truncate_right(self):
        """If X were promoted now (its next epoch from its written offset) and Y attached
        to it, the agreement would be exactly what their logs share."""
        for x in self.brokers.values():
            promoted = x.history() + [entry(x.lease + 1, x.name, len(x.log))]
            for y in self.brokers.values():
                if y is x:
                    continue
                agree = epochs.consistent_end(promoted, y.history(), len(y.log))
                truth = common_prefix(x.log, y.log)
                assert agree == truth, (
                    f"consistent_end says {agree}, the logs agree up to {truth}:\n"
                    f"master {x.name} {promoted}\n  log {runs(x.log)}\n"
                    f"replica {y.name} {y.history()}\n  log {runs(y.log)}")

    def teardown(self):
        for b in self.brokers.values():
            if b.sfs.fs.exists(b.sfs.root):
                b.sfs.fs.rm(b.sfs.root, recursive=True)


TestFailovers = Failovers.TestCase
TestFailovers.settings = settings(max_examples=500, stateful_step_count=40, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])


# -- examples ------------------------------------------------------------------

def test_a_replica_promoted_before_catching_up_does_not_hide_the_old_masters_tail():
    """Three brokers. A (epoch 1) writes 12 bytes; B copies 10 of them, C 5. A is lost,
    B is promoted (epoch 2 from 10). C attaches to B at offset 5, copies B's history
    and nothing more before B is lost too: C is promoted (epoch 3 from 5), its history
    [A1@0, B2@10, C3@5]. A comes back with its 12 bytes of epoch 1: only the first 5 are
    C's (C wrote 5.. in epoch 3). Reading the agreement off the entry after A1 (B2@10)
    said 10: A kept its bytes 5..10 where C has its own, then copied C's from 10 on."""
    root = f"memory://sparkmq-epochs-{uuid.uuid4().hex}"
    a, c = StoreFS(f"{root}/A"), StoreFS(f"{root}/C")
    epochs.append(a, 1, "A", 0)
    epochs.save(c, [entry(1, "A", 0), entry(2, "B", 10)])    # what B sent C at offset 5
    c_history = epochs.append(c, 3, "C", 5)
    assert c_history == [entry(1, "A", 0), entry(2, "B", 10), entry(3, "C", 5)]
    assert epochs.consistent_end(c_history, epochs.load(a), 12) == 5
    # B rejoining C (it wrote 10..14 in epoch 2) agrees with C up to 5 as well
    b_history = [entry(1, "A", 0), entry(2, "B", 10)]
    assert epochs.consistent_end(c_history, b_history, 14) == 5
    # the same list on the replica's side: C rejoining an A that never saw B2 or C3
    assert epochs.consistent_end([entry(1, "A", 0), entry(4, "A", 30)], c_history, 20) == 5


def test_a_replica_that_copied_an_epoch_it_has_no_bytes_of_then_was_promoted():
    """Hypothesis's smallest case. A (epoch 1) writes a byte and C copies it; A restarts
    (epoch 2 from 1); B, still empty, attaches and copies A's list; A is lost, B is
    promoted (epoch 3 from 0) and writes. C attaches to B: its byte 0 is A's, B's is B's
    own. Reading the agreement off the entry after A1 (A2@1) said 1: C kept A's byte and
    appended B's bytes from 1 on."""
    sfs = StoreFS(f"memory://sparkmq-epochs-{uuid.uuid4().hex}")
    epochs.save(sfs, [entry(1, "A", 0), entry(2, "A", 1)])
    b_history = epochs.append(sfs, 3, "B", 0)
    assert epochs.consistent_end(b_history, [entry(1, "A", 0)], 1) == 0


def test_documented_edges():
    hist = [entry(1, "A", 0), entry(2, "B", 10)]
    assert epochs.consistent_end(hist, [], 0) == 0                   # an empty replica
    assert epochs.consistent_end(hist, hist, 0) == 0
    # no common entry: nothing is known to agree, even if the bytes might (deliberate)
    assert epochs.consistent_end(hist, [entry(1, "X", 0)], 7) == 0
    assert epochs.consistent_end(hist, [], 7) == 0
    # the same history: everything the replica has (capped by its offset)
    assert epochs.consistent_end(hist, hist, 25) == 25
    assert epochs.consistent_end(hist, hist[:1], 25) == 10


def test_append_records_an_epoch_once():
    sfs = StoreFS(f"memory://sparkmq-epochs-{uuid.uuid4().hex}")
    assert epochs.load(sfs) == []
    assert epochs.append(sfs, 3, "A", 0) == [entry(3, "A", 0)]
    assert epochs.append(sfs, 3, "A", 40) == [entry(3, "A", 0)]     # a restart of it
    assert epochs.append(sfs, 4, "A", 40) == [entry(3, "A", 0), entry(4, "A", 40)]
    assert epochs.append(sfs, 4, "B", 40)[-1] == entry(4, "B", 40)  # another store
    assert epochs.load(sfs) == [entry(3, "A", 0), entry(4, "A", 40), entry(4, "B", 40)]


# -- malformed input -------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=6)
# the values that break naive code (a float, a negative, a bool are numbers to min()),
# then anything JSON
bad_values = st.one_of(st.sampled_from([None, True, False, -1, 2.5, 1e300, float("inf"),
                                        float("-inf"), float("nan"), "7", [], {}]), json_values)
FIELDS = ("epoch", "storeId", "startOffset")
MASTER = [entry(1, "A", 0), entry(2, "B", 10), entry(3, "C", 5), entry(4, "C", 20)]
OTHER_KEYS = [(2, "A"), (3, "B"), (5, "B"), (5, "A")]


@st.composite
def wire_lists(draw):
    """What a replica's hello may carry as its history: anything JSON, or a list shaped
    like a real one (a prefix of the master's entries, then entries of other writers)
    with some entries corrupted (a field of a bad type or missing, not an object)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    keys = [(e["epoch"], e["storeId"]) for e in MASTER[:draw(st.integers(0, len(MASTER)))]]
    keys += draw(st.lists(st.sampled_from(OTHER_KEYS), max_size=3, unique=True))
    entries = [entry(ep, sid, draw(st.integers(0, 40))) for ep, sid in keys]
    for k in range(len(entries)):
        how = draw(st.sampled_from(["keep", "keep", "keep", "offset", "offset", "retype",
                                    "drop", "replace"]))
        if how == "replace":
            entries[k] = draw(bad_values)
        elif how == "drop":
            entries[k].pop(draw(st.sampled_from(FIELDS)))
        elif how in ("offset", "retype"):
            field = "startOffset" if how == "offset" else draw(st.sampled_from(FIELDS))
            entries[k][field] = draw(bad_values)
    return entries


@settings(max_examples=400, deadline=None)
@given(theirs=wire_lists(), offset=st.integers(0, 50), master=st.sampled_from(
    [MASTER, MASTER[:1], MASTER[:2], MASTER[:3]]))
def test_a_malformed_replica_history_never_crashes_the_handshake(theirs, offset, master):
    # off the wire: what JSON can carry (NaN and Infinity included, as json.loads takes)
    theirs = json.loads(json.dumps(theirs))
    try:
        end = epochs.consistent_end(master, theirs, offset)
    except (KeyError, TypeError, ValueError):
        return                      # _handshake answers these with agreement 0
    assert type(end) is int and 0 <= end <= offset, end


@settings(max_examples=400, deadline=None)
@given(data=wire_lists(), raw=st.binary(max_size=20))
def test_load_of_a_malformed_file_is_empty_or_well_typed(data, raw):
    sfs = StoreFS(f"memory://sparkmq-epochs-{uuid.uuid4().hex}")
    try:
        for blob in (json.dumps(data).encode(), raw):
            sfs.replace(fmt.ha_epochs_file(), blob)
            got = epochs.load(sfs)
            assert isinstance(got, list)
            for e in got:
                assert set(e) == {"epoch", "storeId", "startOffset"}
                assert type(e["epoch"]) is int and type(e["startOffset"]) is int
                assert type(e["storeId"]) is str
    finally:
        if sfs.fs.exists(sfs.root):
            sfs.fs.rm(sfs.root, recursive=True)
