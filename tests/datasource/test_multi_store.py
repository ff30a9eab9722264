"""One query across brokers (issue 15 item 3): a topic spread over two brokers' stores
read by one batch or streaming query (``load([a, b])``, ``stores``, ``namesrv``), rows
told apart by ``broker_name``, streaming offsets keyed by broker name.

Real stores on tmp_path written with sparkmq.Store, the shared SparkSession, and for
``namesrv`` a real NameServer with two in-process brokers registered with it.
"""
from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pytest

from sparkmq.datasource.options import parse_options
from sparkmq.datasource.reader import SparkMQBatchReader
from sparkmq.datasource.stream import SparkMQStreamReader
from sparkmq.datasource.writer import check_write_options
from sparkmq.errors import UserError
from sparkmq.log.store import Store

TOPIC = "Orders"
QUEUES = 2


def append(url: str, broker: str, start: int, n: int) -> None:
    """Messages ``{broker}-{i}`` for i in start..start+n to TOPIC of the store at ``url``."""
    with Store.open(url, start_services=False, brokerName=broker) as s:
        s.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, exist_ok=True)
        s.append_batch(pa.table({"topic": [TOPIC] * n,
                                 "body": [f"{broker}-{i}".encode()
                                          for i in range(start, start + n)]}))


@pytest.fixture
def two_stores(tmp_path):
    """Stores of broker-a (40 messages) and broker-b (30), topic Orders on both."""
    a, b = str(tmp_path / "broker-a"), str(tmp_path / "broker-b")
    append(a, "broker-a", 0, 40)
    append(b, "broker-b", 0, 30)
    return a, b


def expected(**counts) -> list[str]:
    return sorted(f"{broker.replace('_', '-')}-{i}" for broker, n in counts.items()
                  for i in range(n))


def bodies(rows) -> list[str]:
    return sorted(bytes(r.body).decode() for r in rows)


@pytest.mark.spark
def test_batch_read_of_two_stores_returns_every_row_with_its_broker(spark, two_stores):
    a, b = two_stores
    for df in (spark.read.format("sparkmq").option("topic", TOPIC).load([a, b]),
               spark.read.format("sparkmq").option("stores", f"{a},{b}").load()):
        rows = df.select("body", "broker_name", "queue_id", "queue_offset").collect()
        assert bodies(rows) == expected(broker_a=40, broker_b=30)
        assert all(bytes(r.body).decode().startswith(r.broker_name + "-") for r in rows)
        assert Counter(r.broker_name for r in rows) == {"broker-a": 40, "broker-b": 30}
        # each broker's queues are its own: (broker, queue, offset) is unique
        assert len({(r.broker_name, r.queue_id, r.queue_offset) for r in rows}) == 70
    one = spark.read.format("sparkmq").load([a, b]).where("broker_name = 'broker-b'")
    assert bodies(one.collect()) == expected(broker_b=30)
    # startingOffsets keyed by broker: broker-b from offset 10 of each queue, broker-a all
    later = spark.read.format("sparkmq").option(
        "startingOffsets", json.dumps({"broker-b": {TOPIC: {"0": 10, "1": 10}}})).load([a, b])
    assert Counter(r.broker_name for r in later.collect()) == {"broker-a": 40, "broker-b": 10}


