"""sparkmq's own clients over the Apache RocketMQ 5.x gRPC protocol.

Producer (sync, async, oneway, batch; round robin or sharding key; failover with
back-off; local transactions with a checker), SimpleConsumer, PushConsumer, PullConsumer.
See each module's docstring.
"""
from .consumer import ConsumeMode, ConsumeResult, PushConsumer, SimpleConsumer
from .pull import PullConsumer
from .core import BrokerUnavailableError, ClientError, Message, Queue, ReceivedMessage
from .producer import Producer, SendReceipt, TransactionResult
from .transaction import TransactionResolution

__all__ = ["BrokerUnavailableError", "ClientError", "ConsumeMode", "ConsumeResult", "Message",
           "Producer", "PullConsumer", "PushConsumer", "Queue", "ReceivedMessage",
           "SendReceipt", "SimpleConsumer", "TransactionResolution", "TransactionResult"]
