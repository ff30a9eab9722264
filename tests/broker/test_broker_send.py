"""SendMessage's columnar path: every field of every kind of message (plain, tagged
with keys and properties, FIFO, delayed, transactional, refused) is stored as sent,
and the response has one entry per message with the right top status. The servicer
is called directly (no gRPC) on a real broker and store."""
from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from helpers.brokers import GrpcContext as Context
from helpers.net import free_port
from helpers.waiting import wait_until
from sparkmq.broker import Broker, BrokerConfig
from sparkmq.broker.longpoll import ArrivalNotifier
from sparkmq.broker.schedule import PROP_REAL_TOPIC, SCHEDULE_TOPIC
from sparkmq.broker.grpc_service import MessagingServicer
from sparkmq.broker.send import SendRows
from sparkmq.log.batch import list_column as _column
from sparkmq.broker.transaction import HALF_TOPIC
from sparkmq.log import format as fmt

Code = pb.Code


@pytest.fixture
def broker(tmp_path):
    b = Broker(BrokerConfig.from_properties({
        "brokerName": "send", "storePathRootDir": str(tmp_path / "store"),
        "listenPort": str(free_port()), "adminPort": str(free_port()),
        "flushDiskType": "ASYNC_FLUSH", "autoCreateTopicEnable": "false",
        "defaultTopicQueueNums": "2", "maxMessageSize": "1024"})).start()
    b.store.create_topic("T")
    yield b
    b.stop()


def message(body: bytes, *, mtype=pb.NORMAL, topic="T", **sys_props) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_type = mtype
    m.system_properties.born_timestamp.FromMilliseconds(1_700_000_000_123)
    for k, v in sys_props.items():
        setattr(m.system_properties, k, v)
    return m


def stored(b: Broker, topic: str) -> list:
    conf = b.store.topics()[topic]
    return [m for q in range(conf["writeQueueNums"]) for m in b.store.read(topic, q, 0, 100)]



@pytest.mark.integration
def test_every_kind_of_message_is_stored_with_all_its_fields(broker):
    plain = message(b"plain", message_id="ID-PLAIN", born_host="host-a")
    rich = message(b"rich", message_id="ID-RICH", tag="TagA")
    rich.system_properties.keys.extend(["k1", "k2"])
    rich.user_properties.update({"p": "1", "q": "2"})
    fifo = message(b"fifo", mtype=pb.FIFO, message_id="ID-FIFO", message_group="g1")
    due_ms = int(time.time() * 1000) + 3_600_000
    delayed = message(b"later", mtype=pb.DELAY, message_id="ID-DELAY")
    delayed.system_properties.delivery_timestamp.FromMilliseconds(due_ms)
    half = message(b"half", mtype=pb.TRANSACTION, message_id="ID-TX")
    resp = MessagingServicer(broker).send_message(spb.SendMessageRequest(
        messages=[plain, rich, fifo, delayed, half]), Context())

    assert resp.status.code == Code.OK
    assert [e.status.code for e in resp.entries] == [Code.OK] * 5
    assert [e.message_id for e in resp.entries[:5]] == ["ID-PLAIN", "ID-RICH", "ID-FIFO",
                                                        "ID-DELAY", "ID-TX"]
    txid = resp.entries[4].transaction_id
    assert txid and not any(e.transaction_id for e in resp.entries[:4])

    by_body = {m.body: m for m in stored(broker, "T")}
    assert sorted(by_body) == [b"fifo", b"plain", b"rich"]
    p, r, f = by_body[b"plain"], by_body[b"rich"], by_body[b"fifo"]
    assert (p.unique_key, p.born_host, p.born_timestamp, p.tags, p.keys, p.properties,
            p.message_group, p.message_type) == ("ID-PLAIN", "host-a", 1_700_000_000_123, None,
                                                 [], {}, None, fmt.MESSAGE_TYPE_NORMAL)
    assert (r.tags, r.keys, r.properties) == ("TagA", ["k1", "k2"], {"p": "1", "q": "2"})
    assert (f.message_group, f.message_type) == ("g1", fmt.MESSAGE_TYPE_FIFO)
    assert resp.entries[0].offset == p.queue_offset and resp.entries[2].offset == f.queue_offset

    (d,) = stored(broker, SCHEDULE_TOPIC)
    assert (d.body, d.unique_key, d.delivery_timestamp, d.message_type,
            d.properties[PROP_REAL_TOPIC]) == (b"later", "ID-DELAY", due_ms,
                                               fmt.MESSAGE_TYPE_DELAY, "T")
    (h,) = stored(broker, HALF_TOPIC)
    assert (h.body, h.transaction_id, h.message_type, h.properties[PROP_REAL_TOPIC]) == \
        (b"half", txid, fmt.MESSAGE_TYPE_TRANSACTION, "T")