@pytest.mark.spark
def test_stream_over_two_stores_reads_each_message_once_across_restarts(spark, two_stores,
                                                                        tmp_path):
    a, b = two_stores          # readStream.load takes one path: the stores option names both
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run():
        df = (spark.readStream.format("sparkmq").option("startingOffsets", "earliest")
              .option("maxMessagesPerTrigger", "25").option("stores", f"{a},{b}").load()
              .select("body", "broker_name", "queue_id", "queue_offset"))
        q = (df.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        try:
            assert q.awaitTermination(120), "query did not finish"
            assert q.exception() is None
        finally:
            q.stop()
        return q

    q = run()
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [25, 25, 20]
    latest = json.loads(q.lastProgress["sources"][0]["endOffset"])
    assert latest == {"broker-a": {TOPIC: {"0": 20, "1": 20}},
                      "broker-b": {TOPIC: {"0": 15, "1": 15}}}
    append(a, "broker-a", 40, 6)
    append(b, "broker-b", 30, 4)
    run()                                     # restart from the checkpoint
    rows = spark.read.parquet(str(out)).collect()
    assert bodies(rows) == expected(broker_a=46, broker_b=34)        # each exactly once
    assert Counter(r.broker_name for r in rows) == {"broker-a": 46, "broker-b": 34}


def test_two_stores_of_one_broker_are_refused(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    append(a, "broker-a", 0, 2)
    append(b, "broker-a", 0, 2)
    for cls in (SparkMQBatchReader, SparkMQStreamReader):
        with pytest.raises(UserError, match="both belong to broker 'broker-a'"):
            cls({"paths": json.dumps([a, b])})


def test_option_errors_say_what_to_do(two_stores):
    a, b = two_stores
    with pytest.raises(UserError, match="one way only"):
        parse_options({"path": a, "stores": b})
    with pytest.raises(UserError, match="names a store twice"):
        parse_options({"stores": f"{a},{a}"})
    with pytest.raises(UserError, match="versionAsOf numbers the versions of one store"):
        parse_options({"stores": f"{a},{b}", "versionAsOf": "1"})
    with pytest.raises(UserError, match="unknown read option 'store'; did you mean 'stores'"):
        parse_options({"store": a})
    with pytest.raises(UserError, match=r"exist in none of the stores"):
        SparkMQBatchReader({"stores": f"{a},{b}", "topic": "Nope"})
    with pytest.raises(UserError, match=r"names brokers \['broker-c'\]"):
        SparkMQBatchReader({"stores": f"{a},{b}",
                            "startingOffsets": json.dumps({"broker-c": {TOPIC: {"0": 1}}})})
    with pytest.raises(UserError, match="a write goes to one store"):
        check_write_options({"stores": f"{a},{b}"})


def test_a_checkpoint_of_other_stores_fails_clearly(two_stores):
    a, b = two_stores
    one = SparkMQStreamReader({"path": a, "startingoffsets": "earliest"})
    both = SparkMQStreamReader({"stores": f"{a},{b}", "startingoffsets": "earliest"})
    only_a = SparkMQStreamReader({"stores": a, "startingoffsets": "earliest"})
    assert one.initialOffset() == {TOPIC: {"0": 0, "1": 0}}         # today's format
    start = both.initialOffset()
    assert start == {"broker-a": {TOPIC: {"0": 0, "1": 0}}, "broker-b": {TOPIC: {"0": 0, "1": 0}}}
    with pytest.raises(UserError, match=r"brokers \['broker-b'\] whose stores this query does"):
        only_a.latestOffset(start)                                  # a store missing
    with pytest.raises(UserError, match=r"brokers \['broker-b'\] were added since"):
        both.latestOffset(only_a.initialOffset())                   # a store added later
    with pytest.raises(UserError, match="offsets are of a read of one store"):
        both.latestOffset(one.initialOffset())
    with pytest.raises(UserError, match="offsets are keyed by brokers"):
        one.latestOffset(start)


@pytest.mark.spark
@pytest.mark.integration
def test_namesrv_option_reads_every_broker_groups_store(spark, make_broker):
    from helpers.net import free_port
    from sparkmq.namesrv import NameServer
    with NameServer(port=free_port()) as ns:
        brokers = [make_broker(name, namesrvAddr=ns.address) for name in ("broker-a", "broker-b")]
        for i, br in enumerate(brokers):
            br.store.create_topic(TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
            name = br.config.broker_name
            br.store.append_batch(pa.table({"topic": [TOPIC] * (5 + i), "body": [
                f"{name}-{k}".encode() for k in range(5 + i)]}))
            br.store.publish(force=True)      # visible to readers now, not at the next publish
        rows = spark.read.format("sparkmq").option("namesrv", ns.address) \
            .option("topic", TOPIC).load().collect()
    assert bodies(rows) == expected(broker_a=5, broker_b=6)
    assert Counter(r.broker_name for r in rows) == {"broker-a": 5, "broker-b": 6}
