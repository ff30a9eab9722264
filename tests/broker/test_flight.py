"""The Arrow Flight service (issue 16 items 1-3, first part), driven with plain
``pyarrow.flight`` as a Java, Go or Rust Flight client would use it (docs/PROTOCOL.md):
record batches in, one ack per batch with queue ids, offsets and message ids; batches
out by (topic, queue, offset) with long polling; offsets committed; the RocketMQ path's
checks (credentials, ACLs, message types, limits) through the same code; what a Flight
producer sent, the official RocketMQ client consumes."""
from __future__ import annotations

import datetime as dt
import json
import threading
import zlib

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from rocketmq import FilterExpression, SimpleConsumer

from helpers.brokers import client_conf
from helpers.net import free_port
from helpers.storetools import offset_commits
from helpers.waiting import wait_until
from sparkmq.broker.authn import signature
from sparkmq.log.topics import message_type_attributes

pytestmark = pytest.mark.integration

SEND = fl.FlightDescriptor.for_path("send")


def _client(b, headers=()):
    c = fl.FlightClient(f"grpc+tcp://127.0.0.1:{b.flight_port}")
    return c, fl.FlightCallOptions(headers=list(headers), timeout=30)


def _send(client, opts, batch: pa.RecordBatch) -> pa.Table:
    writer, reader = client.do_put(SEND, batch.schema, options=opts)
    writer.write_batch(batch)
    ack = reader.read()
    writer.done_writing()
    writer.close()
    return pa.ipc.open_stream(ack).read_all()


def _get(client, opts, **ticket) -> pa.Table:
    return client.do_get(fl.Ticket(json.dumps(ticket).encode()), options=opts).read_all()


def _batch(topic: str, bodies: list[bytes], **cols) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"topic": [topic] * len(bodies), "body": bodies, **cols})


@pytest.fixture
def broker(make_broker):
    b = make_broker(flightEnable="true", flightPort=free_port(), autoCreateTopicEnable="false")
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    return b


def test_send_ack_get_commit_and_the_official_client_consumes_it(broker):
    client, opts = _client(broker)
    ack = _send(client, opts, _batch("T", [b"a", b"b", b"c"], keys=[["k1"], None, ["k3"]]))
    assert ack.column("queue_offset").to_pylist() == [0, 1, 2]
    assert ack.column("queue_id").to_pylist() == [0, 0, 0]
    ids = ack.column("message_id").to_pylist()
    got = _get(client, opts, topic="T", queue=0, offset=1, max=10)
    assert got.column("body").to_pylist() == [b"b", b"c"]
    assert got.column("message_id").to_pylist() == ids[1:]
    list(client.do_action(fl.Action("commitOffset", json.dumps(
        {"group": "G", "topic": "T", "queue": 0, "offset": 3}).encode()), options=opts))
    assert broker.store.consumer_offsets("G") == {("T", 0): 3}
    consumer = SimpleConsumer(client_conf(broker), "Official", {"T": FilterExpression()},
                              await_duration=2)
    consumer.startup()
    try:
        seen = []
        for _ in range(10):
            seen += consumer.receive(16, 30)
            if len(seen) >= 3:
                break
        assert sorted(m.body for m in seen) == [b"a", b"b", b"c"]
        assert {m.message_id for m in seen} == set(ids)
    finally:
        consumer.shutdown()


def test_a_batch_goes_to_one_queue_as_a_rocketmq_request_does(broker):
    """Rows without a queue id or message group: one queue per batch, the next batch
    the next queue (the RocketMQ path's rule, SendService.request_queue); an own
    queue id is kept and a message group hashed, as there."""
    broker.store.create_topic("Q", read_queue_nums=4, write_queue_nums=4)
    client, opts = _client(broker)
    firsts = []
    for _ in range(4):
        qids = _send(client, opts, _batch("Q", [b"x"] * 5)).column("queue_id").to_pylist()
        assert len(set(qids)) == 1
        firsts.append(qids[0])
    assert sorted(firsts) == [0, 1, 2, 3]
    mixed = _send(client, opts, _batch("Q", [b"a", b"b", b"c", b"d"],
                                       queue_id=pa.array([3, None, None, None], pa.int32()),
                                       message_group=[None, "g", None, None]))
    qids = mixed.column("queue_id").to_pylist()
    assert qids[0] == 3 and qids[1] == zlib.crc32(b"g") % 4 and qids[2] == qids[3]
    after = _send(client, opts, _batch("Q", [b"e"])).column("queue_id").to_pylist()
    assert after == [(qids[2] + 1) % 4]         # the mixed batch took one turn, as a request


def test_a_topic_without_a_free_row_takes_no_turn_of_its_round_robin(broker):
    """A batch of two topics: QA's rows all name their queue, QB's are free. QB's rows
    share one queue; QA's round robin is left as it was (``request_queues``, the rule
    the RocketMQ path places by), so QA's next plain batch goes to its first queue."""
    for t in ("QA", "QB"):
        broker.store.create_topic(t, read_queue_nums=4, write_queue_nums=4)
    client, opts = _client(broker)
    two = pa.RecordBatch.from_pydict({
        "topic": ["QA", "QB", "QA", "QB"], "body": [b"a", b"b", b"c", b"d"],
        "queue_id": pa.array([2, None, 3, None], pa.int32())})
    qids = _send(client, opts, two).column("queue_id").to_pylist()
    assert qids[0] == 2 and qids[2] == 3 and qids[1] == qids[3]
    assert _send(client, opts, _batch("QA", [b"e"])).column("queue_id").to_pylist() == [0]


