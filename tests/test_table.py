"""A topic is a table for pandas, Polars and DuckDB users too (issue 15 item 7):
``sparkmq.dataset`` gives one committed snapshot as a pyarrow Dataset, zero copy
over the segments."""
from __future__ import annotations

import duckdb
import polars as pl
import pytest

import sparkmq
from sparkmq import Message, Store
from sparkmq.errors import TopicNotFoundError


@pytest.fixture
def store(tmp_path):
    url = str(tmp_path / "s")
    with Store.open(url, mode="w", start_services=False) as s:
        s.create_topic("Orders", read_queue_nums=3, write_queue_nums=3)
        s.create_topic("Other", read_queue_nums=1, write_queue_nums=1)
        s.append([Message("Orders", f"o{i}".encode(), keys=[f"k{i % 5}"], tags="big" if i % 2
                          else "small") for i in range(300)])
        s.append([Message("Other", b"x")])
    return url


def test_polars_and_duckdb_read_a_topic(store):
    ds = sparkmq.dataset(store, "Orders")
    assert ds.count_rows() == 300
    frame = pl.scan_pyarrow_dataset(ds).filter(pl.col("tags") == "big") \
        .select(pl.col("body").cast(pl.Utf8), "queue_id", "queue_offset").collect()
    assert frame.height == 150 and set(frame["queue_id"]) <= {0, 1, 2}
    orders = ds  # noqa: F841  (DuckDB finds the Arrow dataset by its variable name)
    got = duckdb.sql("select tags, count(*) as n from orders group by tags order by tags") \
        .fetchall()
    table = ds.to_table()
    assert got == [("big", 150), ("small", 150)]
    bodies = sorted(table.column("body").to_pylist())
    assert bodies == sorted(f"o{i}".encode() for i in range(300))


def test_one_version_every_topic_columns_and_errors(store):
    every = sparkmq.dataset(store)
    assert every.count_rows() == 301
    before = sparkmq.dataset(store, "Orders")
    with Store.open(store, mode="w", start_services=False) as s:
        s.append([Message("Orders", b"later")])
    assert before.count_rows() == 300               # a snapshot: later appends not in it
    assert sparkmq.dataset(store, "Orders").count_rows() == 301
    slim = sparkmq.dataset(store, ["Orders"], columns=["body", "queue_offset"])
    assert slim.schema.names == ["body", "queue_offset"]
    with pytest.raises(TopicNotFoundError, match="Nope"):
        sparkmq.dataset(store, "Nope")
