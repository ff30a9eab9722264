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
    """A topic or group name breaks RocketMQ's naming rules; ``what`` says which it was
    ("topic" or "group")."""

    code = "SPARKMQ_INVALID_NAME"

    def __init__(self, message: str, what: str = "topic"):
        super().__init__(message)
        self.what = what


class InvalidConfigError(UserError):
    """A configuration value or data source option is malformed."""

    code = "SPARKMQ_INVALID_CONFIG"


class InvalidMessageError(UserError):
    """A message is malformed (missing body, too large, bad field type)."""

    code = "SPARKMQ_INVALID_MESSAGE"


class MessageLimitError(InvalidMessageError):
    """A message or request breaks an input limit (size, properties, tag, key, group,
    id, time, type); ``status`` names the RocketMQ proxy's status code for it."""

    code = "SPARKMQ_MESSAGE_LIMIT"

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status
        self.args = (f"[{self.code}] {status}: {message}",)    # the text names the status

    def __reduce__(self):
        return type(self), (self.status, self.message)


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


class DelayRefused(UserError):
    """A delay the broker will not take (too long, unknown level); the message says why."""

    code = "SPARKMQ_ILLEGAL_DELIVERY_TIME"


class UnknownTransaction(UserError):
    """EndTransaction for a transaction that is not pending (unknown or already resolved)."""

    code = "SPARKMQ_INVALID_TRANSACTION_ID"


class FilterExpressionError(UserError, ValueError):
    """A SQL92 filter expression that does not parse; the message says where and why.

    Also a ``ValueError``, as it was before it moved here."""

    code = "SPARKMQ_INVALID_FILTER"


class InvalidReceiptHandleError(UserError):
    """A receipt handle that does not decode, or whose lease is gone."""

    code = "SPARKMQ_INVALID_RECEIPT_HANDLE"


class ClientIdRequiredError(UserError):
    """A broadcasting consumer sent no ``x-mq-client-id`` header."""

    code = "SPARKMQ_CLIENT_ID_REQUIRED"


class IllegalOffsetError(UserError):
    """An offset outside a queue's min..max offsets."""

    code = "SPARKMQ_ILLEGAL_OFFSET"


class BindError(UserError):
    """A server could not listen on its address (port in use, no permission); pick
    another port or stop the process holding it."""

    code = "SPARKMQ_BIND_FAILED"


# --- retriable -------------------------------------------------------------

class CommitConflictError(RetriableError):
    """Another writer won every version this commit tried; retry later."""

    code = "SPARKMQ_COMMIT_CONFLICT"


class StoreLockedError(RetriableError):
    """Another live writer holds the store's writer lease."""

    code = "SPARKMQ_STORE_LOCKED"


class BrokerUnavailableError(RetriableError):
    """No broker could be reached (or every one failed); retry later or check the endpoints."""

    code = "SPARKMQ_BROKER_UNAVAILABLE"


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


class AuthenticationError(UserError):
    """The request carries no valid credential (``authenticationEnabled=true``): give
    the client its access key and secret key."""

    code = "SPARKMQ_UNAUTHENTICATED"


class TooManyRequestsError(RetriableError):
    """The broker holds as many long polls as it may (``maxLongPollingRequests``): this
    one is answered at once instead of taking a worker the sends need (the proxy's
    TOO_MANY_REQUESTS). Retry after a pause, or raise the capacity with
    ``grpcThreadPoolNums``."""

    code = "SPARKMQ_TOO_MANY_REQUESTS"


class ReplicaNotAvailableError(RetriableError):
    """A SYNC_MASTER has no replica attached to acknowledge a send: the send is refused
    before anything is stored (RocketMQ 5's in-sync-replica check; the proxy's
    HA_NOT_AVAILABLE). Retry, or on another broker group."""

    code = "SPARKMQ_HA_NOT_AVAILABLE"


class AuthorizationError(UserError):
    """The authenticated user may not do this (``authorizationEnabled=true``): no ACL
    entry of the user allows the action on the resource, or one denies it (the
    proxy's FORBIDDEN). Grant it with ``sparkmq admin acl create``."""

    code = "SPARKMQ_FORBIDDEN"


class DiskFullError(StoreError):
    """Writes are refused: the disk holding the store is fuller than
    ``diskSpaceWarningLevelRatio`` (RocketMQ's disk-full state). Reads, offsets and
    retention go on; writes are accepted again once usage drops below it (retention
    removes old segments past ``diskSpaceCleanForciblyRatio``)."""

    code = "SPARKMQ_DISK_FULL"


class StoreIOError(StoreError):
    """The store's file system failed an operation (disk full, I/O error, no permission).

    Raised only by :class:`sparkmq.log.fs.StoreFS` and the segment writer, the one
    boundary where ``OSError`` becomes a store error. ``errno`` is the OS error
    number (``errno.ENOSPC``...), ``path`` the store-relative path, ``operation``
    what was being done; the message says what to do.
    """

    code = "SPARKMQ_STORE_IO"

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None,
                 operation: str | None = None):
        super().__init__(message)
        self.errno = errno
        self.path = path
        self.operation = operation


# --- remote peers: the branch depends on the peer's answer ------------------

class ClientError(SparkMQError):
    """A broker answered a request with a non-OK status; ``status_code`` is the protocol code."""

    code = "SPARKMQ_CLIENT_ERROR"

    def __init__(self, message: str, status_code: int = 50000):   # Code.INTERNAL_ERROR
        super().__init__(message)
        self.status_code = status_code


class HAProtocolError(SparkMQError):
    """A replication peer broke the protocol or failed authentication; check haSecret
    and that the address is a sparkmq HA port."""

    code = "SPARKMQ_HA_PROTOCOL"

