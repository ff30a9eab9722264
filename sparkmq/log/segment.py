"""One CommitLog segment: an Arrow IPC stream file of message record batches.

On-disk layout (docs/FORMAT.md, "Segments")::

    [schema message][batch message][batch message]...[end-of-stream marker]?

Each message is Arrow's encapsulated IPC message: ``0xFFFFFFFF``, an int32
metadata length ``L``, ``L`` bytes of flatbuffer metadata (padded to 8), then
the body. A whole file is readable by ``pyarrow.ipc.open_stream``. The physical
offset of a batch is the segment's base offset plus the batch's byte position
in the file. A sealed segment may end with the 8-byte end-of-stream marker.

After a crash the file may end in a torn batch (a prefix of a message, or
zeros). :func:`scan` walks the framing and finds the end of the last whole
batch; recovery truncates the file there.

Thread-safety: ``SegmentWriter`` is not thread-safe (the CommitLog serializes
appends); readers are stateless functions over immutable buffers.
"""
from __future__ import annotations

import errno
import logging
import os
import struct
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from ..durable import makedirs_durably, sync_folder
from ..errors import CorruptStoreError
from . import checksum
from . import format as fmt
from .fs import StoreFS, preallocate, start_writeback

try:
    from .. import _ipc
except ImportError:     # not built here (no C compiler): pyarrow writes every message
    _ipc = None

log = logging.getLogger("sparkmq.store")

CONTINUATION = 0xFFFFFFFF
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"
SCHEMA_BYTES = fmt.SEGMENT_SCHEMA.serialize().to_pybytes()
HEADER_SIZE = len(SCHEMA_BYTES)
_IPC_OPTIONS = pa.ipc.IpcWriteOptions()
_CHECKSUM_METADATA = pa.KeyValueMetadata(checksum.CUSTOM_METADATA)   # (a dict: converted per call)


def serialize_batch(batch, c_array: tuple | None = None) -> pa.Buffer:
    """:func:`message_bytes` as a pyarrow Buffer."""
    data = message_bytes(batch, c_array)
    return data if isinstance(data, pa.Buffer) else pa.py_buffer(data)


def message_bytes(batch, c_array: tuple | None = None) -> "bytearray | pa.Buffer":
    """The encapsulated IPC message of ``batch`` (the bytes appended to a segment), with its
    CRC32C checksum in the message's custom metadata (:mod:`sparkmq.log.checksum`).

    Written and sealed in one C call (``sparkmq._ipc``: the same bytes to a reader, one call
    instead of ~10 pyarrow and Python steps) where that module was built and lays the batch
    out; else by pyarrow's stream writer. ``batch``: a record batch or BuiltRows
    (``log/built.py``); ``c_array``: its ``__arrow_c_array__()`` if the caller exported it
    already. The C call's bytearray where it wrote them (a Buffer of them would cost a
    pyarrow object an append, which needs only their length and their buffer), else a
    Buffer."""
    if _ipc is not None:
        out = _ipc.record_batch_message(*(c_array or batch.__arrow_c_array__()),
                                        *checksum.SEAL_ARGS)
        if out is not None:
            return out
    batch = fmt.record_batch(batch)
    sink = pa.BufferOutputStream()
    # explicit options: new_stream without them reads two environment variables a call
    writer = pa.ipc.RecordBatchStreamWriter(sink, batch.schema, options=_IPC_OPTIONS)
    writer.write_batch(batch, custom_metadata=_CHECKSUM_METADATA)
    stream = sink.getvalue()                       # a mutable buffer: sealed in place
    start = 8 + struct.unpack_from("<i", stream, 4)[0]     # the schema message: no body
    checksum.seal_in_place(memoryview(stream)[start:])
    return stream.slice(start)


def segment_format(header) -> int | None:
    """The format version a segment's schema message declares (its ``sparkmq.format``
    metadata): 2 for segments whose batches carry checksums, 1 for older ones; None when
    ``header`` (the segment's first bytes, buffer protocol) does not start with a segment
    schema of a known version."""
    if bytes(memoryview(header)[:HEADER_SIZE]) == SCHEMA_BYTES:
        return fmt.FORMAT_VERSION
    buf = header if isinstance(header, pa.Buffer) else pa.py_buffer(bytes(header))
    n = header_length(buf)
    if not n:
        return None
    meta = pa.ipc.read_schema(buf.slice(0, n)).metadata or {}
    try:
        version = int(meta.get(b"sparkmq.format", b"1"))
    except ValueError:
        return None
    return version if version in (1, fmt.FORMAT_VERSION) else None


