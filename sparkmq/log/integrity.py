"""The check a store gets when it opens: every file the current version
references is there with its recorded size (docs/FORMAT.md section 10).

One listing per folder (``commitlog/``, ``consumequeue/``, ``index/``), no file
is read: cheap enough for every open, also on object stores. A segment may be
longer than its ``add`` records (the writer's unpublished tail, recovered from
the bytes); a side table must have exactly its recorded size. What it finds is
named in one ``CorruptStoreError`` with what to do, instead of a
``FileNotFoundError`` or ``ArrowInvalid`` at the first read of the file.
"""
from __future__ import annotations

import posixpath

from ..errors import CorruptStoreError
from .fs import StoreFS
from .txlog import LogState

#: how many problems the error message lists (all are counted)
SHOWN_PROBLEMS = 10


def missing_files(sfs: StoreFS, state: LogState) -> list[str]:
    """One line per file of ``state`` that is missing or has the wrong size."""
    listings: dict[str, dict[str, int]] = {}
    problems = []
    for files, exact in ((state.segments, False), (state.consumequeue_files, True),
                         (state.index_files, True)):
        for add in files.values():
            folder, name = posixpath.split(add.path)
            if folder not in listings:
                listings[folder] = sfs.list_sizes(folder)
            size = listings[folder].get(name)
            if size is None:
                problems.append(f"{add.path}: missing ({add.kind}, {add.size} bytes recorded)")
            elif size < add.size or (exact and size != add.size):
                problems.append(f"{add.path}: {size} bytes, {add.size} recorded ({add.kind})")
    return problems


def check_files(sfs: StoreFS, state: LogState) -> None:
    """Raise ``CorruptStoreError`` naming the files of ``state`` that are missing or
    have the wrong size (see :func:`missing_files`)."""
    problems = missing_files(sfs, state)
    if not problems:
        return
    shown = "; ".join(problems[:SHOWN_PROBLEMS])
    more = f" (and {len(problems) - SHOWN_PROBLEMS} more)" if len(problems) > SHOWN_PROBLEMS \
        else ""
    raise CorruptStoreError(
        f"store {sfs.url}: {len(problems)} file(s) that version {state.version} references "
        f"are missing or damaged: {shown}{more}. Restore them from a backup or a replica "
        f"(a replica of this store holds the same files), then open the store again; "
        f"'sparkmq admin verify {sfs.url}' checks every file")
