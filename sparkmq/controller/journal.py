"""The controller's Raft journal, durable: every entry, term and vote fsynced before Raft
acts on it.

Raft's safety rests on three things surviving a power loss: a node's log entries once it
has acknowledged them (a leader counts its own copy toward the majority), its current
term, and its vote in that term. pysyncobj's own ``FileJournal`` writes the log through a
memory map and the term and vote with a rename, and fsyncs none of them: a power cut of a
majority could lose a committed command (a master's election), or let a node vote twice in
one term (two leaders, two masters). This journal keeps pysyncobj's interface and its file
format (a journal written by either opens in the other), and adds the syncs.

On disk (pysyncobj's ``FileJournal`` format): a 40-byte header (``PYSYNCOBJ`` padded to 24
bytes, the library version in 8, the format version and the end of the last record, both
little-endian u32), then records ``size | idx u64 | term u64 | command | size`` (``size``
u32 covers idx, term and command). Bytes past the recorded end are not entries.
``<journal>.meta`` holds the term, the vote and the commit index (pysyncobj's pickle).
``<journal>.dump`` is pysyncobj's snapshot of the state after log compaction.

Crash behaviour:

* ``add`` writes the record and fsyncs it, then moves the recorded end and fsyncs again: a
  power loss leaves the end before the record (not acknowledged, so not needed) or after
  it, never after bytes that are not a whole record.
* ``deleteEntriesFrom`` (a follower's conflicting tail) moves the end back, fsynced.
* ``deleteEntriesTo`` (compaction) writes the entries kept to a new file, fsynced, and
  renames it over the journal, after making the dump that replaces the others durable.
  ``clear`` (a snapshot loaded) likewise makes the dump durable first.
* The term and vote are written to a new file, fsynced, renamed, and the folder fsynced,
  before ``setCurrentTerm`` returns (pysyncobj then sends the vote).

Thread-safety: none; pysyncobj calls it from its one Raft thread.
"""
from __future__ import annotations

import os
import struct

from pysyncobj.journal import (APP_NAME, FIRST_RECORD_OFFSET, JOURNAL_FORMAT_VERSION,
                               LAST_RECORD_OFFSET_OFFSET, NAME_SIZE, VERSION_SIZE, Journal,
                               MemoryJournal)
from pysyncobj.pickle import dumps, loads, to_bytes
from pysyncobj.version import VERSION

from ..durable import makedirs_durably, replace_durably, sync_folder
from ..errors import InvalidConfigError

_U32 = struct.Struct("<I")
_IDX_TERM = struct.Struct("<QQ")


def create_journal(path: str | None) -> Journal:
    """pysyncobj's ``createJournal`` for a controller: memory for no path, else durable."""
    return MemoryJournal() if path is None else DurableJournal(path)


def _header(end: int = FIRST_RECORD_OFFSET) -> bytes:
    """The journal's header, its records ending at ``end``."""
    return (APP_NAME.ljust(NAME_SIZE, b"\0") + VERSION.encode().ljust(VERSION_SIZE, b"\0")
            + struct.pack("<II", JOURNAL_FORMAT_VERSION, end))


def _record(command, idx: int, term: int) -> bytes:
    data = _IDX_TERM.pack(idx, term) + to_bytes(command)
    return _U32.pack(len(data)) + data + _U32.pack(len(data))


