"""What survives a power loss: the one home of the syncs a file's name and content need.

POSIX makes a file's content durable with its ``fsync``/``fdatasync``, and its name
(created, linked or renamed) only with the fsync of its folder, as Kafka's, RocksDB's and
PostgreSQL's writers assume. Every layer that keeps state in local files (the store's
log, the NameServer's fencing memory, the controller's Raft journal, the timer wheel,
secret files) makes it durable through these functions. A file system that does not sync
folders (``_NO_FOLDER_SYNC``) is let pass, as PostgreSQL's ``fsync_fname`` does.

Thread-safe (no state).
"""
from __future__ import annotations

import errno as errnos
import os

#: a folder's fsync answered with these means "not supported here" (some FUSE and network
#: file systems), not a failed write: as PostgreSQL's fsync_fname, it is let pass
_NO_FOLDER_SYNC = frozenset({errnos.EINVAL, errnos.EBADF, errnos.ENOTSUP, errnos.EOPNOTSUPP})


def sync_folder(folder: str) -> None:
    """Make ``folder``'s entries durable (fsync of the folder): a file created, linked or
    renamed there is only sure to keep its name through a power loss after this (POSIX
    leaves it to the folder's fsync, as Kafka's and RocksDB's writers assume). Raises
    the OSError, unless the file system does not sync folders (``_NO_FOLDER_SYNC``)."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_FOLDER_SYNC:
            raise
    finally:
        os.close(fd)


def makedirs_durably(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, each folder it creates made durable in its
    parent (:func:`sync_folder`), so a power loss cannot take a folder whose files were
    synced. Raises the OSError."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        makedirs_durably(parent)
    try:
        os.mkdir(path)
    except FileExistsError:       # (made meanwhile by another thread or process)
        if not os.path.isdir(path):
            raise
        return
    sync_folder(parent or ".")


def _write_synced(tmp: str, data: bytes, flags: int, mode: int) -> None:
    """``data`` written to a new file ``tmp`` (opened with ``flags``) and fsynced."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: str, data: bytes, *, mode: int = 0o644) -> None:
    """Make ``data`` the content of ``path`` such that a power loss leaves either it or
    the old content: a new file beside it written and fsynced, renamed over ``path``, the
    folder fsynced. Raises the OSError (the new file removed)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        _write_synced(tmp, data, os.O_TRUNC, mode)
        os.replace(tmp, path)
    except BaseException:        # (a full disk, EIO: the half-written file goes too)
        try:
            os.unlink(tmp)
        except OSError:          # (never made, or renamed already)
            pass
        raise
    sync_folder(os.path.dirname(os.path.abspath(path)))


def create_durably(path: str, data: bytes, *, mode: int = 0o644) -> None:
    """Make ``path`` with ``data`` as its content such that a power loss leaves it whole or
    absent, never empty or cut short: written and fsynced beside it, linked as ``path``
    (which publishes the whole file, or fails if one exists), the folder fsynced. Raises
    FileExistsError if ``path`` exists (it is left as it is), or the OSError."""
    tmp = f"{path}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        _write_synced(tmp, data, os.O_EXCL, mode)
        try:
            os.link(tmp, path)
        except FileExistsError:  # (``path``'s, not the temporary file's)
            raise FileExistsError(errnos.EEXIST, os.strerror(errnos.EEXIST), path) from None
    finally:                     # (a full disk, EIO: the half-written file goes too)
        try:
            os.unlink(tmp)
        except FileNotFoundError:   # (never made)
            pass
    sync_folder(os.path.dirname(os.path.abspath(path)))