def test_a_producers_own_message_id_wins_where_a_row_has_one(broker):
    client, opts = _client(broker)
    own = ["K1", "K2"]
    ack = _send(client, opts, _batch("T", [b"a", b"b"], unique_key=own))
    assert ack.column("message_id").to_pylist() == own
    mixed = _send(client, opts, _batch("T", [b"c", b"d", b"e"], unique_key=["K3", None, ""]))
    ids = mixed.column("message_id").to_pylist()
    assert ids[0] == "K3" and all(len(i) == 32 for i in ids[1:]) and ids[1] != ids[2]
    got = _get(client, opts, topic="T", queue=0, offset=0, max=10, view="consumer")
    assert got.column("message_id").to_pylist() == own + ids
    # no null, one empty id: that row is the broker's
    ids = _send(client, opts, _batch("T", [b"f", b"g"], unique_key=["K4", ""])) \
        .column("message_id").to_pylist()
    assert ids[0] == "K4" and len(ids[1]) == 32


def _hold_first_append(b, monkeypatch):
    """Hold the store's first append until ``gate`` is set (``entered`` once it waits);
    (the real append_batch, gate, entered)."""
    real, gate, entered = b.store.append_batch, threading.Event(), threading.Event()

    def held(batch, **kw):
        if not entered.is_set():
            entered.set()
            gate.wait(30)
        return real(batch, **kw)
    monkeypatch.setattr(b.store, "append_batch", held)
    return real, gate, entered


def _queued_behind_one_append(b, monkeypatch, lead: list[bytes], *others):
    """Send ``lead`` and, while its append is held, each of ``others`` (bodies, or a
    whole batch) on a DoPut of its own; release once all are queued (SendMerger). Each
    one's ack, or its error."""
    real, gate, entered = _hold_first_append(b, monkeypatch)
    out: list = [None] * (1 + len(others))

    def send(i, bodies):
        try:
            out[i] = _send(*_client(b), bodies if isinstance(bodies, pa.RecordBatch)
                           else _batch("T", bodies))
        except pa.ArrowException as e:        # the store's refusal: INVALID_ARGUMENT
            out[i] = e
    threads = [threading.Thread(target=send, args=(0, lead))]
    threads[0].start()
    assert entered.wait(30)
    try:
        for i, bodies in enumerate(others, 1):     # queued in this order
            threads.append(threading.Thread(target=send, args=(i, bodies)))
            threads[-1].start()
            wait_until(lambda i=i: b.batch_sender.merger.pending == i, "the batches queued",
                       timeout_s=30)
    finally:
        gate.set()
        for t in threads:
            t.join(30)
    monkeypatch.setattr(b.store, "append_batch", real)
    return out


class _CountingLock:
    """A lock that counts the threads waiting for it."""

    def __init__(self):
        self._lock, self.waiting = threading.Lock(), 0

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            self.waiting += 1
            self._lock.acquire()
            self.waiting -= 1
        return self

    def __exit__(self, *exc):
        self._lock.release()


def test_puts_that_never_wait_run_one_at_a_time_and_waiting_ones_together(
        make_broker, monkeypatch):
    """ASYNC_FLUSH (no fsync or replica to wait for): a second stream's put waits for the
    first put to end before it starts (the Flight put lock), so it is its own append, not
    merged; SYNC_FLUSH: it queues in the merger (test below). Both acks name their rows."""
    b = make_broker(flightEnable="true", flightPort=free_port(), autoCreateTopicEnable="false",
                    flushDiskType="ASYNC_FLUSH")
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    assert b.sender.never_waits()
    lock = b.flight._alone = _CountingLock()
    _, gate, entered = _hold_first_append(b, monkeypatch)
    out: list = [None, None]

    def send(i, bodies):
        out[i] = _send(*_client(b), _batch("T", bodies))
    threads = [threading.Thread(target=send, args=(0, [b"L0", b"L1"]))]
    threads[0].start()
    try:
        assert entered.wait(30)
        threads.append(threading.Thread(target=send, args=(1, [b"a0"])))
        threads[1].start()
        wait_until(lambda: lock.waiting == 1, "the second put waiting for the first",
                   timeout_s=30)
        assert b.batch_sender.merger.pending == 0     # not queued behind the append
    finally:
        gate.set()
        for t in threads:
            t.join(30)
    assert b.batch_sender.merger.batches == 2 and b.batch_sender.merger.requests == 2
    assert [r.as_py() for r in out[0].column("queue_offset")] == [0, 1]
    assert [r.as_py() for r in out[1].column("queue_offset")] == [2]
    monkeypatch.setattr(type(b.sender), "role", property(lambda self: "SYNC_MASTER"))
    assert not b.sender.never_waits()                  # a replica to wait for


def test_batches_waiting_together_are_one_append_and_a_refused_one_fails_alone(
        make_broker, monkeypatch):
    """DoPut batches that queue behind a running append are stored as ONE append (the
    gRPC path's SendMerger: group commit), and each ack gives its own rows' offsets and
    ids; a batch the store refuses (a queue the topic does not have) fails alone."""
    b = make_broker(flightEnable="true", flightPort=free_port(), autoCreateTopicEnable="false",
                    maxMessageSize=100)
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    sends = [[b"L0", b"L1"], [b"a0", b"a1", b"a2"], [b"c0"]]
    acks = _queued_behind_one_append(b, monkeypatch, *sends)
    assert b.batch_sender.merger.batches == 2            # the leader's, then a and c together
    stored = _get(*_client(b), topic="T", queue=0, offset=0, max=100)
    by_offset = dict(zip(stored.column("queue_offset").to_pylist(),
                         zip(stored.column("body").to_pylist(),
                             stored.column("message_id").to_pylist())))
    for bodies, ack in zip(sends, acks):
        got = [by_offset[o] for o in ack.column("queue_offset").to_pylist()]
        assert [body for body, _ in got] == bodies
        assert [mid for _, mid in got] == ack.column("message_id").to_pylist()
    a_ids, c_ids = (ack.column("message_id").to_pylist() for ack in acks[1:])
    # one stored batch: the same physical offset (digits 9-24), rows 0-2 then 3
    lead_batch = acks[0].column("message_id")[0].as_py()[:24]
    assert {i[:24] for i in a_ids + c_ids} == {a_ids[0][:24]} != {lead_batch}
    assert [int(i[24:], 16) for i in a_ids + c_ids] == [0, 1, 2, 3]

    no_queue = _batch("T", [b"x"], queue_id=pa.array([5], pa.int32()))
    lead, good, bad = _queued_behind_one_append(b, monkeypatch, [b"M0"], [b"g0"], no_queue)
    assert isinstance(bad, pa.ArrowInvalid) and "queue_id out of range" in str(bad)
    assert [r.as_py() for r in good.column("queue_offset")] == [7]
    assert _get(*_client(b), topic="T", queue=0, offset=7, max=10).column(
        "body").to_pylist() == [b"g0"]


