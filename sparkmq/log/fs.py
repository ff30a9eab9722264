"""File access for one store, through fsspec.

Every byte of a store is read and written here. ``StoreFS`` wraps an fsspec
filesystem and a root; callers pass paths relative to the root, built by
:mod:`sparkmq.log.format`.

Guarantees, per backend (docs/FORMAT.md, "Log store guarantees"):

* ``put_if_absent(path, data)`` writes ``data`` at ``path`` only if nothing is
  there, atomically: a reader sees the whole file or no file, and of two
  concurrent callers exactly one gets ``True``.

  - local disks: the bytes go to a temporary file in the same folder, are
    fsynced, then ``os.link`` publishes them (link fails if the name exists);
    the folder is fsynced after.
  - ``memory://``: a process-wide lock around exists-check and write (the
    memory filesystem lives in one process, so this is exact).
  - other backends: fsspec's exclusive-create mode ``"xb"``, which object
    stores implement as a conditional PUT (S3 ``If-None-Match: *``, GCS
    ``ifGenerationMatch=0``). A backend without it raises on first use.
* ``replace(path, data)`` overwrites atomically (rename locally, a single PUT
  on object stores); only for files that may be rewritten (``_last_checkpoint``).
* ``read_buffer(path)`` returns a ``pyarrow.Buffer``: a memory map on local
  disks (zero copy), the bytes otherwise.

Errors: this is the one place where ``OSError`` becomes a store error. A failing
backend call raises :class:`~sparkmq.errors.StoreIOError` naming the operation,
the store-relative path, ``errno`` and what to do (ENOSPC: free space; EIO:
check the disk). ``FileNotFoundError`` and ``FileExistsError`` keep their
meaning (a missing file, a lost put-if-absent race) and pass through as they are.
The segment writer's own ``os`` calls use :meth:`StoreFS.io_error` likewise.

Thread-safe: methods hold no state but the memory-map cache, which is locked.

An absolute local path (``/data/store`` or ``file:///data/store``) without
storage options is served by ``os`` calls alone: fsspec (whose import reads
every installed package's entry points, ~0.1-0.5 s) is imported only when a
store needs it. That import is paid again by every fresh Python process Spark
starts for a streaming query.
"""
from __future__ import annotations

import errno as errnos
import functools
import logging
import os
import threading
import uuid
from typing import Iterable

import pyarrow as pa

from ..durable import makedirs_durably, sync_folder
from ..errors import InvalidConfigError, StoreIOError

log = logging.getLogger("sparkmq.log.fs")

_MEMORY_LOCK = threading.Lock()

#: what to do about an OSError, by errno (anything else: check the file system)
_IO_ADVICE = {
    errnos.ENOSPC: "free space on the disk holding the store, then retry",
    errnos.EDQUOT: "raise the disk quota of the store's user or free space, then retry",
    errnos.EIO: "check the disk (kernel log, SMART); the store may need recovery",
    errnos.EROFS: "the file system is mounted read-only; remount it read-write",
    errnos.EACCES: "check the permissions of the store's folder",
    errnos.EPERM: "check the permissions of the store's folder",
    errnos.EMFILE: "raise the open-files limit (ulimit -n)",
}


def _io_boundary(operation: str):
    """Method decorator: an ``OSError`` (but ``FileNotFoundError``/``FileExistsError``,
    which callers rely on) from the wrapped ``StoreFS`` method becomes a
    ``StoreIOError`` naming ``operation`` and the method's first argument (a path)."""
    def wrap(method):
        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except (FileNotFoundError, FileExistsError):
                raise
            except OSError as exc:
                raise self.io_error(operation, args[0] if args else "", exc) from exc
        return guarded
    return wrap


