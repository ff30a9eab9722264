"""Server TLS of the broker's client ports under ``tlsServerMode=enforcing``: the
RocketMQ gRPC port and the Arrow Flight port serve one certificate pair
(``tlsServerCertPath``/``tlsServerKeyPath``), loaded once by ``sparkmq.tls``."""
from __future__ import annotations

from ..tls import server_pem_pair

SETTINGS = "tlsServerCertPath/tlsServerKeyPath"


def server_pair(config) -> tuple[bytes, bytes] | None:
    """``(certificate chain PEM, key PEM)`` for the client ports of a broker ``config``
    with ``tlsServerMode=enforcing`` (None: plaintext); InvalidConfigError at start when
    the files do not load."""
    if config.tls_server_mode != "enforcing":
        return None
    return server_pem_pair(config.tls_server_cert_path, config.tls_server_key_path, SETTINGS)


def grpc_server_credentials(pair: tuple[bytes, bytes]):
    """gRPC server credentials of ``pair`` (TLS 1.2+, no client certificate asked)."""
    import grpc
    cert, key = pair
    return grpc.ssl_server_credentials([(key, cert)])