def test_sends_are_counted_per_topic_in_messages_and_body_bytes(broker):
    """The metrics the gRPC path keeps (sparkmq_messages_sent_total, _bytes_sent_total),
    per topic of a batch that holds two."""
    broker.store.create_topic("U", read_queue_nums=1, write_queue_nums=1)
    client, opts = _client(broker)
    _send(client, opts, _batch("T", [b"abc", b"de"]))
    _send(client, opts, pa.RecordBatch.from_pydict(
        {"topic": ["T", "U", "T", "U"], "body": [b"1", b"2222", b"33", b"4"]}))
    m = broker.metrics
    assert m.get("sparkmq_messages_sent_total", topic="T") == 4
    assert m.get("sparkmq_bytes_sent_total", topic="T") == 8
    assert m.get("sparkmq_messages_sent_total", topic="U") == 2
    assert m.get("sparkmq_bytes_sent_total", topic="U") == 5


def test_a_get_long_polls_until_a_send_arrives(broker):
    client, opts = _client(broker)
    out = {}

    def poll():
        out["t"] = _get(client, opts, topic="T", queue=0, offset=0, max=5, pollMs=20_000)
    t = threading.Thread(target=poll)
    t.start()
    from helpers.waiting import wait_until
    wait_until(lambda: broker.notifier.waiting == 1, "the poll to wait")
    _send(client, opts, _batch("T", [b"late"]))
    t.join(30)
    assert out["t"].column("body").to_pylist() == [b"late"]


def test_a_followed_get_streams_each_queues_arrivals_until_cancelled(broker):
    """One DoGet follows two queues: what is there first, then each arrival as its own
    batch (one queue per batch, in offset order), until the client cancels; a bad
    queue is the call's error; a stopping broker ends the stream."""
    broker.store.create_topic("F", read_queue_nums=2, write_queue_nums=2)
    client, opts = _client(broker)

    def send(q, bodies):
        return _send(client, opts, _batch("F", bodies, queue_id=pa.array([q] * len(bodies),
                                                                          pa.int32())))
    send(0, [b"a0", b"a1"])
    reader = client.do_get(fl.Ticket(json.dumps(
        {"topic": "F", "follow": [[0, 1], [1, 0]], "view": "consumer"}).encode()), options=opts)

    def batch():
        t = reader.read_chunk().data
        return t.column("queue_id").to_pylist(), t.column("body").to_pylist()
    assert batch() == ([0], [b"a1"])                      # from offset 1 of queue 0
    threading.Timer(0.2, send, (1, [b"b0", b"b1"])).start()
    assert batch() == ([1, 1], [b"b0", b"b1"])            # an arrival, while following
    send(0, [b"a2"])
    assert batch() == ([0], [b"a2"])
    reader.cancel()
    with pytest.raises(pa.ArrowInvalid, match="QUEUE_NOT_FOUND"):
        _get(client, opts, topic="F", follow=[[0, 0], [7, 0]])
    with pytest.raises(pa.ArrowInvalid, match="names no queue"):
        _get(client, opts, topic="F", follow=[])
    held = client.do_get(fl.Ticket(json.dumps({"topic": "F", "follow": [[0, 3]]}).encode()),
                         options=opts)
    stopper = threading.Thread(target=broker.stop)
    stopper.start()
    with pytest.raises(StopIteration):                    # ended by the stop, cleanly
        held.read_chunk()
    stopper.join(10)
    assert not stopper.is_alive()


def test_a_followed_get_filters_by_tag_on_the_broker_and_names_each_batch_s_next_offset(broker):
    """``"tags"`` cuts a followed read's rows on the broker; every batch's app_metadata
    says its queue and the offset after it, so a batch whose rows were all filtered out
    still moves the reader on; a malformed expression is the call's error."""
    broker.store.create_topic("G", read_queue_nums=1, write_queue_nums=1)
    client, opts = _client(broker)

    def send(bodies, tags):
        _send(client, opts, pa.RecordBatch.from_pydict(
            {"topic": ["G"] * len(bodies), "body": bodies, "tags": tags}))
    send([b"a", b"b", b"c"], ["A", "B", None])
    reader = client.do_get(fl.Ticket(json.dumps(
        {"topic": "G", "follow": [[0, 0]], "tags": "A || C", "view": "consumer"}).encode()),
        options=opts)

    def chunk():
        c = reader.read_chunk()
        return c.data.column("body").to_pylist(), json.loads(c.app_metadata.to_pybytes())
    assert chunk() == ([b"a"], {"queue": 0, "next": 3})
    send([b"d"], ["B"])                                   # nothing for this reader
    assert chunk() == ([], {"queue": 0, "next": 4})
    send([b"e", b"f"], ["C", "A"])
    assert chunk() == ([b"e", b"f"], {"queue": 0, "next": 6})
    reader.cancel()
    with pytest.raises(pa.ArrowInvalid, match="empty tag"):
        _get(client, opts, topic="G", follow=[[0, 0]], tags="A || ")
    with pytest.raises(pa.ArrowInvalid, match="tag expression string"):
        _get(client, opts, topic="G", follow=[[0, 0]], tags=["A"])


