"""The main job on an embedded default (``sparkmq demo``, the README's first command).

1. Create a store in a local folder; append a few thousand messages to two
   topics (SYNC_FLUSH for one batch of sends, ASYNC_FLUSH store default).
2. Read them back by queue offset, by key and by time; look one up by id.
3. Spark: a batch write of a DataFrame to a topic, then a Structured
   Streaming query (Trigger.AvailableNow) that reads the topic back,
   printing its progress.
"""
from __future__ import annotations

import os
import shutil
import time

from .log import Message, Store


def run_demo(store_path: str = "demo-store", messages: int = 5000, spark: bool = True) -> int:
    if os.path.exists(store_path):
        shutil.rmtree(store_path)
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
    print(f"appended {messages} messages to 2 topics in {time.monotonic() - t0:.2f}s; "
          f"{len(store.commitlog.segments())} CommitLog segment(s), log version {store.version}")

    for topic in ("Orders", "Payments"):
        ranges = store.queue_ranges(topic)
        total = sum(hi - lo for lo, hi in ranges.values())
        print(f"  {topic}: {total} messages in {len(ranges)} queues "
              + ", ".join(f"q{q}=[{lo},{hi})" for (_, q), (lo, hi) in sorted(ranges.items())))
    batch = store.read("Orders", 1, 10, 3)
    print("by queue offset  Orders/1 @10..12:", [m.body.decode() for m in batch])
    hit = store.query_by_key("Orders", "order-42")
    print("by key           order-42 ->", [(m.body.decode(), m.queue_id, m.queue_offset) for m in hit])
    late = store.query_by_time("Payments", mid_ms, store.clock_ms(), max_results=100_000)
    print(f"by time          Payments stored after the Orders: {len(late)} messages")
    found = store.lookup(first_id)
    print(f"by message id    {first_id} -> {found.body.decode()!r}")
    store.close()

    if spark:
        _spark_part(os.path.abspath(store_path))
    print(f"demo finished in {time.monotonic() - t0:.1f}s; inspect it with: "
          f"sparkmq topics {store_path}  |  sparkmq log {store_path}")
    return 0


def _spark_part(store_path: str) -> None:
    from pyspark.sql import SparkSession, functions as F

    from .datasource import register

    spark = (SparkSession.builder.master("local[2]").appName("sparkmq-demo")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        with Store.open(store_path, start_services=False) as store:
            store.create_topic("Clicks", read_queue_nums=4, write_queue_nums=4)
        df = (spark.range(0, 20_000)
              .select(F.concat(F.lit("click "), F.col("id").cast("string")).alias("body"),
                      F.array(F.concat(F.lit("user-"), (F.col("id") % 100).cast("string")))
                      .alias("keys")))
        t0 = time.monotonic()
        df.write.format("sparkmq").option("topic", "Clicks").mode("append").save(store_path)
        print(f"spark batch write: 20000 rows to topic Clicks in {time.monotonic() - t0:.1f}s "
              "(one transaction-log version)")
        checkpoint = os.path.join(store_path + "-checkpoints", "clicks")
        stream = (spark.readStream.format("sparkmq").option("topic", "Clicks")
                  .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 5000)
                  .load(store_path))
        q = (stream.writeStream.format("memory").queryName("clicks")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        q.awaitTermination(300)
        for p in q.recentProgress:
            print(f"  micro-batch {p['batchId']}: {p['numInputRows']} rows")
        n = spark.sql("select count(*) from clicks").collect()[0][0]
        print(f"spark streaming read back {n} messages from Clicks")
    finally:
        spark.stop()
