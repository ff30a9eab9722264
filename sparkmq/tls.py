"""Development TLS material: ``sparkmq tls selfsigned --out DIR --host 127.0.0.1``.

Makes ``DIR/tls.key`` (an EC P-256 private key, PKCS#8 PEM, mode 0600) and
``DIR/tls.crt`` (a self-signed X.509 certificate, PEM) naming every ``--host`` as a
subject alternative name (IP addresses as IP entries, other names as DNS entries),
valid for ``--days`` (365) days, usable for TLS servers and clients. Clients trust
it by using the certificate itself as the CA file (``sparkmq admin --tls-ca
DIR/tls.crt``, ``curl --cacert``). For production use certificates from your CA.

Built on the ``cryptography`` package (pyca): well kept, and the standard way to
make keys and X.509 certificates in Python; the ``ssl`` module cannot make them.
Existing files are never overwritten; each file is written durably (whole or absent
after a power loss: ``durable.create_durably``).
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import os

from .durable import create_durably, makedirs_durably
from .errors import InvalidConfigError

KEY_FILE, CERT_FILE = "tls.key", "tls.crt"


def _alt_name(host: str):
    from cryptography import x509
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_self_signed(out_dir: str, hosts: list[str], *, days: int = 365) -> tuple[str, str]:
    """Write a key and a self-signed certificate for ``hosts`` into ``out_dir``;
    returns ``(cert_path, key_path)``. InvalidConfigError if either file exists."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise InvalidConfigError("give at least one --host (e.g. 127.0.0.1 or localhost)")
    cert_path, key_path = os.path.join(out_dir, CERT_FILE), os.path.join(out_dir, KEY_FILE)
    for path in (cert_path, key_path):
        if os.path.exists(path):
            raise InvalidConfigError(f"{path} exists; remove it or choose another --out")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0]),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sparkmq development")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in hosts]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    makedirs_durably(out_dir)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    try:        # each whole or absent after a power loss (an empty key file fails TLS)
        create_durably(key_path, key_pem, mode=0o600)
        create_durably(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    except FileExistsError as e:   # (made since the check above)
        raise InvalidConfigError(f"{e.filename} exists; remove it or choose another --out") \
            from None
    return cert_path, key_path


def main(argv: list[str] | None = None) -> int:
    """``sparkmq tls selfsigned --out DIR [--host H ...] [--days N]``."""
    import argparse
    import sys
    p = argparse.ArgumentParser(prog="sparkmq tls", description="development TLS material")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("selfsigned", help="make a self-signed key and certificate pair")
    s.add_argument("--out", required=True, help="folder for tls.key and tls.crt")
    s.add_argument("--host", action="append", help="host name or IP the certificate names "
                                                   "(repeatable; default 127.0.0.1 and localhost)")
    s.add_argument("--days", type=int, default=365)
    args = p.parse_args(argv)
    try:
        cert, key = make_self_signed(args.out, args.host or ["127.0.0.1", "localhost"],
                                     days=args.days)
    except InvalidConfigError as e:
        print(f"sparkmq tls: {e}", file=sys.stderr)
        return 1
    print(f"wrote {cert} and {key} (0600)\n"
          f"broker config: adminTlsCertFile={cert}\n               adminTlsKeyFile={key}\n"
          f"clients trust it with: sparkmq admin --tls-ca {cert} ...")
    return 0


def server_pem_pair(cert_path: str, key_path: str, settings: str) -> tuple[bytes, bytes]:
    """The PEM bytes ``(certificate chain, key)`` of a server's TLS pair, read once and
    checked at start (a wrong file fails here, not at the first handshake): each file
    readable and PEM, and the two loading as a pair (``server_ssl_context``). The one
    loader of server certificates: gRPC and Arrow Flight take the bytes, the admin
    endpoint and the HA link the context. InvalidConfigError naming ``settings``."""
    pem = {}
    for what, path in (("certificate", cert_path), ("key", key_path)):
        try:
            with open(path, "rb") as f:
                pem[what] = f.read()
        except OSError as e:
            raise InvalidConfigError(f"{settings}: cannot read the TLS {what} {path}: "
                                     f"{e.strerror}; `sparkmq tls selfsigned --out DIR` makes "
                                     "a development pair") from None
        if b"-----BEGIN" not in pem[what]:
            raise InvalidConfigError(f"{settings}: the TLS {what} {path} is not PEM")
    server_ssl_context(cert_path, key_path, settings)
    return pem["certificate"], pem["key"]


def server_ssl_context(cert_path: str, key_path: str, settings: str):
    """A TLS 1.2+ server context of a PEM certificate chain and its key;
    InvalidConfigError naming ``settings`` (the configuration keys) when they do not
    load (unreadable, not PEM, or a key that is not the certificate's)."""
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as e:
        raise InvalidConfigError(
            f"{settings} ({cert_path}, {key_path}) cannot be loaded (the certificate and "
            f"key do not load as a pair): {e}; give a PEM certificate and its key "
            "(`sparkmq tls selfsigned --out DIR` makes a development pair)") from None
    return ctx