def checked_length(buf, pos: int, where: str) -> int:
    """Length of the whole record batch message at byte ``pos`` of ``buf``, from its header
    with every offset and length checked against ``buf`` (nothing trusted, no pyarrow)."""
    n = message_extent(buf, pos)
    if n is None or n == NOT_A_MESSAGE or n == 0 or pos < 0 or pos + n > len(buf):
        raise checksum.corrupt(where, pos, "no whole record batch message there "
                               f"(header says {n} bytes, the file has {len(buf) - pos} left)")
    return n


def verify_message(msg, where: str, pos: int, legacy,
                   verified: checksum.VerifiedBatches | None = None) -> None:
    """Check the checksum of the whole message ``msg`` found at byte ``pos`` of ``where``
    (unless ``verified`` remembers it checked); ``legacy()`` tells whether the segment is
    of format 1 (whose batches have none). Raises :class:`CorruptStoreError` when the
    bytes are damaged."""
    ok = verified.check(msg, where, pos) if verified is not None else \
        checksum.verify(msg, where, pos)
    if not ok and not legacy():
        raise checksum.corrupt(where, pos, "its checksum is missing (format 2 segments "
                               "checksum every batch)")


def decode_message(msg: pa.Buffer, where: str, pos: int) -> pa.RecordBatch:
    """Decode one whole, verified IPC message into a record batch (zero copy)."""
    try:
        return pa.ipc.read_record_batch(pa.ipc.read_message(msg), fmt.SEGMENT_SCHEMA)
    except (pa.ArrowInvalid, OSError, IndexError, EOFError) as exc:
        raise checksum.corrupt(where, pos, str(exc)) from exc


def read_batch_at(buf: pa.Buffer, pos: int, where: str = "segment", *,
                  legacy: bool | None = None,
                  verified: checksum.VerifiedBatches | None = None) -> pa.RecordBatch:
    """Decode the record batch whose message starts at byte ``pos`` of ``buf`` (a whole
    segment, zero copy), after checking its bounds and its checksum. ``where`` names the
    file in errors; ``legacy`` says whether ``buf`` is a format-1 segment (None: read it
    from ``buf``'s schema message); ``verified``: the reader's memory of batches already
    checked. Raises :class:`CorruptStoreError` on damage."""
    n = checked_length(buf, pos, where)
    msg = buf.slice(pos, n)
    verify_message(msg, where, pos,
                   lambda: segment_format(buf) == 1 if legacy is None else legacy, verified)
    return decode_message(msg, where, pos)


def read_remote_batch(sfs: StoreFS, rel: str, pos: int) -> tuple[pa.RecordBatch, int]:
    """The record batch at byte ``pos`` of segment ``rel`` on a non-local backend and the
    byte length of its message, fetching only that message (ranged reads through the
    backend's file object), not the whole segment; checked like :func:`read_batch_at`."""
    with sfs.open_input(rel) as f:
        f.seek(pos)
        data = f.read(8)
        if len(data) == 8:
            data += f.read(max(0, struct.unpack_from("<i", data, 4)[0]))
        n = message_extent(data, 0)
        if n is not None and n > len(data):
            data += f.read(n - len(data))
        if n is None or n == NOT_A_MESSAGE or n == 0 or n > len(data):
            raise checksum.corrupt(rel, pos, "no whole record batch message there")

        def legacy() -> bool:
            f.seek(0)
            return segment_format(f.read(HEADER_SIZE)) == 1

        msg = pa.py_buffer(data[:n])
        verify_message(msg, rel, pos, legacy)
        return decode_message(msg, rel, pos), n


def message_length(buf: pa.Buffer | bytes, pos: int) -> int | None:
    """Byte length of the whole IPC message at ``pos``, or None if it is torn or absent.

    Returns 0 for an end-of-stream marker.
    """
    size = len(buf)
    if pos + 8 > size:
        return None
    cont, meta_len = struct.unpack_from("<Ii", buf, pos)
    if cont != CONTINUATION:
        return None
    if meta_len == 0:
        return 0
    if meta_len < 0 or pos + 8 + meta_len > size:
        return None
    try:
        view = buf.slice(pos, size - pos) if isinstance(buf, pa.Buffer) else pa.py_buffer(buf)[pos:]
        msg = pa.ipc.read_message(view)
    except (pa.ArrowInvalid, OSError):
        return None
    total = 8 + meta_len + msg.body.size
    if pos + total > size:
        return None
    return total


