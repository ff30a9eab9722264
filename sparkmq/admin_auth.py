"""The broker admin token: where it lives, how callers find it, how it is checked.

A broker's admin HTTP endpoint (``broker/admin_http.py``) answers state changes and
reads only to ``Authorization: Bearer <token>``. The token is, in this order:

1. the ``SPARKMQ_ADMIN_TOKEN`` environment variable of the broker process, if set
   (no file is written; as ``JUPYTER_TOKEN`` does);
2. else the file ``adminTokenFile`` (broker config), or by default
   ``<storePathRootDir>/admin.token`` for a store on a local disk
   (``~/.sparkmq/<cluster>-<brokerName>-<brokerId>.admin-token`` for a remote store),
   created at the first start with ``secrets.token_urlsafe(32)`` and mode 0600.

Callers (``sparkmq admin``, the Spark committer's hand-off, tests, bench) find it
with :func:`find_token`: an explicit token, else ``SPARKMQ_ADMIN_TOKEN``, else a
token file (given, or the one beside a local store). The file lives beside the
store because the processes allowed to write the store (Spark jobs committing
through the broker) are the ones that can read it.

An https endpoint (adminTlsCertFile) is trusted through the system's CAs, or a
CA/certificate file in ``SPARKMQ_ADMIN_CA`` (``--tls-ca`` for the CLI).

Tokens are compared with ``hmac.compare_digest`` (constant time).
"""
from __future__ import annotations

import hmac
import os

from .secretfile import load_or_create, read_secret

TOKEN_ENV = "SPARKMQ_ADMIN_TOKEN"
CA_ENV = "SPARKMQ_ADMIN_CA"          # CA/certificate file an https admin endpoint is trusted with
TOKEN_FILE_NAME = "admin.token"


def local_store_dir(store_url: str) -> str | None:
    """The folder of a store on a local disk (a path or ``file://``), else None."""
    if store_url.startswith("file://"):
        return store_url[len("file://"):]
    return None if "://" in store_url else store_url


def default_token_file(store_url: str, *, cluster: str, broker_name: str,
                       broker_id: int) -> str:
    """Where a broker keeps its token when ``adminTokenFile`` is not set."""
    folder = local_store_dir(store_url)
    if folder is not None:
        return os.path.join(os.path.abspath(folder), TOKEN_FILE_NAME)
    return os.path.join(os.path.expanduser("~"), ".sparkmq",
                        f"{cluster}-{broker_name}-{broker_id}.admin-token")


def broker_token(token_file: str) -> tuple[str, str | None, bool]:
    """The broker's own token at start: ``(token, file or None, created)``."""
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env, None, False
    token, created = load_or_create(token_file)
    return token, token_file, created


def find_token(*, token: str | None = None, token_file: str | None = None,
               store_url: str | None = None) -> str | None:
    """The admin token a caller should send, or None if none is found: ``token``,
    else ``SPARKMQ_ADMIN_TOKEN``, else ``token_file``, else the token file beside
    the local store ``store_url``."""
    if token:
        return token
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env
    if token_file is None and store_url is not None:
        folder = local_store_dir(store_url)
        token_file = None if folder is None else os.path.join(folder, TOKEN_FILE_NAME)
    if token_file is None:
        return None
    try:
        return read_secret(token_file)
    except FileNotFoundError:
        return None


def auth_headers(token: str | None) -> dict[str, str]:
    """The request headers carrying ``token`` (none if it is None)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def client_ssl_context(ca_file: str | None = None):
    """The TLS context callers reach an https admin endpoint with: trusting ``ca_file``
    (else ``SPARKMQ_ADMIN_CA``) besides the system's CAs; None for the default."""
    ca_file = ca_file or os.environ.get(CA_ENV) or None
    if ca_file is None:
        return None
    import ssl
    return ssl.create_default_context(cafile=ca_file)


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (constant time)."""
    scheme, _, presented = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    presented = presented.strip().encode()
    return hmac.compare_digest(presented, token.encode())


MISSING_TOKEN_HINT = (
    "the broker's admin endpoint needs its token: pass --token, set SPARKMQ_ADMIN_TOKEN, or "
    f"--token-file (the broker printed the token at start and keeps it in {TOKEN_FILE_NAME} "
    "in its store folder, or in adminTokenFile)")
