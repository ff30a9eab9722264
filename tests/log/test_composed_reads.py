"""A read of rows a put just cached composed (``_compose.view`` through
``messagetable.composed_message_table``: the stored columns referenced, the computed ones
inserted, one import) gives the table the general read builds in pyarrow, for any rows
a producer may send and any contiguous range of them; its memory is held exactly as long
as something reads it; what does not fit is refused and moves nothing. A read of the same
rows as StoredMessages (the RocketMQ pop's: ``_compose.values``) gives the messages the
general read gives. Fast tier: no servers."""
from __future__ import annotations

import gc
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers.clock import Clock
from sparkmq import Store
from sparkmq.log import built, messagetable
from sparkmq.log import reader as reader_module
from sparkmq.log.message import column_values
from sparkmq.log.messagetable import MESSAGE_COLUMNS, MESSAGE_SCHEMA

_compose = pytest.importorskip("sparkmq._compose", reason="the C module is not built here")
from test_composed_rows import NOW, _both, _over, send_batches  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("composed-reads") / "store")
    with Store.open(url, clock_ms=Clock(NOW), start_services=False) as s:
        s.create_topic("t", read_queue_nums=8, write_queue_nums=8)
        yield s


def _any_range(test):
    """``test(store, monkeypatch, source, queue, cut)`` for any rows a producer may send
    (``source``), appended to ``queue``, and a range of them drawn with ``cut``."""
    return settings(max_examples=120, deadline=None, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.function_scoped_fixture])(
        given(source=send_batches(), queue=st.integers(0, 7), cut=st.data())(test))


def _spy(monkeypatch, name: str, real) -> list:
    """What each call of the reader's ``name`` (``real``) answered, in a list the test
    reads."""
    answers: list = []
    monkeypatch.setattr(reader_module, name,
                        lambda *a: answers.append(real(*a)) or answers[-1])
    return answers


def _appended_range(store, source, queue, cut):
    """(the composed rows of ``source``, appended to ``queue``; the queue offset of the
    first; a drawn range lo..hi of them)."""
    rows = _both(source, queue)[1]
    first_offset = int(store.append_batch(rows).queue_offsets[0])
    lo = cut.draw(st.integers(0, source.num_rows - 1))
    return rows, first_offset, lo, cut.draw(st.integers(lo + 1, source.num_rows))


@_any_range
def test_a_read_of_composed_rows_is_the_table_the_general_read_builds(
        store, monkeypatch, source, queue, cut):
    rows, first_offset, lo, hi = _appended_range(store, source, queue, cut)
    views = _spy(monkeypatch, "composed_message_table", messagetable.composed_message_table)
    fast = store.read_table("t", queue, first_offset + lo, first_offset + hi)
    assert len(views) == 1 and views[0] is not None          # the view made this table
    general = store.read_table("t", queue, first_offset + lo, first_offset + hi,
                               columns=MESSAGE_COLUMNS)          # (built in pyarrow)
    assert fast.schema.equals(MESSAGE_SCHEMA, check_metadata=True)
    assert fast.equals(general)
    fast.validate(full=True)
    assert fast.column("queue_offset").to_pylist() == \
        list(range(first_offset + lo, first_offset + hi))


def test_a_read_spanning_batches_or_of_some_columns_is_built_in_pyarrow(store, monkeypatch):
    made = []
    monkeypatch.setattr(messagetable, "composed_view",
                        lambda *a: made.append(1) or None)
    for _ in range(2):
        store.append_batch(_both(_over(bytearray(b"two")), queue=0)[1])
    end = store.max_offset("t", 0)
    both = store.read_table("t", 0, end - 2, end)        # two batches: not one view
    assert both.num_rows == 2 and made == []
    some = store.read_table("t", 0, end - 1, end, columns=["body", "message_id"])
    assert some.column("body").to_pylist() == [b"two"] and made == []


