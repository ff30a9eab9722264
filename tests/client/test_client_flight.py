"""sparkmq's Producer and PullConsumer over Arrow Flight (issue 16 item 3): found through
the broker's QueryRoute answers, the same messages once stored (the official RocketMQ
client consumes what they sent over Flight, they read what it sent), gRPC when the
broker offers no Flight, when its Flight does not connect, for what Flight refuses (a
delayed message) and on request; credentials over Flight as over gRPC."""
from __future__ import annotations

import threading
import time

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression
from rocketmq import Producer as OfficialProducer
from rocketmq import SimpleConsumer as OfficialConsumer

from helpers.brokers import client_conf
from helpers.storetools import HeldSyncOS, offset_commits
from helpers.net import free_port
from helpers.waiting import wait_until
from sparkmq.broker.protocol import Code
from sparkmq.client import ClientError, Message, Producer, PullConsumer

pytestmark = pytest.mark.integration

ROOT = ("root", "root-secret")


def flight_broker(make_broker, **props):
    return make_broker(**{"flightEnable": "true", "flightPort": free_port(),
                          "defaultTopicQueueNums": 2, **props})


def rich(topic: str, i: int, group: str | None = None) -> Message:
    return Message(topic, f"m{i}".encode(), tag="TagA" if i % 2 else "TagB",
                   keys=[f"k{i}", "shared"], properties={"i": str(i), "lang": "py"},
                   message_group=group)


def official_receive(b, topic: str, n: int, conf=None) -> list:
    consumer = OfficialConsumer(conf or client_conf(b), "Official", {topic: FilterExpression()},
                                await_duration=2)
    consumer.startup()
    try:
        got, deadline = [], time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            for m in consumer.receive(16, 30):
                got.append(m)
                consumer.ack(m)
        return got
    finally:
        consumer.shutdown()


def pull_all(pc: PullConsumer, topic: str, tags: str = "*") -> list:
    out = []
    for q in pc.queues(topic):
        off = 0
        while True:
            msgs, nxt = pc.pull(q, off, max_messages=7, tag_expression=tags)
            out += msgs
            if nxt == off:
                break
            off = nxt
    return out


def test_a_flight_producer_is_consumed_by_the_official_client_with_every_field(
        make_broker, closing):
    b = flight_broker(make_broker)
    p = closing(Producer(b.endpoint))
    receipts = [p.send(rich("T", i)) for i in range(4)]
    receipts += p.send_batch([rich("T", i, group="g1") for i in range(4, 10)])
    receipts.append(p.send_async(rich("T", 10)).result(10))
    assert {r.transport for r in receipts} == {"flight"}
    assert p.sent_over == {"flight": 11, "grpc": 0}
    assert all(r.queue_id in (0, 1) and r.queue_offset >= 0 and r.broker_name == "broker-a"
               and r.endpoint == b.endpoint for r in receipts)
    got = {m.body: m for m in official_receive(b, "T", 11)}
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(11))
    for i, r in enumerate(receipts):
        m, want = got[f"m{i}".encode()], rich("T", i, "g1" if 4 <= i < 10 else None)
        assert m.message_id == r.message_id
        assert (m.tag, set(m.keys), m.properties, m.message_group) == \
            (want.tag, set(want.keys), want.properties, want.message_group)


def test_the_stored_rows_of_both_transports_are_the_same(make_broker, closing):
    b = flight_broker(make_broker, defaultTopicQueueNums=1)
    over = {t: closing(Producer(b.endpoint, transport=t)) for t in ("flight", "grpc")}
    for t, p in over.items():
        r = p.send(Message("S", t.encode(), tag="A", keys=["k"], properties={"p": "1"},
                           message_group="g"))
        assert r.transport == t
    rows = b.store.read_table("S", 0, 0, 2).to_pylist()
    varying = {"body", "queue_offset", "physical_offset", "message_id", "unique_key",
               "born_timestamp", "store_timestamp"}
    flight, grpc = ({k: v for k, v in row.items() if k not in varying} for row in rows)
    assert flight == grpc and flight["message_type"] == 1 and flight["born_host"]


