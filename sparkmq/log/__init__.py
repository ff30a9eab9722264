"""The storage engine: CommitLog, ConsumeQueue, Index, transaction log, store.

This package imports neither pyspark nor any network code.
"""
from .message import Message, StoredMessage
from .reader import MESSAGE_SCHEMA, Snapshot
from .status import GetMessageStatus, PutMessageStatus
from .store import AppendResult, BatchAppendResult, CommitResult, Store

__all__ = ["Message", "StoredMessage", "Snapshot", "Store", "AppendResult", "BatchAppendResult",
           "CommitResult", "PutMessageStatus", "GetMessageStatus", "MESSAGE_SCHEMA"]
