"""The writer lease: who may write a store, and with which epoch.

A store has at most one writer: the owner of the newest ``lease`` action of its
transaction log (FORMAT.md). The owner is ``<host>:<pid>:<token>``; the epoch
grows with every new writer (and with every promotion of a replica). A writer
renews its lease at its publishes; a lease unrenewed past ``expiresTime`` may be
taken over; a writer whose lease was taken learns it at its next commit
(:meth:`WriterLease.check`, raising FencedError) and refuses writes from then on.

:func:`lease_status` is the one place that decides whether a lease is free,
live or left by a crash; the in-process registry (:func:`register_live`,
:func:`live_writer`) tells a live Store of this process from a dead one.

On disk: only the ``lease`` actions of the log. After a crash: the lease stays
unreleased until it expires (or its holder process is seen gone on this host);
the next writer takes it with epoch + 1 and recovers. Thread-safety: the
registry is thread-safe; a :class:`WriterLease` is used under the store's
commit lock.
"""
from __future__ import annotations

import logging
import os
import socket
import uuid
import weakref
from dataclasses import replace
from typing import Callable

from ..errors import FencedError, StoreLockedError
from .actions import Lease
from .txlog import LogState

log = logging.getLogger("sparkmq.store")

LEASE_FREE = "free"
LEASE_LIVE = "live"
LEASE_CRASHED = "crashed"

_LIVE: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()


def register_live(token: str, writer: object) -> None:
    """``writer`` (a Store) holds the lease with owner token ``token`` in this process."""
    _LIVE[token] = writer


def unregister_live(token: str) -> None:
    _LIVE.pop(token, None)


def live_writer(token: str):
    """The live writer of this process with owner token ``token``, or None."""
    return _LIVE.get(token)


def parse_owner(owner: str) -> tuple[str, str, str]:
    """(host, pid, token) of a lease owner ``host:pid:token``."""
    host, _, rest = str(owner or "").partition(":")
    pid_s, _, token = rest.partition(":")
    return host, pid_s, token


def process_scope() -> str:
    """Where a pid names this process: ``host/boot id/PID namespace``. Two containers
    sharing a hostname have different PID namespaces; a reboot changes the boot id."""
    global _SCOPE
    if _SCOPE is None:
        _SCOPE = "/".join((socket.gethostname(), _read_first("/proc/sys/kernel/random/boot_id"),
                           _readlink("/proc/self/ns/pid")))
    return _SCOPE


_SCOPE: str | None = None


