"""The Telemetry stream of the RocketMQ 5 protocol: the settings handshake (each client
Settings answered with the broker's) and the broker's commands to a producer
(transaction check-backs, sent by ``TransactionService`` through ``ProducerStreams``)
on the same stream.

A coroutine on the gRPC server's event loop (grpc_server.py): one task reads the
client's side, the handler writes the stream's :class:`Outbox`; an open stream holds no
thread however long the client lives.
"""
from __future__ import annotations

import asyncio
import logging

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from ..errors import AuthenticationError, AuthorizationError, InvalidNameError
from ..log.names import validate_group, validate_topic
from ..log.retrypolicy import EXPONENTIAL
from .authz import peer_ip, settings_resources
from .otlp import metric_settings
from .protocol import OK, Code, duration, error_status, ms_of_duration, status

log = logging.getLogger("sparkmq.broker.grpc")

#: The client types that consume (the proxy's ``GrpcValidator.isConsumer``, with PULL_CONSUMER
#: as its pull API has it): they send subscription settings and heartbeat with a group.
CONSUMER_TYPES = frozenset({pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER, pb.PULL_CONSUMER})
#: The client types a Heartbeat is answered for (the proxy's ClientActivity.heartbeat);
#: any other (CLIENT_TYPE_UNSPECIFIED, the LITE_* consumers of lite topics, which this
#: broker does not serve, a number outside the enum) gets UNRECOGNIZED_CLIENT_TYPE.
HEARTBEAT_TYPES = CONSUMER_TYPES | {pb.PRODUCER}


def client_type_name(client_type: int) -> str:
    """``client_type``'s enum name, or its number when the enum has none."""
    try:
        return pb.ClientType.Name(client_type)
    except ValueError:
        return str(client_type)


def unrecognized_type(client_type: int) -> pb.Status | None:
    """UNRECOGNIZED_CLIENT_TYPE for a Heartbeat from a ``client_type`` outside
    ``HEARTBEAT_TYPES``, else None."""
    if client_type in HEARTBEAT_TYPES:
        return None
    return status(Code.UNRECOGNIZED_CLIENT_TYPE, f"client_type {client_type_name(client_type)} "
                  "is not served here; send PRODUCER, PUSH_CONSUMER, SIMPLE_CONSUMER or "
                  "PULL_CONSUMER")


def retry_policy_pb(max_attempts: int, policy: dict) -> pb.RetryPolicy:
    """A group's retry policy (log/retrypolicy.py) as the settings' ``backoff_policy``, as
    the proxy's GrpcClientSettingsManager builds it."""
    if policy["type"] == EXPONENTIAL:
        e = policy["exponentialRetryPolicy"]
        return pb.RetryPolicy(max_attempts=max_attempts, exponential_backoff=pb.ExponentialBackoff(
            initial=duration(e["initial"]), max=duration(e["max"]),
            multiplier=float(e["multiplier"])))
    return pb.RetryPolicy(max_attempts=max_attempts, customized_backoff=pb.CustomizedBackoff(
        next=[duration(ms) for ms in policy["customizedRetryPolicy"]["next"]]))


def client_id(context) -> str:
    """The client id of a call (``x-mq-client-id``), else its peer address."""
    for k, v in context.invocation_metadata() or ():
        if k == "x-mq-client-id":
            return v
    return context.peer()


