"""The public errors of sparkmq.

One root, :class:`SparkMQError`, split by what the caller should do next:

* :class:`RetriableError` — the operation may succeed if tried again as is
  (a commit conflict that ran out of retries, a lease briefly held).
* :class:`UserError` — the request itself is wrong (bad name, bad option,
  unknown topic); retrying it unchanged will fail again.
* :class:`StoreError` — the store cannot serve the request (data removed by
  retention, corrupt files, a fenced writer).

Every error has a stable ``code``: errors raised inside Spark executors reach
users as text, so the code is printed first (``[SPARKMQ_TOPIC_NOT_FOUND] ...``).
Expected outcomes on the hot path (no message yet, offset too small, flush
timed out) are status values (see :mod:`sparkmq.log.status`), not exceptions.
"""
from __future__ import annotations


class SparkMQError(Exception):
    """Root of every error sparkmq raises on purpose."""

    code = "SPARKMQ_ERROR"
    retriable = False

    def __init__(self, message: str):
        super().__init__(f"[{self.code}] {message}")
        self.message = message


class RetriableError(SparkMQError):
    """The operation may succeed if it is tried again unchanged."""

    code = "SPARKMQ_RETRIABLE"
    retriable = True


class UserError(SparkMQError):
    """The request is wrong; fix it before trying again."""

    code = "SPARKMQ_INVALID_REQUEST"


class StoreError(SparkMQError):
    """The store cannot serve this request in its current state."""

    code = "SPARKMQ_STORE_ERROR"


# --- user errors -----------------------------------------------------------

class InvalidNameError(UserError):
    """A topic or group name breaks RocketMQ's naming rules."""

    code = "SPARKMQ_INVALID_NAME"


class InvalidConfigError(UserError):
    """A configuration value or data source option is malformed."""

    code = "SPARKMQ_INVALID_CONFIG"


class InvalidMessageError(UserError):
    """A message is malformed (missing body, too large, bad field type)."""

    code = "SPARKMQ_INVALID_MESSAGE"


class TopicNotFoundError(UserError):
    """The topic does not exist in the store's committed metadata."""

    code = "SPARKMQ_TOPIC_NOT_FOUND"


class TopicExistsError(UserError):
    """A topic with this name already exists."""

    code = "SPARKMQ_TOPIC_EXISTS"


class GroupNotFoundError(UserError):
    """The consumer group has no subscription group config in this store."""

    code = "SPARKMQ_GROUP_NOT_FOUND"


class QueueNotFoundError(UserError):
    """The queue id is outside the topic's queues."""

    code = "SPARKMQ_QUEUE_NOT_FOUND"


class PermissionDeniedError(UserError):
    """The topic's permission forbids this operation (read or write)."""

    code = "SPARKMQ_PERMISSION_DENIED"


class InvalidMessageIdError(UserError):
    """A message id does not decode, or belongs to another store."""

    code = "SPARKMQ_INVALID_MESSAGE_ID"


class VersionNotFoundError(UserError):
    """The requested transaction-log version or timestamp has no snapshot."""

    code = "SPARKMQ_VERSION_NOT_FOUND"


class StoreNotFoundError(UserError):
    """No store exists at this URL (open it with create=True to make one)."""

    code = "SPARKMQ_STORE_NOT_FOUND"


class ReadOnlyStoreError(UserError):
    """The store was opened for reading; writes need mode='w'."""

    code = "SPARKMQ_READ_ONLY"


# --- retriable -------------------------------------------------------------

class CommitConflictError(RetriableError):
    """Another writer won every version this commit tried; retry later."""

    code = "SPARKMQ_COMMIT_CONFLICT"


class StoreLockedError(RetriableError):
    """Another live writer holds the store's writer lease."""

    code = "SPARKMQ_STORE_LOCKED"


# --- store errors ----------------------------------------------------------

class DataLossError(StoreError):
    """The requested offsets were removed by retention."""

    code = "SPARKMQ_DATA_LOSS"

    def __init__(self, message: str, *, earliest_offset: int | None = None):
        super().__init__(message)
        self.earliest_offset = earliest_offset


class CorruptStoreError(StoreError):
    """A file of the store does not match the format spec."""

    code = "SPARKMQ_CORRUPT_STORE"


class FencedError(StoreError):
    """A writer with a higher lease epoch took over; this writer must stop."""

    code = "SPARKMQ_FENCED"


class UnsupportedFormatError(StoreError):
    """The store needs a newer reader or writer than this sparkmq."""

    code = "SPARKMQ_UNSUPPORTED_FORMAT"


class StoreClosedError(StoreError):
    """The store object was closed."""

    code = "SPARKMQ_STORE_CLOSED"


class UncleanWriterError(StoreError):
    """The last writer did not stop cleanly; open the store for writing to recover it."""

    code = "SPARKMQ_UNCLEAN_WRITER"


class HAProtocolError(SparkMQError):
    """A replication peer broke the protocol or failed authentication; check haSecret
    and that the address is a sparkmq HA port."""

    code = "SPARKMQ_HA_PROTOCOL"