NOT_A_MESSAGE = -1


def message_extent(buf, pos: int) -> int | None:
    """Byte length of the IPC message starting at ``pos``, from its header alone
    (prefix and flatbuffer metadata; the body need not be in ``buf``).

    Returns 0 for an end-of-stream marker, None when ``buf`` ends inside the
    header, :data:`NOT_A_MESSAGE` when the bytes are not a message header. For
    a replica that walks message boundaries in a stream of received bytes
    without decoding the batches (see ``message_length`` for a whole message).
    ``buf``: any object with the buffer protocol.
    """
    size = len(buf)
    if pos + 8 > size:
        return None
    cont, meta_len = struct.unpack_from("<Ii", buf, pos)
    if cont != CONTINUATION or meta_len < 0:
        return NOT_A_MESSAGE
    if meta_len == 0:
        return 0
    m = pos + 8
    if m + meta_len > size:
        return None
    # flatbuffer Message table: field 3 is bodyLength (int64), absent = 0
    end = m + meta_len
    if meta_len < 8:
        return NOT_A_MESSAGE
    (root,) = struct.unpack_from("<I", buf, m)
    table = m + root
    if table + 4 > end:
        return NOT_A_MESSAGE
    (vt_back,) = struct.unpack_from("<i", buf, table)
    vtable = table - vt_back
    if vtable < m or vtable + 4 > end:
        return NOT_A_MESSAGE
    (vt_size,) = struct.unpack_from("<H", buf, vtable)
    body = 0
    if vt_size >= 12:
        (field,) = struct.unpack_from("<H", buf, vtable + 10)
        if field:
            if table + field + 8 > end:
                return NOT_A_MESSAGE
            (body,) = struct.unpack_from("<q", buf, table + field)
    if body < 0:
        return NOT_A_MESSAGE
    return 8 + meta_len + body


@dataclass(frozen=True)
class ScanResult:
    """What :func:`scan` found: positions of whole batches and where valid bytes end."""

    positions: list[int]
    lengths: list[int]
    valid_end: int       # end of the last whole batch (where a torn tail is cut)
    sealed: bool         # the stream ended with an end-of-stream marker


def header_length(buf: pa.Buffer) -> int:
    """Length of the segment's schema message, or 0 if it does not start with one.

    The schema is compared decoded, not byte for byte, so a segment written by
    another pyarrow version (which may serialize the same schema differently)
    is still recognised.
    """
    if len(buf) >= HEADER_SIZE and buf.slice(0, HEADER_SIZE).to_pybytes() == SCHEMA_BYTES:
        return HEADER_SIZE
    n = message_length(buf, 0)
    if not n:
        return 0
    try:
        schema = pa.ipc.read_schema(buf.slice(0, n))
    except (pa.ArrowInvalid, OSError, EOFError):
        return 0
    return n if schema.equals(fmt.SEGMENT_SCHEMA, check_metadata=False) else 0


def scan(buf: pa.Buffer, start: int = HEADER_SIZE, *, validate: bool = False) -> ScanResult:
    """Walk the messages of a segment from ``start``; stop at the first torn one.

    With ``validate`` each batch is also decoded and fully validated, so a
    message whose framing is whole but whose bytes are not (zeros, garbage)
    ends the valid prefix too. A file without a valid schema message scans as
    empty (``valid_end`` 0).
    """
    header = header_length(buf)
    if header == 0:
        return ScanResult([], [], 0, False)
    positions: list[int] = []
    lengths: list[int] = []
    pos = max(start, header)
    sealed = False
    while True:
        n = message_length(buf, pos)
        if n is None:
            break
        if n == 0:
            sealed = True
            break
        if validate:
            try:
                batch = read_batch_at(buf, pos)
                batch.validate(full=True)
            except (CorruptStoreError, pa.ArrowInvalid):
                break
        positions.append(pos)
        lengths.append(n)
        pos += n
    return ScanResult(positions, lengths, pos, sealed)


