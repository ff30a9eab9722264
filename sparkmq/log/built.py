"""Rows a caller checked, built by the log's one builder: the store appends them without
checking again what was checked, and stamps their store time in place.

The broker holds a producer's rows to every rule before it stores them (the send batch
valid Arrow in full, every row with a topic, every body present and within
maxMessageSize, the input limits: ``broker/batchsend.py``). :func:`build_rows` builds
them in SEGMENT_SCHEMA with :func:`~sparkmq.log.batch.build_segment_batch` and returns
:class:`BuiltRows`: the batch, each row's body bytes (what the check measured, reused
by the store's dispatch and the broker's counts), and the batch's ``store_timestamp``
in a buffer of its own. ``Store.append_batch`` takes BuiltRows as that receipt: it does
not validate the Arrow data, measure or check the bodies, or check the limits again
(the topic, its queues and the store's state it still checks, as for any batch), and
under its append lock it writes the store time into that buffer instead of building a
new column and a new batch.

Only :func:`build_rows` and :meth:`BuiltRows.concat` make BuiltRows; a caller who has not
checked the columns gives ``append_batch`` a plain record batch, which the store stamps
with :func:`stamp_store_time` (a new column).
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from ..arrowcols import constant_column
from . import format as fmt
from .batch import build_segment_batch, shared_defaults, time_column, time_values
from .dispatch import binary_lengths

try:
    from .. import _ipc
except ImportError:     # not built here (no C compiler): each export takes the schema too
    _ipc = None
try:
    from .. import _compose
except ImportError:     # not built here: every segment batch is built in pyarrow
    _compose = None

_SCHEMA_CAPSULE = fmt.SEGMENT_SCHEMA.__arrow_c_schema__()
_STORE_AT = fmt.SEGMENT_SCHEMA.get_field_index("store_timestamp")
_STORE_FIELD = fmt.SEGMENT_SCHEMA.field(_STORE_AT)
_BORN_AT = fmt.SEGMENT_SCHEMA.get_field_index("born_timestamp")
_QUEUE_AT = fmt.SEGMENT_SCHEMA.get_field_index("queue_id")
_IMPORTING = threading.Lock()     # a composed batch is imported into pyarrow once
_TEMPLATE_ROWS = 1024             # (a longer batch is built in pyarrow)


class BuiltRows:
    """A batch in SEGMENT_SCHEMA whose columns were checked (see the module docstring),
    ``body_sizes`` its rows' body bytes (int32), ``times`` its store_timestamp values
    (int64 ms, a view of the column's own buffer, which ``stamp`` writes), ``topic``
    every row's topic if they have one (else None), ``queue`` likewise their queue id,
    ``given`` the columns the builder took from the caller (the others hold the schema's
    defaults: what the store need not look at). Its length: rows.

    Rows made by :func:`composed_rows` hold their batch as an Arrow C struct
    (``sparkmq._compose``) until ``batch`` is first read: the limit screen and the IPC
    writer read the struct (``c_array``), so a put that needs nothing else never builds
    the pyarrow batch; the CommitLog's cache keeps the rows, read as a batch later."""
    __slots__ = ("_batch", "_import", "num_rows", "body_sizes", "topic", "queue",
                 "given", "composed", "_buf", "_c_array", "_extent")

    def __init__(self, batch: pa.RecordBatch | None, body_sizes: np.ndarray, times: bytearray,
                 *, topic: str | None, queue: int | None, given: frozenset,
                 composed: tuple | None = None,
                 body_extent: tuple[int, int, int] | None = None):
        self._batch, self.body_sizes, self.topic, self.given = batch, body_sizes, topic, given
        self._extent = body_extent
        self.queue = queue
        self._buf = times
        self._c_array = self._import = None
        self.composed = composed is not None      # (made in C: ``composed_rows``)
        if composed is not None:         # (import capsule, its address, the kept capsule)
            self._import, self._c_array = composed[:2], (_SCHEMA_CAPSULE, composed[2])
        self.num_rows = len(times) >> 3

    def __len__(self) -> int:
        return self.num_rows

    @property
    def batch(self) -> pa.RecordBatch:
        """The rows as a record batch in SEGMENT_SCHEMA (composed rows: imported from
        their C struct the first time, by one thread)."""
        if self._batch is None:
            with _IMPORTING:
                if self._batch is None:
                    self._batch = pa.RecordBatch._import_from_c(self._import[1],
                                                                fmt.SEGMENT_SCHEMA)
                    self._import = None
        return self._batch

    def c_array(self) -> tuple:
        """The batch's ``__arrow_c_array__()``, exported once for the limit screen and the
        IPC writer both (neither moves it): SEGMENT_SCHEMA's export made once for all, and
        the batch's arrays (~35 k instructions; the schema's took ~27 k more). It points at
        the batch's buffers, so it reads the store time stamped in place later."""
        if self._c_array is None:
            self._c_array = _export(self.batch)
        return self._c_array

    @property
    def nbytes(self) -> int:
        """The rows' body bytes."""
        return self.body_extent[2]

    @property
    def body_extent(self) -> tuple[int, int, int]:
        """(least, greatest, total) bytes of the rows' bodies: as measured with the sizes
        (``dispatch.measured_bodies``), else found here (a numpy reduction costs ~10 k
        instructions even of one row: a few rows are summed in Python)."""
        if self._extent is None:
            s = self.body_sizes
            if len(s) <= 16:
                v = s.tolist()
                self._extent = (min(v, default=0), max(v, default=0), sum(v))
            else:
                self._extent = (int(np.minimum.reduce(s)), int(np.maximum.reduce(s)),
                                int(np.add.reduce(s)))
        return self._extent

    @property
    def times(self) -> np.ndarray:
        return np.frombuffer(self._buf, np.int64)

    def stamp(self, ts_ms: int) -> np.ndarray:
        """Set every row's store time to ``ts_ms`` (in place: the batch's column reads
        it); the store times as int64 ms, what dispatch keeps: an array over bytes of its
        own, not a view of the column's buffer. (A view of a bytearray holds a memoryview,
        which the cyclic collector tracks, with its buffer: two tracked objects for each
        ConsumeQueue chunk kept, which made a full pass of the collector over a broker
        that had taken 80,000 sends take 167-193 ms, GIL held: bench/bench_gc.py.)"""
        values = time_values(ts_ms, self.num_rows)
        self._buf[:] = values
        return np.frombuffer(values, np.int64)

    @staticmethod
    def concat(parts: list["BuiltRows"]) -> "BuiltRows":
        """Several BuiltRows as one (rows in order), with a store-time buffer of its own."""
        batch = pa.concat_batches([p.batch for p in parts])
        times, column = _own_times(0, batch.num_rows)
        topics, queues = {p.topic for p in parts}, {p.queue for p in parts}
        return BuiltRows(batch.set_column(_STORE_AT, _STORE_FIELD, column),
                         np.concatenate([p.body_sizes for p in parts]), times,
                         topic=topics.pop() if len(topics) == 1 else None,
                         queue=queues.pop() if len(queues) == 1 else None,
                         given=frozenset().union(*(p.given for p in parts)))


def stamp_store_time(batch: pa.RecordBatch, ts_ms: int) -> tuple[pa.RecordBatch, np.ndarray]:
    """``batch`` (any rows, not BuiltRows) with every row's store_timestamp set to ``ts_ms``,
    and that column as int64 ms (what dispatch keeps): a new column, a new batch."""
    ts = np.full(batch.num_rows, ts_ms, np.int64)
    return batch.set_column(_STORE_AT, _STORE_FIELD, fmt.ts_array(ts)), ts


def build_rows(columns: Mapping[str, Sequence | pa.Array], n: int, *, store_host: str,
               now_ms: int, body_sizes: np.ndarray | None = None,
               topic: str | None = None, queue: int | None = None,
               body_extent: tuple[int, int, int] | None = None) -> BuiltRows:
    """:func:`build_segment_batch` of ``columns`` (which must not give ``store_timestamp``)
    as BuiltRows, the defaults FORMAT.md requires filled (``fill_required``, born time
    ``now_ms``). The caller vouches for what the module docstring lists; ``body_sizes``:
    the bytes of each row's body if it measured them (else measured here), and
    ``body_extent`` their (least, greatest, total) if it has them; ``topic``, ``queue``:
    every row's topic and queue id, if the caller knows they share one."""
    if "store_timestamp" in columns:
        raise ValueError("build_rows stamps store_timestamp itself (the store's time)")
    times, column = _own_times(now_ms, n)
    given: set = set()
    batch = build_segment_batch({**columns, "store_timestamp": column}, n,
                                store_host=store_host, now_ms=now_ms, given=given)
    given.discard("store_timestamp")
    if any(_has_nulls(columns[name]) for name in given & fmt.FILLED_COLUMNS):
        batch = fmt.fill_required(batch, lambda: now_ms)   # (the defaults are not null)
    if body_sizes is None:
        body_sizes = binary_lengths(batch.column(2))      # (SEGMENT_SCHEMA: body 2)
    return BuiltRows(batch, body_sizes, times, topic=topic, queue=queue,
                     given=frozenset(given), body_extent=body_extent)


class Exported(NamedTuple):
    """A record batch exported to the Arrow C data interface, as ``composed_rows`` takes
    it: its column ``names``, its ``schema`` ("arrow_schema" capsule, only read) and its
    ``array`` ("arrow_array" capsule, moved out where composed). What a plain RocketMQ
    request's columns are without a pyarrow object (``broker/plainsend.py``)."""
    names: tuple
    schema: object
    array: object


def composed_rows(source: "pa.RecordBatch | Exported", columns: Iterable[str],
                  n: int, *, store_host: str, now_ms: int, body_sizes: np.ndarray,
                  topic: str, queue: int,
                  body_extent: tuple[int, int, int] | None = None) -> BuiltRows | None:
    """:func:`build_rows` of ``source``'s columns named ``columns``, every row of topic
    ``topic`` and queue ``queue``, composed in C (``sparkmq._compose``) instead of built
    in pyarrow: the same rows, as the tests hold the two. Each column is in its
    SEGMENT_SCHEMA type (the C code compares the types), and none is ``queue_id`` (every
    row's is ``queue``); the others are the schema's defaults. None where they are not
    composed (the module not built, more than 1,024 rows, a born time to fill, a column
    the C code refuses): then call :func:`build_rows`."""
    if _compose is None or _ipc is None or not 0 < n <= _TEMPLATE_ROWS:
        return None
    if type(source) is Exported:
        names, schema, capsule = source
    else:                                        # (exported below, if it is planned)
        names, schema, capsule = tuple(source.schema.names), None, None
    plan = _plan(names, tuple(columns))
    if plan is None:
        return None
    slots, given = plan
    born_values = time_values(now_ms, n)
    times = bytearray(born_values)              # (the store's: stamped in place later)
    queues = queue.to_bytes(4, sys.byteorder, signed=True) * n
    if capsule is None:
        schema = source.schema.__arrow_c_schema__()
        capsule, address = _ipc.array_capsule()
        source._export_to_c(address)
    composed = _compose.compose(_template(store_host), capsule, schema, _SCHEMA_CAPSULE,
                                slots, (times, born_values, queues))
    if composed is None:
        return None
    return BuiltRows(None, body_sizes, times, topic=topic, queue=queue, given=given,
                     composed=composed, body_extent=body_extent)


def composed_view(rows, first: int, k: int, slots: tuple, values: tuple,
                  schema: pa.Schema) -> pa.RecordBatch | None:
    """Rows ``first..first+k-1`` of ``rows`` (a BuiltRows still composed) with ``values``
    columns inserted as ``slots`` says (``_compose.view``: the same buffers, no pyarrow
    call but the import), a record batch of ``schema``; None where ``rows`` are not a
    composed batch (whether or not it was read as a batch since, its struct is kept), or
    the columns do not fit (then build it in pyarrow: the same batch, as the tests hold
    them). A read of a batch the put just cached (a long poll's) imported the batch,
    sliced, tabled and inserted: eight calls."""
    if _compose is None or not isinstance(rows, BuiltRows) or not rows.composed:
        return None
    made = _compose.view(rows.c_array()[1], first, k, slots, values)
    if made is None:
        return None
    capsule, address = made          # (the capsule frees the moved-out struct)
    return pa.RecordBatch._import_from_c(address, schema)


def _kind(t: pa.DataType) -> str:
    """``_compose.values``' letter for a SEGMENT_SCHEMA column's type."""
    if pa.types.is_map(t):
        return "m"
    if pa.types.is_list(t):
        return "l"
    return {pa.string(): "s", pa.binary(): "b", pa.int8(): "c", pa.int32(): "i",
            pa.int64(): "t"}.get(t, "t" if pa.types.is_timestamp(t) else "?")


_KINDS = "".join(_kind(f.type) for f in fmt.SEGMENT_FIELDS).encode()
_NAMES = tuple(f.name for f in fmt.SEGMENT_FIELDS)
assert b"?" not in _KINDS, "a SEGMENT_SCHEMA type _compose.values does not read"


def composed_values(runs: Sequence[tuple["BuiltRows", int, int]]) -> dict[str, list] | None:
    """The rows of ``runs`` (each ``(rows, first, k)``: rows ``first..first+k-1`` of a
    BuiltRows still composed), one run after the other, as Python values: SEGMENT_SCHEMA
    column name -> its list (a column all null in every run's batch left out), as
    ``message.column_values`` reads a table (``_compose.values``: one C pass, not each
    batch's import, a table of them and sixteen conversions). None where a run is not of
    a composed batch or a column does not fit (then read the batches in pyarrow: the
    same values, as the tests hold them)."""
    if _compose is None or not all(isinstance(rows, BuiltRows) and rows.composed
                                   for rows, _, _ in runs):
        return None
    cols = _compose.values(tuple((rows.c_array()[1], first, k) for rows, first, k in runs),
                           _KINDS)
    return None if cols is None else \
        {name: col for name, col in zip(_NAMES, cols) if col is not None}


@functools.lru_cache(maxsize=64)
def _plan(names: tuple[str, ...], taken: tuple[str, ...]) -> tuple | None:
    """(``_compose.compose``'s slots, the BuiltRows' ``given``) of the source's columns
    ``taken`` (a name not in ``names``, or a store time or queue column: None): each
    SEGMENT_SCHEMA column from the source's column of its name where taken, the store
    time from the first values, the born time from the second where not taken, the queue
    id from the third, else the template."""
    if not set(taken) <= set(names) or {"store_timestamp", "queue_id"} & set(taken):
        return None
    at = {name: names.index(name) for name in taken}
    return tuple(at[f.name] if f.name in at else -2 if i == _STORE_AT else
                 -3 if i == _BORN_AT else -4 if i == _QUEUE_AT else -1
                 for i, f in enumerate(fmt.SEGMENT_FIELDS)), frozenset(taken) | {"queue_id"}


@functools.lru_cache(maxsize=8)
def _template(store_host: str):
    """The exported arrays ("arrow_array" capsule) of a batch of 1,024 rows holding
    SEGMENT_SCHEMA's defaults (:func:`build_segment_batch`'s shared columns), of which a
    composed batch of n rows takes the first n of each column it takes from neither its
    source nor its values (the queue and time columns here are placeholders)."""
    n = _TEMPLATE_ROWS
    cols = list(shared_defaults(n, store_host))
    cols[_QUEUE_AT] = constant_column(0, pa.int32(), n)
    cols[_STORE_AT] = cols[_BORN_AT] = time_column(time_values(0, n), n)
    return _export(pa.RecordBatch.from_arrays(cols, schema=fmt.SEGMENT_SCHEMA))[1]


def _has_nulls(values) -> bool:
    return values.null_count > 0 if isinstance(values, (pa.Array, pa.ChunkedArray)) else \
        None in values


def _export(batch: pa.RecordBatch) -> tuple:
    """(schema capsule, array capsule) of a batch in SEGMENT_SCHEMA, as
    ``__arrow_c_array__`` gives them, the schema's exported once at import."""
    if _ipc is None:
        return batch.__arrow_c_array__()
    capsule, address = _ipc.array_capsule()
    batch._export_to_c(address)      # (pyarrow's export of the arrays alone, as pyarrow.cffi)
    return _SCHEMA_CAPSULE, capsule


def _own_times(ms: int, n: int) -> tuple[bytearray, pa.Array]:
    """``n`` store times ``ms`` in a new writable buffer: (the buffer, the column)."""
    buf = bytearray(time_values(ms, n))
    return buf, time_column(buf, n)
