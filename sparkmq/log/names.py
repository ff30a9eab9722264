"""Topic and group name rules (RocketMQ's ``TopicValidator``).

A name is letters, digits, ``%``, ``|``, ``_`` and ``-``, 1 to 127 characters
(groups: 255). Names never become paths (side tables use numeric topic ids),
but the rules still refuse ``../x`` and friends with a clear message.
"""
from __future__ import annotations

import re

from ..errors import InvalidNameError

_NAME_CHAR = "[%|a-zA-Z0-9_-]"
_NAME_RE = re.compile(f"{_NAME_CHAR}+")     # used with fullmatch: no trailing "\n" slips by
TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255

#: Names RocketMQ reserves for itself; only the broker may create them.
RESERVED_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC",
    "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC",
})
SYSTEM_PREFIXES = ("rmq_sys_", "RMQ_SYS_")
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


def validate_topic(name: object, *, system: bool = False) -> str:
    """Return ``name`` if it is a legal topic name, else raise InvalidNameError."""
    _validate(name, "topic", TOPIC_MAX_LENGTH)
    if not system:
        if name in RESERVED_TOPICS or name.startswith(SYSTEM_PREFIXES):
            raise InvalidNameError(
                f"topic name {name!r} is reserved for the broker's own use; pick another name")
    return name  # type: ignore[return-value]


def validate_group(name: object) -> str:
    """Return ``name`` if it is a legal consumer/producer group name."""
    _validate(name, "group", GROUP_MAX_LENGTH)
    return name  # type: ignore[return-value]


def _validate(name: object, what: str, max_len: int) -> None:
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} name must be a string, got {type(name).__name__}", what)
    if not name:
        raise InvalidNameError(f"{what} name must not be empty", what)
    if len(name) > max_len:
        raise InvalidNameError(
            f"{what} name is {len(name)} characters; at most {max_len} are allowed", what)
    if not _NAME_RE.fullmatch(name):
        bad = sorted({c for c in name if not re.fullmatch(_NAME_CHAR, c)})
        raise InvalidNameError(
            f"{what} name {name!r} contains {''.join(bad)!r}; only letters, digits, "
            "'%', '|', '_' and '-' are allowed", what)