def test_followed_reads_count_against_the_long_poll_capacity(make_broker):
    """A followed read holds a server thread for its whole life, busy or waiting: it
    is a long poll for maxLongPollingRequests, so one more is refused past it
    (TOO_MANY_REQUESTS), and its slot is freed when it ends."""
    b = make_broker(flightEnable="true", flightPort=free_port(), maxLongPollingRequests="1")
    b.store.create_topic("F", read_queue_nums=1, write_queue_nums=1)
    client, opts = _client(b)
    _send(client, opts, _batch("F", [b"x" * 1024] * 2000))

    def follow(offset, limit):
        return client.do_get(fl.Ticket(json.dumps(
            {"topic": "F", "follow": [[0, offset]], "max": limit}).encode()), options=opts)
    busy = follow(0, 1)            # 2,000 one-message batches nobody reads: never waiting
    busy.schema
    wait_until(lambda: b.notifier.waiting == 1, what="the busy follow to be counted")
    with pytest.raises(fl.FlightUnavailableError, match="TOO_MANY_REQUESTS"):
        follow(2000, 10).read_chunk()
    busy.cancel()
    wait_until(lambda: b.notifier.waiting == 0, what="the cancelled follow to end")
    second = follow(2000, 10)
    _send(client, opts, _batch("F", [b"y"]))
    assert second.read_chunk().data.column("body").to_pylist() == [b"y"]
    second.cancel()                # a follow waiting for arrivals: ended within its wait
    wait_until(lambda: b.notifier.waiting == 0, what="the cancelled idle follow to end")


def _strings(values: list[bytes]) -> pa.Array:
    """A string array of exactly these bytes (made from buffers: nothing checks them)."""
    offsets = [0]
    for v in values:
        offsets.append(offsets[-1] + len(v))
    return pa.Array.from_buffers(pa.string(), len(values), [
        None, pa.array(offsets, pa.int32()).buffers()[1], pa.py_buffer(b"".join(values))])


def test_offsets_past_their_buffer_are_refused_and_the_service_goes_on(broker):
    client, opts = _client(broker)
    before = broker.store.commitlog.written_offset
    # the last offset is in bounds (all Arrow's readers check), the middle one is not: value
    # 0 spans bytes 0..1000 of a 2-byte buffer, value 1 runs backwards
    tags = pa.Array.from_buffers(pa.string(), 2, [
        None, pa.array([0, 1000, 2], pa.int32()).buffers()[1], pa.py_buffer(b"ab")])
    with pytest.raises(pa.ArrowInvalid, match="not valid Arrow data: column 'tags'.*out of bounds"):
        _send(client, opts, _batch("T", [b"x", b"y"], tags=tags))
    assert broker.store.commitlog.written_offset == before
    assert _send(client, opts, _batch("T", [b"fine"])).num_rows == 1


@pytest.mark.parametrize("batch, words", [
    (pa.RecordBatch.from_pydict({"body": [b"x"]}), "topic, body"),
    (pa.RecordBatch.from_pydict({"topic": ["T"], "body": [b"x"], "colour": ["red"]}),
     "a Flight send batch has columns"),
    (pa.RecordBatch.from_pydict({"topic": ["T"], "body": [b"x"],
                                 "delivery_timestamp": [1]}), "RocketMQ gRPC path"),
    (_batch("Nope", [b"x"]), "does not exist"),
    (_batch("T", [b"x"], properties=pa.array([[("k\n", "v")]],
                                              pa.map_(pa.string(), pa.string()))),
     "control character"),
    (_batch("T", [b"x"], tags=pa.array([["a"]])), "column 'tags' is list.*does not cast"),
    (pa.RecordBatch.from_arrays([pa.array(["T"]), pa.array([b"x"]), pa.array(["U"])],
                                names=["topic", "body", "topic"]), r"\['topic'\] come more"),
    # strings that are not UTF-8 (Arrow's IPC reader does not look): one row, and four rows
    # (which the limit screen lets through unread), in a column no other check reads
    (_batch("T", [b"x"], tags=_strings([b"\xff"])), "column 'tags'.*UTF8"),
    (_batch("T", [b"x"] * 4, born_host=_strings([b"h", b"h", b"h\xc0\xaf", b"h"])),
     "column 'born_host'.*UTF8"),
    (_batch("T", [b"x"] * 4, unique_key=_strings([b"\xed\xa0\x80"] * 4)),
     "column 'unique_key'.*UTF8"),
    # a null key or property value (one row: the row's rule; four: the screen flags it)
    (_batch("T", [b"x"], keys=pa.array([["k", None]])), "ILLEGAL_MESSAGE_KEY.*key 1 is null"),
    (_batch("T", [b"x"] * 4, properties=pa.array(
        [None, None, [("k", None)], None], pa.map_(pa.string(), pa.string()))),
     "ILLEGAL_MESSAGE_PROPERTY_KEY: row 2: property 'k' has no value"),
])
def test_bad_batches_get_a_clear_error_and_store_nothing(broker, batch, words):
    client, opts = _client(broker)
    before = broker.store.commitlog.written_offset
    with pytest.raises(Exception, match=words):
        _send(client, opts, batch)
    assert broker.store.commitlog.written_offset == before
    _send(client, opts, _batch("T", [b"fine"]))     # the service goes on


