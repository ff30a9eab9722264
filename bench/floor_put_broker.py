"""sparkmq's broker with the Flight put's own work taken out: ``FlightService._send``
replaced by the durable floor's put (bench_flight's ``DURABLE``: the batch's IPC message
with its CRC32C appended to a file, an ack of offsets). Everything else is the broker's:
its Flight server and handler thread, its gRPC server, asyncio loop and services.

What it measures (``bench_flight.py --paired ROUNDS --broker-floor``): how fast the
broker would answer if its put cost what the durable floor's costs, so what part of a
missed target the put's Python work is and what part the process around it. Not a
broker to use: nothing it acks is in the store.

    python bench/floor_put_broker.py FILE -c broker.properties
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_flight import DURABLE  # noqa: E402
from sparkmq.broker import flight, main  # noqa: E402


def floor_put(path: str) -> None:
    """Replace the broker's Flight put with ``durable`` appending to ``path``."""
    floor = {"fd": os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)}
    exec(DURABLE, floor)
    flight.FlightService._send = lambda self, context, batch: floor["durable"](batch)


if __name__ == "__main__":
    floor_put(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
