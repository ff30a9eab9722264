"""The timer wheel of delayed messages with a delivery timestamp: RocketMQ 5's TimerLog and
TimerWheel as two broker-local files. They are derived data (an index of the schedule topic's
timestamp queue): lost or inconsistent files are rebuilt from the store.

On disk, in one folder (``ScheduleService`` picks it: ``timer/`` in a local store's folder,
else ``~/.sparkmq/timer/<store id>``):

- ``log/<20-digit first position>``: the timer log, append-only fixed-size records
  ``(due ms, parked queue offset, position of the previous record of the same slot or -1)``,
  three little-endian int64 (``RECORD_BYTES`` = 24). A record's position counts records since
  the wheel was made; a file holds ``LOG_FILE_RECORDS`` of them; a file wholly below
  ``log_start`` (no live slot points into it) is deleted.
- ``wheel``: a ``HEADER_BYTES`` header, then one ``SLOT_BYTES`` slot per second of the wheel's
  span, second ``s`` in slot ``s % slots``: ``(last record position or -1, first record
  position or -1, record count, lowest parked offset)``. Header (int64 words): magic,
  version, slot count, timer queue id, ``indexed_up_to`` (next offset of the timestamp queue
  to index), ``log_end`` (next record position), ``wheel_second`` (every second before it is
  delivered and its slot emptied), ``log_start``; then the store id (ASCII).

Invariants: a record is chained into the slot of ``max(due second, wheel_second)`` at the time
it is added, and only if that second is below ``wheel_second + slots`` (so a slot holds one
second's records); every record of a slot at or after ``wheel_second`` is undelivered or was
delivered after the header last moved (the schedule service deduplicates those at start).

Crash: a record is written before the slot pointing at it, the slot before the header's
``log_end``/``indexed_up_to`` move; the files are written through the page cache (``pwrite``,
a shared mapping), so a killed process loses nothing it wrote; ``flush`` makes them durable
(``fsync``/``msync``). At open, slots pointing at or past ``log_end`` are walked back below it:
the records of an add cut short are dropped and their parked rows are indexed again. A file
whose header does not match (magic, version, slot count, queue, store) is reported unusable
and the caller rebuilds.

Thread-safety: none; the schedule service calls it under its own lock.
"""

from __future__ import annotations

import logging
import mmap
import os

import numpy as np

from ..admin_auth import local_store_dir
from ..durable import makedirs_durably, replace_durably

log = logging.getLogger(__name__)

MAGIC = int.from_bytes(b"SMQTIMER", "little")
VERSION = 1
HEADER_BYTES = 128
STORE_ID_AT = 72                 # byte offset of the store id in the header
STORE_ID_BYTES = HEADER_BYTES - STORE_ID_AT
RECORD = np.dtype([("due", "<i8"), ("off", "<i8"), ("prev", "<i8")])
RECORD_BYTES = RECORD.itemsize
SLOT = np.dtype([("last", "<i8"), ("first", "<i8"), ("count", "<i8"), ("min_off", "<i8")])
SLOT_BYTES = SLOT.itemsize
LOG_FILE_RECORDS = 1 << 20       # 24 MiB per timer log file
NO_OFFSET = np.iinfo(np.int64).max
WHEEL_FILE = "wheel"
LOG_DIR = "log"
# header words
_H_MAGIC, _H_VERSION, _H_SLOTS, _H_QUEUE, _H_INDEXED, _H_LOG_END, _H_SECOND, _H_LOG_START = \
    range(8)


def default_timer_dir(store) -> str:
    """The folder of a broker's timer wheel: ``timer/`` in a local store's folder (beside
    ``admin.token``), else ``~/.sparkmq/timer/<store id>``."""
    folder = local_store_dir(store.url)
    if folder is not None:
        return os.path.join(os.path.abspath(folder), "timer")
    return os.path.join(os.path.expanduser("~"), ".sparkmq", "timer", store.store_id)


