"""Broker metrics: counters kept in memory, rendered as Prometheus text.

Counters (monotonic, since start): sends, send bytes, send errors, receives
(messages delivered), receive calls, acks, DLQ moves, per topic where it
helps. Gauges are computed at scrape time from the store and the pop state:
queue depth (max - min offset per queue) and consumer lag per (group, topic).
Thread-safety: one lock around the counters.
"""
from __future__ import annotations

import threading


def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    COUNTERS = {
        "sparkmq_messages_sent_total": "Messages stored by SendMessage, per topic.",
        "sparkmq_bytes_sent_total": "Body bytes stored by SendMessage, per topic.",
        "sparkmq_send_errors_total": "Messages refused by SendMessage, per status code.",
        "sparkmq_messages_received_total": "Messages delivered by ReceiveMessage, per topic and group.",
        "sparkmq_bytes_received_total": "Body bytes delivered by ReceiveMessage, per topic and group.",
        "sparkmq_receive_requests_total": "ReceiveMessage calls.",
        "sparkmq_acks_total": "Messages acked, per group.",
        "sparkmq_receipt_renewals_total": "Invisible times the broker renewed for messages "
                                          "received with auto_renew (renew.py).",
        "sparkmq_rpc_errors_total": "RPCs answered with an internal error, per method.",
        "sparkmq_ha_sync_failures_total": "SYNC_MASTER sends stored here that no replica "
                                          "acked in time, per put status.",
    }

    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple], float] = {}
        self._sent: dict[str, tuple[tuple, tuple]] = {}   # topic -> its two send series

    @staticmethod
    def _key(name: str, labels: dict) -> tuple:
        items = tuple(labels.items())
        return (name, items if len(items) < 2 else tuple(sorted(items)))

    def inc(self, name: str, value: float = 1, **labels) -> None:
        key = self._key(name, labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + value

    def count_sent(self, topic: str, count: int, nbytes: int) -> None:
        """Messages of ``topic`` a send stored and their body bytes (every wire path's
        two per-topic send counters; their series made once a topic)."""
        keys = self._sent.get(topic)
        if keys is None:
            keys = self._sent[topic] = (
                self._key("sparkmq_messages_sent_total", {"topic": topic}),
                self._key("sparkmq_bytes_sent_total", {"topic": topic}))
        with self._lock:
            values = self._values
            values[keys[0]] = values.get(keys[0], 0) + count
            values[keys[1]] = values.get(keys[1], 0) + nbytes

    def get(self, name: str, **labels) -> float:
        """Sum of ``name`` over the series whose labels include ``labels``."""
        want = set(labels.items())
        with self._lock:
            return sum(v for (n, lab), v in self._values.items()
                       if n == name and want <= set(lab))

    def series(self, name: str) -> list[tuple[dict, float]]:
        """Every (labels, value) of counter ``name``."""
        with self._lock:
            return [(dict(lab), v) for (n, lab), v in self._values.items() if n == name]

    def render(self, gauges: dict[str, tuple[str, list[tuple[dict, float]]]],
               counters: dict[str, tuple[str, list[tuple[dict, float]]]] | None = None) -> str:
        """Prometheus text format: own counters, ``counters`` kept elsewhere, then
        ``gauges`` (name -> (help, samples))."""
        with self._lock:
            values = dict(self._values)
        lines = []
        for name, help_text in self.COUNTERS.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            series = [(lab, v) for (n, lab), v in values.items() if n == name]
            if not series:
                lines.append(f"{name} 0")
            for lab, v in sorted(series):
                lines.append(f"{name}{_labels(dict(lab))} {v:g}")
        for kind, extra in (("counter", counters or {}), ("gauge", gauges)):
            lines += _family(kind, extra)
        return "\n".join(lines) + "\n"


def _family(kind: str, families: dict) -> list[str]:
    lines = []
    for name, (help_text, samples) in families.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for lab, v in samples:
            lines.append(f"{name}{_labels(lab)} {v:g}")
    return lines


def _labels(lab: dict) -> str:
    if not lab:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(lab.items())) + "}"
