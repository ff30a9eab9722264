"""The gRPC front-end: ``apache.rocketmq.v2.MessagingService`` over a :class:`Broker`.

Each method converts its protobuf request into calls on the broker's domains
(``send.SendService``, ``receive.ReceiveService``, the transaction and schedule
services, the HA role) and their outcomes into the protocol's responses and
status codes (RocketMQ 5 proxy semantics; the conversions live in
``protocol.py``): expected outcomes are status values, never gRPC errors;
request bytes that do not decode (malformed or truncated) get BAD_REQUEST, once the
credential is checked (``_authorized``: without one, UNAUTHORIZED whatever the body); an
unexpected exception becomes ``INTERNAL_ERROR`` with its text, and the broker
keeps serving.

Mapping of notable outcomes: unknown topic -> TOPIC_NOT_FOUND; illegal topic or
group name -> ILLEGAL_TOPIC / ILLEGAL_CONSUMER_GROUP; empty body ->
MESSAGE_BODY_EMPTY; body over maxMessageSize -> MESSAGE_BODY_TOO_LARGE; a
delivery time beyond the delay policy -> ILLEGAL_DELIVERY_TIME; transactional
messages, EndTransaction and RecallMessage on a replica -> UNSUPPORTED; SQL92
filters while ``enablePropertyFilter`` is off -> UNSUPPORTED (malformed ones ->
ILLEGAL_FILTER_EXPRESSION); gzip bodies and lite topics -> UNSUPPORTED; an
unknown transaction id -> INVALID_TRANSACTION_ID; stale or malformed receipt
handle -> INVALID_RECEIPT_HANDLE; a send to a replica or a fenced master ->
FORBIDDEN; fsync over syncFlushTimeout -> MASTER_PERSISTENCE_TIMEOUT (no
replica ack in SYNC_MASTER -> SLAVE_PERSISTENCE_TIMEOUT / HA_NOT_AVAILABLE);
nothing to receive after the long poll -> MESSAGE_NOT_FOUND; a pull past a queue's end ->
ILLEGAL_OFFSET, next_offset the end; a Heartbeat's unknown client type ->
UNRECOGNIZED_CLIENT_TYPE.

Broadcasting: the protocol has no field for it; the request metadata
``x-sparkmq-consume-mode: BROADCASTING`` on ReceiveMessage, AckMessage,
ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue, GetOffset and UpdateOffset
gives that consumer instance every message, with offsets of its own (per client
id). Without it (the official clients) consumption is clustering.

Threading (grpc_server.py): ReceiveMessage, PullMessage and Telemetry are coroutines on
the server's event loop (a long poll is suspended, holding no thread); SendMessage runs
on the loop too, awaiting its fsync (SYNC_FLUSH) and its replica's ack (SYNC_MASTER) as
futures where it waits for them (``replicawait``; in controller mode too); every other
method runs on a worker thread.
"""
from __future__ import annotations

import functools
import logging
import time

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

from ..errors import InvalidReceiptHandleError, SparkMQError, UserError
from ..log.names import validate_group, validate_topic
from ..log.topics import topic_message_type
from .authz import peer_ip, rpc_resources
from .filter import SqlFilter
from .pop import GroupKey, InvalidHandle, TagFilter
from .protocol import (OK, ClientIdRequired, Code, error_status, message_queue,
                       message_to_pb, ms_of_duration, ms_of_timestamp, send_response, status,
                       timestamp)
from .schedule import SCHEDULE_TOPIC, RecallStatus, make_recall_handle, parse_recall_handle
from .send import SendRows
from .receive import PullStatus, run_here
from .replicawait import finish, held, loop_waits
from .telemetry import CONSUMER_TYPES, TelemetryMixin, client_id, unrecognized_type
from .transaction import UnknownTransaction
from .grpc_server import Malformed, lenient
from .plainsend import parsed, read_request, send_plain

log = logging.getLogger("sparkmq.broker.grpc")

MAX_BATCH_SIZE = 1024
FLIGHT_ENDPOINT_HEADER = "x-sparkmq-flight-endpoint"   # on QueryRoute: this broker's Flight
MAX_INVISIBLE_MS = 12 * 3600 * 1000


