"""The Spark writer holds every row to the input limits (sparkmq/log/limits.py), as
Store.append_batch does: a row past one, or with a string that is not UTF-8, fails the job
with the limit's status (or names the column), and nothing becomes visible; so does a
DataFrame that names a column twice. Real local SparkSession."""
from __future__ import annotations

import pytest

from sparkmq import Store
from sparkmq.log import format as fmt
from sparkmq.log.fs import StoreFS
from sparkmq.log.txlog import TransactionLog

pytestmark = pytest.mark.spark


def test_a_row_past_a_limit_fails_the_write_and_nothing_is_visible(spark, tmp_path):
    url = str(tmp_path / "store")
    with Store.open(url, mode="w", start_services=False) as s:
        s.create_topic("T", write_queue_nums=2, read_queue_nums=2)
    before = TransactionLog(StoreFS(url)).latest_version()
    # Arrow batches of 4: the bad row is named as a Spark user finds it, row 6 of partition
    # 0 (its second batch's third row). One partition per failing write here: a second
    # task still running when the job aborts may stage its file after the abort's cleanup
    # (vacuum's to remove), and this test asserts no file is left at all
    df = spark.range(0, 20, 1, 1).selectExpr(
        "cast(id as string) as body",
        "case when id = 6 then 'a|b' else 'TagA' end as tags")
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before_conf = spark.conf.get(key)
    spark.conf.set(key, "4")
    try:
        with pytest.raises(Exception, match="ILLEGAL_MESSAGE_TAG: Spark partition 0, row 6: "):
            df.write.format("sparkmq").mode("append").option("topic", "T").save(url)
    finally:
        spark.conf.set(key, before_conf)
    big = spark.range(3).selectExpr("cast(id as string) as body",
                                    "map('p', repeat('v', 100)) as properties")
    with pytest.raises(Exception, match="MESSAGE_PROPERTIES_TOO_LARGE"):
        big.write.format("sparkmq").mode("append").option("topic", "T") \
            .option("maxUserPropertySize", "50").save(url)
    # Spark casts binary to string without a look at the bytes: such a row is refused by
    # name, or every reader of the topic (consumers, Spark, Polars, DuckDB) would fail on it
    not_utf8 = spark.range(0, 6, 1, 1).selectExpr(
        "cast(id as string) as body",
        "case when id = 4 then cast(unhex('61FF') as string) else 'ok' end as tags")
    with pytest.raises(Exception, match="not valid Arrow data: column 'tags'"):
        not_utf8.write.format("sparkmq").mode("append").option("topic", "T").save(url)
    # a null key (Spark's arrays hold nulls; RocketMQ's keys cannot)
    null_key = spark.range(0, 5, 1, 1).selectExpr(
        "cast(id as string) as body", "case when id = 3 then array('k', null) end as keys")
    with pytest.raises(Exception,
                       match="ILLEGAL_MESSAGE_KEY: Spark partition 0, row 3: key 1 is null"):
        null_key.write.format("sparkmq").mode("append").option("topic", "T").save(url)
    # a column named twice (the writer took the last one)
    twice = spark.range(2).selectExpr("cast(id as string) as body", "'x' as tags",
                                      "'y' as tags")
    with pytest.raises(Exception, match="column 'tags' appears 2 times"):
        twice.write.format("sparkmq").mode("append").option("topic", "T").save(url)
    assert TransactionLog(StoreFS(url)).latest_version() == before
    assert StoreFS(url).list_names(fmt.COMMITLOG_DIR) == []

