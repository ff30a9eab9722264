"""Expected outcomes on the hot path, as status values (RocketMQ's names)."""
from __future__ import annotations

import enum


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"      # stored, but fsync did not finish in time
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"    # SYNC_MASTER: stored here, no replica ack in time
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"    # SYNC_MASTER: stored here, no replica attached


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"    # the queue is empty
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"    # offset == max: nothing new yet
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"          # removed by retention
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"      # messages exist, none matched the filter
