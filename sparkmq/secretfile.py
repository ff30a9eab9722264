"""Secrets kept in files readable by their owner only (mode 0600).

One place creates and reads them: the broker's admin token (``sparkmq.admin_auth``)
and the cluster secret brokers and NameServers share (``sparkmq.namesrv.signing``).
A secret is ``secrets.token_urlsafe`` text on one line.

``load_or_create(path)`` reads the file, or creates it atomically and durably
(``durable.create_durably``: written to a temporary file made with mode 0600, never a
moment world-readable, fsynced, then linked to its name, which fails if the name
exists); of two processes racing to create it, both end with the winner's secret.
Thread-safe (no state).
"""
from __future__ import annotations

import os
import secrets

from .durable import create_durably, makedirs_durably
from .errors import InvalidConfigError

SECRET_BYTES = 32
PRIVATE_MODE = 0o600


def read_secret(path: str) -> str:
    """The secret in ``path`` (stripped); InvalidConfigError if the file is empty or
    readable by other users."""
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise InvalidConfigError(
            f"{path} is readable by other users (mode {mode:o}); run `chmod 600 {path}`")
    with open(path, encoding="utf-8") as f:
        secret = f.read().strip()
    if not secret:
        raise InvalidConfigError(f"{path} is empty; delete it to have a new secret made")
    return secret


def load_or_create(path: str, nbytes: int = SECRET_BYTES) -> tuple[str, bool]:
    """``(secret, created)``: the secret in ``path``, made (0600) if the file is absent."""
    try:
        return read_secret(path), False
    except FileNotFoundError:
        pass
    makedirs_durably(os.path.dirname(os.path.abspath(path)))
    secret = secrets.token_urlsafe(nbytes)
    while secret.startswith("-"):          # "--token -abc" would read as an option
        secret = secrets.token_urlsafe(nbytes)
    try:
        # its name kept through a power loss: else a new secret is made at the next start,
        # and every client and peer holding this one is refused
        create_durably(path, (secret + "\n").encode(), mode=PRIVATE_MODE)
    except FileExistsError:        # another process made it first: use theirs
        return read_secret(path), False
    return secret, True
