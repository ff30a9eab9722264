"""What the console remembers over time: a small in-memory ring of samples per broker,
for the in/out rates of the topics page and the lag sparklines of the group pages.

A sample holds, at one moment, the broker's counters of messages in (stored by sends:
``sparkmq_messages_sent_total``, gRPC and Flight alike) and out (delivered by receives:
``sparkmq_messages_received_total``) per topic (``broker/metrics.py``), and every
consumer group's lag per (topic, queue) (``log.progress.group_lag``: broker consumers
and Spark queries that record a ``consumerGroup`` alike).

Samples are taken every :data:`INTERVAL_S` by a daemon thread started at the first
console page of the broker (it ends when the broker stops), and at a page view when
the newest one is older than the interval; :data:`HISTORY_S` of them are kept. A rate
compares the counters now with the oldest sample of the last :data:`RATE_WINDOW_S`
(else the newest one), so it is defined from the second look on. Nothing is stored:
a broker restart starts a new history.

Thread-safe: one lock per ring; the registry of rings has its own.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger("sparkmq.console")

INTERVAL_S = 5.0           # a sample every 5 s ...
HISTORY_S = 600.0          # ... for the last 10 minutes
RATE_WINDOW_S = 60.0       # a rate is averaged over up to the last minute
MAX_GROUPS = 500           # groups whose lag a sample records, at most

IN_COUNTER = "sparkmq_messages_sent_total"
OUT_COUNTER = "sparkmq_messages_received_total"


@dataclass(frozen=True)
class Sample:
    """The broker at one moment (``t``: ``time.monotonic()``; ``wall_ms``: the clock)."""

    t: float
    wall_ms: int
    messages_in: dict[str, float] = field(default_factory=dict)     # topic -> counter
    messages_out: dict[str, float] = field(default_factory=dict)    # topic -> counter
    lag: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)


def _per_topic(metrics, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in metrics.series(name):
        topic = labels.get("topic", "")
        out[topic] = out.get(topic, 0) + value
    return out


def take(broker, clock=time.monotonic) -> Sample:
    """A sample of ``broker`` now."""
    from ..log.progress import group_lag
    from .pages import group_names
    lag = {}
    for g in group_names(broker)[:MAX_GROUPS]:
        lag[g] = {(r["topic"], r["queueId"]): r["lag"] for r in group_lag(broker.store, g)}
    return Sample(clock(), int(time.time() * 1000), _per_topic(broker.metrics, IN_COUNTER),
                  _per_topic(broker.metrics, OUT_COUNTER), lag)


def _rate(now: dict, before: dict, key: str, dt: float) -> float:
    return max(0.0, now.get(key, 0) - before.get(key, 0)) / dt


class Ring:
    """The samples of one broker, oldest first (see the module docstring)."""

    def __init__(self, broker, *, interval_s: float = INTERVAL_S,
                 history_s: float = HISTORY_S, clock=time.monotonic):
        self._broker = weakref.ref(broker)
        self.interval_s = interval_s
        self._clock = clock
        self._samples: deque[Sample] = deque(maxlen=max(2, int(history_s / interval_s) + 1))
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def record(self, sample: Sample, *, force: bool = False) -> None:
        """Keep ``sample`` if the newest kept one is at least an interval old (or
        ``force``)."""
        with self._lock:
            if (force or not self._samples
                    or sample.t - self._samples[-1].t >= self.interval_s * 0.9):
                self._samples.append(sample)

    def now(self) -> Sample | None:
        """A fresh sample (kept if due), or None once the broker is gone."""
        broker = self._broker()
        if broker is None:
            return None
        sample = take(broker, self._clock)
        self.record(sample)
        return sample

    def rates(self, now: Sample) -> dict[str, tuple[float, float]]:
        """topic -> (messages in per second, out per second) between the oldest sample
        of the last ``RATE_WINDOW_S`` (else the newest) and ``now``; empty before a
        second sample."""
        older = [s for s in self.samples() if s.t < now.t]
        if not older:
            return {}
        recent = [s for s in older if now.t - s.t <= RATE_WINDOW_S]
        base = recent[0] if recent else older[-1]
        dt = now.t - base.t
        topics = set(now.messages_in) | set(now.messages_out)
        return {t: (_rate(now.messages_in, base.messages_in, t, dt),
                    _rate(now.messages_out, base.messages_out, t, dt)) for t in topics}

    def history(self, now: Sample | None = None) -> list[Sample]:
        """The kept samples, then ``now`` if it is newer than the last kept one."""
        s = self.samples()
        if now is not None and (not s or now.t > s[-1].t):
            s.append(now)
        return s

    def in_rate_series(self, topic: str, now: Sample | None = None) -> list[float]:
        """Messages in per second of ``topic`` between consecutive samples (and now)."""
        s = self.history(now)
        return [_rate(b.messages_in, a.messages_in, topic, b.t - a.t)
                for a, b in zip(s, s[1:]) if b.t > a.t]

    def lag_series(self, group: str, queue: tuple[str, int] | None = None,
                   now: Sample | None = None) -> list[int]:
        """The lag of ``group`` (of one (topic, queue), else in total) per sample (and
        now)."""
        out = []
        for s in self.history(now):
            lags = s.lag.get(group)
            if lags is None:
                continue
            out.append(lags.get(queue, 0) if queue is not None else sum(lags.values()))
        return out

    # ------------------------------------------------------------------ the timer
    def start(self) -> None:
        """Sample every interval on a daemon thread until the broker stops."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="console-samples")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            broker = self._broker()
            if broker is None or getattr(broker.state, "value", "") in ("stopping", "stopped"):
                return
            del broker
            try:
                self.now()
            # a sample can fail mid-shutdown or on a store error: logged, tried again
            except Exception:
                log.debug("console sample failed", exc_info=True)


_rings: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_rings_lock = threading.Lock()


def ring_for(broker) -> Ring:
    """The ring of ``broker``, made (and its timer started) at the first call."""
    with _rings_lock:
        ring = _rings.get(broker)
        if ring is None:
            ring = _rings[broker] = Ring(broker)
            ring.start()
    return ring
