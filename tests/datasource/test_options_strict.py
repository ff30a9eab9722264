"""What Spark and Kafka users expect of options (issue 15 items 1, 2): an unknown option
fails naming the closest known one; Kafka's names work where the meaning matches;
the first write creates the store and a missing topic."""
from __future__ import annotations

import json

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows, ReadMinRows

from sparkmq import Message, Snapshot, Store
from sparkmq.datasource.options import parse_options, select_queues, select_topics
from sparkmq.datasource.stream import SparkMQStreamReader
from sparkmq.errors import TopicNotFoundError, UserError


@pytest.fixture
def store(tmp_path):
    url = str(tmp_path / "s")
    with Store.open(url, mode="w", start_services=False) as s:
        for name in ("Orders", "Payments"):
            s.create_topic(name, read_queue_nums=2, write_queue_nums=2)
        s.append([Message("Orders", f"o{i}".encode()) for i in range(10)])
        s.append([Message("Payments", f"p{i}".encode()) for i in range(4)])
    return url


@pytest.mark.parametrize("key, suggestion", [
    ("maxMesagesPerTrigger", "maxMessagesPerTrigger"),
    ("startingOffset", "startingOffsets"),
    ("subscribePatern", "subscribePattern"),
    ("kafka.bootstrap.servers", None),
])
def test_an_unknown_read_option_fails_naming_the_closest(key, suggestion):
    with pytest.raises(UserError, match="unknown read option") as e:
        parse_options({"path": "/x", key.lower(): "1"})
    if suggestion:
        assert f"did you mean {suggestion!r}" in e.value.message


def test_kafka_names_select_the_same_topics_and_queues(store):
    snap = Snapshot.load(store)
    for options, topics, pairs in [
        ({"subscribe": "Orders"}, ["Orders"], [("Orders", 0), ("Orders", 1)]),
        ({"subscribePattern": "Pay.*"}, ["Payments"], [("Payments", 0), ("Payments", 1)]),
        ({"assign": json.dumps({"Orders": [1]})}, ["Orders"], [("Orders", 1)]),
    ]:
        opts = parse_options({"path": store, **{k.lower(): v for k, v in options.items()}})
        assert select_topics(snap, opts) == topics
        assert select_queues(snap, topics, opts) == pairs
    with pytest.raises(UserError, match="only one of subscribe"):
        parse_options({"path": store, "subscribe": "Orders", "topics": "Orders"})


def test_max_offsets_per_trigger_limits_a_micro_batch(store):
    reader = SparkMQStreamReader({"path": store, "subscribe": "Orders",
                                  "maxoffsetspertrigger": "3", "startingoffsets": "earliest"})
    assert reader.getDefaultReadLimit() == ReadMaxRows(3)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert sum(end["Orders"].values()) - sum(start["Orders"].values()) == 3


def test_min_offsets_per_trigger_waits_for_enough_messages_or_the_delay(store):
    reader = SparkMQStreamReader({"path": store, "subscribe": "Payments",
                                  "minoffsetspertrigger": "10", "maxtriggerdelay": "1h",
                                  "startingoffsets": "earliest"})
    assert reader.getDefaultReadLimit() == ReadMinRows(10)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadMinRows(10)) == start      # 4 < 10: wait
    with Store.open(store, mode="w", start_services=False) as s:
        s.append([Message("Payments", f"q{i}".encode()) for i in range(8)])
    end = reader.latestOffset(start, ReadMinRows(10))
    assert sum(end["Payments"].values()) - sum(start["Payments"].values()) == 12
    quick = SparkMQStreamReader({"path": store, "subscribe": "Payments",
                                 "minoffsetspertrigger": "1000", "maxtriggerdelay": "0ms",
                                 "startingoffsets": "earliest"})
    begin = quick.initialOffset()
    assert quick.latestOffset(begin, ReadMinRows(1000)) != begin     # the delay passed


