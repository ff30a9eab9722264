"""Where a delayed message waits: RocketMQ's ``messageDelayLevel`` levels and 5.x delivery
timestamps turned into a schedule queue and a due time (the schedule service, ``schedule``,
delivers them).

Contract: ``DelayPolicy`` turns a send's delay (a level 1..N via the ``DELAY`` user
property, or a delivery timestamp) into ``(schedule queue, due ms)``; a delay beyond
``maxDelayMs`` (default 3 days) or an unknown level raises ``DelayRefused``; a due time
already past means "deliver now" (``None``). ``parked_row`` rewrites one sent message's
topic, queue and properties for where it waits. Immutable and thread-safe.
"""

from __future__ import annotations

from ..errors import DelayRefused, UserError
from ..log.retrypolicy import parse_duration_ms
from .parked import PROP_DELAY_LEVEL, PROP_REAL_TOPIC, SCHEDULE_TOPIC

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_MAX_DELAY_MS = 3 * 24 * 3600 * 1000
def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 1m 2h"`` -> milliseconds per level (level 1 first)."""
    out = []
    for item in text.split():
        try:
            out.append(parse_duration_ms(item))
        except UserError as e:
            raise UserError(f"messageDelayLevel item: {e.message}") from None
    if not out:
        raise UserError("messageDelayLevel is empty")
    return out


class DelayPolicy:
    """Where and until when a delayed message is parked. Immutable; thread-safe."""

    def __init__(self, levels_ms: list[int], max_delay_ms: int = DEFAULT_MAX_DELAY_MS):
        self.levels_ms = list(levels_ms)
        self.max_delay_ms = max_delay_ms

    @property
    def timer_queue(self) -> int:
        """The schedule queue of arbitrary delivery timestamps (after the level queues)."""
        return len(self.levels_ms)

    @property
    def queue_count(self) -> int:
        return len(self.levels_ms) + 1

    def park(self, now_ms: int, *, level: int | None = None,
             deliver_at_ms: int | None = None) -> tuple[int, int] | None:
        """(schedule queue, due ms), or None to deliver at once (level 0, a past timestamp)."""
        if level is not None:
            if level <= 0:
                return None
            if level > len(self.levels_ms):
                raise DelayRefused(f"delay level {level} does not exist; levels are 1.."
                                   f"{len(self.levels_ms)} (messageDelayLevel)")
            return level - 1, now_ms + self.levels_ms[level - 1]
        if deliver_at_ms is None or deliver_at_ms <= now_ms:
            return None
        if deliver_at_ms - now_ms > self.max_delay_ms:
            raise DelayRefused(
                f"delivery time is {deliver_at_ms - now_ms} ms ahead; at most {self.max_delay_ms}"
                " ms (maxDelayMs) is allowed")
        return self.timer_queue, deliver_at_ms


def parked_row(policy: DelayPolicy, now_ms: int, topic: str, properties: dict[str, str],
               deliver_at_ms: int | None) -> tuple[str, int | None, int | None, dict]:
    """(topic, queue id or None, delivery ms or None, properties) for one sent message: the
    schedule topic if it must wait, else the real topic unchanged. Raises DelayRefused."""
    level = None
    raw = properties.get(PROP_DELAY_LEVEL)
    if raw is not None:
        try:
            level = int(raw)
        except ValueError:
            raise DelayRefused(f"{PROP_DELAY_LEVEL} property {raw!r} is not a level number") from None
    parked = policy.park(now_ms, level=level, deliver_at_ms=None if level else deliver_at_ms)
    if parked is None:
        return topic, None, deliver_at_ms, properties
    qid, due = parked
    props = {k: v for k, v in properties.items() if k != PROP_DELAY_LEVEL}
    props[PROP_REAL_TOPIC] = topic
    return SCHEDULE_TOPIC, qid, due, props
