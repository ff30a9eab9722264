"""Receipt handles the broker renews for consumers that ask it to (ReceiveMessage
``auto_renew``), as the Apache RocketMQ 5 proxy's ReceiptHandleManager does.

The official PushConsumers (Java, Python, Go, ...) receive with ``auto_renew`` set and no
invisible duration: the proxy hides each message ``defaultInvisibleTimeMs`` and then keeps
it hidden while the consumer works on it, so a listener that runs longer than that is not
handed its message a second time. The renewer here does the same:

* a message received with ``auto_renew`` is *held*, per (client id, consumer group), under
  the receipt handle the client got (the client keeps that one; each renewal makes a newer
  one that only the broker knows);
* every ``renewSchedulePeriodMillis`` (5 s) a pass renews each held message whose invisible
  time ends within ``renewAheadTimeMillis`` (10 s): hidden 1, 3, 5, 10, 30 and then 60 min
  more, the proxy's RenewStrategyPolicy, for at most ``renewMaxTimeMillis`` (3 h) after it
  was received; past that it is let go, visible again after the group's retry policy's
  delay, as a failed delivery would be;
* an ack, a ChangeInvisibleDuration or a DLQ forward by the client *releases* the message
  first and acts on the newest handle, so the handle the client holds stays good;
* a client that ends (NotifyClientTermination) or falls silent (the client registry forgets
  it) has its held messages let go, visible again ``invisibleTimeMillisWhenClear`` (1 s)
  later, so another consumer takes them over;
* a renewal that fails three times in a row (``maxRenewRetryTimes``), or that finds the
  lease gone (acked, redelivered), drops the message.

Thread-safety: one lock; a renewal runs under it, so a release never sees a handle that a
renewal is replacing (the proxy's per-handle lock). The pop service's group locks are taken
inside it, never the other way round.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from ..lifecycle import ServiceThread
from ..log.retrypolicy import next_delay_ms
from .pop import InvalidHandle

log = logging.getLogger("sparkmq.broker.renew")

#: how long each renewal hides a message, by renewal number (the proxy's RenewStrategyPolicy)
RENEW_STEPS_MS = (60_000, 180_000, 300_000, 600_000, 1_800_000, 3_600_000)
#: renewals that fail in a row before a message is dropped (``maxRenewRetryTimes``)
MAX_RENEW_FAILURES = 3


@dataclass
class Held:
    """A message a consumer is working on, kept hidden by renewals."""

    group: object            # the consumer: a group name or a pop.GroupKey
    topic: str
    handle: str              # the newest receipt handle (the client has the first)
    visible_at_ms: int
    received_ms: int
    reconsume_times: int
    renewals: int = 0
    failures: int = 0


class ReceiptRenewer:
    """See the module docstring. ``receiver`` changes invisible times
    (``ReceiveService.change_invisible``); ``online(client_id)`` tells whether a client is
    still there; ``retry_policy(group name)`` is a group's retry policy (retrypolicy.py)."""

    def __init__(self, receiver, online: Callable[[str], bool],
                 retry_policy: Callable[[str], dict], *, clock_ms: Callable[[], int],
                 ahead_ms: int, max_ms: int, clear_ms: int, on_renewed=None):
        self.receiver = receiver
        self.online = online
        self.retry_policy = retry_policy
        self.clock_ms = clock_ms
        self.ahead_ms = ahead_ms
        self.max_ms = max_ms
        self.clear_ms = clear_ms
        self.on_renewed = on_renewed or (lambda: None)
        self._lock = threading.Lock()
        # (client id, consumer) -> the client's receipt handle -> Held
        self._held: dict[tuple[str, object], dict[str, Held]] = {}

    def hold(self, client_id: str, group, topic: str, deliveries) -> None:
        """Keep ``deliveries`` (pop.Delivery, just received by ``client_id`` for
        ``group``) hidden until released."""
        now = self.clock_ms()
        with self._lock:
            held = self._held.setdefault((client_id, group), {})
            for d in deliveries:
                held[d.receipt_handle] = Held(group, topic, d.receipt_handle,
                                              now + d.invisible_ms, now, d.attempt - 1)

    def release(self, client_id: str, group, handle: str) -> str:
        """Stop renewing the message of ``handle`` (a handle the client was given);
        returns the handle to act on: the newest, or ``handle`` if it is not held."""
        with self._lock:
            held = self._held.get((client_id, group))
            h = held.pop(handle, None) if held else None
            if held is not None and not held:
                del self._held[(client_id, group)]
            return handle if h is None else h.handle

    def held_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._held.values())

    def forget_client(self, client_id: str, group: str) -> None:
        """Let go of every message ``client_id`` holds for consumer group ``group`` (it
        ended): each visible again ``clear_ms`` from now."""
        with self._lock:
            for key in [k for k in self._held
                        if k[0] == client_id and getattr(k[1], "group", k[1]) == group]:
                self._clear(self._held.pop(key))

    def renew_due(self) -> None:
        """One pass: let go of what offline clients hold, renew what is due."""
        with self._lock:
            keys = list(self._held)
        for key in keys:
            if not self.online(key[0]):
                with self._lock:
                    held = self._held.pop(key, None)
                    if held:
                        log.info("client %s is gone: %d held messages of %s let go",
                                 key[0], len(held), key[1])
                        self._clear(held)
                continue
            with self._lock:
                handles = list(self._held.get(key, ()))
            for handle in handles:
                with self._lock:           # (a release waits for the renewal in hand)
                    held = self._held.get(key)
                    h = held.get(handle) if held else None
                    if h is not None and h.visible_at_ms - self.clock_ms() <= self.ahead_ms \
                            and not self._renew(h):
                        del held[handle]
                    if held is not None and not held:
                        del self._held[key]

    def _renew(self, h: Held) -> bool:
        """Renew ``h`` (under the lock); False: it is no longer held."""
        now = self.clock_ms()
        group_name = getattr(h.group, "group", h.group)
        past_max = now - h.received_ms >= self.max_ms
        ms = next_delay_ms(self.retry_policy(group_name), h.reconsume_times) if past_max \
            else RENEW_STEPS_MS[min(h.renewals, len(RENEW_STEPS_MS) - 1)]
        try:
            handle = self.receiver.change_invisible(h.group, h.handle, ms, h.topic)
        except InvalidHandle:          # acked, redelivered or changed by another way
            return False
        except Exception:  # a failed renewal is retried next pass, a few times; logged
            h.failures += 1
            log.warning("renewal of a message of %s/%s failed (%d in a row)", group_name,
                        h.topic, h.failures, exc_info=True)
            return h.failures < MAX_RENEW_FAILURES
        if past_max:
            log.info("a message of %s/%s held past renewMaxTimeMillis: visible again in %d ms",
                     group_name, h.topic, ms)
            return False
        h.handle, h.visible_at_ms = handle, now + ms
        h.renewals, h.failures = h.renewals + 1, 0
        self.on_renewed()
        return True

    def _clear(self, held: dict[str, Held]) -> None:
        for h in held.values():
            try:
                self.receiver.change_invisible(h.group, h.handle, self.clear_ms, h.topic)
            except InvalidHandle:      # already acked or redelivered: nothing to let go
                pass
            except Exception:  # one that cannot be let go now becomes visible when its
                # renewed time ends; the others are still let go (logged)
                log.warning("could not let go of a message of %s/%s", h.group, h.topic,
                            exc_info=True)


class ReceiptRenewService(ServiceThread):
    """Runs :meth:`ReceiptRenewer.renew_due` every ``renewSchedulePeriodMillis``."""

    name = "receipt-renew"

    def __init__(self, renewer: ReceiptRenewer, interval_ms: int):
        super().__init__(interval_ms)
        self.renewer = renewer

    def run_once(self) -> None:
        self.renewer.renew_due()