@pytest.mark.parametrize("ticket, words", [
    ({"topic": "T", "queue": 0.5, "offset": 0}, "'queue' is a whole number, got 0.5"),
    ({"topic": "T", "queue": 0, "offset": "1"}, "'offset' is a whole number, got '1'"),
    ({"topic": "T", "queue": True, "offset": 0}, "'queue' is a whole number, got True"),
    ({"topic": "T", "queue": 0, "offset": 0, "max": 2.5}, "'max' is a whole number"),
    ({"topic": "T", "follow": [[0, 1.5]]}, "'follow' is a whole number, got 1.5"),
])
def test_a_ticket_s_numbers_are_whole_or_refused(broker, ticket, words):
    """(``int()`` read 0.5 as queue 0 and "1" as offset 1.)"""
    client, opts = _client(broker)
    _send(client, opts, _batch("T", [b"a", b"b"]))
    with pytest.raises(pa.ArrowInvalid, match=words):
        _get(client, opts, **ticket)
    assert _get(client, opts, topic="T", queue=0, offset=1).num_rows == 1   # it goes on


@pytest.mark.parametrize("queue, offset", [(0.9, 1), (0, 1.5), (0, "1"), (False, 1)])
def test_a_commit_s_numbers_are_whole_or_refused(broker, queue, offset):
    client, opts = _client(broker)
    with pytest.raises(pa.ArrowInvalid, match="is a whole number"):
        list(client.do_action(fl.Action("commitOffset", json.dumps(
            {"group": "G", "topic": "T", "queue": queue, "offset": offset}).encode()),
            options=opts))
    assert broker.store.consumer_offsets("G") == {}


def test_the_topics_message_type_is_checked(broker):
    broker.store.create_topic("F", read_queue_nums=1, write_queue_nums=1,
                              attributes=message_type_attributes("FIFO"))
    client, opts = _client(broker)
    with pytest.raises(Exception, match="expected type is FIFO"):
        _send(client, opts, _batch("F", [b"x"]))
    ack = _send(client, opts, _batch("F", [b"x"], message_group=["g"]))
    assert ack.num_rows == 1
    with pytest.raises(Exception, match="expected type is FIFO"):   # one row without a group
        _send(client, opts, _batch("F", [b"x", b"y"], message_group=["g", None]))
    with pytest.raises(Exception, match="expected type is FIFO"):   # an empty group is none
        _send(client, opts, _batch("F", [b"x"], message_group=[""]))
    broker.store.create_topic("N", read_queue_nums=1, write_queue_nums=1,
                              attributes=message_type_attributes("NORMAL"))
    _send(client, opts, _batch("N", [b"y"], message_group=[""], tags=[""]))
    with pytest.raises(Exception, match="expected type is NORMAL"):  # one row with a group
        _send(client, opts, _batch("N", [b"x", b"y"], message_group=[None, "g"]))
    row = _get(client, opts, topic="N", queue=0, offset=0, max=10).to_pylist()[0]
    assert (row["message_group"], row["tags"], row["message_type"]) == (None, None, 0)
    # one batch of both topics: each topic's rows are held to its own type
    two = pa.RecordBatch.from_pydict({"topic": ["F", "N", "F"], "body": [b"1", b"2", b"3"],
                                      "message_group": ["g", None, "h"]})
    assert _send(client, opts, two).num_rows == 3
    with pytest.raises(Exception, match="expected type is NORMAL"):
        _send(client, opts, pa.RecordBatch.from_pydict({
            "topic": ["F", "N"], "body": [b"1", b"2"], "message_group": ["g", "g"]}))


def test_a_topic_changed_or_deleted_after_a_send_is_checked_again(broker):
    # the send keeps what it found of a topic (writable, its message type) while the
    # store's state is the same: a change of either is seen at the next batch
    client, opts = _client(broker)
    assert _send(client, opts, _batch("T", [b"a"])).num_rows == 1
    broker.store.update_topic("T", attributes=message_type_attributes("FIFO"))
    with pytest.raises(Exception, match="expected type is FIFO"):
        _send(client, opts, _batch("T", [b"b"]))
    assert _send(client, opts, _batch("T", [b"c"], message_group=["g"])).num_rows == 1
    broker.store.delete_topic("T")
    with pytest.raises(Exception, match="does not exist"):
        _send(client, opts, _batch("T", [b"d"], message_group=["g"]))
    broker.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    assert _send(client, opts, _batch("T", [b"e"])).column("queue_offset").to_pylist() == [0]


