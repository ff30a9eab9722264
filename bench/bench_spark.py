"""Spark benchmark: sparkmq against Spark's own Parquet source and sink, in one run.

    .venv/bin/python bench/bench_spark.py [--quick] [--rows N] [--body-bytes B] [--repeat N]
                                          [--conf KEY=VALUE ...]

1. batch write of N rows with B-byte bodies: ``df.write.format("sparkmq")``
   against ``df.write.parquet`` (same cached DataFrame, same partitions);
2. streaming read of the same N messages with ``Trigger.AvailableNow`` into
   the ``noop`` sink: ``spark.readStream.format("sparkmq")`` over the store
   the write made, against Spark's Parquet file-stream source over the
   Parquet files the write made; ``select("body")`` on both, and sparkmq
   again with the schema declared as ``body binary`` (Parquet prunes to the
   one column by itself; a Python data source is told only a declared schema);
   and the like-for-like case, every column on both sides (no select): sparkmq
   against Parquet files holding the same messages with all 20 columns (written,
   untimed, from a batch read of the store).

Prints rows/s for each and the ratio sparkmq/parquet (above 1.0: sparkmq is
faster). Data lives under a fresh folder in /tmp, deleted at the end. The
streaming read is skipped (and the report says so) if the read side of the
data source is not available.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from sparkmq.progress import track

DEFAULT_ROWS = 1_000_000
QUICK_ROWS = 100_000
BODY_BYTES = 1024
PARTITIONS = 2
TIMEOUT_S = 1800


def spark_session(confs: dict[str, str] | None = None):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.master(f"local[{PARTITIONS}]").appName("sparkmq-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", "4g")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", str(PARTITIONS)))
    for key, value in (confs or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from sparkmq.datasource import register
    register(spark)
    return spark


def source_frame(spark, rows: int, body_bytes: int):
    """N rows of ``body_bytes``-byte bodies (hex of hashes: not trivially compressible)."""
    from pyspark.sql import functions as F
    parts = -(-body_bytes // 64)
    hexes = [F.sha2(F.concat(F.col("id").cast("string"), F.lit(f"/{i}")), 256)
             for i in range(parts)]
    body = F.substring(F.concat(*hexes), 1, body_bytes).cast("binary")
    df = spark.range(rows, numPartitions=PARTITIONS).select(body.alias("body"))
    df = df.cache()
    assert df.count() == rows
    return df


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_write(spark, df, rows: int, root: str, repeat: int = 1) -> dict:
    """Best of ``repeat`` writes each (sparkmq's repeats go to other topics, so the
    read below still reads ``rows`` messages)."""
    from sparkmq import Store
    store = os.path.join(root, "store")
    with Store.open(store, mode="w", start_services=False) as s:
        for i in track(range(repeat), "runs"):
            s.create_topic("bench" if i == 0 else f"bench{i}", write_queue_nums=4,
                           read_queue_nums=4)
        s.create_topic("warmup", write_queue_nums=1, read_queue_nums=1)
    pq_dir = os.path.join(root, "parquet")
    warm = df.limit(1000)      # start Python workers and JIT both paths before timing
    warm.write.format("sparkmq").mode("append").option("topic", "warmup").save(store)
    warm.write.mode("overwrite").parquet(os.path.join(root, "warmup"))
    t_mq, t_pq = [], []
    for i in track(range(repeat), "runs"):
        t_mq.append(timed(lambda: df.write.format("sparkmq").mode("append")
                          .option("topic", "bench" if i == 0 else f"bench{i}").save(store)))
        t_pq.append(timed(lambda: df.write.mode("overwrite").parquet(pq_dir)))
    return {"store": store, "parquet": pq_dir, "sparkmq_s": min(t_mq), "parquet_s": min(t_pq)}


def run_available_now(stream_df, checkpoint: str) -> float:
    def go():
        q = (stream_df.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
        try:
            if not q.awaitTermination(TIMEOUT_S):
                raise TimeoutError(f"streaming query did not finish in {TIMEOUT_S} s")
        finally:
            if q.isActive:
                q.stop()
    return timed(go)


def bench_stream_read(spark, rows: int, written: dict, root: str,
                      repeat: int = 1) -> list[tuple[str, dict]]:
    """Parquet's source prunes to ``body`` by itself; a Python data source cannot be told
    the columns a query uses, so sparkmq is measured both ways: all 20 columns then
    ``select("body")`` (what Spark materializes without help), and with the schema
    declared as ``body binary`` (the same single column as Parquet)."""
    schema = spark.read.parquet(written["parquet"]).schema
    pq_all = os.path.join(root, "parquet-all")     # the messages, all columns (untimed)
    spark.read.format("sparkmq").option("topic", "bench").load(written["store"]) \
        .write.mode("overwrite").parquet(pq_all)
    schema_all = spark.read.parquet(pq_all).schema
    times: dict[str, list[float]] = {"pq": [], "mq": [], "decl": [], "pq_all": [], "mq_all": []}
    for i in range(repeat):    # each query from scratch (new checkpoint), interleaved
        times["pq"].append(run_available_now(
            spark.readStream.schema(schema).parquet(written["parquet"]).select("body"),
            os.path.join(root, f"ck-parquet-{i}")))
        mq = spark.readStream.format("sparkmq").option("topic", "bench") \
            .option("startingOffsets", "earliest").load(written["store"]).select("body")
        times["mq"].append(run_available_now(mq, os.path.join(root, f"ck-sparkmq-{i}")))
        declared = spark.readStream.format("sparkmq").schema("body binary") \
            .option("topic", "bench").option("startingOffsets", "earliest") \
            .load(written["store"])
        times["decl"].append(run_available_now(declared,
                                               os.path.join(root, f"ck-declared-{i}")))
        times["pq_all"].append(run_available_now(
            spark.readStream.schema(schema_all).parquet(pq_all),
            os.path.join(root, f"ck-parquet-all-{i}")))
        times["mq_all"].append(run_available_now(
            spark.readStream.format("sparkmq").option("topic", "bench")
            .option("startingOffsets", "earliest").load(written["store"]),
            os.path.join(root, f"ck-sparkmq-all-{i}")))
    t_pq = min(times["pq"])
    return [("stream read (AvNow)", {"sparkmq_s": min(times["mq"]), "parquet_s": t_pq}),
            ("  declared body only", {"sparkmq_s": min(times["decl"]), "parquet_s": t_pq}),
            ("  all columns", {"sparkmq_s": min(times["mq_all"]),
                               "parquet_s": min(times["pq_all"])})]


def read_side_available(spark, store: str) -> str | None:
    """None if ``spark.readStream.format("sparkmq")`` can be planned, else why not."""
    try:
        spark.readStream.format("sparkmq").option("topic", "bench").load(store).schema
        return None
    except Exception as exc:   # the read side may not have landed yet
        return str(exc).splitlines()[0][:200]


def report(name: str, rows: int, res: dict) -> None:
    mq, pq = rows / res["sparkmq_s"], rows / res["parquet_s"]
    print(f"{name:<22} sparkmq {mq:>12,.0f} rows/s ({res['sparkmq_s']:.2f} s)   "
          f"parquet {pq:>12,.0f} rows/s ({res['parquet_s']:.2f} s)   "
          f"ratio sparkmq/parquet {mq / pq:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows instead of "
                    f"{DEFAULT_ROWS:,}")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--body-bytes", type=int, default=BODY_BYTES)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every timed case N times and report the best (noisy machines)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark conf for the session (repeatable), e.g. spark.buffer.size=1048576")
    args = ap.parse_args(argv)
    confs = dict(c.split("=", 1) for c in args.conf)
    rows = args.rows or (QUICK_ROWS if args.quick else DEFAULT_ROWS)
    root = tempfile.mkdtemp(prefix="sparkmq-bench-", dir="/tmp")
    spark = spark_session(confs)
    try:
        import sparkmq
        print(f"sparkmq from {os.path.dirname(sparkmq.__file__)}")
        print(f"rows {rows:,}, body {args.body_bytes} bytes, local[{PARTITIONS}], best of "
              f"{args.repeat}, data in {root}; confs {confs or 'default'}")
        df = source_frame(spark, rows, args.body_bytes)
        written = bench_write(spark, df, rows, root, args.repeat)
        report("batch write", rows, written)
        df.unpersist()
        why = read_side_available(spark, written["store"])
        if why is None:
            for name, res in bench_stream_read(spark, rows, written, root, args.repeat):
                report(name, rows, res)
        else:
            print(f"stream read skipped: the sparkmq read side is not available ({why})")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
