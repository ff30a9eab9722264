"""sparkmq: a RocketMQ-style message log stored as a table Spark reads and writes natively.

The public names below are imported on first use (PEP 562), so a process that
needs one part (Spark's Python workers import only the data source and the
log's readers) does not pay for the store's writer, services and config.
"""
import os

from ._lazy import lazy_names

# gRPC's fork handlers (grpcio >= 1.80, on unless set) can kill a child forked while its
# channels are busy before the child execs: pyspark starts Spark's JVM that way
# (``preexec_fn``), so a notebook that has a sparkmq client open may fail to start Spark
# ("Java gateway process exited"; grpc/grpc#43055). sparkmq never uses gRPC in a forked
# child, so it turns them off unless the process already chose (read when gRPC starts).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
__all__ = ["Store", "Message", "StoredMessage", "Snapshot", "AppendResult", "PutMessageStatus",
           "StoreConfig", "SYNC_FLUSH", "ASYNC_FLUSH", "SparkMQError", "dataset", "__version__"]

_LAZY = {"StoreConfig": ".config", "SYNC_FLUSH": ".config", "ASYNC_FLUSH": ".config",
         "SparkMQError": ".errors", "Store": ".log", "Message": ".log",
         "StoredMessage": ".log", "Snapshot": ".log", "AppendResult": ".log",
         "PutMessageStatus": ".log", "dataset": ".table"}


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY, __all__)