class TimerLog:
    """The timer log's files (module docstring). Not thread-safe."""

    def __init__(self, folder: str):
        self.folder = folder
        makedirs_durably(folder)
        self._fds: dict[int, int] = {}

    def _path(self, base: int) -> str:
        return os.path.join(self.folder, f"{base:020d}")

    def _fd(self, base: int) -> int:
        fd = self._fds.get(base)
        if fd is None:
            fd = os.open(self._path(base), os.O_RDWR | os.O_CREAT, 0o644)
            self._fds[base] = fd
        return fd

    def write(self, pos: int, records: np.ndarray) -> None:
        """Write ``records`` (dtype RECORD) at positions ``pos``, ``pos + 1``, ..."""
        i = 0
        while i < len(records):
            base = (pos + i) // LOG_FILE_RECORDS * LOG_FILE_RECORDS
            n = min(len(records) - i, base + LOG_FILE_RECORDS - (pos + i))
            os.pwrite(self._fd(base), records[i:i + n].tobytes(),
                      (pos + i - base) * RECORD_BYTES)
            i += n

    def read(self, pos: int) -> tuple[int, int, int]:
        """(due ms, parked offset, previous position) of the record at ``pos``."""
        base = pos // LOG_FILE_RECORDS * LOG_FILE_RECORDS
        raw = os.pread(self._fd(base), RECORD_BYTES, (pos - base) * RECORD_BYTES)
        if len(raw) != RECORD_BYTES:
            raise EOFError(f"timer log record {pos} is missing")
        due, off, prev = np.frombuffer(raw, RECORD)[0].tolist()
        return due, off, prev

    def holds(self, end: int) -> bool:
        """Whether every record below ``end`` that a file should hold is there (its size)."""
        if end <= 0:
            return True
        base = (end - 1) // LOG_FILE_RECORDS * LOG_FILE_RECORDS
        try:
            return os.path.getsize(self._path(base)) >= (end - base) * RECORD_BYTES
        except FileNotFoundError:
            return False

    def drop_below(self, start: int) -> None:
        """Delete the files whose records all lie below ``start``."""
        for name in os.listdir(self.folder):
            if not name.isdigit():
                continue
            base = int(name)
            if base + LOG_FILE_RECORDS <= start:
                fd = self._fds.pop(base, None)
                if fd is not None:
                    os.close(fd)
                os.remove(self._path(base))

    def flush(self) -> None:
        for fd in self._fds.values():
            os.fsync(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class TimerWheel:
    """The wheel file and its timer log (module docstring). Not thread-safe."""

    def __init__(self, folder: str, mm: mmap.mmap, fd: int, slots: int):
        self.folder = folder
        self.slot_count = slots
        self._mm, self._fd = mm, fd
        self._hdr = np.ndarray((8,), "<i8", buffer=mm, offset=0)
        self.slots = np.ndarray((slots,), SLOT, buffer=mm, offset=HEADER_BYTES)
        self.log = TimerLog(os.path.join(folder, LOG_DIR))

    # ------------------------------------------------------------ open / create
    @classmethod
    def open(cls, folder: str, *, slots: int, queue_id: int, store_id: str,
             indexed_up_to: int, wheel_second: int,
             max_indexed: int) -> tuple["TimerWheel", str | None]:
        """The wheel in ``folder``, and None; or, when there is none or it does not match
        or is inconsistent (indexed past ``max_indexed``, the queue's end in the store), a
        new empty one (indexing from ``indexed_up_to``, delivered before ``wheel_second``)
        and the reason the old one was not used."""
        makedirs_durably(folder)
        path = os.path.join(folder, WHEEL_FILE)
        reason = "no timer wheel yet"
        if os.path.exists(path):
            wheel = cls._map(folder, path, slots)
            reason = wheel._mismatch(slots, queue_id, store_id)
            if reason is None and wheel.indexed_up_to > max_indexed:
                reason = (f"the timer wheel indexed up to offset {wheel.indexed_up_to}, past "
                          f"the queue's end {max_indexed} (a store restored from a backup?)")
            if reason is None:
                wheel._repair()
                return wheel, None
            wheel.close()
        cls._create(folder, path, slots, queue_id, store_id, indexed_up_to, wheel_second)
        return cls._map(folder, path, slots), reason

    @classmethod
    def _map(cls, folder: str, path: str, slots: int) -> "TimerWheel":
        fd = os.open(path, os.O_RDWR)
        size = os.fstat(fd).st_size
        if size != HEADER_BYTES + slots * SLOT_BYTES:
            # a wheel of another slot count: map what is there; _mismatch reports it
            slots = max(0, (size - HEADER_BYTES) // SLOT_BYTES)
        mm = mmap.mmap(fd, HEADER_BYTES + slots * SLOT_BYTES)
        return cls(folder, mm, fd, slots)

    @staticmethod
    def _create(folder, path, slots, queue_id, store_id, indexed_up_to, wheel_second) -> None:
        for name in os.listdir(os.path.join(folder, LOG_DIR)) if os.path.isdir(
                os.path.join(folder, LOG_DIR)) else ():
            os.remove(os.path.join(folder, LOG_DIR, name))
        body = np.empty(slots, SLOT)
        body["last"] = body["first"] = -1
        body["count"] = 0
        body["min_off"] = NO_OFFSET
        hdr = np.zeros(HEADER_BYTES // 8, "<i8")
        hdr[[_H_MAGIC, _H_VERSION, _H_SLOTS, _H_QUEUE, _H_INDEXED, _H_LOG_END, _H_SECOND,
             _H_LOG_START]] = [MAGIC, VERSION, slots, queue_id, indexed_up_to, 0,
                               wheel_second, 0]
        raw = bytearray(hdr.tobytes())
        sid = store_id.encode()[:STORE_ID_BYTES]
        raw[STORE_ID_AT:STORE_ID_AT + len(sid)] = sid
        # whole or absent, and its name kept through a power loss: never a half-made wheel
        replace_durably(path, bytes(raw) + body.tobytes())

    def _mismatch(self, slots: int, queue_id: int, store_id: str) -> str | None:
        h = self._hdr
        if self.slot_count < 1 or int(h[_H_MAGIC]) != MAGIC:
            return "the timer wheel file is damaged (no header)"
        if int(h[_H_VERSION]) != VERSION:
            return f"timer wheel version {int(h[_H_VERSION])}, this broker writes {VERSION}"
        if int(h[_H_SLOTS]) != slots or self.slot_count != slots:
            return f"the timer wheel has {int(h[_H_SLOTS])} slots, maxDelay now needs {slots}"
        if int(h[_H_QUEUE]) != queue_id:
            return f"the timer wheel indexes queue {int(h[_H_QUEUE])}, not {queue_id}"
        sid = bytes(self._mm[STORE_ID_AT:HEADER_BYTES]).rstrip(b"\0").decode(errors="replace")
        if sid != store_id[:STORE_ID_BYTES]:
            return f"the timer wheel belongs to store {sid!r}, not {store_id!r}"
        if not (0 <= self.log_start <= self.log_end) or not self.log.holds(self.log_end):
            return "the timer log is shorter than the wheel says"
        return None

    def _repair(self) -> None:
        """Drop records at or past ``log_end`` from the slots (an add cut short by a crash)."""
        bad = np.nonzero(self.slots["last"] >= self.log_end)[0]
        for i in bad.tolist():
            chain = []
            pos = int(self.slots["last"][i])
            while pos >= self.log_start:
                due, off, prev = self.log.read(pos)
                if pos < self.log_end:
                    chain.append((pos, off))
                pos = prev
            s = self.slots[i:i + 1]
            s["last"] = chain[0][0] if chain else -1
            s["first"] = chain[-1][0] if chain else -1
            s["count"] = len(chain)
            s["min_off"] = min((o for _, o in chain), default=NO_OFFSET)
        if len(bad):
            log.warning("timer wheel: %d slot(s) pointed past the timer log's end (an add "
                        "cut short); repaired", len(bad))

    # ------------------------------------------------------------ header
    def _get(self, word: int) -> int:
        return int(self._hdr[word])

    indexed_up_to = property(lambda self: self._get(_H_INDEXED))
    log_end = property(lambda self: self._get(_H_LOG_END))
    wheel_second = property(lambda self: self._get(_H_SECOND))
    log_start = property(lambda self: self._get(_H_LOG_START))

    def _index(self, second: int) -> int:
        return second % self.slot_count

    # ------------------------------------------------------------ adding
    def add(self, seconds: list[int], dues: list[int], offsets: list[int],
            indexed_up_to: int) -> None:
        """Chain one record per (slot second, due ms, parked offset) and record that the
        timestamp queue is indexed up to ``indexed_up_to``. Every second must lie in
        [wheel_second, wheel_second + slots)."""
        n = len(seconds)
        start = self.log_end
        if n:
            k = np.asarray(seconds, np.int64) % self.slot_count
            offs = np.asarray(offsets, np.int64)
            order = np.argsort(k, kind="stable")        # by slot, then by position
            ks, ps = k[order], start + order
            head = np.ones(n, bool)
            head[1:] = ks[1:] != ks[:-1]
            prev_sorted = np.empty(n, np.int64)
            prev_sorted[1:] = ps[:-1]
            prev_sorted[head] = self.slots["last"][ks[head]]
            recs = np.empty(n, RECORD)
            recs["due"] = dues
            recs["off"] = offs
            recs["prev"][order] = prev_sorted
            self.log.write(start, recs)                  # records before the slots
            starts = np.nonzero(head)[0]
            ends = np.r_[starts[1:], n] - 1
            uk = ks[starts]
            last, first = self.slots["last"], self.slots["first"]
            first[uk] = np.where(last[uk] < 0, ps[starts], first[uk])
            last[uk] = ps[ends]
            self.slots["count"][uk] += ends - starts + 1
            self.slots["min_off"][uk] = np.minimum(self.slots["min_off"][uk],
                                                   np.minimum.reduceat(offs[order], starts))
        self._hdr[_H_LOG_END] = start + n                # then the header
        self._hdr[_H_INDEXED] = indexed_up_to

    def uncount(self, second: int) -> None:
        """One record of ``second``'s slot was recalled (the record stays; loads skip it)."""
        s = self.slots[self._index(second):self._index(second) + 1]
        if int(s["count"][0]) > 0:
            s["count"] -= 1

    # ------------------------------------------------------------ reading
    def walk(self, second: int) -> list[tuple[int, int]]:
        """(due ms, parked offset) of the records chained in ``second``'s slot."""
        out = []
        pos = int(self.slots["last"][self._index(second)])
        start, end = self.log_start, self.log_end
        while start <= pos < end:
            due, off, pos = self.log.read(pos)
            out.append((due, off))
        return out

    def _indexes(self, lo: int, hi: int) -> np.ndarray:
        if hi - lo >= self.slot_count:
            return np.arange(self.slot_count)
        return np.arange(lo, hi) % self.slot_count

    def next_busy(self, lo: int, hi: int) -> int | None:
        """The first second in [lo, hi) whose slot holds a record, else None."""
        if hi <= lo:
            return None
        hi = min(hi, lo + self.slot_count)
        busy = np.nonzero(self.slots["last"][self._indexes(lo, hi)] >= 0)[0]
        return lo + int(busy[0]) if len(busy) else None

    def count_between(self, lo: int, hi: int) -> int:
        """Records (not recalled) chained in the slots of seconds [lo, hi)."""
        if hi <= lo:
            return 0
        return int(self.slots["count"][self._indexes(lo, hi)].sum())

    def lowest_offset(self) -> int:
        """The lowest parked offset chained in any slot (NO_OFFSET if none)."""
        return int(self.slots["min_off"].min())

    # ------------------------------------------------------------ advancing
    def advance(self, second: int) -> None:
        """Empty the slots of [wheel_second, second) (their records are delivered), then
        move ``wheel_second`` and ``log_start`` and delete timer log files no slot needs."""
        lo = self.wheel_second
        if second <= lo:
            return
        idx = self._indexes(lo, second)
        self.slots["last"][idx] = -1
        self.slots["first"][idx] = -1
        self.slots["count"][idx] = 0
        self.slots["min_off"][idx] = NO_OFFSET
        self._hdr[_H_SECOND] = second                    # slots first, then the header
        firsts = self.slots["first"]
        live = firsts[firsts >= 0]
        start = int(live.min()) if len(live) else self.log_end
        if start > self.log_start:
            self._hdr[_H_LOG_START] = start
            self.log.drop_below(start)

    def flush(self) -> None:
        """Make what was written durable: the timer log, then the wheel."""
        self.log.flush()
        self._mm.flush()

    def close(self) -> None:
        self.log.close()
        self._hdr = self.slots = None
        try:
            self._mm.close()
        except BufferError:
            pass            # a numpy view still refers to the map; it goes with the process
        os.close(self._fd)
