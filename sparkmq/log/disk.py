"""RocketMQ's three disk thresholds, with RocketMQ's meaning (docs/FORMAT.md section 13).

Usage is measured as ``df`` and RocketMQ measure it (:meth:`StoreFS.disk_usage_ratio`):

* over ``diskMaxUsedSpaceRatio`` (75 %) a retention pass runs at once instead of
  waiting for a ``deleteWhen`` hour, but removes only what has expired;
* over ``diskSpaceCleanForciblyRatio`` (85 %) it also removes the oldest segment
  when nothing has expired (the pass logs the consumer groups that lose messages);
* over ``diskSpaceWarningLevelRatio`` (90 %) the store refuses appends
  (``DiskFullError``, raised by the Appender) until usage drops below it again.

Thread-safety: ``note_disk_usage`` runs on the retention thread; the Appender
reads ``store.disk_full_percent`` (one attribute, replaced whole).
"""
from __future__ import annotations

import datetime as _dt
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("sparkmq.retention")


def retention_due(store: "Store", now_ms: int, force_hour: bool) -> tuple[bool, bool]:
    """(a pass acts now, the oldest segment goes even if unexpired): a ``deleteWhen``
    hour, ``force_hour`` or a disk over ``diskMaxUsedSpaceRatio`` make a pass act;
    a disk over ``diskSpaceCleanForciblyRatio`` makes it remove unexpired data."""
    hour = _dt.datetime.fromtimestamp(now_ms / 1000).hour
    pct = _disk_used_percent(store)
    c = store.config
    early = pct is not None and pct > c.disk_max_used_space_ratio
    forcibly = pct is not None and pct > c.disk_space_clean_forcibly_ratio
    return force_hour or early or hour in c.delete_hours(), forcibly


def note_disk_usage(store: "Store") -> None:
    """Refuse appends while the disk is over ``diskSpaceWarningLevelRatio``
    (``store.disk_full_percent`` set: the Appender raises ``DiskFullError``);
    accept them again once it is below. Logged when the state changes."""
    pct = _disk_used_percent(store)
    limit = store.config.disk_space_warning_level_ratio
    full = pct is not None and pct > limit
    if full and store.disk_full_percent is None:
        log.error("store %s: the disk is %.1f%% full, over diskSpaceWarningLevelRatio (%d%%): "
                  "appends are refused until retention or an operator frees space",
                  store.url, pct, limit)
    elif not full and store.disk_full_percent is not None:
        log.warning("store %s: the disk is below diskSpaceWarningLevelRatio (%d%%) again: "
                    "appends are accepted", store.url, limit)
    store.disk_full_percent = pct if full else None


def _disk_used_percent(store: "Store") -> float | None:
    ratio = store.sfs.disk_usage_ratio()
    return None if ratio is None else ratio * 100