def test_the_view_outlives_the_cache_and_releases_every_buffer_once_read(tmp_path):
    # the view holds the composed batch (and so the producer's buffers) after the cache,
    # the rows and the store let go of them; once the table goes, every buffer is let go
    body = bytearray(b"payload!" * 16)
    base = sys.getrefcount(body)
    with Store.open(str(tmp_path / "s"), clock_ms=Clock(NOW), start_services=False) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        rows = _both(_over(body), queue=0)[1]
        s.append_batch(rows)
        del rows
        table = s.read_table("t", 0, 0, 1)
        s.commitlog.clear_cache()
    gc.collect()
    assert sys.getrefcount(body) > base            # held by the view
    assert table.column("body").to_pylist() == [bytes(body)]
    del table
    gc.collect()
    assert sys.getrefcount(body) == base


def _kept(n: int = 3):
    source = pa.RecordBatch.from_pydict({"topic": ["t"] * n, "body": [b"x"] * n})
    rows = _both(source, queue=0)[1]
    return rows, rows.c_array()[1]


@pytest.mark.parametrize("first,k", [(-1, 1), (0, 0), (2, 2), (3, 1)])
def test_view_refuses_a_range_past_the_batch(first, k):
    rows, kept = _kept()
    assert _compose.view(kept, first, k, (0,), ()) is None


@pytest.mark.parametrize("values", [
    ((np.zeros(2, np.int64),),),                                   # 2 values for 3 rows
    ((np.zeros(3, np.int32),),),                                   # 4-byte values
    ((np.array([0, 1, 2, 3], np.int32), b"ab"),),                  # offsets past the data
    ((np.array([1, 1, 2, 3], np.int32), b"abc"),),                 # offsets not from 0
    ((np.array([0, 2, 1, 3], np.int32), b"abc"),),                 # offsets going back
    ((b"x", b"y", b"z"),),                                         # three buffers
    ("not buffers",),
])
def test_view_refuses_values_that_do_not_fit_and_holds_nothing(values):
    rows, kept = _kept()
    held = [v for bufs in values if isinstance(bufs, tuple) for v in bufs
            if isinstance(v, np.ndarray)]
    counts = [sys.getrefcount(v) for v in held]
    assert _compose.view(kept, 0, 3, (0, -1), values) is None
    assert [sys.getrefcount(v) for v in held] == counts


def test_view_refuses_a_slot_past_the_columns_and_a_capsule_it_did_not_make():
    rows, kept = _kept()
    assert _compose.view(kept, 0, 3, (99,), ()) is None
    assert _compose.view(kept, 0, 3, (-2,), ((np.zeros(3, np.int64),),)) is None
    other = pa.RecordBatch.from_pydict({"a": [1, 2, 3]}).__arrow_c_array__()[1]
    assert _compose.view(other, 0, 3, (0,), ()) is None


def test_threads_reading_one_cached_batch_at_once_get_the_same_table(tmp_path):
    # each read makes its own view over the one composed batch, and releases it on its
    # own thread; once every table is gone the producer's buffer is let go. (A release
    # from one of Flight's C++ threads, which hold no GIL, is not reached here: the
    # release takes the GIL itself, as compose()'s does.)
    import threading
    body = bytearray(b"shared" * 32)
    base = sys.getrefcount(body)
    with Store.open(str(tmp_path / "s"), clock_ms=Clock(NOW), start_services=False) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        s.append_batch(_both(_over(body), queue=0)[1])
        want = s.read_table("t", 0, 0, 1, columns=MESSAGE_COLUMNS)
        got, start = [], threading.Barrier(8)

        def read() -> None:
            start.wait()
            for _ in range(50):
                table = s.read_table("t", 0, 0, 1)
                got.append(table.equals(want))
                del table                        # released here, on this thread
        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [True] * 400
        s.commitlog.clear_cache()
    del want
    gc.collect()
    assert sys.getrefcount(body) == base


@_any_range
def test_a_pop_of_composed_rows_gives_the_messages_the_general_read_gives(
        store, monkeypatch, source, queue, cut):
    # the RocketMQ pop's read (StoredMessages) of rows the cache holds composed:
    # ``_compose.values`` in one pass, the same values as pyarrow's column by column
    rows, first_offset, lo, hi = _appended_range(store, source, queue, cut)
    made = _spy(monkeypatch, "composed_values", built.composed_values)
    fast = store.read("t", queue, first_offset + lo, hi - lo)
    assert len(made) == 1 and made[0] is not None            # read from the C struct
    assert _some(made[0]) == _some(column_values(pa.table(rows.batch.slice(lo, hi - lo))))
    store.commitlog.clear_cache()                             # read from the segment
    general = store.read("t", queue, first_offset + lo, hi - lo)
    assert len(made) == 1 and len(fast) == hi - lo
    assert fast == general
    assert [m.queue_offset for m in fast] == list(range(first_offset + lo, first_offset + hi))


