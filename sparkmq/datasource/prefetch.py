"""Reading small micro-batches in the driver: Spark's prefetch path for Python streams.

Why: an executor task of a Python data source costs a micro-batch ~100 ms on top of
Spark's own floor (a JVM task feeding a Python worker the pickled read function and
the partition, and Arrow back), whatever the source does: a stream reader that reads
nothing measures the same. Spark has a path without that task, for
``SimpleDataSourceStreamReader``: its source worker (the driver's Python process that
already answers ``latestOffset`` and ``partitions``) sends the rows of the micro-batch
along with its one partition, and the JVM serves them from its block manager.

How: pyspark takes that path for a reader that is an instance of its
``_SimpleStreamReaderWrapper`` (``pyspark.sql.streaming.python_streaming_source_runner``
asks it ``getCache(start, end)`` after ``partitions``; an iterator is the micro-batch's
rows, None means "read the partitions on executors as usual"). :class:`DriverReads`
is such a wrapper around :class:`~sparkmq.datasource.stream.SparkMQStreamReader`,
keeping all of its behaviour (admission control, ``AvailableNow``, its markers); its
``getCache`` is the reader's ``prefetched``: rows for a micro-batch ``partitions``
planned as one small piece (``driverReadMaxMessages``), None for any other. Replays
after a restart take the same path (the rows are read again from the same offsets).

The wrapper class is private to pyspark (checked with pyspark 4.x): without it
(:data:`AVAILABLE` false) the data source returns the plain reader, and every
micro-batch is read by executor tasks, as before. Lost with the wrapper: the
``latestOffset`` of the query's progress (pyspark asks a wrapper for no
``reportLatestOffset``); ``driverReadMaxMessages=0`` keeps it (no wrapper, no driver
reads).

Runs in the driver's streaming source worker and, pickled inside Spark's read
function, on executors (``read`` of a batch too big for the driver). Not thread-safe
(Spark calls it from one thread).
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamReader

try:
    from pyspark.sql.datasource_internal import _SimpleStreamReaderWrapper as _Wrapper
    AVAILABLE = True
except ImportError:   # another pyspark: no prefetch path, executors read every batch
    _Wrapper = DataSourceStreamReader
    AVAILABLE = False


class DriverReads(_Wrapper):
    """A :class:`SparkMQStreamReader` that Spark asks for prefetched rows (see the
    module doc); every other call goes to the reader."""

    def __init__(self, reader):
        self.reader = reader
        # pyspark looks here for AvailableNow support and prepareForTriggerAvailableNow
        self.simple_reader = reader
        self.cache: list = []    # (the wrapper's own prefetch cache: unused)

    def initialOffset(self):
        return self.reader.initialOffset()

    def getDefaultReadLimit(self):
        return self.reader.getDefaultReadLimit()

    def latestOffset(self, start=None, limit=None):
        return self.reader.latestOffset(start, limit)

    def prepareForTriggerAvailableNow(self):
        self.reader.prepareForTriggerAvailableNow()

    def reportLatestOffset(self):
        return self.reader.reportLatestOffset()

    def partitions(self, start, end):
        return self.reader.partitions(start, end)

    def getCache(self, start, end):
        return self.reader.prefetched(start, end)

    def read(self, partition):
        return self.reader.read(partition)

    def commit(self, end):
        self.reader.commit(end)

    def stop(self):
        self.reader.stop()


def stream_reader(reader):
    """``reader`` as Spark should get it: wrapped when the prefetch path exists and the
    read allows driver reads (``driverReadMaxMessages`` above 0, the default)."""
    return DriverReads(reader) if AVAILABLE and reader.opts.driver_read_max_messages > 0 \
        else reader
