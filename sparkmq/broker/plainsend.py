"""The plain RocketMQ SendMessage request without a Python object per message.

A request of messages that are all plain (one topic; NORMAL;
each with its message id, born host and born time; a tag and keys or not; no group,
properties, delivery time or gzip: what sparkmq's Producer sends for
``send_batch(messages)``) is read straight from the client's bytes into Arrow column
buffers by ``sparkmq._wire`` (C), in the request's deserializer (``read_request``), so upb
never parses it: the scanner checks every string it takes to be UTF-8, as upb would, and
declines whatever it does not know (upb then parses those bytes as for any request). It
is held to the rules and stored by the one core a Flight batch goes through
(``batchsend.BatchSender``; its segment batch composed from the buffers as one Arrow C
struct, ``_wire.plain_struct``, with no pyarrow object made of them), and answered, when
every row is stored, with the SendMessageResponse encoded by ``_wire`` too. Anything
else (another kind of request, a refused message, a send the broker may not take now)
is left to the general path, ``SendService.accept`` and ``send_response``, which answers
each message with its own status: the same statuses, the same stored rows
(tests/broker/test_plain_send.py).

Where ``sparkmq._wire`` was not built (no C compiler where sparkmq was installed),
every request takes the general path.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
from rocketmq.grpc_protocol import service_pb2 as spb

from ..errors import SparkMQError
from ..arrowcols import constant_column
from ..log.built import Exported
from ..log.dispatch import measured_offsets
from ..log.status import PutMessageStatus
from .protocol import OK, error_status, send_response

try:
    from .. import _wire
except ImportError:     # not built here: the general path reads every request
    _wire = None

log = logging.getLogger("sparkmq.broker.send")

# A request of fewer messages takes the general path. Since the columns go to the store
# unchecked a second time and without a batch of their own, the column path costs less
# at every size, one message too (in process, CPU of 1,000 requests of 1 KiB messages, best
# of 5, the column path / the general path: 1 message 72 / 102 us, 2: 77 / 120, 4: 83 /
# 132, 8: 90 / 152; /tmp-style script, bench/README.md "2026-11-27 (fourth session)"):
# every request the scanner reads takes it. (16 until then: the column path's fixed cost
# passed the general path's Python per message only there.)
MIN_MESSAGES = 1
_OK_STATUS = OK.SerializeToString()


class PlainRequest:
    """A SendMessageRequest the scanner read from the client's bytes (``read_request``):
    ``scanned``, its columns, and ``data``, the bytes, which upb parses only if the
    general path is to answer it after all (``parsed``)."""

    __slots__ = ("data", "scanned", "_parsed")

    def __init__(self, data: bytes, scanned: tuple):
        self.data, self.scanned, self._parsed = data, scanned, None

    @property
    def topic(self) -> str:
        """The one topic every message names."""
        return self.scanned[0].decode()

    def parsed(self) -> spb.SendMessageRequest:
        """upb's parse of the same bytes (the scanner accepts nothing upb refuses)."""
        if self._parsed is None:
            self._parsed = spb.SendMessageRequest.FromString(self.data)
        return self._parsed


def read_request(parse):
    """SendMessage's request deserializer: a :class:`PlainRequest` for a plain request of
    at least ``MIN_MESSAGES`` messages, else ``parse(data)`` (upb, or ``Malformed``)."""
    def read(data: bytes):
        scanned = None if _wire is None else _wire.scan_plain(data, MIN_MESSAGES)
        return parse(data) if scanned is None else PlainRequest(data, scanned)
    return read


def parsed(request) -> spb.SendMessageRequest:
    """``request`` as upb parsed it (a :class:`PlainRequest`'s bytes parsed now)."""
    return request.parsed() if isinstance(request, PlainRequest) else request


class PlainColumns(Mapping):
    """A plain request's rows as a send batch's columns, name -> array: topic, body,
    unique_key, born_timestamp, born_host; tags and keys where some row has them (an
    empty tag is none, as the proxy reads it). ``n`` rows, their one ``topic``,
    ``body_sizes`` (each body's bytes, from the scanner's offsets) and ``body_extent``
    (their least, greatest and sum, where one C call measured them; else None).

    The columns are the scanner's buffers: :meth:`exported`, one Arrow C struct over
    them, is what a send's segment batch is composed from; pyarrow arrays of them (no
    copy) are made only where one is read (the segment batch built in pyarrow, or the
    answer to a refusal)."""

    __slots__ = ("scanned", "n", "topic", "body_sizes", "body_extent", "names", "_arrays")

    def __init__(self, scanned: tuple):
        self.scanned, self.n, self._arrays = scanned, scanned[1], None
        self.topic = scanned[0].decode()
        self.names = _NAMES[scanned[10] < self.n, scanned[14] < self.n]  # (tag, key nulls)
        self.body_sizes, self.body_extent = measured_offsets(scanned[3], 0, self.n)

    def __getitem__(self, name: str) -> pa.Array:
        if name not in self.names:
            raise KeyError(name)
        if self._arrays is None:
            self._arrays = _arrays(self.scanned, self.names)
        return self._arrays[name]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name) -> bool:
        return name in self.names

    def get(self, name: str, default=None):
        """(Mapping's ``get`` raises and catches a KeyError for a column not given.)"""
        return self[name] if name in self.names else default

    def exported(self) -> Exported:
        """The columns as a record batch exported to the Arrow C data interface
        (``_wire.plain_struct``, holding the scanner's buffers; no pyarrow object)."""
        return Exported(self.names, _SCHEMAS[self.names],
                        _wire.plain_struct(self.scanned, "tags" in self.names,
                                           "keys" in self.names))

    def batch(self) -> pa.RecordBatch:
        """The columns as one pyarrow record batch (no copy)."""
        return pa.RecordBatch.from_arrays([self[name] for name in self.names],
                                          names=list(self.names))


