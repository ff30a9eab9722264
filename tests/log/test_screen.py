"""The input-limit screen in C (sparkmq/_screen.c) against the rule it screens for
(limits.message_violation) and against the numpy screen it replaces: every row the rule
refuses is listed, sliced batches read right, both screens give check_batch the same
verdict, and a batch of another shape is declined (numpy screens instead). Fast tier: no
servers."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkmq.errors import MessageLimitError
from sparkmq.log import format as fmt
from sparkmq.log import limits
from sparkmq.log.batch import build_segment_batch

pytestmark = pytest.mark.skipif(limits._c_screen is None, reason="sparkmq._screen not built")

SMALL = limits.MessageLimits(max_message_size_bytes=200, max_user_property_size_bytes=70,
                             user_property_max_num=3, max_message_group_size_bytes=5,
                             max_message_id_size_bytes=5)
# A row is good with one to three fields made bad, so that no other fault hides the one a
# screen misses. Good text: a few printable characters, ASCII or not (a value starting
# with a space is not blank, but the screen may list it). Bad text: good text with one
# control character (C0, DEL, the C1 U+0085 and U+009F) or '|', or blank (ASCII or
# Unicode whitespace only); values at and past the byte limits.
_GOOD = st.text(alphabet=st.sampled_from(list("ab é标")), min_size=1, max_size=3)
_BAD_CHAR = st.sampled_from(["\t", "\n", "\x00", "\x1f", "\x7f", "\x85", "\x9f", "|"])
_BLANK = st.sampled_from([" ", "  ", "\t", "\xa0", "\u3000", "\u2028", " \u3000"])
_BAD = st.builds(lambda a, c, b: a + c + b, st.just("") | _GOOD, _BAD_CHAR,
                 st.just("") | _GOOD) | _BLANK
_LONG = st.text(alphabet=st.sampled_from(list("ab标")), min_size=20, max_size=40)
_HUGE = st.text(alphabet=st.just("标"), min_size=67, max_size=70)      # over 200 bytes
_GOOD_FIELDS = {
    "body": st.binary(max_size=20),
    "tags": st.none() | _GOOD,
    "keys": st.none() | st.lists(_GOOD, max_size=2),
    "properties": st.none() | st.lists(st.tuples(_GOOD, _GOOD), max_size=2),
    "message_group": st.none() | st.sampled_from(["g", "gggg", "群g"]),      # under 5 bytes
    "unique_key": st.none() | st.sampled_from(["i", "iiiii", "标i"]),       # 5 at most
    "born_host": st.none() | _GOOD,
    "transaction_id": st.none() | _GOOD,
    "born_timestamp": st.sampled_from([0, 1_700_000_000_000, limits.MAX_TIMESTAMP_MS]),
    "delivery_timestamp": st.none() | st.sampled_from([0, limits.MAX_TIMESTAMP_MS]),
    "message_type": st.integers(0, 3),
}
_BAD_FIELDS = {
    "body": st.binary(min_size=180, max_size=200),
    "tags": _BAD | _LONG,
    "keys": st.lists(st.none() | _BAD | _LONG, min_size=1, max_size=2),
    "properties": st.lists(st.tuples(_BAD, _GOOD) | st.tuples(_GOOD, st.none() | _BAD)
                           | st.tuples(st.sampled_from(sorted(limits.RESERVED_PROPERTY_KEYS)),
                                       _GOOD) | st.tuples(_LONG, _GOOD),
                           min_size=1, max_size=2)
    | st.lists(st.tuples(_GOOD, _GOOD), min_size=4, max_size=5),
    "message_group": _BAD | st.sampled_from(["ggggg", "群gg"]) | _LONG,   # 5 bytes on
    "unique_key": _BAD | st.sampled_from(["iiiiii", "标ii"]) | _LONG,     # 6 bytes on
    "born_host": _HUGE,
    "transaction_id": _HUGE,
    "born_timestamp": st.sampled_from([-1, limits.MAX_TIMESTAMP_MS + 1]),
    "delivery_timestamp": st.sampled_from([-1, limits.MAX_TIMESTAMP_MS + 1]),
    "message_type": st.sampled_from([-1, 4]),
}


@st.composite
def _row(draw) -> dict:
    row = draw(st.fixed_dictionaries(_GOOD_FIELDS))
    for name in draw(st.lists(st.sampled_from(sorted(_BAD_FIELDS)), max_size=3, unique=True)):
        row[name] = draw(_BAD_FIELDS[name])
    return row


_ROW = _row()


def _segment_batch(rows: list[dict]) -> pa.RecordBatch:
    cols = {"topic": pa.array(["T"] * len(rows))}
    for name in _GOOD_FIELDS:
        f = fmt.SEGMENT_SCHEMA.field(name)
        values = [r[name] for r in rows]
        if pa.types.is_timestamp(f.type):
            cols[name] = pa.array(values, pa.int64()).cast(f.type)
        else:
            cols[name] = pa.array(values, f.type)
    return build_segment_batch(cols, len(rows), store_host="h", now_ms=1_700_000_000_000)


def _refused(batch: pa.RecordBatch, r: int) -> bool:
    return limits.message_violation(SMALL, **limits._row_fields(batch, r),
                                    reserved_keys=limits.RESERVED_PROPERTY_KEYS) is not None


def _verdict(batch: pa.RecordBatch) -> str | None:
    try:
        limits.check_batch(batch, SMALL, limits.RESERVED_PROPERTY_KEYS)
    except MessageLimitError as e:
        return str(e)
    return None


def _c_screen(batch: pa.RecordBatch) -> list[int]:
    return limits._c_screen.screen(*batch.__arrow_c_array__(), (
        SMALL.max_message_size_bytes, SMALL.max_user_property_size_bytes,
        SMALL.user_property_max_num, SMALL.max_message_group_size_bytes,
        SMALL.max_message_id_size_bytes), limits._encoded(limits.RESERVED_PROPERTY_KEYS))


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(_ROW, min_size=1, max_size=4), before=st.lists(_ROW, max_size=2))
def test_the_c_screen_lists_every_row_the_rule_refuses(rows, before):
    """Rows ``before`` are sliced off, so every column (and the keys' and properties'
    children) is read at an offset; the same rows unsliced list the same."""
    whole = _segment_batch(before + rows)
    batch = whole.slice(len(before))
    listed = _c_screen(batch)
    assert listed == sorted(set(listed))
    assert {r for r in range(len(rows)) if _refused(batch, r)} <= set(listed)
    assert _c_screen(_segment_batch(rows)) == listed
    with_c = _verdict(batch)
    with pytest.MonkeyPatch.context() as mp:     # the numpy screen, or the rule alone
        mp.setattr(limits, "_c_screen", None)
        assert _verdict(batch) == with_c


# one fault per row, each rule of the screen (the rule's status)
_FAULTS = [
    ("tags", "a|b", "ILLEGAL_MESSAGE_TAG"), ("tags", "a\x7f", "ILLEGAL_MESSAGE_TAG"),
    ("tags", "\u3000", "ILLEGAL_MESSAGE_TAG"), ("tags", "\xa0", "ILLEGAL_MESSAGE_TAG"),
    ("keys", ["ok", "k\x00"], "ILLEGAL_MESSAGE_KEY"), ("keys", [" "], "ILLEGAL_MESSAGE_KEY"),
    ("keys", ["ok", None], "ILLEGAL_MESSAGE_KEY"),
    ("properties", [("k", "v\x85")], "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    ("properties", [("k\x9f", "v")], "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    ("properties", [("k", "\x1f")], "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    ("properties", [("UNIQ_KEY", "v")], "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    ("properties", [("a", "b"), ("k", None)], "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    ("properties", [(f"k{i}", "v") for i in range(4)], "MESSAGE_PROPERTIES_TOO_LARGE"),
    ("properties", [("k", "v" * 70)], "MESSAGE_PROPERTIES_TOO_LARGE"),
    ("keys", ["k" * 71], "MESSAGE_PROPERTIES_TOO_LARGE"),
    ("message_group", "ggggg", "ILLEGAL_MESSAGE_GROUP"),
    ("message_group", "群gg", "ILLEGAL_MESSAGE_GROUP"),
    ("message_group", "\u2028", "ILLEGAL_MESSAGE_GROUP"),
    ("unique_key", "iiiiii", "ILLEGAL_MESSAGE_ID"), ("unique_key", "i\n", "ILLEGAL_MESSAGE_ID"),
    ("body", b"x" * 200, "MESSAGE_BODY_TOO_LARGE"),
    ("born_host", "h" * 199, "MESSAGE_BODY_TOO_LARGE"),
    ("transaction_id", "t" * 199, "MESSAGE_BODY_TOO_LARGE"),
    ("born_timestamp", -1, "BAD_REQUEST"),
    ("born_timestamp", limits.MAX_TIMESTAMP_MS + 1, "BAD_REQUEST"),
    ("delivery_timestamp", -1, "ILLEGAL_DELIVERY_TIME"),
    ("message_type", 4, "BAD_REQUEST"), ("message_type", -1, "BAD_REQUEST"),
]
_PLAIN = dict(body=b"x", tags=None, keys=None, properties=None, message_group=None,
              unique_key=None, born_host=None, transaction_id=None,
              born_timestamp=1_700_000_000_000, delivery_timestamp=None, message_type=0)


@pytest.mark.parametrize("name, value, status", _FAULTS,
                         ids=[f"{f[0]}={f[1]!r}"[:40] for f in _FAULTS])
def test_each_fault_is_listed_and_refused_alone_and_among_good_rows(name, value, status):
    bad = dict(_PLAIN, **{name: value})
    for rows, r in (([bad], 0), ([_PLAIN] * 3 + [bad, _PLAIN], 2)):
        batch = _segment_batch(rows).slice(1) if len(rows) > 1 else _segment_batch(rows)
        assert _c_screen(batch) == [r]
        for c_screen in (limits._c_screen, None):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(limits, "_c_screen", c_screen)
                with pytest.raises(MessageLimitError, match=f"{status}: row {r}:"):
                    limits.check_batch(batch, SMALL, limits.RESERVED_PROPERTY_KEYS)


def test_a_plain_batch_lists_no_row():
    rows = [dict(body=b"x" * 10, tags="TagA", keys=["k1", "k2"], properties=[("a", "b")],
                 message_group=None, unique_key="id1", born_host="10.0.0.1",
                 transaction_id=None, born_timestamp=1_700_000_000_000,
                 delivery_timestamp=None, message_type=fmt.MESSAGE_TYPE_NORMAL)] * 50
    assert _c_screen(_segment_batch(rows)) == []


def test_a_batch_of_another_shape_is_declined():
    """(check_batch then screens with numpy: the hypothesis test above runs that path.)"""
    batch = _segment_batch([dict(body=b"x", tags="a|b", keys=None, properties=None,
                                 message_group=None, unique_key=None, born_host=None,
                                 transaction_id=None, born_timestamp=0,
                                 delivery_timestamp=None, message_type=0)] * 5)
    big = pa.RecordBatch.from_arrays(
        [c.cast(pa.large_string()) if c.type == pa.string() else c for c in batch.columns],
        names=batch.schema.names)
    assert limits._c_screen.screen(*big.__arrow_c_array__(), (1, 1, 1, 1, 1), ()) is None
    short = pa.RecordBatch.from_arrays(batch.columns[:-1], names=batch.schema.names[:-1])
    assert limits._c_screen.screen(*short.__arrow_c_array__(), (1, 1, 1, 1, 1), ()) is None
    assert limits._c_screen.screen(*batch.__arrow_c_array__(), (1, 1, 1, 1, 1), ()) == \
        list(range(5))
