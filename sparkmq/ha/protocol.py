"""The replication wire protocol between a master's HAService and a replica's HAClient.

One TCP connection per replica. Every frame is::

    [uint32 header length H][uint64 payload length P][H bytes UTF-8 JSON header][P bytes]

(big-endian). The header is a JSON object with a ``type``; only ``data`` frames
carry a payload (raw CommitLog bytes). Limits: H <= 64 KiB, P <= 64 MiB; a
frame past them ends the connection with an error (never a crash).

Conversation (master M, replica R)::

    M -> R  challenge {nonce, brokerName, epoch, epochs}
    R -> M  hello     {brokerName, brokerId, nonce, proof, offset, followedEpoch}
    M -> R  welcome   {proof, epoch, epochs, truncateTo?}     (or error {code, message})
    M -> R  meta      {topics, consumerOffsets, retention, subscriptionGroups} (at start, on change)
    M -> R  segment   {path, baseOffset}                     (a segment begins)
    M -> R  data      {path, pos, offset, whole} + bytes     (bytes at ``pos`` of ``path``;
                                                              whole: they end at a batch end)
    M -> R  heartbeat {writtenOffset, epoch}                 (every second when idle)
    R -> M  ack       {offset}                               (the end of the last whole
                                                              batch written, whenever it
                                                              advances; on each heartbeat)

Authentication is HMAC-SHA256 challenge-response over the shared ``haSecret``
in both directions: ``proof = HMAC(secret, "<role>|<nonce>|<brokerName>")``
with role ``replica`` (R proves to M over M's nonce) and ``master`` (M proves
to R over R's nonce). The secret never crosses the wire; a stranger without it
is refused (and logged) before any byte of the CommitLog is sent.

With ``haTlsEnable`` the same conversation runs inside TLS (``tlslink.py``).

``check_secret`` refuses, at broker start, an ``haSecret`` shorter than 16 bytes
or a shipped placeholder (``change-me...``).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import select
import socket
import struct

from ..errors import HAProtocolError, InvalidConfigError

PREFIX = struct.Struct("!IQ")
MAX_HEADER_BYTES = 64 << 10
MAX_PAYLOAD_BYTES = 64 << 20
CHUNK_BYTES = 4 << 20            # largest data frame the master sends



def new_nonce() -> str:
    return os.urandom(16).hex()


def proof(secret: str, role: str, nonce: str, broker_name: str) -> str:
    """HMAC-SHA256 of ``role|nonce|broker_name`` under ``secret``, hex."""
    msg = f"{role}|{nonce}|{broker_name}".encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def check_proof(secret: str, role: str, nonce: str, broker_name: str, got) -> bool:
    if not isinstance(got, str):
        return False
    return hmac.compare_digest(proof(secret, role, nonce, broker_name), got)


def send_frame(sock: socket.socket, header: dict, payload: bytes | memoryview = b"") -> None:
    """Send one frame (not thread-safe per socket: one sender per direction)."""
    sock.sendall(frame_head(header, len(payload)))
    if payload:
        sock.sendall(payload)


def frame_head(header: dict, payload_len: int) -> bytes:
    """A frame's prefix and header, the bytes before its payload."""
    h = json.dumps(header, separators=(",", ":")).encode()
    return PREFIX.pack(len(h), payload_len) + h


def data_frame_head(path: str, pos: int, offset: int, whole: bool, count: int) -> bytes:
    """``frame_head`` of a data frame (the same bytes), formatted directly: it is sent
    for every append a replica follows."""
    h = (f'{{"type":"data","path":{json.dumps(path)},"pos":{pos:d},"offset":{offset:d},'
         f'"whole":{"true" if whole else "false"}}}').encode()
    return PREFIX.pack(len(h), count) + h


def send_now(sock: socket.socket, parts: list) -> list | None:
    """Send ``parts`` (bytes-like, one frame or more) if the socket takes them without
    waiting (``MSG_DONTWAIT``: one ``sendmsg``, never blocks): None if nothing was sent
    (it would have waited), else what is left to send (the caller sends it before any
    other byte; ``[]``: all sent)."""
    try:
        sent = sock.sendmsg(parts, [], socket.MSG_DONTWAIT)
    except BlockingIOError:
        return None
    left = []
    for part in parts:
        if sent >= len(part):
            sent -= len(part)
        else:
            left.append(memoryview(part)[sent:])
            sent = 0
    return left


