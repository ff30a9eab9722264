"""Store configuration, with RocketMQ's property names.

``StoreConfig.from_properties`` accepts the camelCase names a RocketMQ
``broker.conf`` uses (``mappedFileSizeCommitLog``, ``flushDiskType``, ...);
attributes carry their unit in the name.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import InvalidConfigError
from .properties import parse_bool, parse_int

SYNC_FLUSH = "SYNC_FLUSH"
ASYNC_FLUSH = "ASYNC_FLUSH"

GIB = 1 << 30
MIB = 1 << 20

# defaults that other modules use too (the Spark writer, the direct committer, the broker)
DEFAULT_MAX_MESSAGE_SIZE_BYTES = 4 * MIB        # maxMessageSize
DEFAULT_COMMIT_RETRIES = 50                    # put-if-absent conflicts before giving up
# the RocketMQ 5 proxy's input limits (ProxyConfig), enforced by sparkmq.log.limits
DEFAULT_MAX_USER_PROPERTY_SIZE_BYTES = 16 << 10   # maxUserPropertySize
DEFAULT_USER_PROPERTY_MAX_NUM = 128               # userPropertyMaxNum
DEFAULT_MAX_MESSAGE_GROUP_SIZE_BYTES = 64         # maxMessageGroupSize
DEFAULT_MAX_MESSAGE_ID_SIZE_BYTES = 128           # maxMessageIdSize (sparkmq's own)


@dataclass(frozen=True)
class StoreConfig:
    """Configuration of one store. Immutable; thread-safe to share."""

    segment_size_bytes: int = GIB                 # mappedFileSizeCommitLog
    flush_disk_type: str = ASYNC_FLUSH            # flushDiskType
    flush_interval_ms: int = 500                  # flushIntervalCommitLog
    sync_flush_timeout_ms: int = 5_000            # syncFlushTimeout
    publish_interval_ms: int = 1_000              # how often progress is committed to _log
    publish_min_gap_ms: int = 100                 # publishMinGapMs: publish cadence while a
                                                  # stream reader is live (_readers/ marker)
    checkpoint_interval_versions: int = 10        # checkpointInterval
    file_reserved_time_hours: float = 72.0        # fileReservedTime
    delete_when: str = "04"                       # deleteWhen (hours, ';' separated)
    disk_max_used_space_ratio: int = 75           # diskMaxUsedSpaceRatio: expired files go at once
    disk_space_clean_forcibly_ratio: int = 85     # diskSpaceCleanForciblyRatio: oldest go, expired or not
    disk_space_warning_level_ratio: int = 90      # diskSpaceWarningLevelRatio: writes refused
    retention_check_interval_ms: int = 10_000     # how often the retention service looks
    max_message_size_bytes: int = DEFAULT_MAX_MESSAGE_SIZE_BYTES   # maxMessageSize (whole message)
    max_user_property_size_bytes: int = DEFAULT_MAX_USER_PROPERTY_SIZE_BYTES  # maxUserPropertySize
    user_property_max_num: int = DEFAULT_USER_PROPERTY_MAX_NUM     # userPropertyMaxNum
    max_message_group_size_bytes: int = DEFAULT_MAX_MESSAGE_GROUP_SIZE_BYTES  # maxMessageGroupSize
    max_message_id_size_bytes: int = DEFAULT_MAX_MESSAGE_ID_SIZE_BYTES  # maxMessageIdSize
    default_topic_queue_nums: int = 4             # defaultTopicQueueNums
    auto_create_topic: bool = False               # autoCreateTopicEnable
    compact_after_files: int = 8                  # small side-table files before compaction
    compact_max_rows: int = 524_288               # rows per side-table file written (bounds memory)
    side_table_row_group_rows: int = 65_536       # Parquet row group size of side tables
    memory_consume_queue_entries: int = 1_000_000 # in-memory ConsumeQueue entries kept hot
    memory_consume_queue_bytes: int = 64 << 20    # memoryConsumeQueueBytes: and their bytes
    lease_timeout_ms: int = 30_000                # writer lease expiry without renewal
    deleted_file_retention_ms: int = 60_000       # deletedFileRetentionMs: removed file -> deleted
    log_retention_ms: int = 30 * 24 * 3_600_000   # logRetentionMs: old _log/ versions -> cleaned
    commit_retries: int = DEFAULT_COMMIT_RETRIES  # put-if-absent conflicts before giving up
    store_host: str = "127.0.0.1:10911"           # brokerIP1:listenPort
    broker_name: str = "broker-a"                 # brokerName

    _ALIASES = {
        "mappedFileSizeCommitLog": "segment_size_bytes",
        "flushDiskType": "flush_disk_type",
        "flushIntervalCommitLog": "flush_interval_ms",
        "syncFlushTimeout": "sync_flush_timeout_ms",
        "publishIntervalMs": "publish_interval_ms",
        "publishMinGapMs": "publish_min_gap_ms",
        "checkpointInterval": "checkpoint_interval_versions",
        "fileReservedTime": "file_reserved_time_hours",
        "deleteWhen": "delete_when",
        "diskMaxUsedSpaceRatio": "disk_max_used_space_ratio",
        "diskSpaceCleanForciblyRatio": "disk_space_clean_forcibly_ratio",
        "diskSpaceWarningLevelRatio": "disk_space_warning_level_ratio",
        "maxMessageSize": "max_message_size_bytes",
        "maxUserPropertySize": "max_user_property_size_bytes",
        "userPropertyMaxNum": "user_property_max_num",
        "maxMessageGroupSize": "max_message_group_size_bytes",
        "maxMessageIdSize": "max_message_id_size_bytes",
        "defaultTopicQueueNums": "default_topic_queue_nums",
        "autoCreateTopicEnable": "auto_create_topic",
        "storeHost": "store_host",
        "brokerName": "broker_name",
        "deletedFileRetentionMs": "deleted_file_retention_ms",
        "logRetentionMs": "log_retention_ms",
        "memoryConsumeQueueBytes": "memory_consume_queue_bytes",
    }

    def __post_init__(self):
        if self.flush_disk_type not in (SYNC_FLUSH, ASYNC_FLUSH):
            raise InvalidConfigError(
                f"flushDiskType must be SYNC_FLUSH or ASYNC_FLUSH, got {self.flush_disk_type!r}")
        if self.segment_size_bytes < 4096:
            raise InvalidConfigError(
                f"mappedFileSizeCommitLog must be at least 4096 bytes, got {self.segment_size_bytes}")
        for name in ("flush_interval_ms", "publish_interval_ms", "publish_min_gap_ms",
                     "checkpoint_interval_versions",
                     "max_message_size_bytes", "default_topic_queue_nums", "compact_after_files",
                     "max_user_property_size_bytes", "user_property_max_num",
                     "max_message_group_size_bytes", "max_message_id_size_bytes",
                     "compact_max_rows", "memory_consume_queue_bytes",
                     "commit_retries", "sync_flush_timeout_ms"):
            if getattr(self, name) <= 0:
                raise InvalidConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.deleted_file_retention_ms < 0:
            raise InvalidConfigError(
                f"deletedFileRetentionMs must be 0 or more, got {self.deleted_file_retention_ms}")
        if self.log_retention_ms <= 0:
            raise InvalidConfigError(
                f"logRetentionMs must be positive, got {self.log_retention_ms}")
        ratios = {"diskMaxUsedSpaceRatio": self.disk_max_used_space_ratio,
                  "diskSpaceCleanForciblyRatio": self.disk_space_clean_forcibly_ratio,
                  "diskSpaceWarningLevelRatio": self.disk_space_warning_level_ratio}
        for name, value in ratios.items():
            if not 10 <= value <= 99:
                raise InvalidConfigError(f"{name} must be within 10..99 (percent), got {value}")
        if not (self.disk_max_used_space_ratio <= self.disk_space_clean_forcibly_ratio
                <= self.disk_space_warning_level_ratio):
            raise InvalidConfigError(
                f"disk ratios must rise: diskMaxUsedSpaceRatio <= diskSpaceCleanForciblyRatio <= "
                f"diskSpaceWarningLevelRatio, got {', '.join(f'{k}={v}' for k, v in ratios.items())}")
        self.delete_hours()  # validates

    def delete_hours(self) -> set[int]:
        """The hours of the day (0-23) at which expired segments are removed."""
        try:
            hours = {int(h) for h in str(self.delete_when).split(";") if h.strip()}
        except ValueError:
            raise InvalidConfigError(
                f"deleteWhen must be hours like '04' or '04;16', got {self.delete_when!r}") from None
        if not hours or not all(0 <= h <= 23 for h in hours):
            raise InvalidConfigError(f"deleteWhen hours must be 0..23, got {self.delete_when!r}")
        return hours

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None, **kwargs) -> "StoreConfig":
        """Build a config from RocketMQ names or attribute names (strings are parsed)."""
        merged = dict(options or {})
        merged.update(kwargs)
        fields = {f.name: f for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        values: dict[str, Any] = {}
        for key, raw in merged.items():
            name = cls._ALIASES.get(key, key)
            if name not in fields:
                continue  # other components' properties (listenPort, namesrvAddr, ...)
            values[name] = _coerce(name, fields[name].type, raw)
        return cls(**values)

    def to_properties(self) -> dict[str, Any]:
        """The config as a flat dict of attribute names (stored in metaData)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not f.name.startswith("_")}


def _coerce(name: str, type_name: Any, raw: Any) -> Any:
    """``raw`` as option ``name``'s type: booleans and integers as every config reads
    them (``properties.parse_bool`` / ``parse_int``: one meaning of true and of a number)."""
    t = str(type_name)
    if t == "bool":
        return parse_bool(f"config {name}", raw)
    if t == "int":
        return parse_int(f"config {name}", raw)
    try:
        return float(raw) if t == "float" else str(raw)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"config {name} must be of type {t}, got {raw!r}") from None