@pytest.mark.integration
def test_a_batch_without_message_ids_gets_ids_from_the_store_and_goes_to_one_queue(broker):
    """As the Apache proxy's SendMessageQueueSelector: a request's messages go to ONE
    queue, and the next request to the next queue (round robin by request)."""
    def send(msgs):
        return MessagingServicer(broker).send_message(spb.SendMessageRequest(messages=msgs),
                                                      Context())
    msgs = [message(b"m%d" % i) for i in range(4)]       # no message_id, no born_timestamp
    for m in msgs:
        m.system_properties.ClearField("born_timestamp")
    before_ms = int(time.time() * 1000)
    resp = send(msgs)
    assert resp.status.code == Code.OK and len(resp.entries) == 4
    assert len({e.message_id for e in resp.entries}) == 4 and all(e.message_id for e in resp.entries)
    rows = stored(broker, "T")
    assert len({m.queue_id for m in rows}) == 1                      # one request, one queue
    assert {m.message_id for m in rows} == {e.message_id for e in resp.entries}
    assert all(m.born_timestamp >= before_ms for m in rows)          # stamped by the broker
    assert send([message(b"n%d" % i) for i in range(3)]).status.code == Code.OK
    later = {m.queue_id for m in stored(broker, "T") if m.body.startswith(b"n")}
    assert later == {1 - rows[0].queue_id}                           # the other of 2 queues


@pytest.mark.integration
def test_one_rule_places_a_requests_rows_on_both_paths(broker):
    """``SendService.request_queues``, the rule both wire paths place a request by: the
    free rows of one topic share ONE queue, a row that is not free keeps None (its own
    queue, its group's hash, or parked), and a topic with no free row takes no turn of
    the round robin."""
    for t in ("RA", "RB"):
        broker.store.create_topic(t, read_queue_nums=4, write_queue_nums=4)
    sender = broker.sender
    placed = sender.request_queues(["RA", "RB", "RA", "RB"], [True, False, True, False])
    assert placed[1] is None and placed[3] is None and placed[0] == placed[2] is not None
    assert sender.request_queue("RA") == (placed[0] + 1) % 4
    assert sender.request_queue("RB") == 0        # RB's first turn: not taken above


def test_merged_requests_keep_the_queue_each_was_given():
    a, b = SendRows(), SendRows()
    a.add(0, message(b"a"))
    b.add(0, message(b"b"))
    b.add(1, message(b"c"))
    a.placed, b.placed = {0: 1}, {0: 0, 1: 0}
    both = SendRows.concat([a, b])
    assert both.columns()["queue_id"] == [1, 0, 0]
    assert both.subset([2, 0]).columns()["queue_id"] == [0, 1]


@pytest.mark.integration
def test_a_request_with_a_refused_message_is_refused_whole_and_stores_nothing(broker):
    """As the proxy's SendMessageActivity: the first bad message's status, no entries;
    a delayed or transactional neighbour is not parked either."""
    due = message(b"due", mtype=pb.DELAY, message_id="ID-DUE")
    due.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000)
                                                            + 3_600_000)
    half = message(b"half-of-refused", mtype=pb.TRANSACTION)
    def counts():
        return {t: len(stored(broker, t)) if t in broker.store.topics() else 0
                for t in ("T", SCHEDULE_TOPIC, HALF_TOPIC)}
    before = counts()
    resp = MessagingServicer(broker).send_message(spb.SendMessageRequest(
        messages=[message(b"ok"), due, half, message(b""), message(b"")]), Context())
    assert resp.status.code == Code.MESSAGE_BODY_EMPTY and not resp.entries
    assert resp.status.message.startswith("message 3 of 5: ")
    assert "nothing of this request was stored" in resp.status.message
    assert counts() == before


def test_send_rows_subset_keeps_parked_rows_and_columns():
    rows = SendRows()
    rows.add(0, message(b"a", message_id="A"))
    rows.add(3, message(b"b", message_id="B"), ("PARKED", 1, 99, {"x": "y"}))
    assert rows.columns()["topic"] == ["T", "PARKED"]
    sub = rows.subset([1])
    assert sub.index == [3]
    c = sub.columns()
    assert (c["topic"], c["queue_id"], c["delivery_timestamp"], c["properties"],
            c["message_type"]) == (["PARKED"], [1], [99], [[("x", "y")]], [fmt.MESSAGE_TYPE_DELAY])


