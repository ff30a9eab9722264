"""Long polls are suspended requests, not threads (issue 18 item 1): far more polls than
gRPC workers are held at once while sends go through; each held poll is answered when
a message arrives; a client that goes away frees its poll; Telemetry streams hold no
worker either; past ``maxLongPollingRequests`` a poll is answered TOO_MANY_REQUESTS."""
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

WORKERS = 8


def _poll(stub, i: int, topic: str = "P", seconds: int = 25):
    """Start one ReceiveMessage long poll (the call runs until it is answered)."""
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name="G"), message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), id=-1), batch_size=1,
        invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(seconds=seconds))
    return stub.ReceiveMessage(req, timeout=seconds + 15,
                               metadata=[("x-mq-client-id", f"c{i}")])


def _send(stub, topic: str, i: int) -> int:
    reply = stub.SendMessage(spb.SendMessageRequest(messages=[pb.Message(
        topic=pb.Resource(name=topic), body=f"m{i}".encode(),
        system_properties=pb.SystemProperties(
            message_id=f"0B{i:030d}", body_encoding=pb.IDENTITY,
            message_type=pb.NORMAL))]), timeout=5, metadata=[("x-mq-client-id", "p")])
    return reply.entries[0].status.code


def _codes(call) -> list[int]:
    return [r.status.code for r in call if r.HasField("status")]


def test_many_more_polls_than_workers_are_held_and_sends_go_through(make_broker):
    polls = 25 * WORKERS
    b = make_broker(grpcThreadPoolNums=WORKERS)
    b.store.create_topic("P", read_queue_nums=1, write_queue_nums=1)
    channel = grpc.insecure_channel(b.endpoint)
    stub = MessagingServiceStub(channel)
    threads_before = threading.active_count()
    try:
        calls = [_poll(stub, i) for i in range(polls)]
        wait_until(lambda: b.notifier.waiting == polls, f"{polls} polls held at once")
        # a held poll holds no thread: the process has about as many as before
        assert threading.active_count() - threads_before <= WORKERS + 4
        for i in range(WORKERS * 2):            # sends find a worker: each is answered OK
            assert _send(stub, "P", i) == Code.OK
        for i in range(WORKERS * 2, polls):
            assert _send(stub, "P", i) == Code.OK
        answers = [_codes(c) for c in calls]
        assert answers == [[Code.OK]] * polls          # every poll got its message
        assert b.notifier.waiting == 0
    finally:
        channel.close()


def test_a_client_gone_away_frees_its_poll_and_telemetry_holds_no_worker(make_broker):
    b = make_broker(grpcThreadPoolNums=WORKERS)
    b.store.create_topic("P", read_queue_nums=1, write_queue_nums=1)
    channel = grpc.insecure_channel(b.endpoint)
    stub = MessagingServiceStub(channel)
    release = threading.Event()
    try:
        calls = [_poll(stub, i) for i in range(3 * WORKERS)]
        streams = [stub.Telemetry(_silent(release), timeout=60,
                                  metadata=[("x-mq-client-id", f"t{i}")])
                   for i in range(3 * WORKERS)]
        wait_until(lambda: b.notifier.waiting == 3 * WORKERS, "the polls held")
        assert _send(stub, "Q", 0) == Code.OK       # a worker answers (Q auto-created)
        for c in calls:
            c.cancel()
        wait_until(lambda: b.notifier.waiting == 0, "cancelled polls removed")
        assert _send(stub, "P", 1) == Code.OK
        for s in streams:
            s.cancel()
    finally:
        release.set()
        channel.close()


def _silent(release: threading.Event):
    """A client side of a Telemetry stream that sends nothing until ``release``."""
    release.wait()
    yield from ()


def test_polls_past_the_cap_are_answered_too_many_requests(make_broker):
    cap, polls = 4, 10
    b = make_broker(maxLongPollingRequests=cap)
    b.store.create_topic("P", read_queue_nums=1, write_queue_nums=1)
    channel = grpc.insecure_channel(b.endpoint)
    stub = MessagingServiceStub(channel)
    try:
        calls = [_poll(stub, i) for i in range(polls)]
        wait_until(lambda: b.notifier.waiting == cap, "the cap held")
        for i in range(cap):
            assert _send(stub, "P", i) == Code.OK
        answers = sorted(_codes(c)[-1] for c in calls)
        assert answers.count(Code.TOO_MANY_REQUESTS) == polls - cap
        assert answers.count(Code.OK) == cap
    finally:
        channel.close()


_BURST_CLIENT = r"""
import sys, time, grpc
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb, service_pb2 as spb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
endpoint, n = sys.argv[1], int(sys.argv[2])
stub = MessagingServiceStub(grpc.insecure_channel(endpoint))
req = spb.ReceiveMessageRequest(
    group=pb.Resource(name="G"), message_queue=pb.MessageQueue(topic=pb.Resource(name="P"), id=-1),
    batch_size=1, invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(seconds=20))
calls = [stub.ReceiveMessage(req, timeout=60, metadata=[("x-mq-client-id", f"b{i}")]) for i in range(n)]
print("opened", flush=True)
sys.stdin.readline()                        # the test has counted what it holds
print(sum(1 for c in calls if c.done() and c.code() == grpc.StatusCode.CANCELLED), flush=True)
for c in calls:
    c.cancel()
"""


def test_a_burst_of_polls_from_another_process_is_held_whole(make_broker):
    """gRPC core cancels calls the server has not taken up yet past 1,000 pending: a burst
    of polls opened at once by one client process lost some before the broker saw them.
    The broker raises that limit (maxLongPollingRequests is the cap that applies)."""
    import subprocess
    import sys
    n = 1500
    b = make_broker()
    b.store.create_topic("P", read_queue_nums=1, write_queue_nums=1)
    proc = subprocess.Popen([sys.executable, "-c", _BURST_CLIENT, b.endpoint, str(n)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "opened"
        wait_until(lambda: b.notifier.waiting == n, f"{n} polls held", timeout_s=60)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert int(proc.stdout.readline()) == 0           # none cancelled on the way
    finally:
        proc.kill()
        proc.wait(10)