def test_offsets_by_timestamp_per_queue(store):
    snap = Snapshot.load(store)
    stamps = [m.store_timestamp for m in snap.read("Orders", 0, 0, 100)]
    from sparkmq.datasource.options import resolve_offsets
    opts = parse_options({"path": store, "startingoffsetsbytimestamp":
                          json.dumps({"Orders": {"0": stamps[-1]}})})
    out = resolve_offsets(snap, [("Orders", 0), ("Orders", 1)], None, None, "earliest",
                          "startingOffsets", opts.starting_by_timestamp,
                          opts.by_timestamp_strategy)
    assert out[("Orders", 0)] == snap.offset_for_time("Orders", 0, stamps[-1])
    assert out[("Orders", 1)] == 0                                  # not named: earliest
    late = parse_options({"path": store, "startingoffsetsbytimestamp":
                          json.dumps({"Orders": {"0": stamps[-1] + 10**9}})})
    with pytest.raises(UserError, match="no message stored at or after"):
        resolve_offsets(snap, [("Orders", 0)], None, None, "earliest", "startingOffsets",
                        late.starting_by_timestamp, late.by_timestamp_strategy)


@pytest.mark.spark
def test_the_first_write_creates_the_store_and_missing_topics(spark, tmp_path):
    url = str(tmp_path / "new")
    df = spark.createDataFrame([("a",), ("b",)], "body string")
    df.write.mode("append").format("sparkmq").option("topic", "Fresh") \
        .option("queues", "3").save(url)
    snap = Snapshot.load(url)
    assert snap.topics()["Fresh"].write_queue_nums == 3
    assert sorted(m.body for q in range(3) for m in snap.read("Fresh", q, 0, 10)) == \
        [b"a", b"b"]
    # a topic named by the column is created on first use too
    spark.createDataFrame([("Other", "x")], "topic string, body string") \
        .write.mode("append").format("sparkmq").save(url)
    assert "Other" in Snapshot.load(url).topics()
    # unless autoCreateTopic=false
    with pytest.raises(Exception, match="does not exist"):
        spark.createDataFrame([("Third", "x")], "topic string, body string") \
            .write.mode("append").format("sparkmq").option("autoCreateTopic", "false") \
            .save(url)
    with pytest.raises(Exception, match="unknown write option 'queus'.*'queues'"):
        df.write.mode("append").format("sparkmq").option("topic", "Fresh") \
            .option("queus", "2").save(url)
    with pytest.raises(Exception, match="unknown read option"):
        spark.read.format("sparkmq").option("subscrib", "Fresh").load(url).count()
    assert spark.read.format("sparkmq").option("subscribe", "Fresh").load(url).count() == 2
    for act in (lambda: spark.read.format("sparkmq").load("memory://m").count(),
                lambda: df.write.mode("append").format("sparkmq").option("topic", "T")
                .save("memory://m")):
        with pytest.raises(Exception, match="memory:// store lives in one process"):
            act()


def test_memory_urls_are_refused_for_spark_writes_with_why():
    from sparkmq.log.autocreate import create_store
    with pytest.raises(UserError, match="memory:// store lives in one process"):
        create_store("memory://x", None, {"T": 1})


def test_the_store_and_the_option_topic_are_created_in_one_commit(tmp_path):
    from sparkmq.log.autocreate import create_store
    from sparkmq.log.fs import StoreFS
    from sparkmq.log.txlog import TransactionLog
    url = str(tmp_path / "one")
    assert create_store(url, None, {"T": 2})
    log = TransactionLog(StoreFS(url))
    assert log.versions() == [0] and Snapshot.load(url).topics()["T"].read_queue_nums == 2
    assert not create_store(url, None, {"U": 1})          # exists: nothing changes
    assert log.versions() == [0]
    with pytest.raises(TopicNotFoundError):
        from sparkmq.log.batch import writable_topic_conf
        writable_topic_conf(Snapshot.load(url).topics(), "U")


@pytest.mark.spark
def test_the_key_option_reads_the_messages_with_that_key_through_the_index(spark, tmp_path):
    url = str(tmp_path / "keys")
    with Store.open(url, mode="w", start_services=False) as s:
        s.create_topic("K", read_queue_nums=2, write_queue_nums=2)
        s.append([Message("K", f"m{i}".encode(), keys=[f"order-{i % 10}", "all"])
                  for i in range(100)])
    rows = spark.read.format("sparkmq").option("key", "order-3").load(url) \
        .select("body").collect()
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(3, 100, 10))
    assert spark.read.format("sparkmq").option("key", "nope").load(url).count() == 0
