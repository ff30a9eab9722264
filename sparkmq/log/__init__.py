"""The storage engine: CommitLog, ConsumeQueue, Index, transaction log, store.

This package imports neither pyspark nor any network code. Its public names
are imported on first use (PEP 562): a reader (``Snapshot``) does not load the
store's writer and services.
"""
from importlib import import_module

__all__ = ["Message", "StoredMessage", "Snapshot", "Store", "AppendResult", "BatchAppendResult",
           "CommitResult", "PutMessageStatus", "GetMessageStatus", "MESSAGE_SCHEMA"]

_LAZY = {"Message": ".message", "StoredMessage": ".message", "MESSAGE_SCHEMA": ".reader",
         "Snapshot": ".reader", "GetMessageStatus": ".status", "PutMessageStatus": ".status",
         "AppendResult": ".store", "BatchAppendResult": ".store", "CommitResult": ".store",
         "Store": ".store"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkmq.log' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