def test_plain_and_rich_batches_alternate_on_one_producer_and_store_as_over_grpc(
        make_broker, closing):
    """A batch of plain messages goes in the narrower PLAIN_SEND_SCHEMA, a batch with a
    tag, keys or properties in SEND_SCHEMA: one producer alternating them (a DoPut stream
    per schema) stores each row as the gRPC path stores the same message."""
    b = flight_broker(make_broker, defaultTopicQueueNums=1)
    over = {t: closing(Producer(b.endpoint, transport=t)) for t in ("flight", "grpc")}
    for t, p in over.items():
        p.send(Message("P", b"plain-" + t.encode()))
        p.send(Message("P", b"rich-" + t.encode(), tag="A", keys=["k"], properties={"p": "1"}))
        p.send_batch([Message("P", b"batch-" + t.encode()) for _ in range(3)])
        p.send(Message("P", b"group-" + t.encode(), message_group="g"))
        p.send(Message("P", b"tagged-" + t.encode(), tag="B"))
    assert over["flight"].sent_over == {"flight": 7, "grpc": 0}
    rows = b.store.read_table("P", 0, 0, 100).to_pylist()
    assert len(rows) == 14
    varying = {"body", "queue_offset", "physical_offset", "message_id", "unique_key",
               "born_timestamp", "store_timestamp"}
    by = {}
    for row in rows:
        kind, _, t = row["body"].decode().rpartition("-")
        by.setdefault(kind, {}).setdefault(t, []).append(
            {k: v for k, v in row.items() if k not in varying})
    assert set(by) == {"plain", "rich", "batch", "group", "tagged"}
    for kind, sent in by.items():
        assert sent["flight"] == sent["grpc"], kind
    assert by["rich"]["flight"][0]["tags"] == "A" and by["plain"]["flight"][0]["tags"] is None
    assert by["group"]["flight"][0]["message_group"] == "g"
    assert by["tagged"]["flight"][0]["tags"] == "B"


def test_the_pull_consumer_reads_an_official_producers_messages_alike_over_both(
        make_broker, closing):
    b = flight_broker(make_broker)
    producer = OfficialProducer(client_conf(b), ("P",))
    producer.startup()
    try:
        from helpers.brokers import msg
        sent = []
        for i in range(9):
            m = msg("P", f"o{i}".encode(), tag="TagA" if i % 3 else "TagB", keys=f"k{i}")
            m.add_property("i", str(i))
            sent.append(producer.send(m))
    finally:
        producer.shutdown()
    flight = closing(PullConsumer(b.endpoint, "GP"))
    grpc = closing(PullConsumer(b.endpoint, "GP", transport="grpc"))
    over_flight, over_grpc = pull_all(flight, "P"), pull_all(grpc, "P")
    assert flight.pulled_over == {"flight": 9, "grpc": 0}
    assert grpc.pulled_over == {"flight": 0, "grpc": 9}
    assert over_flight == over_grpc                   # every field of every message
    assert {m.message_id for m in over_flight} == {s.message_id for s in sent}
    m = next(x for x in over_flight if x.body == b"o4")
    assert (m.tag, m.keys, m.properties) == ("TagA", ("k4",), {"i": "4"})
    assert pull_all(flight, "P", "TagB") == pull_all(grpc, "P", "TagB")
    assert len(pull_all(flight, "P", "TagB")) == 3


