"""The client-metrics collector the RocketMQ proxy offers (``metricCollectorMode=proxy``):
an OpenTelemetry OTLP ``MetricsService/Export`` on the broker's gRPC port.

The official clients export their own metrics (send latency, consume time, cached
messages) to the endpoint the broker names in the Settings it answers on Telemetry.
The broker names itself and accepts the exports (counted in
``sparkmq_client_metrics_exports_total``; their content is not kept). Naming no
endpoint is not an option: the official Python PushConsumer then fails to register
its gauges ("'NoneType' object has no attribute 'get_meter'") and stops reading its
Telemetry stream. Credentials are checked like every RPC (``authn.py``).
"""
from __future__ import annotations

import grpc

SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


def add_to_server(broker, server) -> None:
    """Register the Export method on ``server`` (requests kept as bytes, answered with
    an empty ExportMetricsServiceResponse)."""
    def export(request: bytes, context) -> bytes:
        from ..errors import AuthenticationError
        try:
            broker.authenticator.check(context.invocation_metadata())
        except AuthenticationError as e:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, e.message)
        broker.metrics.inc("sparkmq_client_metrics_exports_total")
        return b""
    handler = grpc.unary_unary_rpc_method_handler(
        export, request_deserializer=None, response_serializer=lambda b: b)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE, {"Export": handler}),))


def metric_settings(broker, metric, client_type) -> None:
    """Fill the ``Metric`` of a Settings reply: this broker collects a push consumer's
    metrics (the official Python PushConsumer needs a meter to register its gauges).
    Other clients get metrics off (the official clients never stop their meter after
    shutdown, and export at exit). Under TLS none: the official clients export over
    plaintext only."""
    import ipaddress
    from rocketmq.grpc_protocol import definition_pb2 as pb
    cfg = broker.config
    metric.Clear()
    metric.on = cfg.tls_server_mode == "disabled" and client_type == pb.PUSH_CONSUMER
    if metric.on:
        try:
            scheme = pb.IPv6 if ipaddress.ip_address(cfg.host).version == 6 else pb.IPv4
        except ValueError:
            scheme = pb.DOMAIN_NAME
        metric.endpoints.scheme = scheme
        metric.endpoints.addresses.add(host=cfg.host, port=broker.listen_port)
