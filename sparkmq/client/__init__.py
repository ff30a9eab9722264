"""sparkmq's own clients over the Apache RocketMQ 5.x gRPC protocol.

Producer (sync, async, oneway, batch; round robin or sharding key; failover with
back-off), SimpleConsumer, PushConsumer, PullConsumer. See each module's docstring.
"""
from .consumer import ConsumeMode, ConsumeResult, PullConsumer, PushConsumer, SimpleConsumer
from .core import BrokerUnavailableError, ClientError, Message, Queue, ReceivedMessage
from .producer import Producer, SendReceipt

__all__ = ["BrokerUnavailableError", "ClientError", "ConsumeMode", "ConsumeResult", "Message",
           "Producer", "PullConsumer", "PushConsumer", "Queue", "ReceivedMessage",
           "SendReceipt", "SimpleConsumer"]
