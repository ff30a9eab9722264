"""Message-id epochs: which store tag each batch's message ids carry (FORMAT.md "Message
id").

An id is ``tag | batch offset | row``: the batch's address, so it is looked up with no
index. After a crash took bytes an ASYNC_FLUSH append had already acknowledged, the
next appends are placed at the same offsets, and the lost messages' ids would name new
messages. So a recovery from a crash (and a replica's truncation to a new master) begins
an *id epoch* at the log's end: from that offset on, ids carry a new tag, and an id whose
tag is not its offset's epoch's names nothing. ``metaData.idEpochs`` lists them; below
the first, ids carry the store tag (``crc32(storeId)``).

:class:`IdTags` answers the tag of an offset (one compare in the usual case: the offset
is in the newest epoch); :func:`epoch_actions` is the commit's part that begins one.
Thread-safety: values are immutable; the functions are pure.
"""
from __future__ import annotations

import bisect
import dataclasses
import zlib

import numpy as np

from . import format as fmt
from .actions import Action, IdEpoch, MetaData, protocol_at_least
from .message import store_tag


class IdTags:
    """The tags of a store's id epochs (``metadata``: its metaData action, None for a
    store without one yet)."""

    __slots__ = ("base", "_starts", "_tags", "_known", "last_start", "last")

    def __init__(self, metadata: MetaData | None):
        self.base = store_tag(metadata.store_id if metadata else "")
        epochs = (metadata.id_epochs if metadata else None) or ()
        self._starts = [int(e.start_offset) for e in epochs]
        self._tags = [int(e.tag) for e in epochs]
        self._known = frozenset([self.base, *self._tags])
        self.last_start = self._starts[-1] if epochs else 0
        self.last = self._tags[-1] if epochs else self.base

    def at(self, batch_offset: int) -> int:
        """The tag of the ids of the batch at physical offset ``batch_offset``."""
        if batch_offset >= self.last_start:
            return self.last
        i = bisect.bisect_right(self._starts, batch_offset)
        return self._tags[i - 1] if i else self.base

    def of(self, batch_offsets: np.ndarray) -> int | np.ndarray:
        """The tag of each of ``batch_offsets``: one int where they share it (the usual
        read: a store without epochs, or offsets all in the newest), else one per offset."""
        if not self._starts or not len(batch_offsets) or \
                int(batch_offsets.min()) >= self.last_start:
            return self.last
        i = np.searchsorted(np.asarray(self._starts, np.int64), batch_offsets, side="right")
        return np.asarray([self.base, *self._tags], np.int64)[i]

    def issued_here(self, tag: int) -> bool:
        """Whether ``tag`` is one this store gives ids (in some epoch)."""
        return tag in self._known


def epoch_actions(state, start_offset: int) -> list[Action]:
    """The actions that begin an id epoch at ``start_offset`` (``state``: the store's
    LogState; every batch it holds lies below the offset, every batch appended next at
    or above it): its metaData with the epoch added, and the protocol that the store now
    needs (``format.ID_EPOCHS_*_VERSION``), where it asked for less. The new tag is
    derived from the store id and the epoch's number, unlike every tag before it; epochs
    of equal starts are the newest's (a lookup takes the last one at or below an offset)."""
    meta, start = state.metadata, int(start_offset)
    known = IdTags(meta)
    # a later epoch a truncation cut back (a replica's, to its new master) is left empty,
    # not dropped: its tag stays the store's and is never chosen again. (Each crash
    # begins one, even where the last began at the same offset: the messages a crash
    # took were that epoch's.)
    epochs = tuple(e if e.start_offset <= start else dataclasses.replace(e, start_offset=start)
                   for e in meta.id_epochs or ())
    number = len(epochs) + 1
    while known.issued_here(tag := zlib.crc32(f"{meta.store_id}/{number}".encode())
                            & 0xFFFFFFFF):
        number += 1
    out: list[Action] = [dataclasses.replace(
        meta, id_epochs=epochs + (IdEpoch(start_offset=start, tag=tag),))]
    needed = protocol_at_least(state.protocol, fmt.ID_EPOCHS_READER_VERSION,
                               fmt.ID_EPOCHS_WRITER_VERSION)
    return out if needed is None else [*out, needed]
