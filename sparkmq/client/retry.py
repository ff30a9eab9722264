"""A consumer group's retry policy, as the brokers tell it to push consumers, and the wait
it sets before a failed message comes back.

RocketMQ 5 sends a group's policy in the Telemetry settings (``backoff_policy``: a
``RetryPolicy`` with ``max_attempts`` and a customized or exponential backoff; the
broker's side is ``sparkmq/log/retrypolicy.py``). When a listener fails a message, the
official clients' push consumers do not wait out the message's invisible duration: they
change it to the policy's delay for the message's delivery attempt (the Java client's
``ProcessQueueImpl.nackMessage``), so the message comes back after 1 s, 5 s, 10 s, ...
of the default policy. :func:`fetch_retry_policy` asks one broker for it with a one-shot
Telemetry stream (:func:`group_retry_policy`: the first of several that answers);
:meth:`RetryPolicy.delay_s` is the clients' arithmetic.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from .core import Code, Connections, duration

log = logging.getLogger("sparkmq.client.consumer")


def _seconds(d) -> float:
    return d.seconds + d.nanos / 1e9


@dataclass(frozen=True)
class RetryPolicy:
    """``steps``: a customized backoff's delays (seconds); else exponential ``initial``
    * ``multiplier`` ** (attempt - 1), at most ``maximum``."""

    max_attempts: int
    steps: tuple[float, ...] = ()
    initial: float = 0.0
    maximum: float = 0.0
    multiplier: float = 1.0

    @classmethod
    def from_pb(cls, p: pb.RetryPolicy) -> "RetryPolicy | None":
        """None for a policy with no backoff (nothing to apply)."""
        kind = p.WhichOneof("strategy")
        if kind == "customized_backoff" and len(p.customized_backoff.next):
            return cls(p.max_attempts, tuple(_seconds(d) for d in p.customized_backoff.next))
        if kind == "exponential_backoff":
            e = p.exponential_backoff
            return cls(p.max_attempts, initial=_seconds(e.initial), maximum=_seconds(e.max),
                       multiplier=e.multiplier or 1.0)
        return None

    def delay_s(self, attempt: int) -> float:
        """The wait before delivery ``attempt + 1`` of a message whose delivery
        ``attempt`` (1 = the first) failed: customized, step ``attempt`` (the last step
        repeated); exponential, ``initial * multiplier ** (attempt - 1)`` up to the max."""
        attempt = max(1, attempt)
        if self.steps:
            return self.steps[min(attempt, len(self.steps)) - 1]
        return max(0.0, min(self.maximum, self.initial * self.multiplier ** (attempt - 1)))


def fetch_retry_policy(conns: Connections, endpoint: str, settings: pb.Settings
                       ) -> RetryPolicy | None:
    """``endpoint``'s answer to a consumer's ``settings`` (its group and subscriptions):
    the group's retry policy, or None when the broker refused the settings, sent no
    backoff, or could not be reached (BrokerUnavailableError is not raised: the caller
    keeps what it had)."""
    call = None
    try:
        call = conns.stub(endpoint).Telemetry(iter([spb.TelemetryCommand(settings=settings)]),
                                              timeout=conns.request_timeout_s,
                                              metadata=conns.metadata)
        for cmd in call:
            if not cmd.HasField("settings"):
                continue
            if cmd.status.code not in (Code.OK, 0):
                log.warning("broker %s refused the consumer settings: %s", endpoint,
                            cmd.status.message)
                return None
            if not cmd.settings.HasField("backoff_policy"):
                return None
            return RetryPolicy.from_pb(cmd.settings.backoff_policy)
    except grpc.RpcError as e:
        log.info("telemetry settings from %s: %s", endpoint, e.code())
    finally:
        if call is not None:
            call.cancel()
    return None


def group_retry_policy(conns: Connections, endpoints, settings: pb.Settings
                       ) -> RetryPolicy | None:
    """The group's retry policy as the first of ``endpoints`` that answers tells it
    (the brokers of a group serve the same subscription group config)."""
    for ep in sorted(endpoints):
        policy = fetch_retry_policy(conns, ep, settings)
        if policy is not None:
            return policy
    return None


def consumer_settings(group: str, subscriptions: dict[str, tuple[int, str]], *,
                      request_timeout_s: float, long_polling_s: float) -> pb.Settings:
    """A push consumer's Telemetry settings (``subscriptions``: topic -> (filter type,
    expression))."""
    return pb.Settings(
        client_type=pb.PUSH_CONSUMER, request_timeout=duration(request_timeout_s),
        subscription=pb.Subscription(
            group=pb.Resource(name=group), long_polling_timeout=duration(long_polling_s),
            subscriptions=[pb.SubscriptionEntry(
                topic=pb.Resource(name=t),
                expression=pb.FilterExpression(type=kind, expression=expr))
                for t, (kind, expr) in subscriptions.items()]))
