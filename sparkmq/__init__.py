"""sparkmq: a RocketMQ-style message log stored as a table Spark reads and writes natively."""
from .config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from .errors import SparkMQError
from .log import (AppendResult, Message, PutMessageStatus, Snapshot, Store, StoredMessage)

__version__ = "0.1.0"
__all__ = ["Store", "Message", "StoredMessage", "Snapshot", "AppendResult", "PutMessageStatus",
           "StoreConfig", "SYNC_FLUSH", "ASYNC_FLUSH", "SparkMQError", "__version__"]