def test_credentials_and_acls_as_on_the_rocketmq_path(make_broker):
    from sparkmq.auth import meta
    b = make_broker(flightEnable="true", flightPort=free_port(), authenticationEnabled="true",
                    authorizationEnabled="true",
                    initAuthenticationUser='{"username": "root", "password": "root-secret"}')
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    meta.create_user(b.store, "reader", "reader-secret")
    meta.set_acl(b.store, "reader", [{"entries": [{"resource": "Topic:T",
                                                    "actions": ["Sub"]}]}], create=True)

    def signed(user, secret):
        when = dt.datetime.now().strftime("%Y%m%dT%H%M%SZ")
        return [(b"x-mq-date-time", when.encode()),
                (b"authorization", (f"MQv2-HMAC-SHA1 Credential={user}, SignedHeaders="
                                    f"x-mq-date-time, Signature={signature(secret, when)}")
                 .encode())]
    anonymous, a_opts = _client(b)
    with pytest.raises(fl.FlightUnauthenticatedError):
        _send(anonymous, a_opts, _batch("T", [b"x"]))
    reader, r_opts = _client(b, signed("reader", "reader-secret"))
    with pytest.raises(fl.FlightUnauthorizedError, match="may not Pub"):
        _send(reader, r_opts, _batch("T", [b"x"]))
    root, root_opts = _client(b, signed("root", "root-secret"))
    _send(root, root_opts, _batch("T", [b"ok"]))
    assert _get(reader, r_opts, topic="T", queue=0, offset=0).column("body").to_pylist() == \
        [b"ok"]
    with pytest.raises(fl.FlightUnauthorizedError, match="Group:G"):   # as PullMessage
        _get(reader, r_opts, topic="T", queue=0, offset=0, group="G")
    with pytest.raises(fl.FlightUnauthenticatedError):                # a followed read too
        _get(anonymous, a_opts, topic="T", follow=[[0, 0]])
    followed = reader.do_get(fl.Ticket(json.dumps({"topic": "T", "follow": [[0, 0]]}).encode()),
                             options=r_opts)
    assert followed.read_chunk().data.column("body").to_pylist() == [b"ok"]
    meta.delete_acl(b.store, "reader", "Topic:T")
    with pytest.raises(fl.FlightUnauthorizedError, match="Topic:T"):  # revoked: the open
        followed.read_chunk()                                         # stream ends too
    with pytest.raises(pa.ArrowInvalid, match="SPARKMQ_INVALID_NAME: group name"):
        _get(reader, r_opts, topic="T", queue=0, offset=0, group="bad group!")

    def commit(client, opts, group):
        list(client.do_action(fl.Action("commitOffset", json.dumps(
            {"group": group, "topic": "T", "queue": 0, "offset": 1}).encode()), options=opts))
    with pytest.raises(fl.FlightUnauthorizedError, match="Group:G"):
        commit(reader, r_opts, "G")                 # no right on the group
    # UpdateOffset's rule: Update (without Sub) on the group and topic moves an offset
    meta.create_user(b.store, "mover", "mover-secret")
    meta.set_acl(b.store, "mover", [{"entries": [
        {"resource": "Topic:T", "actions": ["Update"]},
        {"resource": "Group:G", "actions": ["Update"]}]}], create=True)
    mover, m_opts = _client(b, signed("mover", "mover-secret"))
    commit(mover, m_opts, "G")
    assert b.store.consumer_offsets("G") == {("T", 0): 1}


ROOT = '{"username": "root", "password": "root-secret"}'


def _signed(user, secret):
    when = dt.datetime.now().strftime("%Y%m%dT%H%M%SZ")
    return [(b"x-mq-date-time", when.encode()),
            (b"authorization", (f"MQv2-HMAC-SHA1 Credential={user}, SignedHeaders="
                                f"x-mq-date-time, Signature={signature(secret, when)}").encode())]


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory, tls_pair):
    """tlsServerMode=enforcing (gRPC and Flight) with credentials required."""
    from helpers.brokers import broker_config, tls_props
    from sparkmq.broker import Broker
    b = Broker(broker_config(tmp_path_factory.mktemp("tlsflight"), flightEnable="true",
                             flightPort=free_port(), **tls_props(tls_pair),
                             authenticationEnabled="true", initAuthenticationUser=ROOT,
                             autoCreateTopicEnable="false")).start()
    b.store.create_topic("T", read_queue_nums=1, write_queue_nums=1)
    yield b
    b.stop()


def _tls_client(b, tls_pair, headers=()):
    c = fl.FlightClient(f"grpc+tls://127.0.0.1:{b.flight_port}",
                        tls_root_certs=open(tls_pair[0], "rb").read())
    return c, fl.FlightCallOptions(headers=list(headers), timeout=30)


def test_a_plain_flight_client_puts_and_gets_over_tls(tls_broker, tls_pair):
    client, opts = _tls_client(tls_broker, tls_pair, _signed("root", "root-secret"))
    first = tls_broker.store.max_offset("T", 0)
    ack = _send(client, opts, _batch("T", [b"over", b"tls"]))
    assert ack.column("queue_offset").to_pylist() == [first, first + 1]
    got = _get(client, opts, topic="T", queue=0, offset=first, max=10)
    assert got.column("body").to_pylist() == [b"over", b"tls"]
    list(client.do_action(fl.Action("commitOffset", json.dumps(
        {"group": "GT", "topic": "T", "queue": 0, "offset": first + 2}).encode()), options=opts))
    assert tls_broker.store.consumer_offsets("GT") == {("T", 0): first + 2}


def test_a_plaintext_flight_client_is_refused_by_an_enforcing_broker(tls_broker):
    before = tls_broker.store.commitlog.written_offset
    plain = fl.FlightClient(f"grpc+tcp://127.0.0.1:{tls_broker.flight_port}")
    opts = fl.FlightCallOptions(headers=_signed("root", "root-secret"), timeout=10)
    with pytest.raises(fl.FlightUnavailableError):
        _send(plain, opts, _batch("T", [b"in the clear"]))
    with pytest.raises(fl.FlightUnavailableError):
        _get(plain, opts, topic="T", queue=0, offset=0)
    assert tls_broker.store.commitlog.written_offset == before


def test_query_route_names_the_tls_scheme(tls_broker, tls_pair):
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
    roots = open(tls_pair[0], "rb").read()
    with grpc.secure_channel(tls_broker.endpoint, grpc.ssl_channel_credentials(roots)) as ch:
        _, call = MessagingServiceStub(ch).QueryRoute.with_call(
            spb.QueryRouteRequest(topic=pb.Resource(name="T")), timeout=10,
            metadata=[("x-mq-client-id", "t"),
                      *((k.decode(), v.decode()) for k, v in _signed("root", "root-secret"))])
    assert dict(call.initial_metadata())["x-sparkmq-flight-endpoint"] == \
        f"grpc+tls://127.0.0.1:{tls_broker.flight_port}"


def _grpc_status(b, roots, method, request, headers):
    """The status code of a RocketMQ RPC at ``b`` over TLS (unary, or the first
    response of a streaming one)."""
    import grpc
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
    md = [("x-mq-client-id", "t"), *((k.decode(), v.decode()) for k, v in headers)]
    with grpc.secure_channel(b.endpoint, grpc.ssl_channel_credentials(roots)) as ch:
        r = getattr(MessagingServiceStub(ch), method)(request, timeout=10, metadata=md)
        if not hasattr(r, "status"):
            r = next(iter(r))
        return r.status.code


