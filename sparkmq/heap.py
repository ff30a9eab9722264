"""The daemons' garbage collector: their start-up heap frozen, its pauses counted.

CPython's cyclic collector runs, besides its frequent young collections (well under a
millisecond), a full collection that visits every tracked object while it holds the
GIL. A started broker tracks ~90,000 objects (modules, functions, classes, descriptors,
made by imports and start-up and never garbage), and a full collection of them took
25-95 ms on this project's machines: a stall that every request in flight waits out,
every few thousand requests (bench/README.md, "GC pauses").

:func:`settle` is what a daemon calls once it has started: one collection, then
``gc.freeze()`` (standard library, Python 3.7+), which moves every object alive to a
permanent generation that later collections ignore. Later collections see only what
was made since, and garbage made later is collected as before. A start-up object whose
last reference goes is freed as ever (reference counting); only a reference cycle among
start-up objects that becomes garbage stays (the start-up heap lives as long as the
process).

:func:`watch` counts each generation's collections and the time they held the
process (``gc.callbacks``), for ``/metrics``. Idempotent, process-wide, thread-safe
(the collector calls its callbacks with the GIL held, one collection at a time).
"""
from __future__ import annotations

import gc
import time

_pause_s = [0.0, 0.0, 0.0]      # per generation, since watch()
_started: list[float] = []


def _on_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        _pause_s[info["generation"]] += time.perf_counter() - _started[0]


def watch() -> None:
    """Count the collector's pauses from now on (once per process)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def settle() -> int:
    """A daemon's start-up heap, collected once and frozen (see the module docstring);
    returns how many objects are frozen."""
    watch()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def metric_families() -> tuple[dict, dict]:
    """(counters, gauges) for ``Metrics.render``: per generation, collections (the
    Prometheus Python client's name) and the seconds they held the process; the objects
    frozen."""
    gens = [str(g) for g in range(3)]
    stats = gc.get_stats()
    counters = {
        "python_gc_collections_total": (
            "Collections of each generation of the cyclic garbage collector.",
            [({"generation": g}, s["collections"]) for g, s in zip(gens, stats)]),
        "python_gc_objects_collected_total": (
            "Objects the cyclic garbage collector freed, per generation.",
            [({"generation": g}, s["collected"]) for g, s in zip(gens, stats)]),
        "sparkmq_gc_pause_seconds_total": (
            "Seconds the cyclic garbage collector held the process (GIL), per generation "
            "(counted since the broker started).",
            [({"generation": g}, s) for g, s in zip(gens, _pause_s)]),
    }
    gauges = {"sparkmq_gc_frozen_objects": (
        "Objects of the start-up heap frozen out of the collector's reach (gc.freeze; "
        "0 in a process that is not a sparkmq daemon).", [({}, gc.get_freeze_count())])}
    return counters, gauges