class Outbox:
    """A Telemetry stream's outbound commands: ``put`` from any thread, ``get`` on the
    stream's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:       # the loop is closed: the stream is gone with the server
            pass

    async def get(self):
        return await self._queue.get()


class TelemetryMixin:
    """The Telemetry method of ``MessagingServicer`` (which gives ``broker`` and
    ``_subscription_refusal``)."""

    async def Telemetry(self, request_iterator, context):
        from .grpc_server import Malformed
        try:
            user = self.broker.authenticator.check(context.invocation_metadata())
        except AuthenticationError as e:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, e.message)
        source_ip = peer_ip(context.peer())
        cid = client_id(context)
        out = Outbox(asyncio.get_running_loop())
        self.broker.streams.open(cid, out)
        done = object()

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    if isinstance(cmd, Malformed):
                        out.put(spb.TelemetryCommand(status=status(Code.BAD_REQUEST, cmd.error)))
                    elif cmd.HasField("settings"):
                        out.put(self._settings_command(user, cid, cmd.settings, source_ip))
            except grpc.RpcError as e:      # the client went away mid-stream
                log.debug("telemetry stream of %s ended: %s", cid, e)
            except Exception:  # a bad settings reply ends this stream only; logged
                log.exception("telemetry stream of %s failed", cid)
            finally:
                out.put(done)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                item = await out.get()
                if item is done:
                    break
                yield item
        finally:
            reader.cancel()
            self.broker.streams.close(cid, out)

    def _settings_command(self, user, cid: str, settings: pb.Settings, source_ip):
        refused = self._settings_refusal(user, settings, source_ip)
        if refused is not None:
            return spb.TelemetryCommand(status=refused)
        return self._settings_reply(cid, settings)

    def _settings_refusal(self, user, settings: pb.Settings, source_ip) -> pb.Status | None:
        """FORBIDDEN when the user may not use what ``settings`` declares (authz.py)."""
        try:
            self.broker.authorizer.check(user, settings_resources(settings), source_ip)
        except AuthorizationError as e:
            return error_status(e)
        return None

    def _settings_reply(self, cid: str, s: pb.Settings) -> spb.TelemetryCommand:
        cfg = self.broker.config
        out = pb.Settings()
        out.CopyFrom(s)
        # (both before the client is known under a topic or group)
        refused = _name_refusal(s) or _kind_refusal(s)
        if refused is not None:
            log.info("client %s: %s", cid, refused.message)
            return spb.TelemetryCommand(status=refused, settings=out)
        metric_settings(self.broker, out.metric, s.client_type)
        if s.HasField("publishing"):
            self.broker.streams.set_topics(cid, [t.name for t in s.publishing.topics])
            out.publishing.max_body_size = self.broker.store.config.max_message_size_bytes
            out.publishing.validate_message_type = True
            out.backoff_policy.CopyFrom(pb.RetryPolicy(
                max_attempts=3, exponential_backoff=pb.ExponentialBackoff(
                    initial=duration(10), max=duration(1000), multiplier=2.0)))
        elif s.HasField("subscription"):
            group = s.subscription.group.name
            self.broker.clients.heartbeat(cid, group, s.client_type)
            lp = ms_of_duration(s.subscription.long_polling_timeout) or 20_000
            out.subscription.long_polling_timeout.CopyFrom(
                duration(min(lp, cfg.max_long_polling_ms)))
            conf = self.broker.store.state.subscription_groups.get(group)
            # a FIFO consumer group (consumeMessageOrderly), as the proxy tells its clients
            out.subscription.fifo = bool(conf is not None and conf.orderly)
            out.subscription.receive_batch_size = 32
            out.backoff_policy.CopyFrom(retry_policy_pb(
                self.broker.pop.max_attempts(group), self.broker.group_retry_policy(group)))
            refused = self._subscription_refusal(s.subscription)
            if refused is not None:
                log.info("client %s: %s", cid, refused.message)
                return spb.TelemetryCommand(status=refused, settings=out)
        return spb.TelemetryCommand(status=OK, settings=out)


def _name_refusal(s: pb.Settings) -> pb.Status | None:
    """ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP for a topic or group in a client's settings
    that breaks the naming rules, as the proxy's ClientActivity checks them; else None."""
    try:
        if s.HasField("publishing"):
            for topic in s.publishing.topics:
                validate_topic(topic.name)
        elif s.HasField("subscription"):
            validate_group(s.subscription.group.name)
            for entry in s.subscription.subscriptions:
                validate_topic(entry.topic.name)
    except InvalidNameError as e:
        return error_status(e)
    return None


def _kind_refusal(s: pb.Settings) -> pb.Status | None:
    """BAD_REQUEST for settings the proxy does not take (ClientActivity
    ``processAndWriteClientSettings``): neither publishing nor subscription (the proxy
    ends the stream INVALID_ARGUMENT), or a subscription from a client type that does
    not consume (the proxy fails the stream, registering no consumer); else None.
    Publishing settings are taken from any client type, as the proxy takes them."""
    if s.HasField("subscription"):
        if s.client_type in CONSUMER_TYPES:
            return None
        return status(Code.BAD_REQUEST, f"subscription settings from client_type "
                      f"{client_type_name(s.client_type)}: only a PUSH_CONSUMER, "
                      "SIMPLE_CONSUMER or PULL_CONSUMER subscribes; send the consumer's type")
    if s.HasField("publishing"):
        return None
    return status(Code.BAD_REQUEST, "the settings have neither publishing (a producer's) "
                  "nor subscription (a consumer's); send one of them")