def test_a_pull_past_the_end_is_moved_back_to_the_end_over_both_transports(make_broker,
                                                                             closing):
    """On the master, a pull at an offset past a queue's end answers no messages at once,
    a long poll asked or not, and the end as the next offset (as a RocketMQ pull consumer
    corrects an OFFSET_ILLEGAL pull): the message appended next is read from there, not
    skipped. Alike over Flight (DoGet) and gRPC (PullMessage)."""
    b = flight_broker(make_broker, defaultTopicQueueNums=1)
    with Producer(b.endpoint) as p:
        for i in range(3):
            p.send(Message("PE", f"m{i}".encode()))
        for n, transport in enumerate(("flight", "grpc")):
            pc = closing(PullConsumer(b.endpoint, "GE", transport=transport))
            q = pc.queues("PE")[0]
            end = 3 + n
            assert pc.pull(q, end + 7, wait_s=5) == ([], end), transport
            p.send(Message("PE", f"next-{transport}".encode()))
            msgs, nxt = pc.pull(q, end, wait_s=5)
            assert [m.body for m in msgs] == [f"next-{transport}".encode()] and nxt == end + 1
            assert pc.pulled_over[transport] == 1
    pc = closing(PullConsumer(b.endpoint, "GE"))          # a followed read, past the end too
    follow, got = pc.follow({pc.queues("PE")[0]: 50}), []
    reader = threading.Thread(target=lambda: got.extend(
        ([m.body for m in msgs], nxt) for _q, msgs, nxt in follow))
    reader.start()
    closing(Producer(b.endpoint)).send(Message("PE", b"followed"))
    wait_until(lambda: len(got) >= 2, what="the followed message")
    assert got[:2] == [([], 5), ([b"followed"], 6)]
    follow.close()
    reader.join(10)


def test_offsets_committed_over_flight_are_what_getoffset_answers(make_broker, closing):
    b = flight_broker(make_broker, defaultTopicQueueNums=1)
    closing(Producer(b.endpoint)).send_batch([Message("O", b"x")] * 5)
    pc = closing(PullConsumer(b.endpoint, "GO"))
    (q,) = pc.queues("O")
    msgs, nxt = pc.pull(q, 0, max_messages=3)
    assert [m.queue_offset for m in msgs] == [0, 1, 2] and nxt == 3
    pc.commit_offset(q, nxt)
    assert pc.committed_offset(q) == 3                  # GetOffset, over gRPC
    assert b.store.consumer_offsets("GO") == {("O", 0): 3}


@pytest.mark.parametrize("transport", ["flight", "grpc"])
def test_commit_offsets_records_every_queue_given(make_broker, closing, transport):
    """Several queues at once: over Flight one commitOffset (one store commit, at once),
    over gRPC an UpdateOffset a queue (stored by the broker's offset pass, as RocketMQ's
    are); each reads back as GetOffset answers it."""
    b = flight_broker(make_broker, defaultTopicQueueNums=3)
    p = closing(Producer(b.endpoint))
    for _ in range(6):
        p.send(Message("OS", b"x"))
    pc = closing(PullConsumer(b.endpoint, "GS", transport=transport))
    queues = pc.queues("OS")
    assert len(queues) == 3
    ends = {q: pc.query_offset(q, "END") for q in queues}
    assert sum(ends.values()) == 6
    version = b.store.state.version
    sent, action = [], pc.flight.action       # (the bodies, passed on to the broker)
    pc.flight.action = lambda fep, name, body, what: (sent.append(body),
                                                      action(fep, name, body, what))
    pc.commit_offsets(ends)
    assert {q: pc.committed_offset(q) for q in queues} == ends
    pc.commit_offset(queues[0], ends[queues[0]])
    if transport == "flight":
        # one queue: the one-queue form, which any broker serving Flight takes
        assert [sorted(body) for body in sent] == [
            ["group", "offsets", "topic"], ["group", "offset", "queue", "topic"]]
        # the first version that records them holds all three
        assert offset_commits(b.store, "GS", version)[0] == {
            q.queue_id: o for q, o in ends.items()}
    else:
        assert sent == []
        b.persist_offsets()
    assert b.store.consumer_offsets("GS") == {("OS", q.queue_id): o for q, o in ends.items()}