_BORN = pa.timestamp("ms", tz="UTC")
_KEYS = pa.list_(pa.string())
_FIELDS = {"topic": pa.string(), "body": pa.binary(), "unique_key": pa.string(),
           "born_timestamp": _BORN, "born_host": pa.string(), "tags": pa.string(),
           "keys": _KEYS}
# the columns of a plain request, by (some row has a tag, some row has keys), and their
# schema exported once each (``composed_rows`` reads it, never moves it)
_NAMES = {(tags, keys): ("topic", "body", "unique_key", "born_timestamp", "born_host")
          + ("tags",) * tags + ("keys",) * keys for tags in (False, True)
          for keys in (False, True)}
_SCHEMAS = {names: pa.schema([(name, _FIELDS[name]) for name in names]).__arrow_c_schema__()
            for names in _NAMES.values()}


def plain_columns(request) -> PlainColumns | None:
    """``request``'s columns if it is plain, else None. A parsed SendMessageRequest (a
    caller in process) is serialized for the scanner."""
    if isinstance(request, PlainRequest):
        return PlainColumns(request.scanned)
    if _wire is None or len(request.messages) < MIN_MESSAGES:
        return None
    scanned = _wire.scan_plain(request.SerializeToString())
    return None if scanned is None else PlainColumns(scanned)


def _arrays(scanned: tuple, names: tuple) -> dict[str, pa.Array]:
    """``_wire.scan_plain``'s buffers as pyarrow arrays (no copy): the columns ``names``."""
    (topic, n, bodies, body_offsets, ids, id_offsets, hosts, host_offsets, borns,
     tag_bits, tag_nulls, tag_offsets, tags, key_bits, key_nulls, key_lists, key_offsets,
     keys) = scanned

    def column(kind, offsets: bytes, data: bytes, rows: int = n, valid=None, nulls=0):
        return pa.Array.from_buffers(kind, rows, [pa.py_buffer(valid) if nulls else None,
                                                  pa.py_buffer(offsets), pa.py_buffer(data)],
                                     null_count=nulls)
    cols = {"topic": constant_column(topic.decode(), pa.string(), n),
            "body": column(pa.binary(), body_offsets, bodies),
            "unique_key": column(pa.string(), id_offsets, ids),
            "born_timestamp": pa.Array.from_buffers(_BORN, n, [None, pa.py_buffer(borns)]),
            "born_host": column(pa.string(), host_offsets, hosts)}
    if "tags" in names:
        cols["tags"] = column(pa.string(), tag_offsets, tags, valid=tag_bits, nulls=tag_nulls)
    if "keys" in names:
        values = column(pa.string(), key_offsets, keys, rows=len(key_offsets) // 4 - 1)
        cols["keys"] = pa.Array.from_buffers(
            _KEYS, n, [pa.py_buffer(key_bits) if key_nulls else None, pa.py_buffer(key_lists)],
            null_count=key_nulls, children=[values])
    return cols


def send_plain(broker, request, context) -> "bytes | spb.SendMessageResponse | None":
    """The answer to ``request`` if it is plain and may be stored as it is: the encoded
    SendMessageResponse (or, when the store answers other than PUT_OK, the general
    path's ``send_response``); None for the general path, with nothing stored."""
    plain = plain_columns(request)
    if plain is None:
        return None
    topic = plain.topic
    core = broker.batch_sender
    try:
        rows = core.check_columns(plain, plain.n, [topic], body_sizes=plain.body_sizes,
                                  body_extent=plain.body_extent, source=plain.exported())
    # a refusal before anything is stored: the general path answers each message
    # with its own status, as it would have without this path (and anything
    # unexpected here is logged, and left to the general path too)
    except Exception as e:
        if not isinstance(e, SparkMQError):
            log.error("a plain send's checks failed unexpectedly", exc_info=e)
        return None
    notifier = broker.notifier
    n, arrived = plain.n, set()
    try:
        with notifier.deferred() as arrived:
            stored = core.store(rows, [topic])
    # the append failed as a whole (nothing stored: the store's promise): every
    # message gets its status, as the general path answers a failed append
    except Exception as e:
        if not isinstance(e, SparkMQError):
            log.error("a plain send failed unexpectedly", exc_info=e)
        return send_response([error_status(e)] * n)
    finally:
        notifier.wake_after_reply(arrived, context)   # (as grpc_service._store_rows)
    if stored.status is PutMessageStatus.PUT_OK:         # (the ids: the scanner's buffers)
        return _wire.encode_ok(_OK_STATUS, plain.scanned[4], plain.scanned[5],
                               np.ascontiguousarray(stored.queue_offsets, np.int64).tobytes())
    return send_response([(stored.status, i, qo, None) for i, qo in
                          zip(plain["unique_key"].to_pylist(), stored.queue_offsets.tolist())])
