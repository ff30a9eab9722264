"""The main job on an embedded default (``sparkmq demo``, the README's first command).

1. The store on its own: create a store in a local folder, append a few
   thousand messages to two topics, read them back by queue offset, by key,
   by time and by message id.
2. The whole system on loopback: a NameServer and a broker (SYNC_FLUSH) over
   the same store; sparkmq's online Producer sends, an online SimpleConsumer
   receives and acks.
3. Spark, while the broker runs: a batch write of a DataFrame to a topic (its
   commit is handed to the broker, so online consumers see it), then a
   Structured Streaming query (Trigger.AvailableNow) that reads the online
   topic back; it must agree with the online consumer.
4. A clean stop of everything it started.
"""
from __future__ import annotations

import os
import shutil
import socket
import time

from .log import Message, Store


def run_demo(store_path: str = "demo-store", messages: int = 5000, spark: bool = True,
             online: bool = True) -> int:
    if os.path.exists(store_path):
        shutil.rmtree(store_path)
    t0 = time.monotonic()
    _store_part(store_path, messages)
    if online:
        _online_part(os.path.abspath(store_path), spark=spark)
    elif spark:
        _spark_standalone(os.path.abspath(store_path))
    print(f"demo finished in {time.monotonic() - t0:.1f}s; inspect it with: "
          f"sparkmq topics {store_path}  |  sparkmq log {store_path}")
    return 0


def _store_part(store_path: str, messages: int) -> None:
    t0 = time.monotonic()
    store = Store.open(store_path, mappedFileSizeCommitLog=1 << 20)
    store.create_topic("Orders", read_queue_nums=4, write_queue_nums=4)
    store.create_topic("Payments", read_queue_nums=2, write_queue_nums=2)
    half = messages // 2
    first_id = None
    for start in range(0, half, 500):
        orders = [Message("Orders", f"order {i}".encode(), tags="new" if i % 3 else "vip",
                          keys=[f"order-{i}"], properties={"region": "eu" if i % 2 else "us"})
                  for i in range(start, min(half, start + 500))]
        res = store.append(orders)
        first_id = first_id or res[0].message_id
    mid_ms = store.clock_ms()
    time.sleep(0.01)
    for start in range(0, messages - half, 500):
        pays = [Message("Payments", f"payment {i}".encode(), keys=[f"pay-{i}"],
                        message_group=f"user-{i % 7}")
                for i in range(start, min(messages - half, start + 500))]
        store.append(pays)
    store.flush()
    print(f"[store] appended {messages} messages to 2 topics in {time.monotonic() - t0:.2f}s; "
          f"{len(store.commitlog.segments())} CommitLog segment(s), log version {store.version}")
    for topic in ("Orders", "Payments"):
        ranges = store.queue_ranges(topic)
        total = sum(hi - lo for lo, hi in ranges.values())
        print(f"  {topic}: {total} messages in {len(ranges)} queues "
              + ", ".join(f"q{q}=[{lo},{hi})" for (_, q), (lo, hi) in sorted(ranges.items())))
    batch = store.read("Orders", 1, 10, 3)
    print("  by queue offset  Orders/1 @10..12:", [m.body.decode() for m in batch])
    hit = store.query_by_key("Orders", "order-42")
    print("  by key           order-42 ->",
          [(m.body.decode(), m.queue_id, m.queue_offset) for m in hit])
    late = store.query_by_time("Payments", mid_ms, store.clock_ms(), max_results=100_000)
    print(f"  by time          Payments stored after the Orders: {len(late)} messages")
    found = store.lookup(first_id)
    print(f"  by message id    {first_id} -> {found.body.decode()!r}")
    store.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _online_part(store_path: str, *, spark: bool, online_messages: int = 2000) -> None:
    from .broker import Broker, BrokerConfig
    from .client import Message as ClientMessage, Producer, SimpleConsumer
    from .namesrv.server import NameServer

    import secrets
    cluster_secret = secrets.token_urlsafe(32)     # this demo's NameServer and broker only
    namesrv = NameServer(port=0, cluster_secret=cluster_secret).start()
    broker = None
    try:
        broker = Broker(BrokerConfig.from_properties({
            "brokerClusterName": "DemoCluster", "brokerName": "broker-a", "brokerId": "0",
            "storePathRootDir": store_path, "namesrvAddr": namesrv.address,
            "clusterSecret": cluster_secret,
            "listenPort": str(_free_port()), "adminPort": str(_free_port()),
            "flushDiskType": "SYNC_FLUSH", "autoCreateTopicEnable": "true",
            "defaultTopicQueueNums": "4"})).start()
        print(f"[online] NameServer on {namesrv.address}, broker-a on {broker.endpoint} "
              f"(SYNC_FLUSH) over {store_path}")
        endpoint = broker.endpoint
        t0 = time.monotonic()
        with Producer(endpoint) as producer:
            sent = 0
            for start in range(0, online_messages, 100):
                batch = [ClientMessage("Events", f"event {i}".encode(), tag="click",
                                       keys=[f"ev-{i}"])
                         for i in range(start, min(online_messages, start + 100))]
                producer.send_batch(batch)
                sent += len(batch)
            receipt = producer.send(ClientMessage("Events", b"one more", tag="click"))
            sent += 1
        print(f"[online] producer sent {sent} messages in {time.monotonic() - t0:.2f}s "
              f"(last: id {receipt.message_id} at queue offset {receipt.queue_offset})")
        consumer = SimpleConsumer(endpoint, "DemoGroup", {"Events": "*"})
        got = 0
        deadline = time.monotonic() + 60
        try:
            while got < sent and time.monotonic() < deadline:
                for m in consumer.receive(max_messages=64, wait_s=2.0):
                    consumer.ack(m)
                    got += 1
        finally:
            consumer.close()
        print(f"[online] consumer group DemoGroup received and acked {got} messages")
        if spark:
            _admin_create_topic(broker.admin_url, broker.admin_token, "Clicks", 4)
            _spark_with_broker(store_path, sent)
    finally:
        if broker is not None:
            broker.stop()
        namesrv.stop()
        print("[online] broker and NameServer stopped")