def _some(values: dict) -> dict:
    """``values`` without the columns all None (either read may leave them out)."""
    return {name: col for name, col in values.items() if col.count(None) < len(col)}


def test_values_read_every_kind_nulls_and_values_alike():
    source = pa.RecordBatch.from_pydict({
        "topic": ["t"] * 3, "body": [b"a", b"\x00\xff", b"c"],
        "tags": ["x", None, "\u00e9"], "keys": [["k1", "k2"], None, []],
        "properties": pa.array([[("p", "1")], None, [("q", "")]],
                               pa.map_(pa.string(), pa.string())),
        "unique_key": [None, None, None]})
    rows = _both(source, queue=5)[1]
    got = built.composed_values([(rows, 0, 3)])
    assert got == column_values(pa.table(rows.batch))
    assert got["keys"] == [["k1", "k2"], None, []]
    assert got["properties"] == [[("p", "1")], None, [("q", "")]]
    assert got["queue_id"] == [5, 5, 5] and "unique_key" not in got
    assert built.composed_values([(rows, 1, 2)])["body"] == [b"\x00\xff", b"c"]


@pytest.mark.parametrize("first,k", [(-1, 1), (0, 0), (2, 2), (3, 1)])
def test_values_refuse_a_range_past_the_batch(first, k):
    rows, kept = _kept()
    assert _compose.values(((kept, first, k),), built._KINDS) is None


def test_values_refuse_kinds_that_do_not_fit_and_a_capsule_they_did_not_make():
    rows, kept = _kept()
    whole = ((kept, 0, 3),)
    assert _compose.values(whole, built._KINDS[:-1]) is None             # a kind short
    assert _compose.values(whole, b"s" * len(built._KINDS)) is None      # int32 as string
    assert _compose.values(whole, b"l" + built._KINDS[1:]) is None       # string as list
    other = pa.RecordBatch.from_pydict({"a": [1, 2, 3]}).__arrow_c_array__()[1]
    assert _compose.values(((other, 0, 3),), b"t") is None
    assert _compose.values(whole + ((other, 0, 3),), built._KINDS) is None   # one run unfit
    assert _compose.values((), built._KINDS) is None
    assert _compose.values(((kept, 0),), built._KINDS) is None             # not a run
    assert _compose.values(whole, built._KINDS) is not None


def test_a_pop_over_several_batches_reads_them_all_in_one_pass(tmp_path, monkeypatch):
    # a consumer's receive of messages several sends stored (each its own batch, one
    # queue): the runs read together from the cache's structs; a batch the cache no
    # longer holds sends the whole read through pyarrow, with the same messages
    made = _spy(monkeypatch, "composed_values", built.composed_values)
    with Store.open(str(tmp_path / "s"), clock_ms=Clock(NOW), start_services=False) as s:
        s.create_topic("t", read_queue_nums=1, write_queue_nums=1)
        sources = [pa.RecordBatch.from_pydict({"topic": ["t"] * n, "body": [b"%d" % i] * n,
                                               "tags": [None] * (n - 1) + ["x"]})
                   for i, n in enumerate([1, 3, 2, 1])]
        offsets = [int(s.append_batch(_both(src, queue=0)[1]).batch_offset) for src in sources]
        fast = s.read("t", 0, 2, 5)              # from the 2nd batch's second row on
        assert len(made) == 1 and made[0] is not None
        assert [m.body for m in fast] == [b"1", b"1", b"2", b"2", b"3"]
        assert [m.tags for m in fast] == [None, "x", None, "x", "x"]
        assert [m.queue_offset for m in fast] == [2, 3, 4, 5, 6]
        s.commitlog.clear_cache()
        assert s.read("t", 0, 2, 5) == fast and len(made) == 1     # (nothing cached)
        s.append_batch(_both(sources[0], queue=0)[1])              # cached: queue offset 7
        assert s.commitlog.cached_rows(offsets[3]) is None
        assert [m.body for m in s.read("t", 0, 6, 2)] == [b"3", b"0"] and len(made) == 1
