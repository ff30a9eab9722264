"""Long polls never take the workers sends need (issue 18 item 1, the part that fits the
threaded gRPC server): past ``maxLongPollingRequests`` (default: all but 16 of
``grpcThreadPoolNums``) a poll with nothing to deliver is answered TOO_MANY_REQUESTS at
once instead of waiting, so a fleet of polling consumers cannot stall producers."""
from __future__ import annotations

import threading

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol.definition_pb2 import Code
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from helpers.waiting import wait_until

pytestmark = pytest.mark.integration

POLLS, WORKERS = 30, 20           # more polls than workers: without the cap, sends starve
CAPACITY = WORKERS - 16


def test_polls_past_the_capacity_are_answered_and_sends_go_through(make_broker):
    b = make_broker(grpcThreadPoolNums=WORKERS)
    b.store.create_topic("P", read_queue_nums=1, write_queue_nums=1)
    channel = grpc.insecure_channel(b.endpoint)
    stub = MessagingServiceStub(channel)
    answers: list[list[int]] = []
    lock = threading.Lock()

    def poll(i: int) -> None:
        req = spb.ReceiveMessageRequest(
            group=pb.Resource(name="G"), message_queue=pb.MessageQueue(
                topic=pb.Resource(name="P"), id=-1), batch_size=1,
            invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(seconds=20))
        codes = [r.status.code for r in stub.ReceiveMessage(
            req, timeout=40, metadata=[("x-mq-client-id", f"c{i}")]) if r.HasField("status")]
        with lock:
            answers.append(codes)
    threads = [threading.Thread(target=poll, args=(i,)) for i in range(POLLS)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: b.notifier.waiting == CAPACITY and len(answers) == POLLS - CAPACITY,
                   "the capacity held and the rest answered")
        assert all(codes == [Code.TOO_MANY_REQUESTS] for codes in answers)
        for i in range(CAPACITY):            # sends find a worker: each is answered OK
            reply = stub.SendMessage(spb.SendMessageRequest(messages=[pb.Message(
                topic=pb.Resource(name="P"), body=f"m{i}".encode(),
                system_properties=pb.SystemProperties(
                    message_id=f"0B{i:030d}", body_encoding=pb.IDENTITY,
                    message_type=pb.NORMAL))]), timeout=5, metadata=[("x-mq-client-id", "p")])
            assert reply.entries[0].status.code == Code.OK
        for t in threads:
            t.join(60)
        held = answers[POLLS - CAPACITY:]
        assert len(answers) == POLLS                       # no poll dropped
        assert sorted(c[-1] for c in held) == [Code.OK] * CAPACITY   # each got a message
    finally:
        channel.close()
