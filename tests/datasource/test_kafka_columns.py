"""Kafka's columns (issue 15 item 2): read option ``columns=kafka`` returns exactly the
schema of Spark's Kafka source (``includeHeaders`` adds ``headers``), batch and
streaming; a Kafka-source job ports by changing its format and path; a DataFrame in
Kafka's sink columns is written as the Kafka sink would.

Real local SparkSession (session fixture ``spark``), stores written with sparkmq.Store.
"""
from __future__ import annotations

import datetime as dt
import zlib

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

from sparkmq.errors import UserError
from sparkmq.log.store import Message, Store

#: Spark's Kafka source schema, as the Structured Streaming + Kafka Integration Guide and
#: KafkaRecordToRowConverter define it (every field nullable); written out here, not
#: imported, so the test compares against the documented schema
KAFKA = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
])
KAFKA_HEADERS = StructType(KAFKA.fields + [StructField("headers", ArrayType(StructType([
    StructField("key", StringType(), True), StructField("value", BinaryType(), True)]),
    True), True)])

T0 = 1_700_000_000_000      # born timestamps: T0 + i seconds


def make_store(url: str) -> None:
    """Orders (2 queues): o0..o5 in queue 0 and 1 alternately; o0 has two keys, tags
    and a property; o1 nothing but a body; the rest one key each."""
    msgs = []
    for i in range(6):
        keys = ["k0", "extra"] if i == 0 else ([] if i == 1 else [f"k{i}"])
        msgs.append(Message("Orders", f"o{i}".encode(), queue_id=i % 2, keys=keys,
                            tags="big" if i == 0 else None,
                            properties={"source": "web"} if i in (0, 2) else {},
                            born_timestamp=T0 + i * 1000))
    with Store.open(url, mode="w", start_services=False) as s:
        s.create_topic("Orders", read_queue_nums=2, write_queue_nums=2)
        s.append(msgs)


def kafka_read(spark, url, **opts):
    r = spark.read.format("sparkmq").option("columns", "kafka")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(url)


def _ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000)     # Spark returns local naive times


@pytest.mark.spark
def test_batch_read_has_kafkas_schema_and_values(spark, local_store_url):
    make_store(local_store_url)
    df = kafka_read(spark, local_store_url)
    assert df.schema == KAFKA
    rows = sorted(df.collect(), key=lambda r: r.value)
    assert [(r.key, bytes(r.value), r.topic, r.partition, r.offset) for r in rows] == [
        (b"k0", b"o0", "Orders", 0, 0), (None, b"o1", "Orders", 1, 0),
        (b"k2", b"o2", "Orders", 0, 1), (b"k3", b"o3", "Orders", 1, 1),
        (b"k4", b"o4", "Orders", 0, 2), (b"k5", b"o5", "Orders", 1, 2)]
    # timestamp: the producer's (born) time, Kafka's CreateTime (0)
    assert [r.timestamp for r in rows] == [_ts(T0 + i * 1000) for i in range(6)]
    assert {r.timestampType for r in rows} == {0}
    assert "headers" not in df.columns


@pytest.mark.spark
def test_include_headers_adds_properties_tags_and_further_keys(spark, local_store_url):
    make_store(local_store_url)
    df = kafka_read(spark, local_store_url, includeHeaders="true")
    assert df.schema == KAFKA_HEADERS
    by_value = {bytes(r.value): r.headers for r in df.collect()}
    as_pairs = {v: None if h is None else [(e.key, bytes(e.value)) for e in h]
                for v, h in by_value.items()}
    assert as_pairs == {
        b"o0": [("source", b"web"), ("TAGS", b"big"), ("KEYS", b"k0 extra")],
        b"o1": None,                                   # no headers: null, as in Kafka
        b"o2": [("source", b"web")], b"o3": None, b"o4": None, b"o5": None}
    off = kafka_read(spark, local_store_url, includeHeaders="false")
    assert off.schema == KAFKA


