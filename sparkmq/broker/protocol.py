"""Conversions between the RocketMQ 5 protobuf vocabulary and the broker's domain.

The one home of: protocol statuses (``status``, ``OK``, the exception -> status
mapping ``error_status``), durations and timestamps (milliseconds <-> protobuf),
a stored message as a protobuf ``Message`` (``message_to_pb``), a route entry as a
MessageQueue (``message_queue``), the send results as a SendMessageResponse
(``send_response``), a transactional message's properties and its recovery duration's
refusal (``transaction_properties``, ``recovery_refusal``) and the transaction check-back
command (``recover_command``). The send domain
(``send.py``) answers refusals with these statuses; the gRPC layer
(``grpc_service.py``) uses them to build its responses.

Stateless and thread-safe.
"""
from __future__ import annotations

import hashlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from ..errors import (AuthenticationError, AuthorizationError, ClientIdRequiredError,
                      DataLossError, IllegalOffsetError, InvalidMessageError,
                      InvalidNameError, MessageLimitError, PermissionDeniedError,
                      QueueNotFoundError, ReplicaNotAvailableError, SparkMQError,
                      TopicNotFoundError)
from ..log.status import PutMessageStatus
from ..log.limits import RESERVED_PROPERTY_KEYS
from .pop import (ORIGIN_MESSAGE_ID, ORIGIN_OFFSET, ORIGIN_QUEUE, ORIGIN_TOPIC,
                  InvalidHandle)
from .schedule import PROP_DELAY_LEVEL, PROP_SOURCE
from .transaction import PROP_CHECK_IMMUNITY_S

Code = pb.Code


