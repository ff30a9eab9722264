"""The compiled parts of sparkmq (everything else is in pyproject.toml): ``sparkmq._wire``,
the plain RocketMQ SendMessage request read into column buffers and laid out as one Arrow C
struct (sparkmq/_wire.c),
``sparkmq._ipc``, a record batch's Arrow IPC message written in one call, a send's ack
ids laid out in one, and an ack of the broker's ids written whole in one (sparkmq/_ipc.c),
``sparkmq._screen``, the input-limit screen of a batch in one call, a send's bodies
measured in one, and a Flight send batch read in one (sparkmq/_screen.c), and
``sparkmq._compose``, a send's segment batch composed as an Arrow C struct, and a read's
message table of its rows as one (sparkmq/_compose.c), and ``sparkmq._chunk``, the
ConsumeQueue's Chunk as a type the cyclic garbage collector does not track
(sparkmq/_chunk.c).
Optional: where they cannot be built, the broker reads every request in Python, pyarrow
writes every message, numpy screens every batch, measures the bodies and lays out the
ids, pyarrow reads every Flight send batch, and pyarrow builds every segment batch and
every read's table, and the ConsumeQueue's chunks are Python objects."""
from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra"]
setup(ext_modules=[Extension("sparkmq._wire", ["sparkmq/_wire.c"], optional=True,
                             depends=["sparkmq/_arrow_c.h", "sparkmq/_capsule.h"],
                             extra_compile_args=FLAGS),
                   Extension("sparkmq._ipc", ["sparkmq/_ipc.c"], optional=True,
                             depends=["sparkmq/_arrow_c.h", "sparkmq/_capsule.h"],
                             extra_compile_args=FLAGS),
                   Extension("sparkmq._screen", ["sparkmq/_screen.c"], optional=True,
                             depends=["sparkmq/_arrow_c.h", "sparkmq/_capsule.h"],
                             extra_compile_args=FLAGS),
                   Extension("sparkmq._compose", ["sparkmq/_compose.c"], optional=True,
                             depends=["sparkmq/_arrow_c.h", "sparkmq/_capsule.h"],
                             extra_compile_args=FLAGS),
                   Extension("sparkmq._chunk", ["sparkmq/_chunk.c"], optional=True,
                             extra_compile_args=FLAGS)])
