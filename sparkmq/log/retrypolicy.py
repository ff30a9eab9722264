"""A consumer group's retry policy (RocketMQ 5's ``GroupRetryPolicy`` of the subscription
group config): how long a consumer waits before a failed message comes back.

Two kinds, with RocketMQ's JSON names and defaults:

* ``CUSTOMIZED`` (the default): ``{"type": "CUSTOMIZED", "customizedRetryPolicy":
  {"next": [ms, ...]}}``, by default the 18 steps of ``messageDelayLevel``
  (1s 5s 10s 30s 1m ... 2h);
* ``EXPONENTIAL``: ``{"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": ms,
  "max": ms, "multiplier": n}}``, by default 5 s, 2 h, 2.

The broker sends the policy to consumers in the Telemetry settings (``backoff_policy``), as
the proxy does; the clients apply it when a listener fails (they change the message's
invisible duration to the next delay). ``parse_duration_ms`` is the one reader of
``<number><ms|s|m|h|d>`` (delay levels use it too).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from ..errors import UserError
from ..properties import is_whole

CUSTOMIZED, EXPONENTIAL = "CUSTOMIZED", "EXPONENTIAL"
DEFAULT_NEXT_MS = (1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000,
                   360_000, 420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000,
                   3_600_000, 7_200_000)
DEFAULT_EXPONENTIAL = {"initial": 5_000, "max": 7_200_000, "multiplier": 2}
MAX_STEPS = 64
MAX_DELAY_MS = 24 * 3_600_000
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``"5s"`` -> 5000: a whole number and a unit of ms, s, m, h or d."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text.strip())
    if m is None:
        raise UserError(f"{text!r} is not <number><ms|s|m|h|d> (a duration)")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def default_policy() -> dict:
    return {"type": CUSTOMIZED, "customizedRetryPolicy": {"next": list(DEFAULT_NEXT_MS)}}


def validate_policy(policy: Mapping[str, Any]) -> dict:
    """``policy`` checked and normalized (missing parts take RocketMQ's defaults);
    UserError naming what is wrong."""
    if not isinstance(policy, Mapping):
        raise UserError(f"a retry policy is a JSON object, got {policy!r}")
    kind = str(policy.get("type", CUSTOMIZED)).upper()
    if kind == CUSTOMIZED:
        nxt = (policy.get("customizedRetryPolicy") or {}).get("next", DEFAULT_NEXT_MS)
        if not isinstance(nxt, (list, tuple)) or not 1 <= len(nxt) <= MAX_STEPS or not all(
                is_whole(x) and 0 < x <= MAX_DELAY_MS
                for x in nxt):
            raise UserError(f"customizedRetryPolicy.next must be 1..{MAX_STEPS} delays in ms, "
                            f"each 1..{MAX_DELAY_MS}, got {nxt!r}")
        return {"type": CUSTOMIZED, "customizedRetryPolicy": {"next": list(nxt)}}
    if kind == EXPONENTIAL:
        exp = {**DEFAULT_EXPONENTIAL, **(policy.get("exponentialRetryPolicy") or {})}
        ok = all(is_whole(exp[k]) for k in ("initial", "max", "multiplier"))
        if not ok or not 0 < exp["initial"] <= exp["max"] <= MAX_DELAY_MS \
                or not 1 <= exp["multiplier"] <= 100:
            raise UserError("exponentialRetryPolicy needs 0 < initial <= max <= "
                            f"{MAX_DELAY_MS} ms and a multiplier 1..100, got {dict(exp)!r}")
        return {"type": EXPONENTIAL, "exponentialRetryPolicy": {
            k: exp[k] for k in ("initial", "max", "multiplier")}}
    raise UserError(f"retry policy type must be {CUSTOMIZED} or {EXPONENTIAL}, got {kind!r}")


def parse_policy_arg(text: str) -> dict:
    """The command line's ``customized:1s,5s,30s`` or ``exponential:5s,2h,2`` (initial,
    max, multiplier) as a policy."""
    kind, _, rest = text.partition(":")
    items = [x for x in rest.split(",") if x.strip()]
    if kind.strip().lower() == "customized":
        return validate_policy({"type": CUSTOMIZED, "customizedRetryPolicy": {
            "next": [parse_duration_ms(x) for x in items]}})
    if kind.strip().lower() == "exponential" and len(items) == 3:
        try:
            multiplier = int(items[2])
        except ValueError:
            raise UserError(f"the multiplier of {text!r} is not a whole number") from None
        return validate_policy({"type": EXPONENTIAL, "exponentialRetryPolicy": {
            "initial": parse_duration_ms(items[0]), "max": parse_duration_ms(items[1]),
            "multiplier": multiplier}})
    raise UserError(f"retry policy {text!r}: give customized:<d>,<d>,... or "
                    "exponential:<initial>,<max>,<multiplier> (durations like 5s, 2m, 1h)")


def next_delay_ms(policy: Mapping[str, Any], reconsume_times: int) -> int:
    """The wait before redelivery number ``reconsume_times + 1``, as RocketMQ computes it
    (customized: step ``reconsume_times``, the last one repeated; exponential:
    ``initial * multiplier ** n`` up to ``max``)."""
    n = max(0, reconsume_times)
    if policy["type"] == EXPONENTIAL:
        e = policy["exponentialRetryPolicy"]
        return min(e["max"], e["initial"] * e["multiplier"] ** min(n, 32))
    nxt = policy["customizedRetryPolicy"]["next"]
    return nxt[min(n, len(nxt) - 1)]
