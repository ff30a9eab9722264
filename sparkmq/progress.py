"""Progress of long work (recovery at start, vacuum, verify, retention, bench scripts):
a tqdm bar when the output is a terminal, else a log line every ``every_s`` seconds
(and at the end), so a daemon's log or a CI log shows where it is.

    with Progress(total_bytes, "recover", unit="B") as p:
        for ...:
            p.advance(n)

tqdm is the well-kept standard for terminal bars; the log lines go through
``logging`` (logger ``sparkmq.progress``). Not thread-safe: one owner.
"""
from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("sparkmq.progress")

LOG_EVERY_S = 5.0


class Progress:
    """``total`` units of work named ``desc``; ``stream`` (default stderr) decides
    between a bar (a terminal) and log lines."""

    def __init__(self, total: int, desc: str, *, unit: str = "it", stream=None,
                 every_s: float | None = None, print_lines: bool = False,
                 end_line: bool | None = None):
        """``print_lines``: write the lines to ``stream`` (a command's stderr) instead of
        logging them (a daemon), and always end with one (``end_line`` False: only when
        the work took at least ``every_s``, as logged lines do)."""
        self.total, self.desc, self.unit = int(total), desc, unit
        self.print_lines = print_lines
        self.end_line = print_lines if end_line is None else end_line
        self.done = 0
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self._start = self._last = time.monotonic()
        stream = sys.stderr if stream is None else stream
        self._stream = stream
        self._bar = None
        if getattr(stream, "isatty", lambda: False)():
            from tqdm import tqdm
            self._bar = tqdm(total=self.total, desc=desc, unit=unit, file=stream,
                             unit_scale=unit == "B", leave=False)

    def advance(self, n: int = 1) -> None:
        self.set(self.done + n)

    def set(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(done - self.done)
        self.done = done
        now = time.monotonic()
        if self._bar is None and now - self._last >= self.every_s:
            self._last = now
            self._line(now)

    def _line(self, now: float) -> None:
        pct = f" ({100 * self.done // self.total} %)" if self.total else ""
        line = (f"{self.desc}: {self.done}/{self.total} {self.unit}{pct}, "
                f"{now - self._start:.0f} s")
        if self.print_lines:
            print(line, file=self._stream, flush=True)
        else:
            log.info("%s", line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.end_line or time.monotonic() - self._start >= self.every_s:
            self._line(time.monotonic())           # long work ends with a last line

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(iterable, desc: str, *, total: int | None = None, unit: str = "it",
          every_s: float | None = None):
    """Yield from ``iterable`` with a :class:`Progress` over it (``total``: its length
    when it has none): a bar on a terminal, else a line on stderr every ``every_s``
    (bench scripts: their results go to stdout, untouched)."""
    if total is None:
        total = len(iterable)
    with Progress(total, desc, unit=unit, every_s=every_s, print_lines=True,
                  end_line=False) as p:
        for item in iterable:
            yield item
            p.advance()