def test_all_null_columns_have_the_requested_type():
    assert _column([None, None], pa.map_(pa.string(), pa.string())).null_count == 2
    assert _column([None, "x"], pa.string()).to_pylist() == [None, "x"]
    assert _column([], pa.string()).type == pa.string()


def test_constant_columns_are_shared_and_list_values_are_repeated_not_cached():
    a, b = _column(["t"] * 3, pa.string()), _column(["t"] * 3, pa.string())
    assert a is b and a.to_pylist() == ["t"] * 3            # immutable: built once
    assert _column(["t"] * 2, pa.string()).to_pylist() == ["t"] * 2     # length is the key
    assert _column([7] * 2, pa.int8()).type == pa.int8()
    keys = pa.list_(pa.string())
    assert _column([["k"], ["k"]], keys).to_pylist() == [["k"], ["k"]]
    assert _column([["k"], ["j"]], keys).to_pylist() == [["k"], ["j"]]


@pytest.mark.integration
def test_a_plain_batch_keeps_each_born_time_keys_and_properties(broker):
    """The plain fast path converts a born time shared by the batch once; rows with
    their own born time, keys or properties keep theirs."""
    shared = [message(b"s%d" % i, message_id=f"ID-S{i}") for i in range(3)]
    resp = MessagingServicer(broker).send_message(spb.SendMessageRequest(messages=shared),
                                                 Context())
    assert resp.status.code == Code.OK
    own = [message(b"o%d" % i, message_id=f"ID-O{i}") for i in range(3)]
    own[1].system_properties.born_timestamp.FromMilliseconds(1_700_000_000_999)
    own[2].system_properties.keys.extend(["k1"])
    own[2].user_properties.update({"p": "1"})
    resp = MessagingServicer(broker).send_message(spb.SendMessageRequest(messages=own), Context())
    assert resp.status.code == Code.OK
    rows = {m.unique_key: m for m in stored(broker, "T")}
    assert [rows[f"ID-S{i}"].born_timestamp for i in range(3)] == [1_700_000_000_123] * 3
    assert [rows[f"ID-O{i}"].born_timestamp for i in range(3)] == [
        1_700_000_000_123, 1_700_000_000_999, 1_700_000_000_123]
    assert [(rows[f"ID-O{i}"].keys, rows[f"ID-O{i}"].properties) for i in range(3)] == [
        ([], {}), ([], {}), (["k1"], {"p": "1"})]


@pytest.mark.integration
def test_long_polls_are_woken_when_the_send_rpc_is_over(broker):
    ctx = Context()
    seen = broker.notifier.version("T")
    resp = MessagingServicer(broker).send_message(spb.SendMessageRequest(
        messages=[message(b"x")]), ctx)
    assert resp.status.code == Code.OK
    assert stored(broker, "T")[0].body == b"x"                  # readable at once
    assert broker.notifier.version("T") == seen                 # sleepers not woken yet
    assert len(ctx.callbacks) == 1
    ctx.callbacks[0]()                                          # gRPC: the RPC is over
    assert broker.notifier.version("T") != seen


def test_deferred_arrivals_wake_nobody_until_handed_to_wake():
    n = ArrivalNotifier()
    seen = n.version("T")
    with n.deferred() as held:
        n.on_arrival("T", 0, 1)
        n.on_arrival("U", 1, 5)
    assert held == {("T", 0), ("U", 1)}
    assert not n.wait("T", seen, 0)                             # nothing moved yet
    n.on_arrival("V", 0, 1)                                     # outside: at once
    assert n.version("V") != seen
    n.wake(held)
    assert n.wait("T", seen, 0)


