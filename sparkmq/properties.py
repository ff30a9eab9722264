"""Java-style ``.properties`` files, as RocketMQ's ``broker.conf`` and
``namesrv.conf`` are written, and the coercion of their string values.

Shared by the broker, the NameServer and the store's config: one parser, one
meaning of ``true``/``false``. Pure functions; thread-safe.
"""
from __future__ import annotations

import operator
from typing import Any

from .errors import InvalidConfigError


def load_properties(path: str) -> dict[str, str]:
    """Parse a Java-style properties file: ``key=value`` (or ``key: value``),
    ``#``/``!`` comments, blank lines ignored. Raises InvalidConfigError if unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InvalidConfigError(f"cannot read config file {path!r}: {e}") from None
    return parse_properties(text, source=path)


def parse_properties(text: str, *, source: str = "<string>") -> dict[str, str]:
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        seps = [i for i in (line.find("="), line.find(":")) if i > 0]
        if not seps:
            raise InvalidConfigError(f"{source}:{n}: expected key=value, got {raw!r}")
        i = min(seps)
        out[line[:i].strip()] = line[i + 1:].strip()
    return out


def parse_bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    s = str(raw).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise InvalidConfigError(f"{name} must be true or false, got {raw!r}")


def is_whole(value: Any) -> bool:
    """True for a whole number given as one (an ``int``), not a bool, a fraction or a
    string: the one test of every integer field of a JSON body and of the integer
    arguments the store checks (retry policies, retention) (``int()`` reads 1.5 as 1, and
    ``True`` or ``"3"`` as numbers). A config's integers: ``parse_int``."""
    return isinstance(value, int) and not isinstance(value, bool)


def whole(value: Any, name: str) -> int:
    """``value`` of JSON field ``name`` if it is a whole number (``is_whole``); else
    ValueError naming the field and what it got."""
    if not is_whole(value):
        raise ValueError(f"{name!r} is a whole number, got {value!r}")
    return value


def parse_int(name: str, raw: Any) -> int:
    """``raw`` as an integer: a string of one (a properties file's value), or an integer
    value (an ``int`` or any integer type, a numpy one too; not a bool, not a fraction);
    else InvalidConfigError."""
    try:
        if isinstance(raw, str):
            return int(raw)
        if not isinstance(raw, bool):
            return operator.index(raw)
    except (TypeError, ValueError):
        pass
    raise InvalidConfigError(f"{name} must be an integer, got {raw!r}")