_SERVICE = spb.DESCRIPTOR.services_by_name["MessagingService"]


def add_to_server(servicer: "MessagingServicer", server) -> None:
    """Register ``servicer`` for every method of ``apache.rocketmq.v2.MessagingService``,
    with request parsing that turns undecodable bytes into :class:`Malformed` (so the
    client gets the protocol's BAD_REQUEST status rather than a transport error)."""
    makers = {(False, False): grpc.unary_unary_rpc_method_handler,
              (False, True): grpc.unary_stream_rpc_method_handler,
              (True, False): grpc.stream_unary_rpc_method_handler,
              (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for m in _SERVICE.methods:
        make = makers[(m.client_streaming, m.server_streaming)]
        handlers[m.name] = make(getattr(servicer, m.name),
                                request_deserializer=request_reader(m.name),
                                response_serializer=_serializer(m.output_type.name))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE.full_name, handlers),))


def request_reader(method: str):
    """``method``'s request deserializer: upb, lenient (``Malformed`` for bytes that do
    not decode); SendMessage's reads a plain request without upb (``plainsend``)."""
    parse = lenient(getattr(spb, _SERVICE.methods_by_name[method].input_type.name))
    return read_request(parse) if method == "SendMessage" else parse


def _serializer(name: str):
    """A response's serializer; SendMessage's passes bytes through (``plainsend``
    answers a plain request already encoded)."""
    serialize = getattr(spb, name).SerializeToString
    if name != "SendMessageResponse":
        return serialize
    return lambda r: r if isinstance(r, bytes) else serialize(r)


def _bad_request(request: Malformed) -> pb.Status:
    return status(Code.BAD_REQUEST, request.error)


def _failure_status(servicer: "MessagingServicer", method: str, e: Exception) -> pb.Status:
    """The status answering exception ``e`` of ``method``; an unexpected one
    (INTERNAL_ERROR) is logged with its traceback and counted."""
    st = error_status(e)
    if st.code == Code.INTERNAL_ERROR:
        log.exception("%s failed", method)
        servicer.broker.metrics.inc("sparkmq_rpc_errors_total", method=method)
    return st


def _authorized(broker, method: str, request, context) -> pb.Status | None:
    """None when an RPC may go on: authentication first, before the request is looked at
    (AuthenticationError), then BAD_REQUEST (returned) for bytes that do not decode, then
    authorization of what ``request`` touches (AuthorizationError): one implementation
    for every handler (authn.py, authz.py). The headers are read only where authentication
    is on: grpc.aio builds them anew for each ``invocation_metadata()``, ~8 us a call."""
    authn = broker.authenticator
    user = authn.check(context.invocation_metadata()) if authn.enabled else None
    if isinstance(request, Malformed):
        return _bad_request(request)
    if broker.authorizer.enabled:
        broker.authorizer.check(user, rpc_resources(method, request), peer_ip(context.peer()))
    return None


def guarded(response_type, method: str | None = None):
    """Turn an exception of a unary handler into ``response_type(status=...)``;
    ``method``: the RPC's name when the function has another."""
    def wrap(fn):
        name = method or fn.__name__

        @functools.wraps(fn)
        def inner(self, request, context):
            try:
                refused = _authorized(self.broker, name, request, context)
                return response_type(status=refused) if refused is not None \
                    else fn(self, request, context)
            # a daemon never dies of one bad request: anything unexpected becomes
            # INTERNAL_ERROR with its text (see _failure_status)
            except Exception as e:
                return response_type(status=_failure_status(self, name, e))
        return inner
    return wrap


def guarded_async_stream(response_type):
    """``guarded`` for a server-streaming coroutine handler (an async generator: long
    polls, suspended on the broker's event loop, grpc_server.py): an exception ends the
    stream with one ``response_type(status=...)``. A cancelled call (the client went
    away) is not caught: its task ends."""
    def wrap(fn):
        @functools.wraps(fn)
        async def inner(self, request, context):
            try:
                refused = _authorized(self.broker, fn.__name__, request, context)
                if refused is not None:
                    yield response_type(status=refused)
                    return
                async for response in fn(self, request, context):
                    yield response
            except Exception as e:  # as in guarded: the broker keeps serving
                yield response_type(status=_failure_status(self, fn.__name__, e))
        return inner
    return wrap


