"""The CRC32C checksum of every record batch message in a CommitLog segment (format 2).

Where it lives (docs/FORMAT.md, "Batch checksums"): in the Arrow IPC message's own
``custom_metadata``, key :data:`KEY`, value ``crc32c:`` + 8 lower-case hex digits. The
checksum covers the WHOLE encapsulated message (continuation marker, metadata length,
flatbuffer metadata and body) except those 8 digits. So a reader:

1. finds the value by its marker ``crc32c:`` inside the message's metadata bytes (no
   flatbuffer parsing, so damaged metadata cannot mislead or crash it);
2. checks the CRC over the message's bytes, whose length it takes from the header with
   bounds checks (``segment.message_extent``);
3. only then lets pyarrow parse the message.

Choosing the message's own metadata (not a column, not the side tables) means every writer
that serializes through :func:`seal` writes it, every copy of the bytes (a replica, a staged
segment adopted at commit) carries it, a reader needs no extra I/O to find it, and a plain
``pyarrow.ipc.open_stream`` still reads the file (it ignores the metadata).

CRC32C: the ``crc32c`` package (hardware CRC instructions where the CPU has them, ~10 GB/s,
and it reads any buffer without a copy).
"""
from __future__ import annotations

import struct

import crc32c

from ..errors import CorruptStoreError

KEY = "sparkmq.checksum"
MARK = b"crc32c:"
DIGITS = 8
PLACEHOLDER = MARK.decode() + "0" * DIGITS
CUSTOM_METADATA = {KEY: PLACEHOLDER}
_HEX = frozenset(b"0123456789abcdef")
#: how ``sparkmq._ipc.record_batch_message`` seals a message it writes: this key and
#: placeholder as the custom metadata, the placeholder's last 8 bytes filled with the CRC32C
#: of the whole message but them, where ``find_digits`` finds them (it checks that)
SEAL_ARGS = (KEY.encode(), PLACEHOLDER.encode(), crc32c.crc32c)
#: False skips the CRC comparison (bounds are still checked): only bench/bench_store.py sets
#: it, to measure what checking costs. Never turn it off to read a damaged store.
VERIFY = True

VERIFY_HINT = ("run `sparkmq admin verify <store>` to list every damaged file, then restore the "
               "file from a replica (or a backup) before reading it again")


def _readonly(view: memoryview) -> memoryview:
    return view if view.readonly else view.toreadonly()


def message_crc(msg: memoryview, digits_at: int) -> int:
    """CRC32C of ``msg`` (one whole IPC message) without its 8 checksum digits at
    ``digits_at``."""
    crc = crc32c.crc32c(msg[:digits_at])
    return crc32c.crc32c(msg[digits_at + DIGITS:], crc)


def find_digits(msg: memoryview) -> int | None:
    """Offset in ``msg`` (one IPC message) of the checksum's hex digits, searched in its
    metadata only, or None when the message carries no checksum."""
    if len(msg) < 8:
        return None
    (meta_len,) = struct.unpack_from("<i", msg, 4)
    return _find(msg, 8, 8 + max(0, meta_len))


def _find(view: memoryview, lo: int, hi: int) -> int | None:
    region = bytes(view[lo:hi])
    at = region.find(MARK)
    if at < 0 or at + len(MARK) + DIGITS > len(region):
        return None
    return lo + at + len(MARK)


def _fill(out, at: int | None):
    if at is None:
        raise ValueError("bytes were not written with the checksum placeholder")
    view = memoryview(out)
    if view.format != "B":                       # pyarrow buffers are signed bytes ("b")
        view = view.cast("B")
    crc = message_crc(_readonly(view), at)
    view[at:at + DIGITS] = b"%08x" % crc
    return out


def seal_in_place(message: memoryview) -> None:
    """Fill in the checksum digits of ``message`` (a writable view of one IPC message
    serialized with :data:`CUSTOM_METADATA`), without copying it."""
    _fill(message, find_digits(message))


def seal(message: bytes | memoryview) -> bytearray:
    """A copy of ``message`` (an IPC message serialized with :data:`CUSTOM_METADATA`) with
    its checksum digits filled in."""
    out = bytearray(message)
    return _fill(out, find_digits(memoryview(out)))


def seal_region(data: bytes | memoryview) -> bytearray:
    """A copy of ``data`` (any bytes holding the placeholder once, e.g. a Parquet footer)
    with its checksum digits filled in."""
    out = bytearray(data)
    return _fill(out, _find(memoryview(out), 0, len(out)))


def verify(msg, where: str, pos: int, item: str = "record batch") -> bool:
    """Check the checksum of the whole IPC message ``msg`` (buffer protocol), which starts
    at byte ``pos`` of file ``where``.

    Returns True when it matches, False when the message carries no checksum (the caller
    decides whether that is allowed: segments of format 1 have none). Raises
    :class:`CorruptStoreError` naming the file and position when it does not match.
    """
    if not VERIFY:
        return True
    view = _readonly(memoryview(msg))
    return _check(view, find_digits(view), where, pos, item)


def verify_region(data, where: str, pos: int, item: str) -> bool:
    """:func:`verify` for bytes whose placeholder may be anywhere in them (a Parquet
    footer written through :func:`seal_region`)."""
    view = _readonly(memoryview(data))
    return _check(view, _find(view, 0, len(view)), where, pos, item)


def _check(view: memoryview, at: int | None, where: str, pos: int, item: str) -> bool:
    if at is None:
        return False
    stored = bytes(view[at:at + DIGITS])
    if not _HEX.issuperset(stored):
        raise corrupt(where, pos, f"its checksum field holds {stored!r}, not hex digits", item)
    computed = message_crc(view, at)
    if int(stored, 16) != computed:
        raise corrupt(where, pos, f"CRC32C mismatch (stored {stored.decode()}, computed "
                                  f"{computed:08x})", item)
    return True


def corrupt(where: str, pos: int, what: str, item: str = "record batch") -> CorruptStoreError:
    """The error for a damaged record batch (or other ``item``): file, byte position, what
    is wrong, what to do."""
    return CorruptStoreError(f"{where}: {item} at byte {pos} is damaged: {what}; "
                             f"{VERIFY_HINT}")


class VerifiedBatches:
    """The batch messages a reader already verified, so a batch read again (a range read
    repeated, a consumer re-pulling) is not checksummed again: at most ``limit`` entries,
    oldest forgotten first. Keyed by (file, position, length, stored checksum), so bytes
    rewritten at the same place (a truncated and re-filled segment) are verified anew.
    Thread-safe enough for its use (a lost insert only costs one more check)."""

    def __init__(self, limit: int = 1 << 16):
        self.limit = limit
        self._seen: dict[tuple, None] = {}

    def check(self, msg, where: str, pos: int) -> bool:
        """:func:`verify` ``msg`` unless this very message was verified before."""
        view = _readonly(memoryview(msg))
        at = find_digits(view)
        key = (where, pos, len(view), bytes(view[at:at + DIGITS]) if at is not None else None)
        if key in self._seen:
            return True
        ok = verify(view, where, pos)
        if ok and VERIFY:
            self._seen[key] = None
            if len(self._seen) > self.limit:
                try:
                    del self._seen[next(iter(self._seen))]
                except (StopIteration, KeyError, RuntimeError):
                    pass
        return ok
