"""A topic as a table for every engine, without a JVM: ``sparkmq.dataset(url, "Orders")``
is a ``pyarrow.dataset.Dataset`` of one committed snapshot, ready for pandas
(``.to_table().to_pandas()``), Polars (``pl.scan_pyarrow_dataset(ds)``) and DuckDB
(``duckdb.sql("select ... from ds")``).

The dataset holds the snapshot's messages queue by queue, in queue-offset order, with
the columns of a Spark read (README, "Output schema of reads"); bodies and other
stored columns are zero-copy slices of the memory-mapped CommitLog segments. It is
one version: later appends are not in it (load another to see them), and
retention cannot take its rows away while it is referenced (the maps stay valid).
"""
from __future__ import annotations

from typing import Sequence


def dataset(url: str, topics: str | Sequence[str] | None = None, *,
            version: int | None = None, columns: Sequence[str] | None = None,
            storage_options: dict | None = None):
    """The messages of ``topics`` (a name, names, or None for every topic) in ``url``'s
    newest committed version (or ``version``) as a ``pyarrow.dataset.Dataset``."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from .log.reader import Snapshot
    snap = Snapshot.load(url, version=version, storage_options=storage_options)
    names = [topics] if isinstance(topics, str) else list(topics or snap.topic_names())
    tables = []
    for topic in names:
        conf = snap.topics().get(topic)
        if conf is None:
            from .errors import TopicNotFoundError
            raise TopicNotFoundError(f"topic {topic!r} does not exist in version "
                                     f"{snap.version} of {url}; topics: {snap.topic_names()}")
        for q in range(max(conf.read_queue_nums, conf.write_queue_nums)):
            lo, hi = snap.min_offset(topic, q), snap.max_offset(topic, q)
            if hi > lo:
                tables += list(snap.iter_tables(topic, q, lo, hi, columns=columns))
    if not tables:
        from .log.messagetable import select_schema
        return ds.dataset(select_schema(columns).empty_table())
    schema = tables[0].schema
    return ds.InMemoryDataset(pa.concat_tables(
        [t if t.schema == schema else t.cast(schema) for t in tables]))