class MessagingServicer(TelemetryMixin, sgrpc.MessagingServiceServicer):
    """See the module docstring. ``broker`` is a :class:`sparkmq.broker.Broker`;
    ``offload(fn, *args)`` runs blocking work of a coroutine handler on the server's
    workers (set by the broker to ``GrpcServer.offload``)."""

    def __init__(self, broker):
        self.broker = broker
        self.offload = run_here          # until a server gives its worker pool

    # ------------------------------------------------------------ route
    @guarded(spb.QueryRouteResponse)
    def QueryRoute(self, request, context):
        topic = validate_topic(request.topic.name)
        queues = self.broker.route(topic)
        if not queues:
            return spb.QueryRouteResponse(status=status(
                Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist on any broker of the "
                "cluster; create it first (autoCreateTopicEnable is off)"))
        ns = request.topic.resource_namespace
        mtype = topic_message_type(self.broker.topic_conf(topic))
        if self.broker.flight is not None:   # sparkmq's clients send over Flight (flight.py)
            context.send_initial_metadata(((FLIGHT_ENDPOINT_HEADER, self.broker.flight.endpoint),))
        return spb.QueryRouteResponse(status=OK, message_queues=[
            message_queue(topic, q, ns, mtype) for q in queues])

    @guarded(spb.QueryAssignmentResponse)
    def QueryAssignment(self, request, context):
        topic = validate_topic(request.topic.name)
        validate_group(request.group.name)
        queues = self.broker.route(topic)
        if not queues:
            return spb.QueryAssignmentResponse(status=status(
                Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist"))
        ns = request.topic.resource_namespace
        seen, out = set(), []
        for q in queues:   # pop mode: one assignment per broker; the broker balances inside
            if q["brokerName"] in seen or q.get("brokerId", 0) != 0:
                continue
            seen.add(q["brokerName"])
            out.append(pb.Assignment(message_queue=message_queue(topic, {**q, "queueId": -1}, ns)))
        return spb.QueryAssignmentResponse(status=OK, assignments=out)

    # ------------------------------------------------------------ clients
    @guarded(spb.HeartbeatResponse)
    def Heartbeat(self, request, context):
        """As the proxy's ClientActivity: a known client type (else UNRECOGNIZED_CLIENT_TYPE);
        a consumer names its group (the rule's code if not); a producer's is not read."""
        kind = request.client_type
        refused = unrecognized_type(kind)
        if refused is not None:
            return spb.HeartbeatResponse(status=refused)
        group = validate_group(request.group.name) if kind in CONSUMER_TYPES else None
        self.broker.clients.heartbeat(client_id(context), group, kind)
        return spb.HeartbeatResponse(status=OK)

    @guarded(spb.NotifyClientTerminationResponse)
    def NotifyClientTermination(self, request, context):
        cid, group = client_id(context), request.group.name or None
        self.broker.clients.remove(cid, group)
        if group is not None:       # its held messages go to others (renew.py)
            self.broker.renewer.forget_client(cid, group)
        return spb.NotifyClientTerminationResponse(status=OK)

    # ------------------------------------------------------------ send
    async def SendMessage(self, request, context):
        """On the event loop when the send never waits (ASYNC_FLUSH, no replica to wait
        for): the hop to a worker and back costs more than the append (measured: sync
        send p50 1.46 -> 1.08 ms). When it waits for its fsync or its replica: appended
        on the loop too, and those awaited as futures (``replicawait``), in controller
        mode too."""
        sender = self.broker.sender
        if sender.never_waits():
            return self.send_encoded(request, context)
        flush = loop_waits(sender)
        if flush is None:
            return await self.offload(self.send_encoded, request, context)
        with held(flush) as state:
            answer = self.send_encoded(request, context)
        return await finish(self.broker, answer, state, context)

    def send_message(self, request, context) -> spb.SendMessageResponse:
        """``send_encoded``'s answer as a SendMessageResponse (for callers in process)."""
        answer = self.send_encoded(request, context)
        return spb.SendMessageResponse.FromString(answer) if isinstance(answer, bytes) \
            else answer

    @guarded(spb.SendMessageResponse, "SendMessage")
    def send_encoded(self, request, context):
        """Validate each message (a refused one refuses the request, as the proxy:
        ``SendService.accept``), then store them as ONE record batch (one fsync under
        SYNC_FLUSH). A plain request is read into columns and answered as bytes
        (``plainsend``); ``request`` is upb's or a ``PlainRequest``."""
        answer = send_plain(self.broker, request, context)
        if answer is not None:
            return answer
        request = parsed(request)
        if not request.messages:
            return spb.SendMessageResponse(status=status(Code.BAD_REQUEST, "no messages to send"))
        sender = self.broker.sender
        # one pass over upb's container (each ends in an IndexError it formats)
        messages = list(request.messages)
        rows = sender.plain_rows(messages)
        if rows is None:
            rows = sender.accept(messages, lambda: client_id(context))
            if isinstance(rows, pb.Status):
                return spb.SendMessageResponse(status=rows)
        return self._store_rows(request, rows, context)

    def _store_rows(self, request, rows: SendRows, context):
        """Store ``rows``, every message of ``request``, and answer."""
        notifier = self.broker.notifier
        with notifier.deferred() as arrived:
            stored = self.broker.sender.send_rows(rows)
        # Long polls are woken as this handler ends, not in the middle of it: a woken
        # receive would take the GIL from this reply and add its whole pop to the send
        # latency (measured on grpc's threaded server, whose callback ran once the reply
        # was sent: sync send with a waiting consumer 3.3 -> 2.1 ms p50). On grpc.aio's
        # loop the woken polls run once the reply's batch is started (longpoll.py).
        notifier.wake_after_reply(arrived, context)
        results = [error_status(r) if isinstance(r, Exception) else r for r in stored]
        if not rows.parked:       # only delayed (parked) rows get recall handles
            return send_response(results)
        recalls = {}          # request entry -> recall handle of a delayed message
        topics_col = rows.columns()["topic"]
        queues_col = rows.columns()["queue_id"]
        for k, (i, r) in enumerate(zip(rows.index, stored)):
            if topics_col[k] == SCHEDULE_TOPIC and not isinstance(r, Exception):
                recalls[i] = self.broker.handles.sign(make_recall_handle(
                    request.messages[i].topic.name, self.broker.config.broker_name,
                    queues_col[k], r[2], r[1]))
        out = send_response(results)
        for i, handle in recalls.items():
            out.entries[i].recall_handle = handle
        return out

    # ------------------------------------------------------------ receive
    @guarded_async_stream(spb.ReceiveMessageResponse)
    def ReceiveMessage(self, request, context):
        return self._receive(request, context)

    def _filter(self, fe: pb.FilterExpression) -> "TagFilter | SqlFilter":
        """The filter a ReceiveMessage/PullMessage asks for; _FilterRefused (with the status
        to answer) if it is malformed or SQL92 while enablePropertyFilter is off."""
        try:
            if fe.type == pb.SQL:
                if not self.broker.config.enable_property_filter:
                    raise _FilterRefused(status(
                        Code.UNSUPPORTED, "SQL92 filters are disabled on this broker; set "
                        "enablePropertyFilter=true in its configuration"))
                return SqlFilter(fe.expression)
            return TagFilter(fe.expression)
        except ValueError as e:          # FilterExpressionError is a ValueError
            raise _FilterRefused(status(Code.ILLEGAL_FILTER_EXPRESSION, str(e))) from None

    def _subscription_refusal(self, sub: pb.Subscription) -> pb.Status | None:
        """The status refusing a client's subscriptions (checked at subscribe time)."""
        for entry in sub.subscriptions:
            try:
                self._filter(entry.expression)
            except _FilterRefused as e:
                return status(e.status.code, f"subscription to {entry.topic.name!r}: "
                                             f"{e.status.message}")
        return None

    async def _receive(self, request, context):
        group = validate_group(request.group.name)
        topic = validate_topic(request.message_queue.topic.name)
        try:
            tag_filter = self._filter(request.filter_expression)
        except _FilterRefused as e:
            yield spb.ReceiveMessageResponse(status=e.status)
            return
        batch = request.batch_size
        if not 0 < batch <= MAX_BATCH_SIZE:
            yield spb.ReceiveMessageResponse(status=status(
                Code.BAD_REQUEST, f"batch_size must be 1..{MAX_BATCH_SIZE}, got {batch}"))
            return
        # auto_renew (the PushConsumers'): the proxy's default invisible time, then renewed
        # while the consumer works (renew.py); the request's own duration is not read
        renewed = request.auto_renew and self.broker.config.auto_renew
        invisible_ms = (ms_of_duration(request.invisible_duration)
                        if request.HasField("invisible_duration") and not renewed
                        else self.broker.config.default_invisible_ms)
        if not 0 < invisible_ms <= MAX_INVISIBLE_MS:
            yield spb.ReceiveMessageResponse(status=status(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration must be 1 ms..12 h, got {invisible_ms} ms"))
            return
        poll_ms = self._poll_ms(request, context)
        consumer = _consumer(context, group)
        deliveries = await self.broker.receiver.receive_async(
            consumer, topic, batch_size=batch, invisible_ms=invisible_ms,
            tag_filter=tag_filter, poll_ms=poll_ms, offload=self.offload,
            attempt_id=request.attempt_id if request.HasField("attempt_id") else None)
        if not deliveries:
            yield spb.ReceiveMessageResponse(status=status(
                Code.MESSAGE_NOT_FOUND, "no new message within the long-polling time"))
            return
        if renewed:
            cid = client_id(context)
            self.broker.clients.heartbeat(cid, group, pb.PUSH_CONSUMER)   # (a receive is alive)
            self.broker.renewer.hold(cid, consumer, topic, deliveries)
        sent = 0
        try:
            yield spb.ReceiveMessageResponse(delivery_timestamp=timestamp(int(time.time() * 1000)))
            for d in deliveries:
                yield spb.ReceiveMessageResponse(message=message_to_pb(d.message, d))
                sent += 1
            yield spb.ReceiveMessageResponse(status=OK)
        except BaseException:  # cancelled mid-answer (the client went away): what it did
            # not get is visible again in 1 s, as the proxy nacks it; then re-raised
            self.broker.receiver.give_back(consumer, [
                self._released(context, consumer, d.receipt_handle) for d in deliveries[sent:]],
                topic)
            raise

    def _poll_ms(self, request, context) -> int:
        poll = (ms_of_duration(request.long_polling_timeout)
                if request.HasField("long_polling_timeout") else 0)
        poll = min(poll, self.broker.config.max_long_polling_ms)
        left = context.time_remaining()
        if left is not None:   # answer before the client's own deadline
            poll = min(poll, max(0, int(left * 1000) - 300))
        return max(0, poll)

    # ------------------------------------------------------------ ack & co
    @guarded(spb.AckMessageResponse)
    def AckMessage(self, request, context):
        group = _consumer(context, validate_group(request.group.name))
        topic = request.topic.name or None
        out = []
        for e in request.entries:
            try:
                self.broker.receiver.ack(group, self._released(context, group, e.receipt_handle),
                                         topic)
                st = OK
            except InvalidHandle as err:
                st = status(Code.INVALID_RECEIPT_HANDLE, str(err))
            out.append(spb.AckMessageResultEntry(message_id=e.message_id,
                                                 receipt_handle=e.receipt_handle, status=st))
        if not out:
            return spb.AckMessageResponse(status=status(Code.BAD_REQUEST, "no entries to ack"))
        codes = {x.status.code for x in out}
        top = out[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS, "see entries")
        return spb.AckMessageResponse(status=top, entries=out)

    @guarded(spb.ChangeInvisibleDurationResponse)
    def ChangeInvisibleDuration(self, request, context):
        group = validate_group(request.group.name)
        ms = ms_of_duration(request.invisible_duration)
        # the proxy's validateInvisibleTime(t): 0 (visible again at once) up to the max;
        # the Node.js PushConsumer sends 0 for a failed message
        if not 0 <= ms <= MAX_INVISIBLE_MS:
            return spb.ChangeInvisibleDurationResponse(status=status(
                Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration must be 0 ms..12 h, got {ms} ms"))
        consumer = _consumer(context, group)
        handle = self.broker.receiver.change_invisible(
            consumer, self._released(context, consumer, request.receipt_handle), ms,
            request.topic.name or None)
        return spb.ChangeInvisibleDurationResponse(status=OK, receipt_handle=handle)

    @guarded(spb.ForwardMessageToDeadLetterQueueResponse)
    def ForwardMessageToDeadLetterQueue(self, request, context):
        group = validate_group(request.group.name)
        consumer = _consumer(context, group)
        self.broker.receiver.forward_to_dlq(
            consumer, self._released(context, consumer, request.receipt_handle),
            request.topic.name or None)
        return spb.ForwardMessageToDeadLetterQueueResponse(status=OK)

    def _released(self, context, consumer, handle: str) -> str:
        """The handle to act on for a client's ``handle``: the newest one if the broker
        was renewing it (auto_renew), which it stops doing now."""
        return self.broker.renewer.release(client_id(context), consumer, handle)

    # ------------------------------------------------------------ offsets
    def _local_queue(self, mq) -> tuple[str, int]:
        return self.broker.receiver.local_queue(validate_topic(mq.topic.name), mq.id)

    @guarded(spb.GetOffsetResponse)
    def GetOffset(self, request, context):
        group = validate_group(request.group.name)
        topic, qid = self._local_queue(request.message_queue)
        return spb.GetOffsetResponse(status=OK, offset=self.broker.receiver.committed_offset(
            _consumer(context, group), topic, qid))

    @guarded(spb.UpdateOffsetResponse)
    def UpdateOffset(self, request, context):
        group = validate_group(request.group.name)
        topic, qid = self._local_queue(request.message_queue)
        self.broker.receiver.reset_offset(_consumer(context, group), topic, qid, request.offset)
        return spb.UpdateOffsetResponse(status=OK)

    @guarded(spb.QueryOffsetResponse)
    def QueryOffset(self, request, context):
        topic, qid = self._local_queue(request.message_queue)
        policy = request.query_offset_policy
        # any int: the store refuses a time outside 1970..9999 (BAD_REQUEST)
        at_ms = None if policy in (pb.BEGINNING, pb.END) else ms_of_timestamp(request.timestamp)
        return spb.QueryOffsetResponse(status=OK, offset=self.broker.receiver.query_offset(
            topic, qid, at_ms=at_ms, end=policy == pb.END))

    @guarded_async_stream(spb.PullMessageResponse)
    def PullMessage(self, request, context):
        return self._pull(request, context)

    async def _pull(self, request, context):
        validate_group(request.group.name)
        topic, qid = self._local_queue(request.message_queue)
        try:
            tag_filter = self._filter(request.filter_expression)
        except _FilterRefused as e:
            yield spb.PullMessageResponse(status=e.status)
            return
        batch = min(max(1, request.batch_size or 32), MAX_BATCH_SIZE)
        poll_ms = self._poll_ms(request, context)       # (answered before the deadline)
        pulled = await self.broker.receiver.pull_async(
            topic, qid, request.offset, batch, tag_filter, poll_ms, self.offload)
        if pulled.status is PullStatus.OFFSET_ILLEGAL:    # as the proxy's pull stream writer
            yield spb.PullMessageResponse(status=status(Code.ILLEGAL_OFFSET, f"offset "
                                          f"{request.offset} is past the queue's end "
                                          f"{pulled.next_offset}; pull from next_offset"))
        elif not pulled.messages:
            yield spb.PullMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
        else:
            yield spb.PullMessageResponse(status=OK)
            for m in pulled.messages:
                yield spb.PullMessageResponse(message=message_to_pb(m))
        yield spb.PullMessageResponse(next_offset=pulled.next_offset)

    # ------------------------------------------------------------ transactions, recall, lite
    @guarded(spb.EndTransactionResponse)
    def EndTransaction(self, request, context):
        """COMMIT makes the half message visible in its topic; ROLLBACK discards it. As the
        proxy's EndTransactionActivity, the topic is checked first (ILLEGAL_TOPIC), then a
        blank transaction id (INVALID_TRANSACTION_ID), then the transaction is looked up
        (INVALID_TRANSACTION_ID if it is not pending); the message id is not read. Any
        other resolution is the proxy's UNKNOWN: OK, and the transaction stays pending for
        its check-back."""
        validate_topic(request.topic.name)
        tx = self.broker.transactions
        if tx is None:
            return spb.EndTransactionResponse(status=status(
                Code.UNSUPPORTED, "transactional messages are served by the master only"))
        if not request.transaction_id.strip():
            return spb.EndTransactionResponse(status=status(
                Code.INVALID_TRANSACTION_ID, "transaction_id is empty; send the one the "
                "transactional message's SendMessage answered"))
        commit = {pb.COMMIT: True, pb.ROLLBACK: False}.get(request.resolution)
        try:
            tx.end(request.transaction_id, commit, request.topic.name)
        except UnknownTransaction as e:
            return spb.EndTransactionResponse(status=status(Code.INVALID_TRANSACTION_ID, e.message))
        return spb.EndTransactionResponse(status=OK)

    @guarded(spb.RecallMessageResponse)
    def RecallMessage(self, request, context):
        """Cancel a delayed message before it is delivered (5.x RecallMessage), by the
        ``recall_handle`` its send returned. NOT_FOUND once delivered or recalled."""
        sched = self.broker.schedule
        if sched is None:
            return spb.RecallMessageResponse(status=status(
                Code.UNSUPPORTED, "delayed messages are recalled on the master only"))
        try:
            topic, broker_name, qid, offset, message_id = parse_recall_handle(
                self.broker.handles.open(request.recall_handle, "recall handle"))
        except InvalidReceiptHandleError as e:
            return spb.RecallMessageResponse(status=error_status(e))
        except UserError as e:
            return spb.RecallMessageResponse(status=status(Code.BAD_REQUEST, e.message))
        if request.topic.name and request.topic.name != topic:
            return spb.RecallMessageResponse(status=status(
                Code.BAD_REQUEST, f"the recall handle is for topic {topic!r}, not "
                f"{request.topic.name!r}"))
        if broker_name != self.broker.config.broker_name:
            return spb.RecallMessageResponse(status=status(
                Code.NOT_FOUND, f"the message was sent to broker {broker_name!r}, this is "
                f"{self.broker.config.broker_name!r}"))
        if sched.recall(qid, offset) != RecallStatus.RECALLED:
            return spb.RecallMessageResponse(status=status(
                Code.NOT_FOUND, f"delayed message {message_id} is not waiting here (delivered "
                "already, recalled already, or never parked)"), message_id=message_id)
        return spb.RecallMessageResponse(status=OK, message_id=message_id)

    @guarded(spb.SyncLiteSubscriptionResponse)
    def SyncLiteSubscription(self, request, context):
        return spb.SyncLiteSubscriptionResponse(status=status(
            Code.UNSUPPORTED, "lite topics are not supported by this broker"))


BROADCAST_HEADER = "x-sparkmq-consume-mode"


# An exception, not a status value: it leaves _filter from deep inside the filter
# parsing of a request and is answered (never seen by users) by its caller.
class _FilterRefused(SparkMQError):
    """A filter expression refused; ``status`` is the answer to send."""

    code = "SPARKMQ_INVALID_FILTER"

    def __init__(self, st: pb.Status):
        super().__init__(st.message)
        self.status = st


def _consumer(context, group: str):
    """The group (clustering), or GroupKey(group, client id) when the request asks
    for broadcasting (see the module docstring)."""
    meta = dict(context.invocation_metadata() or ()) if context is not None else {}
    if str(meta.get(BROADCAST_HEADER, "")).upper() != "BROADCASTING":
        return group
    cid = meta.get("x-mq-client-id")
    if not cid:
        raise ClientIdRequired("broadcasting consumption needs the x-mq-client-id header")
    return GroupKey(group, cid)
