"""The broker daemon (RocketMQ 5.x gRPC MessagingService over a store). Not built yet (issue 4)."""
