"""Check a whole store for damage (``sparkmq admin verify STORE``).

What is checked, read-only, at the newest version:

- every commit file and checkpoint of ``_log/`` parses, and ``_last_checkpoint`` names a
  checkpoint that is there;
- every segment of the version is there with at least its recorded size, starts with the
  segment schema, and every record batch up to the recorded size passes its bounds and
  CRC32C checks and decodes (format-1 segments: bounds and decoding only);
- every ConsumeQueue and Index file of the version is readable Parquet with its recorded
  row count, and each entry points at a batch that exists (a whole batch start in a
  segment of the version, with the entry's row inside the batch). Entries below the oldest
  segment (removed by retention) are counted, not reported.

The result is a :class:`VerifyReport`; nothing is repaired. ``progress(done_bytes)`` is
called as segment bytes are checked (the admin command draws its progress bar with it).
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import CorruptStoreError, SparkMQError
from . import format as fmt
from . import segment as seg
from . import sidefile
from .fs import StoreFS
from .txlog import TransactionLog, decode_actions

log = logging.getLogger(__name__)


@dataclass
class Problem:
    """One damaged or missing thing: its kind, file, byte position (if any) and error."""

    kind: str            # "commit", "checkpoint", "segment", "batch", "consumequeue", "index"
    path: str
    error: str
    position: int | None = None


@dataclass
class VerifyReport:
    """What :func:`verify_store` checked and the problems it found."""

    url: str
    version: int = -1
    log_versions: int = 0
    checkpoints: int = 0
    segments: int = 0
    segment_bytes: int = 0
    batches: int = 0
    rows: int = 0
    side_tables: int = 0
    side_entries: int = 0
    entries_below_retention: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def total_segment_bytes(url: str, storage_options: dict | None = None) -> int:
    """Bytes of segment data the newest version holds (the progress bar's total; 0 when
    the log does not replay, which :func:`verify_store` then reports)."""
    try:
        state = TransactionLog(StoreFS(url, storage_options)).snapshot()
    except (SparkMQError, ValueError, OSError):
        return 0
    return sum(a.size for a in state.segments.values())


def verify_store(url: str, *, storage_options: dict | None = None,
                 progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Check every log file, segment batch and side table of the store at ``url``."""
    sfs = StoreFS(url, storage_options)
    report = VerifyReport(url=sfs.url)
    tl = TransactionLog(sfs)
    _check_log(sfs, tl, report)
    try:
        state = tl.snapshot()
    except (SparkMQError, ValueError, OSError) as exc:
        report.problems.append(Problem("commit", fmt.LOG_DIR, f"the log does not replay: {exc}"))
        return report
    report.version = state.version
    batches = _check_segments(sfs, state, report, progress or (lambda n: None))
    for kind, files in (("consumequeue", state.consumequeue_files),
                        ("index", state.index_files)):
        for add in files.values():
            _check_side_table(sfs, kind, add, batches, report)
    return report


def _check_log(sfs: StoreFS, tl: TransactionLog, report: VerifyReport) -> None:
    names = sfs.list_names(fmt.LOG_DIR)
    for name in sorted(names):
        kind = "commit" if fmt.parse_commit_file(name) is not None else \
            "checkpoint" if fmt.parse_checkpoint_file(name) is not None else None
        if kind is None:
            continue
        rel = f"{fmt.LOG_DIR}/{name.rsplit('/', 1)[-1]}"
        try:
            decode_actions(sfs.read_bytes(rel), rel)
        except (SparkMQError, ValueError, OSError) as exc:
            report.problems.append(Problem(kind, rel, str(exc)))
        if kind == "commit":
            report.log_versions += 1
        else:
            report.checkpoints += 1
    pointer = fmt.last_checkpoint_file()
    if sfs.exists(pointer):
        try:
            version = int(json.loads(sfs.read_bytes(pointer))["version"])
            if not sfs.exists(fmt.checkpoint_file(version)):
                raise ValueError(f"it names checkpoint {version}, which is not there")
        except (ValueError, KeyError, TypeError) as exc:
            report.problems.append(Problem("checkpoint", pointer, str(exc)))