class StoreFS:
    """Paths relative to one store root, on one fsspec filesystem."""

    def __init__(self, url: str, storage_options: dict | None = None):
        if not url or not isinstance(url, str):
            raise InvalidConfigError(f"store URL must be a non-empty string, got {url!r}")
        self.url = url
        #: the fsspec options this store was opened with (a copy), so that views of
        #: the store (``Snapshot``) can reopen it elsewhere, e.g. on Spark executors
        self.storage_options = dict(storage_options) if storage_options else None
        self._fs = None
        root = None if storage_options else local_root(url)
        if root is not None:
            self.is_local, self.is_memory = True, False
        else:
            self._fs, root = _url_to_fs(url, storage_options)
            fs = self._fs
            protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
            self.is_local = "file" in protocols or "local" in protocols
            self.is_memory = "memory" in protocols
        self.root = root.rstrip("/") or "/"
        self._maps: dict[str, pa.Buffer] = {}
        self._maps_lock = threading.Lock()

    @property
    def fs(self):
        """The fsspec filesystem (built on first use for stores served by ``os`` calls)."""
        if self._fs is None:
            self._fs = _url_to_fs(self.url, self.storage_options)[0]
        return self._fs

    def io_error(self, operation: str, rel: str, exc: OSError) -> StoreIOError:
        """The store error for ``exc``, raised by ``operation`` on ``rel``."""
        code = exc.errno
        name = errnos.errorcode.get(code, str(code)) if code is not None else "no errno"
        advice = _IO_ADVICE.get(code, "check the store's file system")
        return StoreIOError(
            f"cannot {operation} {rel or '.'!r} in store {self.url}: "
            f"{exc.strerror or exc} ({name}); {advice}",
            errno=code, path=rel, operation=operation)

    # -- paths -----------------------------------------------------------
    def full(self, rel: str) -> str:
        return self.root + "/" + rel.lstrip("/") if rel else self.root

    def local_path(self, rel: str) -> str:
        assert self.is_local
        return self.full(rel)

    # -- reading ---------------------------------------------------------
    def _fresh(self, path: str) -> str:
        """``path``, after dropping what fsspec cached of it and its folder: a store's
        files change under a long-lived process (other writers, other processes), and
        a cached listing (s3fs, gcsfs, adlfs keep one per instance, shared process-wide)
        would hide new log versions."""
        if not self.is_memory:
            self.fs.invalidate_cache(path)
            self.fs.invalidate_cache(path.rsplit("/", 1)[0])
        return path

    @_io_boundary("check")
    def exists(self, rel: str) -> bool:
        if self.is_local:
            return os.path.exists(self.full(rel))
        return self.fs.exists(self._fresh(self.full(rel)))

    @_io_boundary("read")
    def read_bytes(self, rel: str) -> bytes:
        if self.is_local:
            with open(self.full(rel), "rb") as f:
                return f.read()
        return self.fs.cat_file(self.full(rel))

    @_io_boundary("read")
    def read_range(self, rel: str, start: int, end: int) -> bytes:
        if self.is_local:
            with open(self.full(rel), "rb") as f:
                f.seek(start)
                return f.read(end - start)
        return self.fs.cat_file(self.full(rel), start=start, end=end)

    @_io_boundary("stat")
    def size(self, rel: str) -> int:
        if self.is_local:
            return os.path.getsize(self.full(rel))
        return int(self.fs.size(self._fresh(self.full(rel))))

    @_io_boundary("stat")
    def modified_ms(self, rel: str) -> int:
        """Last modification time of a file, in ms since the epoch (FileNotFoundError
        if it is gone). Object stores report their last PUT, ``memory://`` the
        creation time."""
        if self.is_local:
            return os.stat(self.full(rel)).st_mtime_ns // 1_000_000
        return int(self.fs.modified(self.full(rel)).timestamp() * 1000)

    @_io_boundary("list")
    def list_names(self, rel_dir: str) -> list[str]:
        """Names (not paths) of the files directly under ``rel_dir``; [] if it is missing."""
        path = self.full(rel_dir)
        if self.is_local:
            try:
                return sorted(os.listdir(path))
            except FileNotFoundError:
                return []
        try:
            entries = self.fs.ls(self._fresh(path), detail=False)
        except FileNotFoundError:
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    @_io_boundary("list")
    def list_sizes(self, rel_dir: str) -> dict[str, int]:
        """Name -> size in bytes of the files directly under ``rel_dir`` (one listing;
        {} if it is missing)."""
        path = self.full(rel_dir)
        if self.is_local:
            try:
                with os.scandir(path) as it:
                    return {e.name: e.stat().st_size for e in it if e.is_file()}
            except FileNotFoundError:
                return {}
        try:
            entries = self.fs.ls(self._fresh(path), detail=True)
        except FileNotFoundError:
            return {}
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
                for e in entries if e.get("type") != "directory"}

    @_io_boundary("map")
    def read_buffer(self, rel: str, *, cache: bool = False,
                    min_size: int | None = None) -> pa.Buffer:
        """The whole file as an Arrow buffer: memory-mapped on local disks.

        With ``cache``, maps are kept per path; a cached map shorter than the file
        is renewed (the file grew). Callers that know how many bytes they need pass
        ``min_size``: a cached map that long is returned without asking the file
        system for the file's size.
        """
        if not self.is_local:
            return pa.py_buffer(self.read_bytes(rel))
        path = self.full(rel)
        if cache:
            with self._maps_lock:
                buf = self._maps.get(path)
                if buf is not None and (len(buf) < min_size if min_size is not None
                                        else len(buf) < os.path.getsize(path)):
                    buf = None   # the file grew (an unsealed segment): map it again
                if buf is None:
                    buf = _map(path)
                    self._maps[path] = buf
                return buf
        return _map(path)

    def forget(self, rel: str) -> None:
        """Drop a cached memory map (the file was removed or rewritten)."""
        with self._maps_lock:
            self._maps.pop(self.full(rel), None)

    @_io_boundary("open")
    def open_input(self, rel: str):
        """A seekable binary file object (for Parquet readers)."""
        if self.is_local:
            return pa.memory_map(self.full(rel), "r")
        return self.fs.open(self.full(rel), "rb")

    # -- writing ---------------------------------------------------------
    @_io_boundary("create folder")
    def makedirs(self, rel_dir: str) -> None:
        if self.is_local:
            makedirs_durably(self.full(rel_dir))
        else:
            self.fs.makedirs(self.full(rel_dir), exist_ok=True)

    @_io_boundary("write")
    def write(self, rel: str, data: bytes, *, sync: bool = True) -> None:
        """Write a new immutable file (side tables, staged segments); ``sync``: fsynced,
        and its name too (its folder), before a commit may name it."""
        if self.is_local:
            path = self.full(rel)
            folder = os.path.dirname(path)
            makedirs_durably(folder)
            _write_file(path, data, sync=sync)
            if sync:
                sync_folder(folder)
        else:
            self.fs.pipe_file(self.full(rel), bytes(data))

    @_io_boundary("create")
    def put_if_absent(self, rel: str, data: bytes) -> bool:
        """Atomically create ``rel`` with ``data``; False if it already exists."""
        path = self.full(rel)
        if self.is_local:
            folder = os.path.dirname(path)
            tmp = _write_temp(folder, data)
            try:
                os.link(tmp, path)
                won = True
            except FileExistsError:
                won = False
            finally:       # (a failed unlink must not fail a create that landed)
                _unlink_quietly(tmp)
            if won:     # (landed: a failed folder sync must not fail it; see below)
                _sync_landed(folder, rel)
            return won
        if self.is_memory:
            with _MEMORY_LOCK:
                if self.fs.exists(path):
                    return False
                self.fs.pipe_file(path, bytes(data))
                return True
        try:
            with self.fs.open(path, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False
        except (NotImplementedError, ValueError) as exc:
            raise InvalidConfigError(
                f"backend {self.fs.protocol!r} does not support exclusive create (mode 'xb'); "
                "sparkmq needs put-if-absent for its transaction log") from exc

    @_io_boundary("replace")
    def replace(self, rel: str, data: bytes) -> None:
        """Atomically overwrite ``rel`` (used only for ``_last_checkpoint``)."""
        path = self.full(rel)
        if self.is_local:
            tmp = _write_temp(os.path.dirname(path), data)
            try:
                os.replace(tmp, path)
            except BaseException:
                _unlink_quietly(tmp)
                raise
            sync_folder(os.path.dirname(path))
        else:
            self.fs.pipe_file(path, bytes(data))

    @_io_boundary("delete")
    def delete(self, rel: str) -> None:
        self.forget(rel)
        try:
            if self.is_local:
                os.unlink(self.full(rel))
            else:
                self.fs.rm_file(self.full(rel))
        except FileNotFoundError:
            pass

    def delete_many(self, rels: Iterable[str]) -> None:
        for rel in rels:
            self.delete(rel)

    @_io_boundary("truncate")
    def truncate(self, rel: str, size: int) -> None:
        """Cut a file to ``size`` bytes (recovery of a torn segment tail)."""
        self.forget(rel)
        if self.is_local:
            with open(self.full(rel), "r+b") as f:
                f.truncate(size)
                f.flush()
                os.fsync(f.fileno())
        else:
            data = self.read_bytes(rel)
            self.fs.pipe_file(self.full(rel), data[:size])

    @_io_boundary("measure the disk of")
    def disk_usage_ratio(self) -> float | None:
        """How full the disk holding the store is (local only, else None), as RocketMQ
        measures it (``UtilAll.getDiskPartitionSpaceUsedPercent``) and ``df`` shows it:
        used / (used + available to this user), so blocks reserved for root or held
        by other tenants of the file system do not count as used."""
        if not self.is_local:
            return None
        st = os.statvfs(self.root if os.path.exists(self.root) else "/")
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        entire = used + st.f_bavail * st.f_frsize
        if entire <= 0:
            return None
        return used / entire

    def close(self) -> None:
        with self._maps_lock:
            self._maps = {}


def local_root(url: str) -> str | None:
    """The root of a store at an absolute local path (``/p`` or ``file:///p``), else None.

    Anything else (relative paths, ``~``, chained or remote URLs) is left to
    fsspec, so roots are exactly what ``fsspec.core.url_to_fs`` gives.
    """
    path = url[len("file://"):] if url.startswith("file://") else url
    if not path.startswith("/") or "://" in path or "::" in path:
        return None
    return path.rstrip("/") or "/"


def _url_to_fs(url: str, storage_options: dict | None):
    import fsspec   # lazily: see the module docstring
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ValueError, ImportError) as exc:
        raise InvalidConfigError(f"cannot open store URL {url!r}: {exc}") from exc