@pytest.mark.parametrize("bad, code", [
    (dict(tag=" "), "ILLEGAL_MESSAGE_TAG"),
    (dict(properties={"UNIQ_KEY": "mine"}), "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    (dict(body=b""), "MESSAGE_BODY_EMPTY"),
])
def test_a_refused_message_gets_the_same_code_over_both_transports(make_broker, closing,
                                                                   bad, code):
    b = flight_broker(make_broker)
    over = {t: closing(Producer(b.endpoint, transport=t)) for t in ("flight", "grpc")}
    fields = {"body": b"x", **bad}
    body = fields.pop("body")
    for t, p in over.items():
        with pytest.raises(ClientError) as info:
            p.send(Message("T", body, **fields))
        assert Code.Name(info.value.status_code) == code, (t, info.value)
    assert b.store.max_offset("T", 0) == b.store.max_offset("T", 1) == 0


def test_auto_uses_grpc_where_the_broker_serves_no_flight(make_broker, closing):
    b = make_broker(flightEnable="false")
    p = closing(Producer(b.endpoint))
    assert p.send(Message("N", b"x")).transport == "grpc"
    assert p.sent_over == {"flight": 0, "grpc": 1}
    pc = closing(PullConsumer(b.endpoint, "GN"))
    assert len(pull_all(pc, "N")) == 1 and pc.pulled_over == {"flight": 0, "grpc": 1}
    strict = closing(Producer(b.endpoint, transport="flight"))
    with pytest.raises(ClientError, match="serves no Arrow Flight"):
        strict.send(Message("N", b"y"))


def test_auto_falls_back_to_grpc_when_flight_does_not_connect(make_broker, closing):
    b = flight_broker(make_broker)
    p = closing(Producer(b.endpoint, isolation_s=60))
    assert p.send(Message("D", b"before")).transport == "flight"
    b.flight.stop()                                     # gRPC goes on serving
    after = p.send(Message("D", b"after"))
    assert after.transport == "grpc" and p.sent_over == {"flight": 1, "grpc": 1}
    assert p.isolated_endpoints() == []                 # the broker itself is fine
    assert p.send(Message("D", b"again")).transport == "grpc"   # Flight marked down
    pc = closing(PullConsumer(b.endpoint, "GD"))
    got = {m.body: m.message_id for m in pull_all(pc, "D")}
    assert sorted(got) == [b"after", b"again", b"before"]
    assert pc.pulled_over["grpc"] == 3
    # one id a message, the same whichever transport carried it (the Flight attempt's
    # ids went over gRPC): the producer's counter moved by one a send
    assert after.message_id == got[b"after"]
    assert all(i.startswith(p._ids.prefix) for i in got.values())
    counters = [int(got[body][-12:], 16) for body in (b"before", b"after", b"again")]
    assert counters == [counters[0], counters[0] + 1, counters[0] + 2]


def test_a_delayed_message_goes_over_grpc_by_itself(make_broker, closing):
    b = flight_broker(make_broker)
    p = closing(Producer(b.endpoint, transport="flight"))
    r = p.send(Message("L", b"later", delivery_timestamp_ms=int(time.time() * 1000) + 60_000))
    assert r.transport == "grpc" and r.recall_handle
    assert p.send(Message("L", b"now")).transport == "flight"
    assert p.sent_over == {"flight": 1, "grpc": 1}


def test_credentials_are_required_and_carried_over_flight(make_broker, closing):
    b = flight_broker(make_broker, authenticationEnabled="true",
                      initAuthenticationUser='{"username": "root", "password": "root-secret"}')
    b.store.create_topic("A", read_queue_nums=1, write_queue_nums=1)
    p = closing(Producer(b.endpoint, credentials=ROOT, transport="flight"))
    assert p.send(Message("A", b"signed")).transport == "flight"
    pc = closing(PullConsumer(b.endpoint, "GA", credentials=ROOT, transport="flight"))
    assert [m.body for m in pull_all(pc, "A")] == [b"signed"]
    conf = ClientConfiguration(b.endpoint, Credentials(*ROOT), request_timeout=5)
    assert [m.body for m in official_receive(b, "A", 1, conf)] == [b"signed"]
    # the route is asked with good credentials, the Flight call made with wrong ones
    forged = closing(Producer(b.endpoint, credentials=ROOT, transport="flight"))
    forged.flight.headers = Producer(b.endpoint, credentials=("root", "guess-123"),
                                     transport="grpc").conns.signed_headers
    with pytest.raises(ClientError, match="UNAUTHORIZED.*wrong access key"):
        forged.send(Message("A", b"forged"))
    assert b.store.max_offset("A", 0) == 1


def test_a_broker_stops_promptly_with_a_flight_producer_connected(make_broker, closing):
    b = flight_broker(make_broker)
    p = closing(Producer(b.endpoint, flight_idle_s=0.5))
    assert p.send(Message("Q", b"x")).transport == "flight"   # its stream stays open
    t0 = time.monotonic()
    b.stop()
    assert time.monotonic() - t0 < 5


def test_the_pull_consumer_follows_queues_on_one_stream(make_broker, closing):
    """``follow``: every queue's messages from its offset as they arrive (tag filter
    applied by the broker, next offsets given past filtered messages too), one stream;
    ``close`` from another thread ends it; gRPC has no such call."""
    b = flight_broker(make_broker)
    p = closing(Producer(b.endpoint))
    pc = closing(PullConsumer(b.endpoint, "GF"))
    queues = pc.queues("F")
    assert len(queues) == 2
    p.send_batch([rich("F", i) for i in range(4)])       # one request: one queue
    follow = pc.follow({q: 0 for q in queues}, tag_expression="TagA")
    got, nexts = [], {}

    def read():
        for q, msgs, nxt in follow:
            got.extend((q.queue_id, m.body) for m in msgs)
            nexts[q.queue_id] = nxt
    reader = threading.Thread(target=read)
    reader.start()
    for i in range(4, 8):                                 # arrivals while following
        p.send(rich("F", i))
    wait_until(lambda: sum(nexts.values()) == 8, what="next offsets past all 8 messages")
    assert sorted(body for _, body in got) == [b"m1", b"m3", b"m5", b"m7"]
    assert pc.pulled_over["flight"] == 4                  # the broker filtered: 4 travelled
    follow.close()
    reader.join(10)
    assert not reader.is_alive()
    grpc_only = closing(PullConsumer(b.endpoint, "GF", transport="grpc"))
    with pytest.raises(ClientError, match="follow needs Arrow Flight"):
        grpc_only.follow({queues[0]: 0})


def test_a_late_fsync_is_the_same_status_over_flight_and_grpc_and_is_stored_once(
        make_broker, closing, monkeypatch):
    from sparkmq.client.core import Code
    from sparkmq.log import segment
    b = flight_broker(make_broker, flushDiskType="SYNC_FLUSH", syncFlushTimeout=50)
    b.store.create_topic("A", read_queue_nums=1, write_queue_nums=1)
    slow = HeldSyncOS()
    monkeypatch.setattr(segment, "os", slow)
    receipts = {}
    for transport in ("flight", "grpc"):
        p = closing(Producer(b.endpoint, transport=transport, max_retries=0))
        receipts[transport] = p.send(Message("A", transport.encode()))
    assert {t: r.transport for t, r in receipts.items()} == {"flight": "flight", "grpc": "grpc"}
    assert slow.syncs > 0
    assert {r.status_code for r in receipts.values()} == {Code.MASTER_PERSISTENCE_TIMEOUT}
    slow.release.set()
    monkeypatch.undo()
    wait_until(lambda: len(b.store.read("A", 0, 0, 10)) >= 2, "both sends to be readable")
    assert sorted(m.body for m in b.store.read("A", 0, 0, 10)) == [b"flight", b"grpc"]
