"""Arrow columns that the store, the broker and the clients all build the same way.

- :func:`constant_column`: ``n`` rows of one value (a batch's topic, host, type, the
  null optional fields), shared from a cache: Arrow arrays are immutable.
- :func:`fixed_width_strings`: strings of one width (message ids: 32 ASCII characters)
  as a string array from their joined bytes and fixed offsets, without converting value
  by value (``pa.array`` of a list of str takes ~3x as long).

Neutral ground: the log, the broker and the client (which may not import the log) use
these, so each rule is written once.
"""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

_CACHED_ROWS = 65_536


def constant_column(value, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` times ``value`` (None: nulls) as an Arrow array of ``type_``. Arrow arrays
    are immutable, so the columns that repeat from batch to batch (topic, hosts, type,
    the null optional fields: ~10 per batch, 1-4 us each to build) are shared; at most
    256 are kept, of at most 65,536 rows each."""
    return _constant(value, type_, n) if n <= _CACHED_ROWS else _build_constant(value, type_, n)


def _build_constant(value, type_: pa.DataType, n: int) -> pa.Array:
    return pa.nulls(n, type_) if value is None else pa.repeat(pa.scalar(value, type_), n)


_constant = functools.lru_cache(maxsize=256)(_build_constant)


def fixed_offsets(n: int, width: int) -> pa.Buffer:
    """The int32 offsets of ``n`` values of ``width`` bytes each (cached up to 1,024)."""
    return _offsets(n, width) if n <= 1024 else _build_offsets(n, width)


def _build_offsets(n: int, width: int) -> pa.Buffer:
    return pa.py_buffer(np.arange(0, width * n + 1, width, dtype=np.int32))


_offsets = functools.lru_cache(maxsize=64)(_build_offsets)


def fixed_width_strings(values: list[str], width: int) -> pa.Array:
    """``values`` as a string array: their bytes joined over :func:`fixed_offsets` where
    each is ``width`` ASCII characters, else by conversion."""
    n = len(values)
    data = "".join(values).encode()
    if len(data) != width * n or set(map(len, values)) != {width}:
        return pa.array(values, pa.string())
    return pa.StringArray.from_buffers(n, fixed_offsets(n, width), pa.py_buffer(data))