def send_frame_from_file(sock: socket.socket, header: dict, fd: int, offset: int,
                         count: int) -> None:
    """Send a frame whose payload is ``count`` bytes of file ``fd`` at ``offset``, with
    ``os.sendfile`` (page cache to socket, no copy through Python); over a TLS link
    (not a plain socket) read and sent through it."""
    sock.sendall(frame_head(header, count))
    if not isinstance(sock, socket.socket):      # a TLS link: encrypt in this process
        for at in range(offset, offset + count, 1 << 20):
            data = os.pread(fd, min(1 << 20, offset + count - at), at)
            if not data:
                raise ConnectionError(f"file ended {offset + count - at} bytes early")
            sock.sendall(data)
        return
    out = sock.fileno()
    sent = 0
    while sent < count:
        try:
            n = os.sendfile(out, fd, offset + sent, count - sent)
        except BlockingIOError:       # a socket timeout makes the fd non-blocking
            select.select([], [out], [], 1.0)
            continue
        if n == 0:
            raise ConnectionError(f"file ended {count - sent} bytes early")
        sent += n


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return buf


def recv_frame(sock: socket.socket) -> tuple[dict, bytes | bytearray]:
    """Read one frame; raises HAProtocolError on a malformed one, ConnectionError on EOF."""
    header, plen = recv_header(sock)
    payload = _recv_exact(sock, plen) if plen else b""   # a bytearray: no copy
    return header, payload


def recv_header(sock: socket.socket) -> tuple[dict, int]:
    """Read one frame's prefix and header and leave its payload in the socket (the
    caller reads exactly the returned payload length, e.g. with ``os.splice``).
    Raises like :func:`recv_frame`."""
    hlen, plen = _sizes(_recv_exact(sock, PREFIX.size), 0)
    return _header(bytes(_recv_exact(sock, hlen))), plen


def take_frames(buf: bytearray) -> list[dict]:
    """The headers of the whole frames at the front of ``buf`` (bytes read from a
    socket without waiting), removed from it with their payloads; a frame's start left
    in ``buf`` waits for its rest. Raises like :func:`recv_frame`."""
    headers, at = [], 0
    while len(buf) - at >= PREFIX.size:
        hlen, plen = _sizes(buf, at)
        start = at + PREFIX.size
        if len(buf) < start + hlen + plen:
            break
        headers.append(_header(bytes(buf[start:start + hlen])))
        at = start + hlen + plen
    del buf[:at]
    return headers


def _sizes(buf, at: int) -> tuple[int, int]:
    hlen, plen = PREFIX.unpack_from(buf, at)
    if hlen > MAX_HEADER_BYTES or plen > MAX_PAYLOAD_BYTES:
        raise HAProtocolError(f"frame too large (header {hlen} bytes, payload {plen} bytes); "
                              "is the peer a sparkmq HA endpoint?")
    return hlen, plen


def _header(raw: bytes) -> dict:
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise HAProtocolError(f"frame header is not JSON: {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise HAProtocolError("frame header must be a JSON object with a 'type'")
    return header


def parse_address(addr: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); raises InvalidConfigError with what was wrong."""
    host, sep, port = (addr or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidConfigError(f"expected host:port, got {addr!r}")
    return host, int(port)


MIN_HA_SECRET_BYTES = 16
PLACEHOLDER_SECRETS = ("change-me", "changeme", "placeholder", "secret", "password")


def check_secret(secret: str, name: str = "haSecret") -> str:
    """``secret`` if it may authenticate replication, else InvalidConfigError saying
    what to do: not a placeholder, at least 16 bytes."""
    lowered = secret.strip().lower()
    if any(lowered.startswith(p) for p in PLACEHOLDER_SECRETS):
        raise InvalidConfigError(
            f"{name} is a placeholder ({secret[:12]!r}...); set the same random secret on the "
            "master and its replicas, e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`, or use haSecretFile")
    if len(secret.encode()) < MIN_HA_SECRET_BYTES:
        raise InvalidConfigError(
            f"{name} is {len(secret.encode())} bytes; it must be at least "
            f"{MIN_HA_SECRET_BYTES}: set a random one, e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`, or use haSecretFile")
    return secret
