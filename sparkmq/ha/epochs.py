"""The epoch history of a store's CommitLog (RocketMQ's EpochFile).

``<store>/ha-epochs.json`` is a JSON list of entries ``{"epoch", "storeId",
"startOffset"}``: from ``startOffset`` on, the CommitLog bytes were written by
the master whose store is ``storeId`` while it held writer-lease ``epoch``. A
master appends an entry when it starts serving with a new epoch; a replica
copies its master's list; a promoted replica appends its own. Two stores agree
on every byte below the *consistent point* that :func:`consistent_end` computes
from their histories; an old master rejoining as a replica must drop
everything past it.

The file is small and rewritten whole (``StoreFS.replace``: atomic). It is not
part of the table format: Spark readers never read it.
"""
from __future__ import annotations

import json

from ..log import format as fmt
from ..log.fs import StoreFS

INFINITY = 1 << 62


def load(sfs: StoreFS) -> list[dict]:
    """The entries, oldest first ([] when there is no file or it is unreadable)."""
    rel = fmt.ha_epochs_file()
    if not sfs.exists(rel):
        return []
    try:
        data = json.loads(sfs.read_bytes(rel))
        return [{"epoch": int(e["epoch"]), "storeId": str(e["storeId"]),
                 "startOffset": int(e["startOffset"])} for e in data]
    except (ValueError, KeyError, TypeError, OverflowError):    # Infinity: OverflowError
        return []


def save(sfs: StoreFS, entries: list[dict]) -> None:
    sfs.replace(fmt.ha_epochs_file(), json.dumps(entries).encode())


def append(sfs: StoreFS, epoch: int, store_id: str, start_offset: int) -> list[dict]:
    """Add an entry unless the newest one already is (epoch, store_id); returns the list."""
    entries = load(sfs)
    if entries and (entries[-1]["epoch"], entries[-1]["storeId"]) == (epoch, store_id):
        return entries
    entries.append({"epoch": int(epoch), "storeId": store_id, "startOffset": int(start_offset)})
    save(sfs, entries)
    return entries


def consistent_end(master: list[dict], replica: list[dict], replica_end: int) -> int:
    """The physical offset below which the replica's bytes equal the master's.

    Walks the replica's history from its newest entry to the first one the
    master also has; the agreement ends where either history moves on to a
    different writer: at the lowest start offset of the entries after it, which
    need not be the next one's. A list is in epoch order, not offset order: a
    replica copies its master's whole list, so one promoted before it caught up
    with the newest entry appends an entry starting below it. No common entry:
    nothing is known to agree (0), unless the replica is empty.
    ``replica`` comes off the wire: a malformed one raises KeyError, TypeError
    or ValueError.
    """
    if replica_end == 0:
        return 0
    index = {(e["epoch"], e["storeId"]): i for i, e in enumerate(master)}
    for j in range(len(replica) - 1, -1, -1):
        i = index.get((replica[j]["epoch"], replica[j]["storeId"]))
        if i is None:
            continue
        m_end = min([e["startOffset"] for e in master[i + 1:]], default=INFINITY)
        r_end = min([_start_offset(e) for e in replica[j + 1:]], default=replica_end)
        return min(m_end, r_end, replica_end)
    return 0


def _start_offset(entry: dict) -> int:
    """A peer's entry's start offset: a non-negative int, else ValueError."""
    start = entry["startOffset"]
    if type(start) is not int or start < 0:
        raise ValueError(f"epoch entry with a bad startOffset: {start!r}")
    return start