def _check_segments(sfs: StoreFS, state, report: VerifyReport,
                    progress: Callable[[int], None]) -> dict[int, int]:
    """Check every batch of every segment; returns {batch offset: rows} of the good ones."""
    good: dict[int, int] = {}
    done = 0
    for add in sorted(state.segments.values(), key=lambda a: a.base_offset):
        rel, base, size = add.path, int(add.base_offset), add.size
        report.segments += 1
        try:
            buf = sfs.read_buffer(rel)
        except FileNotFoundError:
            report.problems.append(Problem("segment", rel, "the file is missing"))
            continue
        except OSError as exc:
            report.problems.append(Problem("segment", rel, f"cannot read it: {exc}"))
            continue
        if len(buf) < size:
            report.problems.append(Problem("segment", rel, f"it has {len(buf)} bytes; the "
                                           f"log records {size}"))
        _check_batches(buf.slice(0, min(size, len(buf))), rel, base, good, report)
        report.segment_bytes += size
        done += size
        progress(done)
        del buf
    return good


def _check_batches(buf: pa.Buffer, rel: str, base: int, good: dict[int, int],
                   report: VerifyReport) -> None:
    pos = seg.header_length(buf)
    if pos == 0:
        report.problems.append(Problem("segment", rel, "it does not start with the segment "
                                       "schema", 0))
        return
    legacy = seg.segment_format(buf) == 1
    while pos < len(buf):
        n = seg.message_extent(buf, pos)
        if n == 0:                                    # end-of-stream marker
            break
        try:
            batch = seg.read_batch_at(buf, pos, rel, legacy=legacy)
        except CorruptStoreError as exc:
            report.problems.append(Problem("batch", rel, str(exc), pos))
            if n is None or n == seg.NOT_A_MESSAGE or n <= 0 or pos + n > len(buf):
                return                                # framing lost: the rest is unreachable
            pos += n
            continue
        good[base + pos] = batch.num_rows
        report.batches += 1
        report.rows += batch.num_rows
        pos += n


def _check_side_table(sfs: StoreFS, kind: str, add, batches: dict[int, int],
                      report: VerifyReport) -> None:
    rel = add.path
    report.side_tables += 1
    try:
        with sidefile.open_checked(sfs, rel) as f:
            table = pq.read_table(f, columns=["batch_offset", "row"],
                                  page_checksum_verification=True)
    except FileNotFoundError:
        report.problems.append(Problem(kind, rel, "the file is missing"))
        return
    except CorruptStoreError as exc:
        report.problems.append(Problem(kind, rel, str(exc)))
        return
    except (pa.ArrowException, OSError, ValueError) as exc:
        report.problems.append(Problem(kind, rel, f"not readable Parquet: {exc}"))
        return
    if add.rows is not None and table.num_rows != add.rows:
        report.problems.append(Problem(kind, rel, f"it has {table.num_rows} rows; the log "
                                       f"records {add['rows']}"))
    report.side_entries += table.num_rows
    per_batch = table.group_by("batch_offset").aggregate([("row", "max"), ("row", "min")])
    starts = sorted(batches)
    oldest = starts[0] if starts else None
    bad = []
    for offset, max_row, min_row in zip(per_batch["batch_offset"].to_pylist(),
                                        per_batch["row_max"].to_pylist(),
                                        per_batch["row_min"].to_pylist()):
        rows = batches.get(offset)
        if rows is not None and 0 <= min_row and max_row < rows:
            continue
        if oldest is None or offset < oldest:
            n = pc.sum(pc.equal(table["batch_offset"], offset)).as_py()
            report.entries_below_retention += n
            continue
        bad.append((offset, min_row, max_row, rows))
    for offset, min_row, max_row, rows in bad[:10]:
        what = "no whole, undamaged batch starts there" if rows is None else \
            f"rows {min_row}..{max_row} but the batch has {rows}"
        report.problems.append(Problem(kind, rel, f"entries point at batch offset {offset}: "
                                       f"{what}"))
    if len(bad) > 10:
        report.problems.append(Problem(kind, rel, f"{len(bad) - 10} more bad batch offsets"))
