"""Expected outcomes on the hot path, as status values (RocketMQ's names), and the
results of appends and commits."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


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


@dataclass
class AppendResult:
    """The outcome of appending one message."""

    status: PutMessageStatus
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


@dataclass
class BatchAppendResult:
    """The outcome of a columnar append: per-row offsets as arrays."""

    status: PutMessageStatus
    batch_offset: int
    queue_offsets: np.ndarray
    queue_ids: np.ndarray
    num_rows: int


@dataclass
class CommitResult:
    """The outcome of adopting staged segment files."""

    version: int
    num_messages: int
    skipped: bool = False    # the (app id, version) was already committed
