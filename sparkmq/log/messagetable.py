"""A read's message table: the stored rows of a step with the three columns that live
outside the segment (``queue_offset``, ``physical_offset``, ``message_id``) inserted after
``topic`` and ``queue_id``, in MESSAGE_SCHEMA (``MessageReader.read_table``'s tables).

Two ways to the same table, as the tests hold them: in pyarrow from the stored table
(:func:`message_table`), or, for contiguous rows of one batch the CommitLog's cache still
holds composed (a long poll's read of what a put just cached), in one C call and one
import (:func:`composed_message_table`, ``_compose.view``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from ..arrowcols import fixed_offsets
from . import format as fmt
from .built import composed_view
from .consumequeue import EntryArrays
from .message import message_id_array, row_id_data

#: Columns of a message table, in order.
MESSAGE_COLUMNS = ["topic", "queue_id", "queue_offset", "physical_offset", "message_id",
                   *[f.name for f in fmt.SEGMENT_SCHEMA if f.name not in ("topic", "queue_id")]]


def message_schema() -> pa.Schema:
    fields = {f.name: f for f in fmt.SEGMENT_SCHEMA}
    fields["queue_offset"] = fmt.QUEUE_OFFSET
    fields["physical_offset"] = fmt.PHYSICAL_OFFSET
    fields["message_id"] = fmt.MESSAGE_ID
    return pa.schema([fields[n] for n in MESSAGE_COLUMNS])


MESSAGE_SCHEMA = message_schema()
# the columns a read computes, inserted after topic and queue_id (SEGMENT_SCHEMA's first two)
COMPUTED_COLUMNS = MESSAGE_COLUMNS[2:5]
assert COMPUTED_COLUMNS == ["queue_offset", "physical_offset", "message_id"]
assert fmt.SEGMENT_SCHEMA.names[:2] == MESSAGE_COLUMNS[:2]
# (their fields taken once: pyarrow wraps a field anew, ~1-2 us, at each ``field()``)
_COMPUTED = tuple(enumerate(((n, MESSAGE_SCHEMA.field(n)) for n in COMPUTED_COLUMNS), 2))
# ``_compose.view``'s slots: each message column from the stored batch's column, or the
# computed values (-1 - j: COMPUTED_COLUMNS[j])
_VIEW_SLOTS = tuple(-1 - COMPUTED_COLUMNS.index(n) if n in COMPUTED_COLUMNS
                    else fmt.SEGMENT_SCHEMA.names.index(n) for n in MESSAGE_COLUMNS)


def select_schema(columns: Sequence[str] | None) -> pa.Schema:
    """The schema of a message table of ``columns`` (None: every column)."""
    if not columns:
        return MESSAGE_SCHEMA
    return pa.schema([MESSAGE_SCHEMA.field(c) for c in columns])


def message_table(stored: pa.Table, qos: np.ndarray, bos: np.ndarray, rows: np.ndarray,
                  tag: int | np.ndarray, columns: Sequence[str] | None) -> pa.Table:
    """``stored`` (SEGMENT_SCHEMA rows at batch offsets ``bos``, rows ``rows``, queue
    offsets ``qos``; ids tagged ``tag``, or each row's: ``IdTags.of``) as a message table
    of ``columns`` (None: every column); the computed columns one array each for all rows."""
    computed = {"queue_offset": lambda: pa.array(qos, pa.int64()),
                "physical_offset": lambda: pa.array(bos + rows.astype(np.int64), pa.int64()),
                "message_id": lambda: message_id_array(tag, bos, rows)}
    if not columns:     # every column: the stored ones, the 3 computed inserted (4 calls,
        # not one per column: a long poll's one message costs ~40% less)
        for i, (name, field) in _COMPUTED:
            stored = stored.add_column(i, field, computed[name]())
        return stored.replace_schema_metadata(None)
    arrays = [pa.chunked_array([computed[c]()]) if c in computed else stored.column(c)
              for c in columns]
    return pa.Table.from_arrays(arrays, schema=select_schema(columns))


def composed_message_table(cached, entries: EntryArrays, tag: int) -> pa.Table | None:
    """The whole message table of ``entries`` where they are contiguous rows of one batch
    and ``cached`` (what the CommitLog's cache holds for it) is that batch still composed:
    ``_compose.view`` over its C struct and one import, not the batch's import, a slice, a
    table, three arrays and three inserts. None otherwise (then :func:`message_table`)."""
    runs = entries.runs()
    if runs is None or len(runs) != 1:
        return None
    (batch_offset, first, n), = runs
    bos, rows = entries.batch_offsets, entries.rows
    ids = row_id_data(tag, batch_offset, first, n)
    if ids is None:
        return None
    values = ((np.ascontiguousarray(entries.queue_offsets, np.int64),),
              (bos + rows.astype(np.int64),), (fixed_offsets(n, 32), ids))
    batch = composed_view(cached, first, n, _VIEW_SLOTS, values, MESSAGE_SCHEMA)
    return None if batch is None else pa.Table.from_batches([batch])
