"""gRPC server credentials for ``tlsServerMode=enforcing`` (the broker's RocketMQ port)."""
from __future__ import annotations

from ..errors import InvalidConfigError


def grpc_server_credentials(cert_path: str, key_path: str):
    """gRPC server credentials of a PEM certificate chain and its key (TLS 1.2+, no
    client certificate asked); InvalidConfigError saying which file is wrong."""
    import grpc
    pem = {}
    for what, path in (("certificate", cert_path), ("key", key_path)):
        try:
            with open(path, "rb") as f:
                pem[what] = f.read()
        except OSError as e:
            raise InvalidConfigError(f"cannot read the TLS {what} {path}: {e.strerror}; "
                                     "`sparkmq tls selfsigned --out DIR` makes a development "
                                     "pair") from None
        if b"-----BEGIN" not in pem[what]:
            raise InvalidConfigError(f"the TLS {what} {path} is not PEM")
    import ssl
    try:    # gRPC would only fail at the first handshake: check the pair now
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
    except ssl.SSLError as e:
        raise InvalidConfigError(f"the TLS certificate {cert_path} and key {key_path} do not "
                                 f"load as a pair: {e}") from None
    return grpc.ssl_server_credentials([(pem["key"], pem["certificate"])])