def _read_first(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _same_process_scope(lease: Lease) -> bool:
    """True if the lease's pid can be checked from here: same host, boot and PID
    namespace (a lease without a scope, from a format-1 writer: same hostname)."""
    if lease.scope is not None:
        return lease.scope == process_scope() and "?" not in lease.scope
    return parse_owner(lease.owner)[0] == socket.gethostname()


def local_token(lease: Lease) -> str | None:
    """The owner token when the lease is held by this very process, else None."""
    _, pid_s, token = parse_owner(lease.owner)
    return token if _same_process_scope(lease) and pid_s == str(os.getpid()) else None


def lease_status(lease: Lease | None, now_ms: int) -> str:
    """``free`` (none, or released), ``live`` (held), or ``crashed`` (its holder is gone).

    A lease is live while it is unexpired and, when its owner runs in this process
    scope (host, boot, PID namespace: :func:`process_scope`), the owner process (and
    in this process, the owning Store) still exists. A holder in another scope is
    judged by expiry alone: its pid means nothing here.
    """
    if not lease or lease.released:
        return LEASE_FREE
    if now_ms > int(lease.expires_time or 0):
        return LEASE_CRASHED
    _, pid_s, token = parse_owner(lease.owner)
    if _same_process_scope(lease) and pid_s.isdigit():
        pid = int(pid_s)
        if pid == os.getpid():
            return LEASE_LIVE if token in _LIVE else LEASE_CRASHED
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return LEASE_CRASHED
        except PermissionError:
            return LEASE_LIVE
    return LEASE_LIVE


class WriterLease:
    """This writer's lease on the store at ``url``: identity, epoch, fencing.

    Builds the ``lease`` actions (acquire, renew, promote, advertise, release);
    the store commits them. ``fenced`` turns true once a newer writer is seen
    (or :meth:`fence` is called): every write is refused from then on.
    Not thread-safe by itself: the store calls it under its commit lock.
    """

    def __init__(self, url: str, clock_ms: Callable[[], int], timeout_ms: int):
        self.url = url
        self.clock_ms = clock_ms
        self.timeout_ms = timeout_ms
        self.token = uuid.uuid4().hex[:12]
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{self.token}"
        self.epoch = 0
        self.endpoint: str | None = None   # admin URL of a broker holding the lease
        self.fenced = False

    def is_held_by_other(self, lease: Lease | None) -> bool:
        """True if ``lease`` belongs to another writer that is still live."""
        return lease is not None and lease.owner != self.owner and \
            lease_status(lease, self.clock_ms()) == LEASE_LIVE

    def acquire(self, state: LogState) -> tuple[list[Lease], bool]:
        """The actions taking the lease (epoch + 1) and whether the previous writer
        left it unreleased (a crash). Raises StoreLockedError while another writer
        holds it."""
        lease = state.lease
        if self.is_held_by_other(lease):
            raise StoreLockedError(
                f"store {self.url} is held by writer {lease.owner} (epoch "
                f"{lease.epoch}) until {lease.expires_time}; stop it or open "
                "the store with mode='r'")
        self.epoch = (int(lease.epoch) if lease else 0) + 1
        crashed = bool(lease) and not lease.released
        now = self.clock_ms()
        return [Lease(owner=self.owner, epoch=self.epoch, acquired_time=now,
                      expires_time=now + self.timeout_ms, released=False,
                      scope=process_scope())], crashed

    def check(self, state: LogState) -> None:
        """Raise FencedError (and stay fenced) unless ``state``'s lease is still ours."""
        lease = state.lease
        if lease is None or parse_owner(lease.owner)[2] != self.token or \
                int(lease.epoch) != self.epoch:
            self.fenced = True
            raise FencedError(
                f"store {self.url}: writer lease now belongs to {lease and lease.owner} epoch "
                f"{lease and lease.epoch}; this writer (epoch {self.epoch}) must stop")

    def fence(self) -> None:
        self.fenced = True

    def promotion(self, state: LogState, new_epoch: int) -> list[Lease]:
        """The action re-taking the lease with ``new_epoch`` (a replica's promotion)."""
        return [replace(state.lease or Lease(owner=self.owner, epoch=new_epoch),
                        owner=self.owner, epoch=new_epoch, released=False,
                        expires_time=self.clock_ms() + self.timeout_ms, scope=process_scope())]

    def lapsing(self, state: LogState) -> bool:
        """Whether this writer's lease (as ``state``, its own newest commit, has it) is
        at or past its expiry less a tenth of the timeout (a margin for clocks that
        differ): from then on another writer may take the store over, seal the segment
        this one appends to and never read its later bytes. An append then renews the
        lease first (the publish), and one that ended then is not answered as stored
        before a renewal shows the lease was still this writer's."""
        lease = state.lease
        expires = int((lease.expires_time if lease else None) or 0)
        return self.clock_ms() >= expires - self.timeout_ms // 10

    def renewal_due(self, state: LogState) -> bool:
        expires_ms = (state.lease.expires_time if state.lease else None) or 0
        return int(expires_ms) - self.clock_ms() < self.timeout_ms // 2

    def renewal(self, state: LogState) -> Lease:
        """The renewed ``lease`` action (keeps the advertised endpoint)."""
        now = self.clock_ms()
        acquired = state.lease.acquired_time if state.lease else None
        return Lease(owner=self.owner, epoch=self.epoch,
                     acquired_time=now if acquired is None else acquired,
                     expires_time=now + self.timeout_ms, released=False,
                     endpoint=self.endpoint or None, scope=process_scope())

    def advertising(self, state: LogState, endpoint: str) -> list[Lease]:
        self.endpoint = endpoint
        return [replace(self._current(state), endpoint=endpoint)]

    def release(self, state: LogState) -> list[Lease]:
        return [replace(self._current(state), released=True, expires_time=self.clock_ms())]

    def _current(self, state: LogState) -> Lease:
        return state.lease or Lease(owner=self.owner, epoch=self.epoch)
