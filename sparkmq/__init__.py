"""sparkmq: a RocketMQ-style message log stored as a table Spark reads and writes natively.

The public names below are imported on first use (PEP 562), so a process that
needs one part (Spark's Python workers import only the data source and the
log's readers) does not pay for the store's writer, services and config.
"""
from importlib import import_module

__version__ = "0.1.0"
__all__ = ["Store", "Message", "StoredMessage", "Snapshot", "AppendResult", "PutMessageStatus",
           "StoreConfig", "SYNC_FLUSH", "ASYNC_FLUSH", "SparkMQError", "__version__"]

_LAZY = {"StoreConfig": ".config", "SYNC_FLUSH": ".config", "ASYNC_FLUSH": ".config",
         "SparkMQError": ".errors", "Store": ".log", "Message": ".log",
         "StoredMessage": ".log", "Snapshot": ".log", "AppendResult": ".log",
         "PutMessageStatus": ".log"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkmq' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
