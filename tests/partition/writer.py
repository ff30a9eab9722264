"""A partition-test client: sends numbered messages to ONE broker endpoint over the
RocketMQ 5 gRPC protocol (raw stubs, no routing, no retries) and records each
acknowledged number with the time of the ack, one line each, flushed at once.

    python writer.py ENDPOINT TOPIC PREFIX OUTFILE STOPFILE
"""
from __future__ import annotations

import os
import sys
import time
import uuid

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc


def main() -> None:
    endpoint, topic, prefix, out_path, stop_path = sys.argv[1:6]
    out = open(out_path, "a", buffering=1)
    channel = grpc.insecure_channel(endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    md = [("x-mq-client-id", f"writer-{prefix}")]
    i = 0
    while not os.path.exists(stop_path):
        body = f"{prefix}-{i}".encode()
        msg = pb.Message(topic=pb.Resource(name=topic), body=body,
                         system_properties=pb.SystemProperties(
                             message_id=uuid.uuid4().hex.upper(),
                             body_encoding=pb.IDENTITY, message_type=pb.NORMAL))
        try:
            reply = stub.SendMessage(spb.SendMessageRequest(messages=[msg]), timeout=5,
                                     metadata=md)
            ok = reply.status.code == pb.OK and reply.entries and \
                reply.entries[0].status.code == pb.OK
        except grpc.RpcError:
            ok = False
        if ok:
            out.write(f"{i} {int(time.time() * 1000)}\n")
        else:
            time.sleep(0.05)      # refused or unreachable: a new number next (an unacked
        i += 1                    # one may or may not be stored; it is never counted)
    out.close()


if __name__ == "__main__":
    main()
