"""Column helpers every writer of a producer's rows shares: the distinct topics of a batch
(a buffer test for one topic, else pyarrow's kernel), an empty tag or message group read
as none, and a group's message type."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparkmq.log import dispatch
from sparkmq.log import format as fmt
from sparkmq.log.batch import group_message_types, none_if_empty
from sparkmq.log.dispatch import distinct_strings

_VALUES = st.lists(st.none() | st.sampled_from(["", "a", "ab", "abab", "lat", "é"]),
                   min_size=1, max_size=12)


@settings(deadline=None)
@given(values=_VALUES, start=st.integers(0, 3), same=st.booleans(),
       typ=st.sampled_from([pa.string(), pa.binary(), pa.large_string()]))
@example(values=["ab", "", "abab"], start=0, same=False, typ=pa.string())  # even total
@example(values=["", ""], start=0, same=False, typ=pa.string())            # width 0
def test_distinct_strings_are_pc_unique(values, start, same, typ):
    if same:
        values = [values[0]] * len(values)
    if typ == pa.binary():
        values = [None if v is None else v.encode() for v in values]
    arr = pa.array(values, typ)
    for a in (arr, arr.slice(min(start, len(arr) - 1))):
        assert distinct_strings(a) == pc.unique(a).to_pylist()


def test_one_topic_is_found_without_the_kernel(monkeypatch):
    def refused(arr):
        raise AssertionError("pc.unique called")
    monkeypatch.setattr(dispatch.pc, "unique", refused)
    assert distinct_strings(pa.array(["lat"] * 100)) == ["lat"]
    assert distinct_strings(pa.array(["T"])) == ["T"]


def test_an_empty_tag_or_group_is_none_and_a_group_makes_a_row_fifo():
    groups = none_if_empty(pa.array(["", "g", None, "", "h"]))
    assert groups.to_pylist() == [None, "g", None, None, "h"]
    assert group_message_types(groups).to_pylist() == [
        fmt.MESSAGE_TYPE_NORMAL, fmt.MESSAGE_TYPE_FIFO, fmt.MESSAGE_TYPE_NORMAL,
        fmt.MESSAGE_TYPE_NORMAL, fmt.MESSAGE_TYPE_FIFO]
    kept = pa.array(["a", None])
    assert none_if_empty(kept) is kept                     # nothing empty: no new array
    ints = pa.array([0, 1])
    assert none_if_empty(ints) is ints                     # not text: its writer says so