@pytest.mark.integration
def test_requests_waiting_at_one_moment_are_appended_as_one_batch(broker):
    """The first request's append is held until three more requests queue behind it:
    they are then stored by ONE append, and each gets the results of its own rows."""
    broker.store.create_topic("R")
    broker.store.update_topic("R", perm=4)       # read only: the store refuses it
    appended: list[int] = []
    release = threading.Event()
    append_batch = broker.store.append_batch

    def held_append(table, **kw):
        appended.append(len(table))    # (BuiltRows, a batch or a table: its rows)
        if len(appended) == 1:
            release.wait(10)
        return append_batch(table, **kw)
    broker.store.append_batch = held_append
    servicer = MessagingServicer(broker)
    requests = {name: spb.SendMessageRequest(messages=[
        message(b"%s-%d" % (name.encode(), i), topic="R" if name == "bad" else "T",
                message_id=f"{name}-{i}") for i in range(2)])
        for name in ("first", "a", "b", "bad")}
    answers: dict[str, spb.SendMessageResponse] = {}

    def send(name):
        answers[name] = servicer.send_message(requests[name], Context())
    first = threading.Thread(target=send, args=("first",))
    first.start()
    wait_until(lambda: appended, "the first append")
    others = [threading.Thread(target=send, args=(n,)) for n in ("a", "b", "bad")]
    for t in others:
        t.start()
    wait_until(lambda: broker.sender.merger.pending == 3, "three queued requests")
    release.set()
    for t in [first, *others]:
        t.join(10)

    assert appended[:2] == [2, 6]                 # one alone, then three merged
    assert appended[2:] == [2, 2, 2, 1, 1]        # refused as a whole: request by request,
    #                                               the bad one row by row
    for name in ("first", "a", "b"):
        r = answers[name]
        assert r.status.code == Code.OK
        assert [e.message_id for e in r.entries] == [f"{name}-0", f"{name}-1"]
    assert answers["bad"].status.code == Code.FORBIDDEN
    rows = stored(broker, "T")
    assert sorted(m.body for m in rows) == sorted(
        b"%s-%d" % (n.encode(), i) for n in ("first", "a", "b") for i in range(2))
    offsets = {(m.queue_id, m.queue_offset) for m in rows}
    assert len(offsets) == 6
    got = {e.message_id: e.offset for n in ("first", "a", "b") for e in answers[n].entries}
    assert got == {m.unique_key: m.queue_offset for m in rows}
    assert broker.sender.merger.requests == 4


def test_an_unexpected_error_reaches_every_request_of_the_merged_batch():
    from sparkmq.broker.sendmerge import SendMerger

    def boom(rows):
        raise RuntimeError("disk on fire")
    def concat(parts):
        return [x for p in parts for x in p]
    merger = SendMerger(boom, boom, concat)
    with pytest.raises(RuntimeError, match="disk on fire"):
        merger.submit([1, 2])
    assert merger.pending == 0 and merger.batches == 1
    ok = SendMerger(lambda rows: [r * 10 for r in rows], boom, concat)
    assert ok.submit([1, 2]) == [10, 20] and ok.submit([3]) == [30]


def test_a_merge_stops_before_max_bytes_where_sizes_are_given():
    """Requests queued behind a running append are merged up to ``max_bytes`` of their
    ``nbytes``; the rest wait for the next round (the head is always taken)."""
    from sparkmq.broker.sendmerge import SendMerger
    gate, entered, appends = threading.Event(), threading.Event(), []

    def append(rows):
        if not entered.is_set():             # the first append waits for the others
            entered.set()
            gate.wait(30)
        appends.append(list(rows))
        return [r * 10 for r in rows]
    merger = SendMerger(append, append, lambda parts: [x for p in parts for x in p],
                        nbytes=sum, max_bytes=10)
    results = {}

    def submit(rows):
        results[rows[0]] = merger.submit(rows)
    first = threading.Thread(target=submit, args=([20],))
    first.start()
    assert entered.wait(30)
    others = []
    for rows in ([5], [4], [3]):           # queued in this order
        others.append(threading.Thread(target=submit, args=(rows,)))
        others[-1].start()
        wait_until(lambda n=len(others): merger.pending == n, "queued", timeout_s=30)
    gate.set()
    for t in [first, *others]:
        t.join(30)
    assert appends == [[20], [5, 4], [3]]
    assert results == {20: [200], 5: [50], 4: [40], 3: [30]}


@pytest.mark.parametrize("n", [1, 3, 1025])
def test_a_segment_batch_gets_the_same_defaults_short_or_long(n):
    """Batches of up to 1,024 rows take their default columns from one shared lookup,
    longer ones column by column: the defaults are the same, and a caller's column
    wins over its default."""
    from sparkmq.log.batch import build_segment_batch
    b = build_segment_batch({"topic": ["t"] * n, "body": [b"x"] * n,
                             "tags": pa.array(["TagA"] * n)}, n, store_host="h:1", now_ms=5)
    assert b.schema.equals(fmt.SEGMENT_SCHEMA) and b.num_rows == n
    row = b.slice(n - 1).to_pylist()[0]
    assert (row["store_host"], row["reconsume_times"], row["message_type"], row["tags"]) == \
        ("h:1", 0, fmt.MESSAGE_TYPE_NORMAL, "TagA")
    assert row["born_timestamp"].timestamp() == 0.005 and row["queue_id"] is None
    assert {row[c] for c in ("keys", "properties", "message_group", "unique_key",
                             "delivery_timestamp", "transaction_id", "born_host")} == {None}
    other = build_segment_batch({"topic": ["t"] * n, "body": [b"y"] * n}, n,
                                store_host="other:2", now_ms=5)
    assert other.column("store_host")[0].as_py() == "other:2"
