"""Options of a write (``df.write`` / ``df.writeStream`` with ``format("sparkmq")``):
which are known, and their parsing (storage options, input limits, integers).

Pure (no Spark): the writer's constructor calls these on the driver. The options
themselves are listed in :mod:`sparkmq.datasource.writer`'s docstring.
"""
from __future__ import annotations

import json

from ..errors import InvalidConfigError, UserError
from ..log.limits import MessageLimits


def lower_options(options) -> dict[str, str]:
    """Options with lower-case names: Spark's option names are case-insensitive, and
    a plain ``dict(options)`` of its CaseInsensitiveDict already holds lower-case keys."""
    return {str(k).lower(): v for k, v in dict(options).items()}


def _storage_options(options) -> dict | None:
    """fsspec storage options: option ``storageOptions`` (a JSON object, as for reads)
    plus any ``storage.<name>`` options."""
    out = {}
    raw = options.get("storageoptions")
    if raw:
        try:
            out.update(json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise InvalidConfigError(f"option storageOptions must be a JSON object: {exc}") \
                from None
    out.update({k[len("storage."):]: v for k, v in options.items() if k.startswith("storage.")})
    return out or None


def _limits(options, max_message_size_bytes: int) -> MessageLimits:
    """The input limits every row is held to (``log/limits.py``): the store's defaults,
    or the options of the same names (maxUserPropertySize, userPropertyMaxNum,
    maxMessageGroupSize, maxMessageIdSize)."""
    d = MessageLimits()
    return MessageLimits(
        max_message_size_bytes,
        _int_option(options, "maxUserPropertySize", d.max_user_property_size_bytes),
        _int_option(options, "userPropertyMaxNum", d.user_property_max_num),
        _int_option(options, "maxMessageGroupSize", d.max_message_group_size_bytes),
        _int_option(options, "maxMessageIdSize", d.max_message_id_size_bytes))


#: every option a write takes (lower case, as Spark hands them), besides ``storage.*``
WRITE_OPTIONS = ("path", "topic", "writerid", "maxsegmentbytes", "maxmessagesize",
                 "storageoptions", "maxuserpropertysize", "userpropertymaxnum",
                 "maxmessagegroupsize", "maxmessageidsize", "autocreatetopic", "queues",
                 "checkpointlocation")
_WRITE_NAMES = {n.lower(): n for n in (
    "path", "topic", "writerId", "maxSegmentBytes", "maxMessageSize", "storageOptions",
    "maxUserPropertySize", "userPropertyMaxNum", "maxMessageGroupSize", "maxMessageIdSize",
    "autoCreateTopic", "queues", "checkpointLocation")}


def _refuse_memory_url(url: str) -> None:
    """memory:// lives in one process; Spark's executors are others."""
    if str(url).startswith("memory://"):
        raise UserError(f"{url}: a memory:// store lives in one process, and Spark reads and "
                        "writes from other processes (its executors); use a local path or an "
                        "object store URL")


def check_write_options(options: dict) -> None:
    """UserError for an option a write does not know, naming the closest known one."""
    from .options import unknown_option_error
    several = [k for k in ("paths", "stores", "namesrv") if k in options]
    if several:
        raise UserError(f"a write goes to one store (got {', '.join(several)}): use "
                        ".save(url); to spread a topic over brokers, write to each "
                        "broker's store (or send through the brokers)")
    for key in options:
        if key not in WRITE_OPTIONS and not key.startswith("storage."):
            raise unknown_option_error(key, _WRITE_NAMES, "write")


def _int_option(options, name: str, default: int) -> int:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidConfigError(f"option {name} must be an integer, got {raw!r}") from None
    if value <= 0:
        raise InvalidConfigError(f"option {name} must be positive, got {value}")
    return value
