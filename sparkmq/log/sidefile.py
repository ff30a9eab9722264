"""The checksum of a side-table (Parquet) file's footer, format 2 (docs/FORMAT.md, "Side
table checksums").

Parquet's own page checksums (``write_page_checksum``) cover the data pages; nothing in
Parquet covers the footer (the file's metadata: schema, row groups, column offsets), and
pyarrow aborts the whole process on some damaged footers. So the writer puts a key-value
metadata entry ``sparkmq.checksum = crc32c:<8 hex>`` in the footer, whose CRC32C covers the
footer and the file's last 8 bytes except those 8 digits (the same rule as a segment's
batches, :mod:`sparkmq.log.checksum`), and every reader checks it before pyarrow parses the
footer. Files without the entry (format 1) are read unchecked.
"""
from __future__ import annotations

import struct
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa

from ..errors import DataLossError
from . import checksum
from .fs import StoreFS

MAGIC = b"PAR1"
ITEM = "Parquet footer"


def with_placeholder(table: pa.Table) -> pa.Table:
    """``table`` with the checksum placeholder in its schema metadata (written to the
    footer's key-value metadata)."""
    meta = dict(table.schema.metadata or {})
    meta[checksum.KEY.encode()] = checksum.PLACEHOLDER.encode()
    return table.replace_schema_metadata(meta)


def _footer_start(tail: bytes, size: int, where: str) -> int:
    """Where the footer of a ``size``-byte Parquet file starts, from its last 8 bytes."""
    if size < 12 or len(tail) != 8 or tail[4:] != MAGIC:
        raise checksum.corrupt(where, max(0, size - 4), "no Parquet magic at the end", ITEM)
    (footer_len,) = struct.unpack_from("<i", tail, 0)
    if footer_len <= 0 or footer_len > size - 12:
        raise checksum.corrupt(where, size - 8, f"footer length {footer_len} does not fit the "
                               f"{size}-byte file", ITEM)
    return size - 8 - footer_len


def seal(data: bytes) -> bytes:
    """A whole Parquet file written from :func:`with_placeholder`'s table, with its footer
    checksum filled in."""
    start = _footer_start(bytes(data[-8:]), len(data), "new side table")
    return bytes(data[:start]) + bytes(checksum.seal_region(memoryview(data)[start:]))


@contextmanager
def open_checked(sfs: StoreFS, rel: str) -> Iterator:
    """``sfs.open_input(rel)`` after checking the file's footer checksum (one read of the
    footer); raises :class:`CorruptStoreError` naming the file when it does not match."""
    with sfs.open_input(rel) as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - 8))
        start = _footer_start(f.read(8), size, rel)
        f.seek(start)
        checksum.verify_region(f.read(size - start), rel, start, ITEM)
        f.seek(0)
        yield f


@contextmanager
def open_listed(sfs: StoreFS, rel: str) -> Iterator:
    """:func:`open_checked` for a reader of a version that lists ``rel``: a file gone since
    (retention removed it in a newer version, and its deletion delay passed) is
    :class:`DataLossError` saying what to do, not a bare FileNotFoundError."""
    try:
        with open_checked(sfs, rel) as f:
            yield f
    except FileNotFoundError:
        raise DataLossError(
            f"side table {rel} of the version read was deleted after a newer version removed it "
            "(retention); read a newer version (refresh the reader). If this is the "
            f"newest version, the store is damaged: run 'sparkmq admin verify {sfs.url}'",
            earliest_offset=None) from None
