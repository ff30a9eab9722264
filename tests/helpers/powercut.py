"""A power cut, modelled on what POSIX promises: a file keeps the content it had at its
last ``fsync``/``fdatasync`` by this process (nothing written after), and a folder keeps
the names it held at its last fsync (a file whose name was never made durable is gone,
whatever was synced into it). For small files (a journal, a metadata file): each sync
takes a copy of the whole file. ``tests/log/test_store_crash_model.py``'s ``SyncWatch``
models the store's large segments by size instead."""
from __future__ import annotations

import os
import shutil
import stat


class PowerCut:
    """Installed over ``os.fsync``/``os.fdatasync`` (the real calls still run) until
    ``remove``. ``image(root)`` is what a power cut at that instant leaves of ``root``'s
    tree; ``restore(root, image)`` makes the tree that (after the writers are gone). A
    file is followed by its inode, so a rename carries what was synced into it."""

    def __init__(self):
        self.content: dict[tuple, tuple] = {}      # inode -> (bytes, mode) at its last sync
        self.names: dict[str, dict] = {}           # folder -> {name: inode} at its last sync
        self._real = (os.fsync, os.fdatasync)

        def watched(real):
            def sync(fd):
                real(fd)
                path, st = os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    self.names[path] = {e.name: _inode(e.stat(follow_symlinks=False))
                                        for e in os.scandir(path)}
                else:
                    with open(path, "rb") as f:     # (the fd may be write-only)
                        self.content[_inode(st)] = (f.read(), stat.S_IMODE(st.st_mode))
            return sync
        os.fsync, os.fdatasync = watched(os.fsync), watched(os.fdatasync)

    def image(self, root: str) -> dict[str, tuple]:
        """Every file under ``root`` (itself kept) a power cut now would leave, with its
        content and mode: the names each folder's last sync held, each with what was last
        synced into the file it named then (nothing if never synced)."""
        out: dict[str, tuple] = {}
        for name, inode in self.names.get(root, {}).items():
            path = os.path.join(root, name)
            if inode is None:                          # a folder
                out.update(self.image(path))
            else:
                out[path] = self.content.get(inode, (b"", 0o644))
        return out

    @staticmethod
    def restore(root: str, image: dict[str, tuple]) -> None:
        """Make ``root``'s tree exactly ``image`` (files not in it are removed)."""
        for entry in os.listdir(root):
            path = os.path.join(root, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        for path, (data, mode) in image.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, mode)

    def remove(self) -> None:
        os.fsync, os.fdatasync = self._real


def _inode(st: os.stat_result) -> tuple | None:
    """A file's identity; None for a folder."""
    return None if stat.S_ISDIR(st.st_mode) else (st.st_dev, st.st_ino)
