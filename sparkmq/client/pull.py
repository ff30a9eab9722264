"""PullConsumer: read queues by offset, over Arrow Flight or RocketMQ's PullMessage
(consumer.py has the pop-mode consumers).

Thread-safe; every RPC has a deadline; ``credentials=`` and ``tls=`` as the other
clients take them.
"""
from __future__ import annotations

import threading
from typing import Mapping

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb

from ..errors import UserError
from ..tagexpr import tag_set
from .core import (DEFAULT_REQUEST_TIMEOUT_S, BrokerUnavailableError, ClientError, Code,
                   Connections, Queue, ReceivedMessage, RouteCache, check, duration,
                   parse_endpoints)
from .flight import TRANSPORTS, Followed, FlightTransport, _FlightDown, received_messages


class PullConsumer:
    """Read queues by offset; the caller keeps or commits offsets (kept at the broker
    per group). Thread-safe.

    Transport (``transport=``, as the Producer's, client/flight.py): ``pull`` is a Flight
    DoGet and ``commit_offset(s)`` a DoAction ``commitOffset`` where the broker serves
    Flight (the same messages, fields and offsets as RocketMQ's PullMessage and
    UpdateOffset give), else gRPC; ``query_offset`` and ``committed_offset`` are always
    gRPC (QueryOffset, GetOffset). ``pulled_over`` counts messages per transport."""

    def __init__(self, endpoints, group: str, *,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 transport: str = "auto", credentials: tuple[str, str] | None = None,
                 flight_down_s: float = 30.0, tls=None):
        if transport not in TRANSPORTS:
            raise UserError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.endpoints = parse_endpoints(endpoints)
        self.group = group
        self.transport = transport
        self.conns = Connections(request_timeout_s, credentials=credentials, tls=tls)
        self.routes = RouteCache(self.conns, self.endpoints)
        self.flight = FlightTransport(self.conns.signed_headers,
                                      request_timeout_s=request_timeout_s,
                                      down_s=flight_down_s, tls=self.conns.tls)
        self.pulled_over = {"flight": 0, "grpc": 0}
        self._lock = threading.Lock()

    def _flight_endpoint(self, queue: Queue) -> str | None:
        """The Flight endpoint to use for ``queue``'s broker now, or None for gRPC."""
        if self.transport == "grpc":
            return None
        fep = self.routes.flight_endpoint(queue.endpoint, queue.topic)
        if self.transport == "flight":
            if fep is None:
                raise ClientError(f"{queue.broker_name} ({queue.endpoint}) serves no Arrow "
                                  "Flight (transport='flight')", Code.UNSUPPORTED)
            return fep
        return fep if self.flight.usable(fep) else None

    def _flight_failed(self, fep: str, e: _FlightDown) -> None:
        if self.transport == "flight":
            raise BrokerUnavailableError(str(e)) from None
        self.flight.mark_down(fep, e)

    def _count(self, transport: str, n: int) -> None:
        with self._lock:
            self.pulled_over[transport] += n

    def queues(self, topic: str) -> list[Queue]:
        """The readable queues of ``topic`` across broker groups: the master's, or
        the lowest-id replica's for a group whose master the route no longer lists."""
        queues = [q for q in self.routes.queues(topic) if q.readable]
        best: dict[str, int] = {}
        for q in queues:
            best[q.broker_name] = min(best.get(q.broker_name, q.broker_id), q.broker_id)
        return [q for q in queues if q.broker_id == best[q.broker_name]]

    def pull(self, queue: Queue, offset: int, max_messages: int = 32, wait_s: float = 0.0,
             tag_expression: str = "*") -> tuple[list[ReceivedMessage], int]:
        """Messages of ``queue`` from ``offset`` (waits up to ``wait_s`` for the first);
        returns (messages, next offset to pull from). An offset past the queue's end on
        its master returns no messages at once and the end as the next offset (as a
        RocketMQ pull consumer corrects an OFFSET_ILLEGAL pull)."""
        fep = self._flight_endpoint(queue)
        if fep is not None:
            tags = tag_set(tag_expression)
            ticket = {"topic": queue.topic, "queue": queue.queue_id, "offset": offset,
                      "max": max_messages, "pollMs": int(wait_s * 1000), "view": "consumer",
                      "group": self.group}
            what = f"pull {queue.topic}/{queue.queue_id} at {fep}"
            try:
                table = self.flight.get(fep, ticket, wait_s + self.conns.request_timeout_s,
                                        what)
            except _FlightDown as e:
                self._flight_failed(fep, e)
            except ClientError as e:
                if "SPARKMQ_DATA_LOSS" not in str(e):
                    raise       # (offsets removed by retention: PullMessage starts at the first)
            else:
                self._count("flight", table.num_rows)
                meta = table.schema.metadata or {}
                if meta.get(b"status") == b"ILLEGAL_OFFSET":   # past the end: read from there
                    return [], int(meta[b"next"])
                nxt = table.column("queue_offset")[-1].as_py() + 1 if table.num_rows else offset
                return received_messages(table, queue.endpoint, tags), nxt
        req = spb.PullMessageRequest(
            group=pb.Resource(name=self.group), message_queue=queue.to_pb(), offset=offset,
            batch_size=max_messages,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression=tag_expression),
            long_polling_timeout=duration(wait_s))
        out, nxt = [], offset
        try:
            for r in self.conns.stub(queue.endpoint).PullMessage(
                    req, timeout=wait_s + self.conns.request_timeout_s,
                    metadata=self.conns.metadata):
                kind = r.WhichOneof("content")
                if kind == "message":
                    out.append(ReceivedMessage.from_pb(r.message, queue.endpoint))
                elif kind == "next_offset":
                    nxt = r.next_offset
                elif kind == "status" and r.status.code not in (
                        Code.OK, Code.MESSAGE_NOT_FOUND, Code.ILLEGAL_OFFSET):  # (next_offset)
                    check(r.status, f"PullMessage {queue.topic}/{queue.queue_id}")
        except grpc.RpcError as e:
            raise BrokerUnavailableError(f"PullMessage at {queue.endpoint}: {e.code()} "
                                         f"{e.details()}") from None
        self._count("grpc", len(out))
        return out, nxt

    def follow(self, positions: Mapping[Queue, int], max_messages: int = 1000,
               tag_expression: str = "*") -> Followed:
        """Read queues of ONE topic on ONE broker from their offsets (``{queue:
        offset}``) as messages arrive, over one Arrow Flight stream (a followed DoGet,
        docs/PROTOCOL.md): no call per pull. Iterate for ``(queue, messages, next
        offset)`` (the broker filters by ``tag_expression``: ``messages`` may be empty
        while the next offset moves on); ``close()`` (any thread) ends it. Flight only."""
        queues = list(positions)
        if not queues or len({(q.topic, q.endpoint) for q in queues}) != 1:
            raise UserError("follow takes the queues of one topic on one broker (one "
                            f"follow per broker); got {queues}")
        first = queues[0]
        fep = None if self.transport == "grpc" else \
            self.routes.flight_endpoint(first.endpoint, first.topic)
        if fep is None:
            raise ClientError(f"follow needs Arrow Flight; {first.broker_name} "
                              f"({first.endpoint}) serves none here", Code.UNSUPPORTED)
        ticket = {"topic": first.topic, "max": max_messages, "view": "consumer",
                  "group": self.group, "tags": tag_expression,
                  "follow": [[q.queue_id, int(o)] for q, o in positions.items()]}
        return self.flight.follow(fep, ticket, f"follow {first.topic} at {fep}",
                                  queues={q.queue_id: q for q in queues},
                                  tags=tag_set(tag_expression), endpoint=first.endpoint,
                                  count=lambda n: self._count("flight", n))

    def query_offset(self, queue: Queue, policy: str = "BEGINNING",
                     timestamp_ms: int | None = None) -> int:
        """Offset at BEGINNING, END, or (policy TIMESTAMP) the first stored at/after timestamp_ms."""
        req = spb.QueryOffsetRequest(message_queue=queue.to_pb(),
                                     query_offset_policy=pb.QueryOffsetPolicy.Value(policy))
        if timestamp_ms is not None:
            req.timestamp.FromMilliseconds(timestamp_ms)
        r = self.conns.call(queue.endpoint, "QueryOffset", req)
        check(r.status, f"QueryOffset {queue.topic}/{queue.queue_id}")
        return r.offset

    def committed_offset(self, queue: Queue) -> int:
        r = self.conns.call(queue.endpoint, "GetOffset", spb.GetOffsetRequest(
            group=pb.Resource(name=self.group), message_queue=queue.to_pb()))
        check(r.status, f"GetOffset {queue.topic}/{queue.queue_id}")
        return r.offset

    def commit_offset(self, queue: Queue, offset: int) -> None:
        """Record ``offset`` as the group's next offset of ``queue``."""
        self.commit_offsets({queue: offset})

    def commit_offsets(self, offsets: Mapping[Queue, int]) -> None:
        """Record each queue's next offset (``{queue: offset}``): over Flight one
        ``commitOffset`` for the queues of a topic on one broker (one store commit; all
        of them or, refused, none), over gRPC an UpdateOffset a queue."""
        parts: dict[tuple, dict[Queue, int]] = {}
        for queue, offset in offsets.items():
            parts.setdefault((self._flight_endpoint(queue), queue.topic), {})[queue] = offset
        for (fep, topic), part in parts.items():
            if fep is not None:
                pairs = [[q.queue_id, o] for q, o in part.items()]
                # (one queue: the form every broker serving Flight takes)
                body = {"queue": pairs[0][0], "offset": pairs[0][1]} if len(pairs) == 1 \
                    else {"offsets": pairs}
                try:
                    self.flight.action(fep, "commitOffset",
                                       {"group": self.group, "topic": topic, **body},
                                       f"commit {topic}/{[q for q, _ in pairs]} at {fep}")
                    continue
                except _FlightDown as e:
                    self._flight_failed(fep, e)
            for queue, offset in part.items():
                r = self.conns.call(queue.endpoint, "UpdateOffset", spb.UpdateOffsetRequest(
                    group=pb.Resource(name=self.group), message_queue=queue.to_pb(),
                    offset=offset))
                check(r.status, f"UpdateOffset {queue.topic}/{queue.queue_id}")

    def close(self) -> None:
        self.flight.close()
        self.conns.close()