@pytest.mark.parametrize("who", ["anonymous", "wrong secret"])
def test_an_unauthenticated_flight_call_is_refused_where_grpc_refuses_it(tls_broker, tls_pair,
                                                                          who):
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    headers = [] if who == "anonymous" else _signed("root", "a-guess-123")
    roots = open(tls_pair[0], "rb").read()
    mq = pb.MessageQueue(topic=pb.Resource(name="T"), id=0)
    grpc_calls = {  # what the same caller gets on the RocketMQ path, per Flight call
        "send": ("SendMessage", spb.SendMessageRequest(messages=[pb.Message(
            topic=pb.Resource(name="T"), body=b"x", system_properties=pb.SystemProperties(
                message_id="01", body_encoding=pb.IDENTITY, message_type=pb.NORMAL))])),
        "get": ("PullMessage", spb.PullMessageRequest(
            group=pb.Resource(name="G"), message_queue=mq, offset=0, batch_size=1,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))),
        "commit": ("UpdateOffset", spb.UpdateOffsetRequest(
            group=pb.Resource(name="G"), message_queue=mq, offset=1)),
    }
    for method, request in grpc_calls.values():
        assert _grpc_status(tls_broker, roots, method, request, headers) == \
            pb.Code.UNAUTHORIZED, method
    client, opts = _tls_client(tls_broker, tls_pair, headers)
    before = tls_broker.store.commitlog.written_offset
    with pytest.raises(fl.FlightUnauthenticatedError):
        _send(client, opts, _batch("T", [b"x"]))
    with pytest.raises(fl.FlightUnauthenticatedError):
        _get(client, opts, topic="T", queue=0, offset=0)
    with pytest.raises(fl.FlightUnauthenticatedError):
        list(client.do_action(fl.Action("commitOffset", json.dumps(
            {"group": "G", "topic": "T", "queue": 0, "offset": 1}).encode()), options=opts))
    assert tls_broker.store.commitlog.written_offset == before
    assert tls_broker.store.consumer_offsets("G") == {}


def test_the_brokers_own_topics_are_not_read_over_flight(broker):
    client, opts = _client(broker)
    for topic in ("RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX"):
        with pytest.raises(pa.ArrowInvalid, match="reserved for the broker"):
            _get(client, opts, topic=topic, queue=0, offset=0)
    with pytest.raises(pa.ArrowInvalid, match="reserved for the broker"):
        list(client.do_action(fl.Action("commitOffset", json.dumps(
            {"group": "G", "topic": "RMQ_SYS_TRANS_HALF_TOPIC", "queue": 0,
             "offset": 1}).encode()), options=opts))


def test_query_route_advertises_the_flight_endpoint_only_when_flight_is_on(broker,
                                                                          make_broker):
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

    def advertised(b):
        with grpc.insecure_channel(b.endpoint) as ch:
            _, call = MessagingServiceStub(ch).QueryRoute.with_call(
                spb.QueryRouteRequest(topic=pb.Resource(name="T")), timeout=10,
                metadata=[("x-mq-client-id", "t")])
            return dict(call.initial_metadata()).get("x-sparkmq-flight-endpoint")
    assert advertised(broker) == f"grpc+tcp://127.0.0.1:{broker.flight_port}"
    assert advertised(make_broker("plain", flightEnable="false")) is None


def test_flight_is_on_by_default_beside_grpc_on_the_same_address(tmp_path, make_broker):
    from sparkmq.broker import BrokerConfig
    conf = BrokerConfig()
    assert conf.flight_enable and conf.flight_ports() == [8083, 0]   # listenPort 8081 + 2
    assert BrokerConfig(listen_port=0).flight_ports() == [0]
    assert BrokerConfig(flight_port=9000).flight_ports() == [9000]
    # the broker's own admin or HA port is never the derived one (Flight binds first)
    assert BrokerConfig(listen_port=9000, admin_port=9002).flight_ports() == [0]
    assert BrokerConfig(listen_port=9000, ha_listen_port=9002,
                        ha_secret="s" * 32).flight_ports() == [0]
    b = make_broker("default")                     # no Flight setting at all
    assert b.flight is not None and b.flight.endpoint.startswith("grpc+tcp://127.0.0.1:")
    client, opts = _client(b)
    b.store.create_topic("D", read_queue_nums=1, write_queue_nums=1)
    assert _send(client, opts, _batch("D", [b"x"])).num_rows == 1


def test_a_taken_derived_port_falls_back_and_a_taken_explicit_one_fails(make_broker):
    import socket
    from sparkmq.errors import BindError
    listen = free_port()
    with socket.socket() as holder:     # something else holds listenPort + 2
        try:
            holder.bind(("127.0.0.1", listen + 2))
            holder.listen()
        except OSError:
            pass                        # already held by another process: the same case
        b = make_broker("derived", listenPort=listen)
        assert b.flight is not None and b.flight_port != listen + 2
        with pytest.raises(BindError, match="flightPort"):
            make_broker("explicit", flightPort=listen + 2)


def test_a_broker_daemon_serving_flight_stops_on_sigterm(tmp_path, procs):
    # pyarrow's serve() would take SIGTERM for the Flight server alone (flight.py, start)
    from helpers.daemons import spawn, stop_process
    admin = free_port()
    conf = tmp_path / "broker.properties"
    conf.write_text(f"flightEnable=true\nflightPort={free_port()}\n")
    p = spawn(["sparkmq.broker", "-c", str(conf), "-p", str(free_port()), "--admin-port",
               str(admin), "--store", str(tmp_path / "store")],
              f"http://127.0.0.1:{admin}/health", procs)
    assert stop_process(p) == 0


