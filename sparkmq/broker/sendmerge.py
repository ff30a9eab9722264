"""Merging concurrent sends into one store append (group commit at the broker).

Sends made on threads (Flight DoPut batches; in-process callers) that wait at the same
moment are appended together (the gRPC loop's own sends run one at a time and await
their fsync as futures, sharing one fsync: ``replicawait``): the first request to
arrive becomes the *leader* and appends its rows; requests arriving while it works
queue up, and after its append the leader hands the lead to the first of
them, which appends everything queued (up to ``max_rows``, and ``max_bytes`` where the
caller gives sizes) as ONE record batch, with
one flush wait under SYNC_FLUSH. A lone request is appended at once (no waiting for
company), so sequential senders pay only a lock.

Each request gets exactly the per-row results of its own rows, in order. Requests
are validated message by message before they get here (``SendService.refusal``), so
a merged batch is rarely refused; if it is, or fails with any exception, it is
retried request by request with ``append``, which isolates bad rows: one bad request
never fails the others, and does not slow them down to row-by-row appends. An
exception of one request's own append is raised in that request only.

Thread-safety: ``submit`` may be called from any number of threads. Every wait is
bounded: a follower whose rows have not been taken after ``wait_s`` appends them
itself; rows already taken are waited for until the leader's append returns (bounded
by the store's own timeouts).
"""
from __future__ import annotations

import threading
from typing import Callable

DEFAULT_MAX_ROWS = 4096
DEFAULT_MAX_BYTES = 64 << 20     # (with ``nbytes``) a merge's bodies, at most
DEFAULT_WAIT_S = 1.0


class _Ticket:
    __slots__ = ("rows", "results", "error", "done", "lead")

    def __init__(self, rows):
        self.rows = rows
        self.results: list | None = None
        self.error: BaseException | None = None
        # results ready, or the lead handed over (a ticket is a follower's only: a lone
        # request, the usual one, appends at once and waits for no one)
        self.done = threading.Event()
        self.lead = False


class SendMerger:
    """See the module docstring. ``append(rows)`` stores one ``SendRows`` and returns
    one result per row (refused rows get their exception); ``append_whole(rows)`` stores
    them as one batch or raises; ``concat(list of SendRows)`` joins several into one."""

    def __init__(self, append: Callable, append_whole: Callable, concat: Callable, *,
                 max_rows: int = DEFAULT_MAX_ROWS, wait_s: float = DEFAULT_WAIT_S,
                 nbytes: Callable | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self._append = append
        self._append_whole = append_whole
        self._concat = concat
        self.max_rows = max_rows
        # ``nbytes(rows)``: their size, to keep a merge under ``max_bytes`` (None: rows only)
        self._nbytes, self.max_bytes = nbytes, max_bytes
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._pending: list[_Ticket] = []
        self._leading = False
        self.batches = 0                     # store appends made (for metrics and tests)
        self.requests = 0                    # requests served

    @property
    def pending(self) -> int:
        """Requests queued behind the current leader."""
        with self._lock:
            return len(self._pending)

    def submit(self, rows, *, merge: bool = True) -> list:
        """Append ``rows`` (alone or with the requests waiting now); per-row results.
        ``merge=False``: alone, at once, whatever waits (a caller that runs its sends one
        at a time and waits for them itself: the gRPC loop, ``replicawait``)."""
        if not merge:
            self.batches += 1
            self.requests += 1
            return self._append(rows)
        ticket = None
        with self._lock:
            if self._leading:            # a leader is at work: queue up behind it
                ticket = _Ticket(rows)
                self._pending.append(ticket)
            self._leading = True         # (no leader: nothing waits either)
        if ticket is None:               # the usual request: appended at once, no ticket
            try:
                return self._append(rows)
            finally:
                self.batches += 1
                self.requests += 1
                self._pass_lead()        # to a request that came meanwhile
        while not ticket.lead:
            if ticket.done.wait(self.wait_s):
                break
            with self._lock:
                if ticket.lead:
                    break
                if ticket in self._pending:  # not taken yet: append it alone
                    self._pending.remove(ticket)
                    alone = True
                else:
                    alone = False            # taken: its results are on their way
            if alone:
                return self._append(rows)
        if ticket.lead:
            self._lead()
        return self._result(ticket)

    def _lead(self) -> None:
        """One round: append the head of the queue (the leader's own ticket first, then
        what queued behind it, up to ``max_rows``), then hand the lead to the next
        waiting request, or give it up when none waits."""
        with self._lock:
            batch = [self._pending.pop(0)]
            nrows = len(batch[0].rows)
            # (sizes only when there is company: a lone request, the usual one, needs none)
            size = self._nbytes(batch[0].rows) if self._nbytes and self._pending else 0
            while self._pending and nrows + len(self._pending[0].rows) <= self.max_rows:
                more = self._nbytes(self._pending[0].rows) if self._nbytes else 0
                if size + more > self.max_bytes:
                    break
                t = self._pending.pop(0)
                batch.append(t)
                nrows += len(t.rows)
                size += more
        try:
            self._run(batch)
        finally:
            self._pass_lead()

    def _pass_lead(self) -> None:
        """Hand the lead to the first waiting request, or give it up when none waits."""
        with self._lock:
            if self._pending:
                nxt = self._pending[0]
                nxt.lead = True
                nxt.done.set()
            else:
                self._leading = False

    def _run(self, batch: list[_Ticket]) -> None:
        outcomes = self._append_batch(batch)
        self.batches += 1
        self.requests += len(batch)
        for t, outcome in zip(batch, outcomes):
            if isinstance(outcome, BaseException):
                t.error = outcome
            else:
                t.results = outcome
            t.done.set()

    def _append_batch(self, batch: list[_Ticket]) -> list:
        """Per ticket: its rows' results, or the exception its request alone failed with."""
        if len(batch) > 1:
            try:
                results = self._append_whole(self._concat([t.rows for t in batch]))
            # a merged batch refused or failed as a whole, by a SparkMQError or by an
            # unexpected error of one request's rows: request by request below, so a bad
            # request fails alone and never the others
            except Exception:
                pass
            else:
                out, start = [], 0
                for t in batch:
                    out.append(results[start:start + len(t.rows)])
                    start += len(t.rows)
                return out
        return [self._append_alone(t.rows) for t in batch]

    def _append_alone(self, rows) -> list | BaseException:
        try:
            return self._append(rows)
        # an unexpected error is this request's own (raised again in its thread only)
        except Exception as e:
            return e

    @staticmethod
    def _result(ticket: _Ticket) -> list:
        if ticket.error is not None:
            raise ticket.error
        return ticket.results