def _admin_create_topic(admin_url: str, token: str, name: str, queues: int) -> None:
    """Create a topic through the broker's admin endpoint (mqadmin updateTopic), with
    the admin token the broker made at start."""
    import json
    import urllib.request

    from .admin_auth import auth_headers
    req = urllib.request.Request(f"{admin_url}/admin/topics", method="POST",
                                 data=json.dumps({"name": name, "queueNums": queues}).encode(),
                                 headers={"Content-Type": "application/json",
                                          **auth_headers(token)})
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()
    print(f"[online] created topic {name} through the broker's admin endpoint")


def _spark_session():
    import sys

    from pyspark.sql import SparkSession

    # Spark's Python workers must run this interpreter (it has pyarrow and sparkmq)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # loopback only, like the daemons
    from .datasource import register

    spark = (SparkSession.builder.master("local[2]").appName("sparkmq-demo")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _wait_published(store_path: str, topic: str, count: int, timeout_s: float = 30.0) -> int:
    """Wait (bounded) until the committed log holds ``count`` messages of ``topic``."""
    from .log.reader import Snapshot
    deadline = time.monotonic() + timeout_s
    total = 0
    while time.monotonic() < deadline:
        snap = Snapshot.load(store_path)
        if topic in snap.topics():
            total = sum(hi - lo for lo, hi in snap.queue_ranges(topic).values())
            if total >= count:
                break
        time.sleep(0.2)
    return total


def _spark_with_broker(store_path: str, sent: int) -> None:
    from pyspark.sql import functions as F

    spark = _spark_session()
    try:
        df = (spark.range(0, 20_000)
              .select(F.concat(F.lit("click "), F.col("id").cast("string")).alias("body"),
                      F.array(F.concat(F.lit("user-"), (F.col("id") % 100).cast("string")))
                      .alias("keys")))
        t0 = time.monotonic()
        df.write.format("sparkmq").option("topic", "Clicks").mode("append").save(store_path)
        print(f"[spark] batch write of 20000 rows to topic Clicks in "
              f"{time.monotonic() - t0:.1f}s: one commit, handed to the running broker")
        _wait_published(store_path, "Events", sent)
        checkpoint = store_path + "-checkpoints/events"
        shutil.rmtree(checkpoint, ignore_errors=True)
        stream = (spark.readStream.format("sparkmq").option("topic", "Events")
                  .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 500)
                  .option("consumerGroup", "SparkEvents").load(store_path))
        q = (stream.writeStream.format("memory").queryName("events")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        q.awaitTermination(300)
        for p in q.recentProgress:
            print(f"  micro-batch {p['batchId']}: {p['numInputRows']} rows")
        n = spark.sql("select count(*) from events").collect()[0][0]
        verdict = "agrees with" if n == sent else "DISAGREES with"
        print(f"[spark] streaming query read {n} messages of Events: {verdict} the online "
              f"consumer ({sent})")
        clicks = spark.read.format("sparkmq").option("topic", "Clicks").load(store_path).count()
        print(f"[spark] batch read of Clicks: {clicks} rows")
    finally:
        spark.stop()


def _spark_standalone(store_path: str) -> None:
    from pyspark.sql import functions as F

    spark = _spark_session()
    try:
        with Store.open(store_path, start_services=False) as store:
            store.create_topic("Clicks", read_queue_nums=4, write_queue_nums=4)
        df = spark.range(0, 20_000).select(
            F.concat(F.lit("click "), F.col("id").cast("string")).alias("body"))
        df.write.format("sparkmq").option("topic", "Clicks").mode("append").save(store_path)
        n = spark.read.format("sparkmq").option("topic", "Clicks").load(store_path).count()
        print(f"[spark] wrote and read back {n} rows of Clicks (no broker)")
    finally:
        spark.stop()