@pytest.mark.spark
def test_stream_read_has_kafkas_schema_and_values(spark, local_store_url, tmp_path):
    make_store(local_store_url)
    stream = (spark.readStream.format("sparkmq").option("columns", "kafka")
              .option("includeHeaders", "true").option("subscribe", "Orders")
              .option("startingOffsets", "earliest").load(local_store_url))
    assert stream.schema == KAFKA_HEADERS
    q = (stream.writeStream.format("memory").queryName("kafka_cols_stream")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(120)
    rows = spark.sql("select * from kafka_cols_stream").collect()
    got = sorted((bytes(r.value), r.key, r.partition, r.offset, r.timestampType) for r in rows)
    assert got == [(b"o0", b"k0", 0, 0, 0), (b"o1", None, 1, 0, 0), (b"o2", b"k2", 0, 1, 0),
                   (b"o3", b"k3", 1, 1, 0), (b"o4", b"k4", 0, 2, 0), (b"o5", b"k5", 1, 2, 0)]
    assert {bytes(r.value): r.headers is None for r in rows}[b"o1"]


def kafka_job(source):
    """A Kafka-source job as the Kafka integration guide writes it: everything after
    ``load`` is Kafka's code, unchanged."""
    return (source.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)", "partition",
                              "offset")
            .where("key IS NOT NULL").orderBy("value"))


@pytest.mark.spark
def test_a_kafka_job_ports_by_changing_format_and_path(spark, local_store_url):
    make_store(local_store_url)
    kafka_source = {"format": "kafka", "options": {
        "kafka.bootstrap.servers": "kafka-1:9092", "subscribe": "Orders",
        "startingOffsets": "earliest"}}
    ported = {"format": "sparkmq", "path": local_store_url, "options": {
        **{k: v for k, v in kafka_source["options"].items() if not k.startswith("kafka.")},
        "columns": "kafka"}}
    source = (spark.read.format(ported["format"]).options(**ported["options"])
              .load(ported["path"]))
    got = [tuple(r) for r in kafka_job(source).collect()]
    assert got == [("k0", "o0", 0, 0), ("k2", "o2", 0, 1), ("k3", "o3", 1, 1),
                   ("k4", "o4", 0, 2), ("k5", "o5", 1, 2)]


@pytest.mark.spark
def test_kafka_names_are_pushed_down(spark, local_store_url):
    """partition / offset / topic filters prune the plan (as queue_id / queue_offset /
    topic); key and timestamp are left to Spark; the results are exact."""
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual
    from sparkmq.datasource.reader import SparkMQBatchReader
    make_store(local_store_url)
    reader = SparkMQBatchReader({"path": local_store_url, "columns": "kafka"})
    key_filter = EqualTo(("key",), b"k2")
    left = list(reader.pushFilters([EqualTo(("partition",), 1), EqualTo(("topic",), "Orders"),
                                    GreaterThanOrEqual(("offset",), 1), key_filter]))
    assert left == [key_filter]
    assert [(p.topic, p.queue_id, p.start, p.end) for p in reader.partitions()] == \
        [("Orders", 1, 1, 3)]
    df = kafka_read(spark, local_store_url)
    got = df.filter((F.col("partition") == 0) & (F.col("offset") >= 1)).collect()
    assert sorted(bytes(r.value) for r in got) == [b"o2", b"o4"]
    assert df.filter(F.col("topic") == "nope").count() == 0


@pytest.mark.spark
def test_declared_schema_and_key_option_with_kafka_columns(spark, local_store_url):
    make_store(local_store_url)
    df = (spark.read.format("sparkmq").option("columns", "kafka")
          .schema("value binary, offset long").load(local_store_url))
    assert df.columns == ["value", "offset"] and df.count() == 6
    # option key (through the Index) filters on keys, which Kafka's columns do not show
    keyed = kafka_read(spark, local_store_url, key="extra").collect()
    assert [(r.key, bytes(r.value)) for r in keyed] == [(b"k0", b"o0")]
    with pytest.raises(Exception, match="not a Kafka .columns=kafka. column"):
        spark.read.format("sparkmq").option("columns", "kafka").schema("body binary") \
            .load(local_store_url).collect()


