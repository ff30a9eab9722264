"""``sparkmq admin verify STORE``: check every batch checksum, side table and log file
(:mod:`sparkmq.log.verify`), with a progress bar on a terminal (tqdm) or a log line every
few seconds otherwise, then a summary (or ``--json``). Exit status 1 when anything is
damaged, 0 when the store is whole."""
from __future__ import annotations

import json

from .errors import CorruptStoreError, SparkMQError

LOG_EVERY_S = 5.0


def _progress(total_bytes: int):
    """A ``progress(done_bytes)`` callback and a function that ends it (sparkmq.progress:
    a bar on a terminal, log lines otherwise)."""
    from .progress import Progress
    p = Progress(total_bytes, "verify: segment bytes checked", unit="B", every_s=LOG_EVERY_S,
                 print_lines=True)
    return p.set, p.close


def summary(report) -> str:
    """The human-readable summary of a :class:`VerifyReport`."""
    lines = [f"store {report.url} at version {report.version}:",
             f"  log: {report.log_versions} commit files, {report.checkpoints} checkpoints",
             f"  segments: {report.segments} ({report.segment_bytes} bytes), "
             f"{report.batches} batches with {report.rows} messages",
             f"  side tables: {report.side_tables} files, {report.side_entries} entries"
             + (f" ({report.entries_below_retention} below retention)"
                if report.entries_below_retention else "")]
    for p in report.problems:
        where = p.path if p.position is None else f"{p.path} byte {p.position}"
        lines.append(f"  DAMAGED {p.kind} {where}: {p.error}")
    lines.append("OK: nothing damaged" if report.ok else
                 f"{len(report.problems)} problem(s): restore the damaged files from a replica "
                 "(or a backup); do not read them")
    return "\n".join(lines)


def store_verify(args) -> None:
    """The admin command (see the module docstring)."""
    from .log import verify
    url = args.store_url or args.store
    if not url:
        raise SparkMQError("verify needs the store: sparkmq admin verify <store URL>")
    update, close = _progress(verify.total_segment_bytes(url))
    try:
        report = verify.verify_store(url, progress=update)
    finally:
        close()
    as_json = args.json or args.verify_json
    print(json.dumps(report.to_dict(), indent=2) if as_json else summary(report))
    if not report.ok:
        raise CorruptStoreError(f"{len(report.problems)} damaged item(s) in {url}")


def add_parser(sub) -> None:
    c = sub.add_parser("verify", help="check every batch checksum, side table and log file")
    c.add_argument("store_url", nargs="?", metavar="store", help="store URL (or --store)")
    c.add_argument("--json", dest="verify_json", action="store_true", help="print JSON")
    c.set_defaults(fn=store_verify)
