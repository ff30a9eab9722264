"""The refusals of a send decided from a message's own fields: body size, message type,
the input limits of ``log/limits.py`` (one message, or a plain request's columns at
once), each with the Apache proxy's status code. Used by ``send.SendService``."""
from __future__ import annotations

import numpy as np
from rocketmq.grpc_protocol import definition_pb2 as pb

from ..log.limits import (MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS, RESERVED_PROPERTY_KEYS,
                          MessageLimits, message_violation)
from .protocol import Code, ms_of_timestamp, status


def body_refusal(size_bytes: int, limit_bytes: int) -> pb.Status | None:
    """The status refusing a body of ``size_bytes`` (empty, or over maxMessageSize
    ``limit_bytes``), or None if it may be sent."""
    if not size_bytes:
        return status(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if size_bytes > limit_bytes:
        return status(Code.MESSAGE_BODY_TOO_LARGE,
                      f"message body is {size_bytes} bytes; maxMessageSize is {limit_bytes}")
    return None


def first_body_refusal(sizes: np.ndarray, limit_bytes: int,
                       extent: tuple[int, int, int] | None = None
                       ) -> tuple[int, pb.Status] | None:
    """A batch's first row (``sizes``: each row's body bytes; ``extent``: their least,
    greatest and total, if known) whose body ``body_refusal`` refuses, with its status;
    None if every body may be sent."""
    if extent is not None and extent[0] > 0 and extent[1] <= limit_bytes:
        return None
    if len(sizes) <= 16:                 # (a few rows: cheaper than four numpy calls)
        for r, size in enumerate(sizes.tolist()):
            refused = body_refusal(size, limit_bytes)
            if refused is not None:
                return r, refused
        return None
    if np.minimum.reduce(sizes) > 0 and np.maximum.reduce(sizes) <= limit_bytes:
        return None                      # (the usual batch: two reductions, ~1.9 against ~2.6 us)
    bad = np.flatnonzero((sizes == 0) | (sizes > limit_bytes))
    r = int(bad[0])
    return r, body_refusal(int(sizes[r]), limit_bytes)


_KNOWN_TYPES = frozenset({pb.MESSAGE_TYPE_UNSPECIFIED, pb.NORMAL, pb.FIFO, pb.DELAY,
                          pb.TRANSACTION})


def type_refusal(m: pb.Message) -> pb.Status | None:
    """BAD_REQUEST for a message type the protocol does not define (99, -5); UNSUPPORTED
    for one it defines that sparkmq does not serve (LITE, PRIORITY)."""
    mtype = m.system_properties.message_type
    if mtype in _KNOWN_TYPES:
        return None
    if mtype in pb.MessageType.values():
        return status(Code.UNSUPPORTED,
                      f"message type {pb.MessageType.Name(mtype)} is not supported")
    return status(Code.BAD_REQUEST, f"message type {mtype} is not a RocketMQ message type "
                  "(NORMAL, FIFO, DELAY, TRANSACTION)")


def limits_refusal(m: pb.Message, limits: MessageLimits) -> pb.Status | None:
    """The status refusing ``m`` for an input limit (``sparkmq.log.limits``: sizes,
    properties, tag, keys, group, id, timestamps), with the proxy's code; else None."""
    sp = m.system_properties
    props = m.user_properties
    bad = message_violation(     # Python lists and dicts: ~2x cheaper to read than pb's
        limits, topic=m.topic.name, body_bytes=len(m.body),
        tag=sp.tag if sp.HasField("tag") else None, keys=list(sp.keys) if sp.keys else (),
        properties=dict(props) if props else None, message_group=sp.message_group or None,
        message_id=sp.message_id or None, born_host=sp.born_host or None,
        born_timestamp_ms=ms_of_timestamp(sp.born_timestamp) or None,
        delivery_timestamp_ms=(ms_of_timestamp(sp.delivery_timestamp)
                               if sp.HasField("delivery_timestamp") else None),
        reserved_keys=RESERVED_PROPERTY_KEYS)
    return None if bad is None else status(Code.Value(bad.status), bad.message)


def plain_within_limits(c: dict, topic: str, max_body_bytes: int,
                         limits: MessageLimits) -> bool:
    """True when no row of a plain request (columns ``c``) can break a limit: no
    properties or keys, short alphanumeric ids, born times in range, bodies far enough
    under maxMessageSize; a few C-level list operations. False: decide row by row."""
    if any(c["keys"]) or any(c["properties"]):
        return False
    ids = list(filter(None, c["unique_key"]))
    if ids:
        joined = "".join(ids)
        if not (joined.isascii() and joined.isalnum()) \
                or max(map(len, ids)) > limits.max_message_id_size_bytes:
            return False
    borns = list(filter(None, c["born_timestamp"]))
    if borns and (min(borns) < MIN_TIMESTAMP_MS or max(borns) > MAX_TIMESTAMP_MS):
        return False
    hosts = max(map(len, filter(None, c["born_host"])), default=0)
    return (max_body_bytes + 4 * (len(topic) + hosts) + limits.max_message_id_size_bytes
            <= limits.max_message_size_bytes)
