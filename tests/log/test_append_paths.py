"""One set of messages through the store's three append paths — ``Store.append`` with
``Message`` objects, ``append_batch`` of a table (casts, defaults) and ``append_batch``
of a batch already in SEGMENT_SCHEMA (no casts) — is refused with the same status or
stored as the same rows (hypothesis; fresh in-memory stores, one fixed clock). A fourth,
``BuiltRows`` (``log/built.py``: rows their caller checked, as the broker gives them),
stores every accepted set as the same rows too. Fast tier: no servers."""
from __future__ import annotations

import uuid

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.clock import Clock
from helpers.storetools import as_segment_batch
from sparkmq import Message, Store
from sparkmq.errors import SparkMQError
from sparkmq.log import format as fmt
from sparkmq.log.built import build_rows

T0_MS = 1_700_000_000_000
_TEXT = st.text(alphabet=st.sampled_from(list("ab |\t\u3000é")), max_size=5)
_OPTIONAL = ("tags", "message_group", "unique_key", "born_host", "born_timestamp",
             "delivery_timestamp")
_MESSAGE = st.fixed_dictionaries({
    "body": st.binary(max_size=12), "keys": st.lists(_TEXT, max_size=2),
    "properties": st.dictionaries(_TEXT, _TEXT, max_size=2),
    "queue_id": st.none() | st.integers(0, 2), "reconsume_times": st.none() | st.integers(0, 2),
    "message_type": st.sampled_from([None, fmt.MESSAGE_TYPE_NORMAL, fmt.MESSAGE_TYPE_FIFO, 7]),
    **{name: st.none() | _TEXT for name in _OPTIONAL[:4]},
    "born_timestamp": st.none() | st.integers(T0_MS - 10, T0_MS),
    "delivery_timestamp": st.none() | st.integers(T0_MS, T0_MS + 10)})


def _table(msgs: list[dict]) -> pa.Table:
    """The messages as a table of the segment schema's columns (no keys or properties:
    null, as a Message without them)."""
    def col(name: str, values: list) -> pa.Array:
        return pa.array(values, fmt.SEGMENT_SCHEMA.field(name).type) \
            if name not in ("born_timestamp", "delivery_timestamp") else \
            pa.array(values, pa.int64()).cast(fmt.TS)
    rows = {"topic": ["t"] * len(msgs), **{k: [m[k] for m in msgs] for k in msgs[0]}}
    rows["keys"] = [m["keys"] or None for m in msgs]
    rows["properties"] = [list(m["properties"].items()) or None for m in msgs]
    return pa.table({name: col(name, values) for name, values in rows.items()})


def _outcome(data_of) -> tuple:
    """(refusal status, None) or (None, the stored rows but their store-given ids)."""
    url = f"memory://sparkmq-paths-{uuid.uuid4().hex}"
    with Store.open(url, clock_ms=Clock(T0_MS + 5), start_services=False) as s:
        s.create_topic("t", read_queue_nums=3, write_queue_nums=3)
        try:
            data_of(s)
        except SparkMQError as e:
            return getattr(e, "status", type(e).__name__), None
        rows = []
        for q in range(3):
            for r in s.read_table("t", q, 0).to_pylist():
                rows.append({k: v for k, v in r.items()
                             if k not in ("physical_offset", "message_id")})
        return None, rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(_MESSAGE, min_size=1, max_size=3))
def test_the_three_append_paths_refuse_or_store_alike(msgs):
    defaults = ("reconsume_times", "message_type")        # a table's null: the default
    message_path = _outcome(lambda s: s.append([Message(topic="t", **{
        k: v for k, v in m.items() if v is not None or k not in defaults}) for m in msgs]))
    table = _table(msgs)
    table_path = _outcome(lambda s: s.append_batch(table))
    segment_path = _outcome(lambda s: s.append_batch(as_segment_batch(table.append_column(
        "store_host", pa.array([s.config.store_host] * len(msgs))))))   # (missing: null)
    assert _differences(table_path, segment_path) == []
    assert _differences(message_path, table_path) == []
    if table_path[0] is None:           # accepted: what a checking caller would build
        columns = {name: table.column(name).chunk(0) for name in table.schema.names}
        built_path = _outcome(lambda s: s.append_batch(build_rows(
            columns, len(msgs), store_host=s.config.store_host, now_ms=T0_MS + 5)))
        assert _differences(table_path, built_path) == []


def _differences(a: tuple, b: tuple) -> list:
    """What two outcomes disagree on: the refusal, the row count, or (row, column,
    one's value, the other's)."""
    if a[0] != b[0] or (a[1] is None) != (b[1] is None):
        return [("refusal", a[0], b[0])]
    if a[1] is None:
        return []
    if len(a[1]) != len(b[1]):
        return [("rows", len(a[1]), len(b[1]))]
    return [(i, k, x[k], y[k]) for i, (x, y) in enumerate(zip(a[1], b[1])) for k in x
            if x[k] != y[k]]