def iter_batches(buf: pa.Buffer, start: int, end: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(position, batch) for each whole batch in ``[start, end)``."""
    pos = start
    while pos < end:
        n = message_length(buf, pos)
        if not n:
            break
        yield pos, read_batch_at(buf, pos)
        pos += n


class SegmentWriter:
    """Appends serialized batches to one segment file.

    Local disks: an ``O_APPEND`` file descriptor, ``fsync`` on flush; with ``reserve``
    (bytes), the blocks ahead of the end are allocated that many at a time
    (:func:`~sparkmq.log.fs.preallocate`, the size unchanged) and given back at close,
    as RocketMQ maps its CommitLog files whole. Other fsspec backends (no append on
    object stores): the segment's bytes are
    kept in memory and the whole object is re-put at each flush, so use small
    segments there. Not thread-safe.
    """

    def __init__(self, sfs: StoreFS, rel_path: str, base_offset: int, *, create: bool,
                 reserve: int = 0):
        self.sfs = sfs
        self._reserve = reserve     # bytes allocated ahead at a time (0: none)
        self._reserved = 0          # the file's blocks are allocated up to here
        self.rel_path = rel_path
        self.base_offset = base_offset
        self._fd: int | None = None
        self._splice_fd: int | None = None
        self._torn = False      # a failed append left bytes past ``size``: cut before the next
        self._buffer: bytearray | None = None
        if sfs.is_local:
            try:
                self._open_local(create)
            except (FileNotFoundError, FileExistsError):
                raise
            except OSError as exc:
                raise sfs.io_error("create" if create else "open", rel_path, exc) from exc
        else:
            if create:
                self._buffer = bytearray(SCHEMA_BYTES)
                sfs.makedirs(fmt.COMMITLOG_DIR)
                if not sfs.put_if_absent(rel_path, bytes(self._buffer)):   # as O_EXCL
                    raise FileExistsError(f"segment {rel_path} exists")
            else:
                self._buffer = bytearray(sfs.read_bytes(rel_path))
            self.size = len(self._buffer)
        self.flushed_size = self.size
        self.dirty = False

    def _open_local(self, create: bool) -> None:
        path = self.sfs.local_path(self.rel_path)
        folder = os.path.dirname(path)
        makedirs_durably(folder)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        if create:
            flags |= os.O_EXCL
        self._fd = os.open(path, flags, 0o644)
        if create:
            try:        # the whole header, or no file: a short one would read as empty
                written = 0
                while written < len(SCHEMA_BYTES):
                    written += os.write(self._fd, SCHEMA_BYTES[written:])
                # the name made durable: else a power loss can take the file with the
                # batches fsynced into it (fdatasync syncs the file, not its folder)
                sync_folder(folder)
            except BaseException:     # (ENOSPC, EIO: the new file is listed nowhere yet)
                os.close(self._fd)
                self._fd = None
                try:
                    os.unlink(path)
                except OSError:       # (the next roll finds it and replaces it: segment_taken)
                    pass
                raise
        self.size = os.fstat(self._fd).st_size

    def append(self, data: pa.Buffer | bytes) -> int:
        """Append one batch; returns its byte position in the file.

        All or nothing: a failed write (ENOSPC, EIO) cuts the file back to ``size``
        (the end of the last whole batch) before the ``StoreIOError`` is raised, so a
        later append lands where ``size`` says. If even the cut fails, every later
        append first retries it and refuses until it succeeds."""
        pos = self.size
        if self._fd is not None:
            self._cut_torn_tail()
            if pos + len(data) > self._reserved and self._reserve:
                self._allocate_ahead(pos + len(data))
            view = memoryview(data)
            written = 0
            try:
                while written < len(view):
                    written += os.write(self._fd, view[written:])
            except OSError as exc:
                if written:
                    self._torn = True
                    self._cut_torn_tail(raise_on_failure=False)
                raise self.sfs.io_error("append to", self.rel_path, exc) from exc
        else:
            self._buffer.extend(memoryview(data))
        self.size += len(data)
        self.dirty = True
        return pos

    def _allocate_ahead(self, end: int) -> None:
        """Allocate the blocks past those allocated, ``reserve`` bytes (or up to ``end`` if
        that is further); where that fails (no space, no support), this segment's appends
        allocate as they go."""
        start = max(self.size, self._reserved)
        nbytes = max(self._reserve, end - start)
        if preallocate(self._fd, start, nbytes):
            self._reserved = start + nbytes
        else:
            self._reserve = 0

    def _cut_torn_tail(self, *, raise_on_failure: bool = True) -> None:
        """Truncate the file back to ``size`` after a partial write (``_torn``)."""
        if not self._torn:
            return
        try:
            os.ftruncate(self._fd, self.size)
            self._torn = False
            self._reserved = self.size          # (the cut gave the blocks past it back)
            log.warning("segment %s: cut a partial write back to %d bytes", self.rel_path,
                        self.size)
        except OSError as exc:
            if raise_on_failure:
                raise self.sfs.io_error("cut a partial write of", self.rel_path, exc) from exc

    def append_from_pipe(self, pipe_fd: int, count: int) -> None:
        """Move ``count`` bytes waiting in pipe ``pipe_fd`` to the end of the file inside
        the kernel (``os.splice``, Linux; a replica receiving a master's bytes): no copy
        through Python. ``size`` grows with every chunk moved, so after an OSError
        (e.g. EINVAL: the file system cannot splice) ``size`` is still the file's
        length and the rest is still in the pipe. Local disks only."""
        if self._fd is None:
            raise OSError(errno.EINVAL, f"{self.rel_path}: not a local file")
        if self._splice_fd is None:   # positional writes: splice refuses O_APPEND files
            self._splice_fd = os.open(self.sfs.local_path(self.rel_path), os.O_WRONLY)
        if self.size + count > self._reserved and self._reserve:
            self._allocate_ahead(self.size + count)
        moved = 0
        while moved < count:
            n = os.splice(pipe_fd, self._splice_fd, count - moved, offset_dst=self.size)
            if n == 0:
                raise OSError(errno.EPIPE, f"pipe ended {count - moved} bytes early")
            moved += n
            self.size += n
            self.dirty = True

    def flush(self, *, sync: bool = True) -> int:
        """Make the bytes durable (fsync) or at least visible to readers; returns the size."""
        size = self.size
        if self._fd is not None:
            if sync and self.flushed_size < size:
                try:
                    os.fdatasync(self._fd)
                except OSError as exc:
                    raise self.sfs.io_error("sync", self.rel_path, exc) from exc
        elif self.dirty:
            self.sfs.write(self.rel_path, bytes(self._buffer))
        self.dirty = False
        self.flushed_size = size
        return size

    def start_writeback_range(self, start: int, end: int) -> None:
        """Start writing bytes ``[start, end)`` to disk without waiting (local disks;
        see :func:`sparkmq.log.fs.start_writeback`), so a later ``flush(sync=True)``
        waits for less. No durability promise. May run on another thread than
        ``append`` (it reads only the file descriptor), but not after ``close``."""
        fd = self._fd
        if fd is not None and end > start:
            start_writeback(fd, start, end - start)

    def close(self) -> None:
        if self._splice_fd is not None:
            os.close(self._splice_fd)
            self._splice_fd = None
        if self._fd is not None:
            # give back the blocks allocated ahead; not where the file grew past ``size``:
            # a writer that took the store over sealed it (``recovery.seal_foreign_tail``),
            # and cutting to ``size`` would cut its end-of-stream marker off
            if self._reserved > self.size and os.fstat(self._fd).st_size == self.size:
                try:
                    os.ftruncate(self._fd, self.size)
                except OSError as exc:        # unused space past the end, not data
                    log.warning("segment %s: could not give back the space allocated "
                                "ahead: %s", self.rel_path, exc)
            os.close(self._fd)
            self._fd = None
        self._buffer = None

    @property
    def in_memory(self) -> bool:
        """True on non-local backends: the bytes live in this writer's buffer."""
        return self._buffer is not None

    def read_buffered_batch(self, pos: int) -> tuple[pa.RecordBatch, int]:
        """The batch at byte ``pos`` of an in-memory segment (non-local backends) and its
        message length. Copies only that message (from a growing window), never exposes
        the buffer itself, which the writer may still extend."""
        want = 1 << 16
        while True:
            chunk = bytes(self._buffer[pos:pos + want])
            n = message_length(chunk, 0)
            if n or pos + want >= len(self._buffer):
                break
            want *= 4
        if not n:
            raise checksum.corrupt(self.rel_path, pos, "no whole record batch message there")
        msg = pa.py_buffer(chunk[:n])
        verify_message(msg, self.rel_path, pos,
                       lambda: segment_format(bytes(self._buffer[:HEADER_SIZE])) == 1)
        return decode_message(msg, self.rel_path, pos), n

    def buffer(self) -> pa.Buffer:
        """The bytes written so far (memory map on local disks)."""
        if self._buffer is not None:
            return pa.py_buffer(bytes(self._buffer))
        return self.sfs.read_buffer(self.rel_path)


def write_segment(sfs: StoreFS, rel_path: str, batches: list[pa.RecordBatch]) -> int:
    """Write a whole sealed segment (used by writer tasks); returns its size."""
    parts = [SCHEMA_BYTES]
    for b in batches:
        parts.append(serialize_batch(b).to_pybytes())   # each with its checksum
    parts.append(EOS)
    data = b"".join(parts)
    sfs.write(rel_path, data)
    return len(data)