_SYNC_FILE_RANGE_WRITE = 2     # linux/fs.h
_FALLOC_FL_KEEP_SIZE = 1       # linux/falloc.h


@functools.lru_cache(maxsize=None)
def _libc(name: str, *argtypes):
    """libc's function ``name`` taking ``argtypes`` (returning an int), looked up once;
    None where there is no such function (not Linux, not glibc)."""
    try:
        import ctypes
        import ctypes.util
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the kernel to start writing ``nbytes`` dirty bytes at ``offset`` of ``fd``
    to disk now, without waiting (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``).

    Not a durability guarantee (that is still ``fdatasync``): it only makes a
    later ``fdatasync`` short, since the disk works while the caller writes on.
    Returns False where the call does not exist (then nothing happened).
    """
    import ctypes
    fn = _libc("sync_file_range", ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return fn is not None and fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) == 0


def preallocate(fd: int, offset: int, nbytes: int) -> bool:
    """Allocate the disk blocks of ``[offset, offset + nbytes)`` of ``fd`` now, without
    changing its size (Linux ``fallocate(FALLOC_FL_KEEP_SIZE)``), so appends into them
    only copy: an append that has to allocate as it goes costs several times as much
    (110 KB on ext4 here: 27-200 us against 20). Readers see nothing of it (the size is
    unchanged); ``ftruncate`` to the size gives the blocks back. False where the call
    does not exist or fails (no space, a file system without it): nothing promised."""
    import ctypes
    fn = _libc("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    return fn is not None and fn(fd, _FALLOC_FL_KEEP_SIZE, offset, nbytes) == 0


def _map(path: str) -> pa.Buffer:
    """Memory-map a whole file; the buffer keeps the map alive (zero copy)."""
    with pa.memory_map(path, "r") as mm:
        return mm.read_buffer()


def _write_file(path: str, data: bytes, *, sync: bool = True) -> None:
    """Write ``data`` as the whole of ``path`` and (``sync``) fsync it."""
    with open(path, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def _write_temp(folder: str, data: bytes) -> str:
    """A new fsynced ``.tmp-*`` file in ``folder`` holding ``data`` (to be linked or
    renamed into place); returns its path."""
    makedirs_durably(folder)
    tmp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
    try:
        _write_file(tmp, data)
    except BaseException:       # (a full disk, EIO: the half-written file goes too)
        _unlink_quietly(tmp)
        raise
    return tmp


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:     # (gone already, or the disk refuses: vacuum removes it later)
        pass


def _sync_landed(folder: str, rel: str) -> None:
    """Sync the folder of ``rel``, a put-if-absent that landed (readers may already use
    it). A failure is logged, not raised: the caller would take the file for not
    written while it is there (a commit retried as lost, its side files deleted)."""
    try:
        sync_folder(folder)
    except OSError as exc:
        log.error("%s was written but its folder could not be synced (%s): a power loss "
                  "may take it; check the disk", rel, exc)
