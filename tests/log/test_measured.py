"""A send's bodies measured from their offsets (dispatch.measured_offsets, what the plain
RocketMQ send and a binary array's measure call): each value's bytes as the offsets'
differences say, and their least, greatest and sum where the C module measured them, with
and without that module; and the plain send's columns carry both. Fast tier: no servers."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkmq.log import dispatch


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=30), st.data())
def test_measured_offsets_are_each_values_bytes_from_any_first_value(values, data):
    first = data.draw(st.integers(0, len(values) - 1))
    n = data.draw(st.integers(1, len(values) - first))
    arr = pa.array(values, pa.binary())
    offsets = arr.buffers()[1]
    want = [len(v) for v in values[first:first + n]]
    for c_screen in (dispatch._c_screen, None):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(dispatch, "_c_screen", c_screen)
            sizes, extent = dispatch.measured_offsets(offsets, first, n)
            assert sizes.dtype == np.int32 and sizes.tolist() == want
            if c_screen is None:
                assert extent is None
            else:
                assert extent == (min(want), max(want), sum(want))
            # a sliced array reads from its own offset, as the offsets say
            got, _ = dispatch.measured_bodies(arr.slice(first, n))
            assert got.tolist() == want


def test_a_plain_sends_columns_carry_their_bodies_sizes_and_bounds():
    from rocketmq.grpc_protocol import definition_pb2 as pb, service_pb2 as spb

    from sparkmq.broker import plainsend
    if plainsend._wire is None or dispatch._c_screen is None:
        pytest.skip("sparkmq._wire or sparkmq._screen not built")
    bodies = [b"a" * 7, b"b" * 300, b"c"]
    msgs = []
    for i, body in enumerate(bodies):
        m = pb.Message(topic=pb.Resource(name="t"), body=body)
        m.system_properties.message_id = "01" + "%030d" % i
        m.system_properties.born_host = "10.0.0.1"
        m.system_properties.born_timestamp.FromMilliseconds(1_700_000_000_000)
        m.system_properties.message_type = pb.NORMAL
        msgs.append(m)
    plain = plainsend.plain_columns(spb.SendMessageRequest(messages=msgs))
    assert plain is not None
    assert plain.body_sizes.tolist() == [7, 300, 1]
    assert plain.body_extent == (1, 300, 308)
    assert plain.get("tags") is None and plain.get("tags", 5) == 5
    assert plain.get("body").to_pylist() == bodies