def _read_view(unique_keys: list, properties: list, chunks: int = 1) -> pa.Table:
    """A read's table as ``consumer_view_of`` takes it (its three columns), the rows
    split into ``chunks`` chunks, as a read of several stored batches gives them."""
    n = len(unique_keys)
    cols = {"message_id": pa.array([f"B{i:031d}" for i in range(n)], pa.string()),
            "unique_key": pa.array(unique_keys, pa.string()),
            "properties": pa.array(properties, pa.map_(pa.string(), pa.string()))}
    cut = [0, *[n * (k + 1) // chunks for k in range(chunks)]]
    return pa.Table.from_batches(
        [pa.record_batch([c.slice(a, b - a) for c in cols.values()], names=list(cols))
         for a, b in zip(cut, cut[1:])])


@pytest.mark.parametrize("chunks", [1, 2])
def test_the_consumer_view_takes_the_producers_ids_and_drops_the_brokers_keys(chunks):
    """What a Flight consumer gets (``view=consumer``): the producer's id where a row has
    one, else the broker's; the properties without the broker's own keys, the user's
    kept. Each case a read meets: no producer id at all, every row with one (in one
    chunk and across chunks), some; a message or two with keys, and a batch with more
    keys than ``_FEW_KEYS`` whose internal key is in its last row."""
    from sparkmq.broker.flight import _FEW_KEYS, consumer_view_of
    from sparkmq.broker.pop import ORIGIN_TOPIC
    view = consumer_view_of(_read_view([None, None], [None, None], chunks))
    assert view.column("message_id").to_pylist() == [f"B{i:031d}" for i in range(2)]
    view = consumer_view_of(_read_view(["K1", "K2"], [None, [("a", "1")]], chunks))
    assert view.column("message_id").to_pylist() == ["K1", "K2"]
    assert view.column("properties").to_pylist() == [None, [("a", "1")]]
    view = consumer_view_of(_read_view(["K1", None, ""], [None] * 3, 1))
    assert view.column("message_id").to_pylist() == ["K1", f"B{1:031d}", f"B{2:031d}"]
    view = consumer_view_of(_read_view(["K1", ""], [None] * 2, chunks))   # no null
    assert view.column("message_id").to_pylist() == ["K1", f"B{1:031d}"]
    view = consumer_view_of(_read_view(
        ["K1", "K2"], [[("a", "1"), (ORIGIN_TOPIC, "T")], [("b", "2")]], chunks))
    assert view.column("properties").to_pylist() == [[("a", "1")], [("b", "2")]]
    rows = _FEW_KEYS + 1
    props = [[("u", str(i))] for i in range(rows - 1)] + [[("u", "z"), (ORIGIN_TOPIC, "T")]]
    view = consumer_view_of(_read_view([f"K{i}" for i in range(rows)], props, chunks))
    assert view.column("properties").to_pylist()[-1] == [("u", "z")]
    assert view.column("properties").to_pylist()[:-1] == props[:-1]


def _commit(client, opts, **body):
    return list(client.do_action(fl.Action("commitOffset", json.dumps(body).encode()),
                                 options=opts))


def test_one_commit_records_several_queues_offsets_in_one_store_commit(broker):
    """``offsets``: several queues of a topic in one commitOffset, one version of the
    store's log; a group's offset then reads back per queue, in memory (GetOffset's)
    and stored."""
    broker.store.create_topic("M", read_queue_nums=3, write_queue_nums=3)
    client, opts = _client(broker)
    for q in range(3):
        _send(client, opts, _batch("M", [b"a", b"b"], queue_id=pa.array([q] * 2, pa.int32())))
    version = broker.store.state.version
    _commit(client, opts, group="G", topic="M", offsets=[[0, 2], [2, 1]])
    assert broker.store.consumer_offsets("G") == {("M", 0): 2, ("M", 2): 1}
    assert offset_commits(broker.store, "G", version) == [{0: 2, 2: 1}]
    assert [broker.receiver.committed_offset("G", "M", q) for q in (0, 2)] == [2, 1]
    broker.persist_offsets()       # the offset pass: nothing of these to commit again
    assert offset_commits(broker.store, "G", version) == [{0: 2, 2: 1}]


@pytest.mark.parametrize("body, words", [
    ({"offsets": []}, "non-empty list"),
    ({"offsets": [[0, 1], [0, 2]]}, "queue 0 is in 'offsets' twice"),
    ({"offsets": [[0, 1, 2]]}, r"each of 'offsets' is \[queue, offset\]"),
    ({"offsets": [[0, 1.5]]}, "is a whole number"),
    ({"offsets": [[0, 1]], "queue": 0}, "not both"),
    ({"offsets": {"0": 1}}, "non-empty list"),
])
def test_a_commit_of_several_queues_that_is_malformed_moves_none(broker, body, words):
    client, opts = _client(broker)
    _send(client, opts, _batch("T", [b"a", b"b"]))
    with pytest.raises(pa.ArrowInvalid, match=words):
        _commit(client, opts, group="G", topic="T", **body)
    assert broker.store.consumer_offsets("G") == {}


def test_a_commit_with_one_offset_out_of_range_moves_no_queue(broker):
    """All or none: the queue in range is not moved either, in memory or stored."""
    broker.store.create_topic("M", read_queue_nums=2, write_queue_nums=2)
    client, opts = _client(broker)
    for q in range(2):
        _send(client, opts, _batch("M", [b"a"], queue_id=pa.array([q], pa.int32())))
    _commit(client, opts, group="G", topic="M", offsets=[[0, 1], [1, 0]])
    with pytest.raises(pa.ArrowInvalid, match="ILLEGAL_OFFSET: offset 9 is outside 0..1"):
        _commit(client, opts, group="G", topic="M", offsets=[[0, 0], [1, 9]])
    assert broker.store.consumer_offsets("G") == {("M", 0): 1, ("M", 1): 0}
    assert [broker.receiver.committed_offset("G", "M", q) for q in (0, 1)] == [1, 0]