def test_column_options_are_checked():
    from sparkmq.datasource.options import parse_options
    with pytest.raises(UserError, match="goes with columns=kafka"):
        parse_options({"path": "/x", "includeheaders": "true"})
    with pytest.raises(UserError, match="columns must be sparkmq"):
        parse_options({"path": "/x", "columns": "avro"})
    with pytest.raises(UserError, match="did you mean 'includeHeaders'"):
        parse_options({"path": "/x", "includeheader": "true"})
    opts = parse_options({"path": "/x", "columns": "Kafka", "includeheaders": "true"})
    assert opts.kafka and opts.include_headers


# -- writes ---------------------------------------------------------------------------------
@pytest.mark.spark
def test_write_kafka_columns_round_trips(spark, tmp_path):
    url = str(tmp_path / "w")
    hdr = "array<struct<key:string,value:binary>>"
    df = spark.createDataFrame(
        [("u1", "v0", [("source", bytearray(b"web")), ("TAGS", bytearray(b"big"))]),
         ("u2", "v1", None), (None, "v2", []), ("u1", "v3", None),
         ("u1", "v4", [("KEYS", bytearray(b"u1 more"))])],
        f"key string, value string, headers {hdr}")
    df.write.format("sparkmq").option("topic", "Clicks").option("queues", "4") \
        .mode("append").save(url)
    back = {bytes(r.value): r for r in kafka_read(spark, url, includeHeaders="true").collect()}
    assert sorted(back) == [b"v0", b"v1", b"v2", b"v3", b"v4"]
    assert back[b"v0"].key == b"u1" and back[b"v2"].key is None
    assert [(e.key, bytes(e.value)) for e in back[b"v0"].headers] == \
        [("source", b"web"), ("TAGS", b"big")]
    assert [(e.key, bytes(e.value)) for e in back[b"v4"].headers] == [("KEYS", b"u1 more")]
    assert back[b"v1"].headers is None and back[b"v2"].headers is None
    assert {r.topic for r in back.values()} == {"Clicks"}
    # one key, one queue (crc32(key) % queues, as Kafka's partitioner keeps a key together)
    assert {back[v].partition for v in (b"v0", b"v3", b"v4")} == {zlib.crc32(b"u1") % 4}
    assert back[b"v1"].partition == zlib.crc32(b"u2") % 4
    # in sparkmq's own columns: keys, tags, properties
    own = {bytes(r.body): r for r in spark.read.format("sparkmq").load(url).collect()}
    assert own[b"v0"].keys == ["u1"] and own[b"v0"].tags == "big"
    assert own[b"v0"].properties == {"source": "web"}
    assert own[b"v4"].keys == ["u1", "more"] and own[b"v4"].properties is None


@pytest.mark.spark
def test_a_kafka_column_read_writes_back_whole(spark, local_store_url, tmp_path):
    """A mirror job: Kafka's read columns written as they are (offset, timestamp and
    timestampType ignored, as the Kafka sink ignores them; partition kept)."""
    make_store(local_store_url)
    copy = str(tmp_path / "copy")
    src = kafka_read(spark, local_store_url, includeHeaders="true")
    src.write.format("sparkmq").mode("append").save(copy)
    cols = ["key", "value", "topic", "partition", "offset", "headers"]
    assert sorted(map(tuple, kafka_read(spark, copy, includeHeaders="true")
                      .select(*cols).collect()), key=lambda t: t[1]) == \
        sorted(map(tuple, src.select(*cols).collect()), key=lambda t: t[1])


@pytest.mark.spark
def test_kafka_write_mistakes_are_named(spark, tmp_path):
    url = str(tmp_path / "bad")
    mixed = spark.createDataFrame([("a", "b")], "value string, body string")
    with pytest.raises(Exception, match="unknown column 'body'"):
        mixed.write.format("sparkmq").option("topic", "T").mode("append").save(url)
    dup = spark.createDataFrame(
        [("v", [("h", bytearray(b"1")), ("h", bytearray(b"2"))])],
        "value string, headers array<struct<key:string,value:binary>>")
    with pytest.raises(Exception, match="two headers of one name"):
        dup.write.format("sparkmq").option("topic", "T").mode("append").save(url)
