"""The storage engine: CommitLog, ConsumeQueue, Index, transaction log, store.

This package imports neither pyspark nor any network code. Its public names
are imported on first use (PEP 562): a reader (``Snapshot``) does not load the
store's writer and services.
"""
from .._lazy import lazy_names

__all__ = ["Message", "StoredMessage", "Snapshot", "Store", "AppendResult", "BatchAppendResult",
           "CommitResult", "PutMessageStatus", "GetMessageStatus", "MESSAGE_SCHEMA"]

_LAZY = {"Message": ".message", "StoredMessage": ".message", "MESSAGE_SCHEMA": ".messagetable",
         "Snapshot": ".reader", "GetMessageStatus": ".status", "PutMessageStatus": ".status",
         "AppendResult": ".store", "BatchAppendResult": ".store", "CommitResult": ".store",
         "Store": ".store"}


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY, __all__)