def status(code: int, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


OK = status(Code.OK)
_OK_ENTRY_BYTES = spb.SendResultEntry(status=OK).SerializeToString()   # merged: cheaper than a copy
ALL_TYPES = [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION]
PERM = {6: pb.READ_WRITE, 4: pb.READ, 2: pb.WRITE, 0: pb.NONE}


ClientIdRequired = ClientIdRequiredError   # the broker's old names for them
IllegalOffset = IllegalOffsetError


def error_status(e: Exception) -> pb.Status:
    """The protocol status answering exception ``e`` (INTERNAL_ERROR for the unexpected)."""
    if isinstance(e, TopicNotFoundError):
        return status(Code.TOPIC_NOT_FOUND, e.message)
    if isinstance(e, AuthenticationError):
        return status(Code.UNAUTHORIZED, e.message)
    if isinstance(e, InvalidNameError):
        code = Code.ILLEGAL_CONSUMER_GROUP if e.what == "group" else Code.ILLEGAL_TOPIC
        return status(code, e.message)
    if isinstance(e, ReplicaNotAvailableError):
        return status(Code.HA_NOT_AVAILABLE, e.message)
    if isinstance(e, (PermissionDeniedError, AuthorizationError)):
        return status(Code.FORBIDDEN, e.message)
    if isinstance(e, MessageLimitError):     # its status is the proxy's code name
        return status(Code.Value(e.status), e.message)
    if isinstance(e, InvalidMessageError):
        code = Code.MESSAGE_BODY_TOO_LARGE if "large" in e.message or "exceeds" in e.message \
            else Code.BAD_REQUEST
        return status(code, e.message)
    if isinstance(e, (QueueNotFoundError, DataLossError)):
        return status(Code.BAD_REQUEST, e.message)
    if isinstance(e, InvalidHandle):
        return status(Code.INVALID_RECEIPT_HANDLE, e.message)
    if isinstance(e, ClientIdRequired):
        return status(Code.CLIENT_ID_REQUIRED, e.message)
    if isinstance(e, IllegalOffset):
        return status(Code.ILLEGAL_OFFSET, e.message)
    if isinstance(e, SparkMQError):
        return status(Code.INTERNAL_ERROR if not e.retriable else Code.TOO_MANY_REQUESTS, e.message)
    return status(Code.INTERNAL_ERROR, f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------- time
def ms_of_duration(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def ms_of_timestamp(t: Timestamp) -> int:
    return t.seconds * 1000 + t.nanos // 1_000_000


def timestamp(ms: int | None) -> Timestamp:
    """``ms`` since the epoch as a Timestamp (None or 0: the empty Timestamp)."""
    t = Timestamp()
    _set_time(t, ms)
    return t


def duration(ms: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(int(ms))      # (a negative one too: nanos take the seconds' sign)
    return d


# ---------------------------------------------------------------- messages
#: Stored properties that are not the user's: RocketMQ's own keys (the proxy's
#: GrpcConverter drops MessageConst.STRING_HASH_SET from the user properties it sends)
#: and the broker's bookkeeping (dead-letter origin, sent as ``dead_letter_queue``; the
#: parked copy a delayed message came from; its delay level).
INTERNAL_PROPERTY_KEYS = RESERVED_PROPERTY_KEYS | {
    ORIGIN_TOPIC, ORIGIN_MESSAGE_ID, ORIGIN_QUEUE, ORIGIN_OFFSET, PROP_SOURCE, PROP_DELAY_LEVEL}


def message_to_pb(sm, delivery=None) -> pb.Message:
    """A stored message (``StoredMessage``) as a protobuf Message; with ``delivery`` (a
    pop ``Delivery``) it carries its receipt handle, attempt and invisible time."""
    msg = pb.Message(topic=pb.Resource(name=sm.topic), body=sm.body)
    props = sm.properties or {}
    if props:                     # (``update`` of a map is Python-level: skipped when empty)
        msg.user_properties.update({k: v for k, v in props.items()
                                    if k not in INTERNAL_PROPERTY_KEYS})
    sp = msg.system_properties
    if ORIGIN_TOPIC in props and ORIGIN_MESSAGE_ID in props:   # as the proxy: a dead letter
        sp.dead_letter_queue.topic = props[ORIGIN_TOPIC]
        sp.dead_letter_queue.message_id = props[ORIGIN_MESSAGE_ID]
    if sm.tags:
        sp.tag = sm.tags
    if sm.keys:
        sp.keys.extend(sm.keys)
    sp.message_id = sm.unique_key or sm.message_id
    # as the Apache proxy's GrpcConverter: MD5 of the body, uppercase hex (the official
    # clients check it; the Node.js client mis-reads a CRC32 one as corrupted)
    sp.body_digest.type = pb.MD5
    sp.body_digest.checksum = hashlib.md5(sm.body).hexdigest().upper()
    sp.body_encoding = pb.IDENTITY
    sp.message_type = pb.FIFO if sm.message_group else pb.NORMAL
    _set_time(sp.born_timestamp, sm.born_timestamp)
    sp.born_host = sm.born_host or ""
    _set_time(sp.store_timestamp, sm.store_timestamp)
    sp.store_host = sm.store_host or ""
    sp.queue_id = sm.queue_id
    sp.queue_offset = sm.queue_offset
    if sm.message_group:
        sp.message_group = sm.message_group
    if sm.delivery_timestamp:
        _set_time(sp.delivery_timestamp, sm.delivery_timestamp)
        if not sm.message_group:
            sp.message_type = pb.DELAY
    if delivery is not None:
        sp.receipt_handle = delivery.receipt_handle
        sp.delivery_attempt = delivery.attempt
        _set_time(sp.invisible_duration, delivery.invisible_ms)
    return msg


def _set_time(field, ms: int | None) -> None:
    """Set a Timestamp, or a Duration of ``ms`` >= 0, ``field`` to ``ms`` (None: 0) from
    its two parts, as ``FromMilliseconds`` does (that is Python: ~1 us more); a message's
    own field is then present even for 0. Set in place, a delivered message's times need
    no copy."""
    ms = int(ms or 0)
    field.seconds = ms // 1000
    field.nanos = ms % 1000 * 1_000_000


# ---------------------------------------------------------------- routes and sends
def endpoints(endpoint: str) -> pb.Endpoints:
    host, port = endpoint.rsplit(":", 1)
    return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=int(port))])


def message_queue(topic: str, q: dict, ns: str = "",
                  message_type: str = "MIXED") -> pb.MessageQueue:
    """A route entry (``Broker.local_queues`` / NameServer route: brokerName, brokerId,
    endpoint, queueId, perm, readable, writable) as a protobuf MessageQueue, accepting
    the topic's ``message_type`` (MIXED: every type)."""
    perm = PERM.get(q["perm"] & 6, pb.READ_WRITE)
    if not q.get("writable", True) and perm == pb.READ_WRITE:
        perm = pb.READ
    if not q.get("readable", True) and perm == pb.READ_WRITE:
        perm = pb.WRITE
    return pb.MessageQueue(
        topic=pb.Resource(name=topic, resource_namespace=ns), id=q["queueId"],
        permission=perm,
        broker=pb.Broker(name=q["brokerName"], id=q["brokerId"],
                         endpoints=endpoints(q["endpoint"])),
        accept_message_types=ALL_TYPES if message_type == "MIXED"
        else [pb.MessageType.Value(message_type)])


def stored_status(put_status: PutMessageStatus) -> pb.Status:
    """The RocketMQ status of a message the store took with ``put_status`` other than
    PUT_OK: one reading for the RocketMQ path's entries and Flight's acks and errors."""
    if put_status is PutMessageStatus.FLUSH_DISK_TIMEOUT:
        return status(Code.MASTER_PERSISTENCE_TIMEOUT, "stored, but the fsync did not "
                      "finish within syncFlushTimeout")
    if put_status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT:
        return status(Code.SLAVE_PERSISTENCE_TIMEOUT, "stored on the master, but no "
                      "replica acked it within syncFlushTimeout (SYNC_MASTER)")
    if put_status is PutMessageStatus.SLAVE_NOT_AVAILABLE:
        # stored here, not replicated: as a replica ack timeout (HA_NOT_AVAILABLE
        # means nothing was stored: see ReplicaNotAvailableError)
        return status(Code.SLAVE_PERSISTENCE_TIMEOUT, "stored on the master, but its "
                      "replica left before acknowledging it (SYNC_MASTER)")
    return status(Code.INTERNAL_ERROR, f"store answered {put_status.value}")


def send_response(results: list) -> spb.SendMessageResponse:
    """``results``: per request entry, a refusal ``Status`` or the store's
    (PutMessageStatus, message id, queue offset, transaction id). The response: one
    entry per request message, built in place (no copies of per-entry messages); the
    top status is the entries' common one or MULTIPLE_RESULTS."""
    out = spb.SendMessageResponse()
    add = out.entries.add
    codes = set()          # codes other than OK
    any_ok = False
    ok, ok_entry = PutMessageStatus.PUT_OK, _OK_ENTRY_BYTES
    for r in results:
        if isinstance(r, pb.Status):
            add(status=r)
            codes.add(r.code)
            continue
        put_status, message_id, offset, txid = r
        if put_status is ok and not txid:       # the common case: merge the status
            e = add()                            # (attribute sets: ~1.5x cheaper than
            e.MergeFromString(ok_entry)          # keyword arguments to add)
            e.message_id = message_id
            e.offset = offset
            any_ok = True
            continue
        if put_status is ok:
            st, any_ok = OK, True
        else:
            st = stored_status(put_status)
            codes.add(st.code)
        if txid:
            add(status=st, message_id=message_id, offset=offset, transaction_id=txid)
        else:
            add(status=st, message_id=message_id, offset=offset)
    if len(codes) + any_ok == 1:     # every entry has the same code
        out.status.CopyFrom(out.entries[0].status)
    else:
        out.status.CopyFrom(status(Code.MULTIPLE_RESULTS, "see entries"))
    return out


#: The proxy's ``maxTransactionRecoverySecond`` (ProxyConfig default: 1 hour).
MAX_TRANSACTION_RECOVERY_S = 3600


def recovery_refusal(sp: pb.SystemProperties) -> pb.Status | None:
    """BAD_REQUEST for a transactional message whose ``orphaned_transaction_recovery_duration``
    is over ``MAX_TRANSACTION_RECOVERY_S`` (the proxy's SendMessageActivity
    ``validateTransactionRecoverySecond``), else None."""
    if not sp.HasField("orphaned_transaction_recovery_duration"):
        return None
    seconds = sp.orphaned_transaction_recovery_duration.seconds
    if seconds <= MAX_TRANSACTION_RECOVERY_S:
        return None
    return status(Code.BAD_REQUEST, f"orphaned_transaction_recovery_duration is {seconds} s; "
                  f"at most {MAX_TRANSACTION_RECOVERY_S} s (maxTransactionRecoverySecond) is "
                  "allowed: ask for a shorter first check-back")


def transaction_properties(m: pb.Message) -> dict[str, str]:
    """The properties a transactional message is stored with: its user properties, and
    as the proxy's SendMessageActivity, its ``orphaned_transaction_recovery_duration`` (whole
    seconds, as ``Durations.toSeconds``) in ``CHECK_IMMUNITY_TIME_IN_SECONDS``, which the
    transaction service reads for its first check-back (over a user property of that name)."""
    props = dict(m.user_properties)
    sp = m.system_properties
    if sp.HasField("orphaned_transaction_recovery_duration"):
        props[PROP_CHECK_IMMUNITY_S] = str(sp.orphaned_transaction_recovery_duration.seconds)
    return props


def recover_command(stored_message, transaction_id: str) -> spb.TelemetryCommand:
    """The RecoverOrphanedTransactionCommand asking a producer to resolve a half message."""
    msg = message_to_pb(stored_message)
    msg.system_properties.message_type = pb.TRANSACTION
    return spb.TelemetryCommand(recover_orphaned_transaction_command=(
        spb.RecoverOrphanedTransactionCommand(message=msg, transaction_id=transaction_id)))