class DurableJournal(Journal):
    """A Raft log and its term, vote and commit index at ``path`` (module docstring)."""

    def __init__(self, path: str):
        self._path, self._dump = path, f"{path}.dump"
        makedirs_durably(os.path.dirname(os.path.abspath(path)))
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            # (an empty file: pysyncobj's own creation cut short, before any entry)
            replace_durably(path, _header())
        self._fd = os.open(path, os.O_RDWR)
        self._entries: list[tuple] = []
        self._ends: list[int] = []        # where each entry's record ends in the file
        try:
            self._end = self._load()
            self._meta = self._load_meta(f"{path}.meta")
        except BaseException:             # (refused: the file is not left open)
            self._destroy()
            raise
        self._meta_saved = True

    def _load_meta(self, meta_path: str) -> dict:
        try:
            with open(meta_path, "rb") as f:
                meta = loads(f.read())
        except FileNotFoundError:
            return {}
        except Exception as exc:      # (pickle's errors vary: EOFError, UnpicklingError, ...)
            raise InvalidConfigError(
                f"controller journal {self._path}: its term and vote ({meta_path}) are "
                f"damaged ({exc!r}); move the journal and its .meta away to start this "
                "controller empty (it then catches up from the others' log)") from None
        if not isinstance(meta, dict):
            raise InvalidConfigError(f"controller journal {self._path}: {meta_path} holds "
                                     f"no term and vote; move the journal and its .meta away")
        return meta

    def _load(self) -> int:
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        if len(data) < FIRST_RECORD_OFFSET or not data.startswith(APP_NAME):
            raise InvalidConfigError(
                f"controller journal {self._path} is not a pysyncobj journal (no header); "
                "move it away to start this controller empty (it then catches up from the "
                "others' log)")
        end, at = _U32.unpack_from(data, LAST_RECORD_OFFSET_OFFSET)[0], FIRST_RECORD_OFFSET
        while at < end:
            size = _U32.unpack_from(data, at)[0] if at + 4 <= len(data) else 0
            if size < _IDX_TERM.size or at + size + 8 > min(end, len(data)):
                raise InvalidConfigError(
                    f"controller journal {self._path}: the record at byte {at} is damaged "
                    "(its length runs past the journal's end); move the journal away to "
                    "start this controller empty (it then catches up from the others' log)")
            idx, term = _IDX_TERM.unpack_from(data, at + 4)
            self._entries.append((data[at + 20:at + 4 + size], idx, term))
            at += size + 8
            self._ends.append(at)
        return at

    def _set_end(self, end: int) -> None:
        os.pwrite(self._fd, _U32.pack(end), LAST_RECORD_OFFSET_OFFSET)
        os.fdatasync(self._fd)
        self._end = end

    def _dump_durable(self) -> None:
        """The snapshot pysyncobj wrote (or received) durable before entries it replaces
        leave the journal: pysyncobj writes and renames it without a sync."""
        try:
            fd = os.open(self._dump, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        sync_folder(os.path.dirname(os.path.abspath(self._dump)))

    # ------------------------------------------------------------ pysyncobj's Journal
    def add(self, command, idx, term):
        rec = _record(command, idx, term)
        os.pwrite(self._fd, rec, self._end)
        os.fdatasync(self._fd)
        self._set_end(self._end + len(rec))
        self._entries.append((command, idx, term))
        self._ends.append(self._end)

    def clear(self):
        self._dump_durable()
        self._set_end(FIRST_RECORD_OFFSET)
        self._entries, self._ends = [], []

    def deleteEntriesFrom(self, entryFrom):
        if entryFrom >= len(self._entries):
            return
        self._set_end(self._ends[entryFrom - 1] if entryFrom > 0 else FIRST_RECORD_OFFSET)
        del self._entries[entryFrom:], self._ends[entryFrom:]

    def deleteEntriesTo(self, entryTo):
        kept = self._entries[entryTo:]
        records = [_record(*e) for e in kept]
        ends, end = [], FIRST_RECORD_OFFSET
        for rec in records:
            end += len(rec)
            ends.append(end)
        self._dump_durable()
        replace_durably(self._path, _header(end) + b"".join(records))
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_RDWR)
        self._entries, self._ends, self._end = kept, ends, end

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self):
        return len(self._entries)

    def _destroy(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def setRaftCommitIndex(self, raftCommitIndex):
        # (not needed for safety: Raft learns it again from the leader; saved each second)
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self):
        return self._meta.get("raftCommitIndex", 1)

    def setCurrentTerm(self, term, votedForNodeId):
        self._meta["currentTerm"], self._meta["votedForNodeId"] = term, votedForNodeId
        self._save_meta()

    def getCurrentTerm(self):
        return self._meta.get("currentTerm", 0)

    def getVotedForNodeId(self):
        return self._meta.get("votedForNodeId", None)

    def onOneSecondTimer(self):
        if not self._meta_saved:
            self._save_meta()

    def _save_meta(self) -> None:
        replace_durably(f"{self._path}.meta", dumps(self._meta))
        self._meta_saved = True
