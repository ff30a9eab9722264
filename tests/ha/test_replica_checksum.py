"""The replica checks each received batch's checksum before it acks it: a copy damaged on
the way (or by the master's disk) is refused, never acked, never dispatched."""
from __future__ import annotations

import pytest

from sparkmq import Message, Store
from sparkmq.errors import HAProtocolError
from sparkmq.log import segment as seg

from helpers.storetools import inline_replica_log


def test_a_damaged_batch_is_not_acked(tmp_path):
    master = Store.open(str(tmp_path / "m"), start_services=False)
    master.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    for i in range(3):
        master.append([Message("T", b"m%d-%d" % (i, j) * 10, queue_id=0) for j in range(5)])
    master.flush()
    ref = master.commitlog.segments()[0]
    data = bytearray(master.sfs.read_range(ref.path, 0, ref.size))
    res = seg.scan(master.sfs.read_buffer(ref.path))
    second, third = res.positions[1], res.positions[2]
    data[second + res.lengths[1] - 20] ^= 0x01           # a body byte of the second batch
    replica = Store.open(str(tmp_path / "r"), replica=True)
    try:
        rlog = inline_replica_log(replica, master, ref)
        acks: list[int] = []
        rlog.write(ref.path, 0, bytes(data[:second + 30]), acks.append)   # cut inside it
        assert acks[-1] == ref.base_offset + second
        with pytest.raises(HAProtocolError, match=rf"checksum.*byte {second}"):
            rlog.write(ref.path, second + 30, bytes(data[second + 30:third]), acks.append)
        assert acks[-1] == ref.base_offset + second      # the damaged batch was never acked
        assert rlog.whole_offset == ref.base_offset + second
        assert replica.max_offset("T", 0) == 5
    finally:
        replica.close()
        master.close()
