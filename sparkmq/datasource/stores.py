"""Which stores a read covers: one, or one per broker of a cluster.

A topic of a RocketMQ cluster is spread over broker groups, each with its own
store. A read names its stores one of these ways (``options._store_sources``):

* ``load(url)`` / ``path``: one store; offsets as always, ``{"topic": {"0": 5}}``.
* ``load([a, b])`` (Spark passes option ``paths``, a JSON array) or ``stores``
  (``"a,b"``): those stores.
* ``namesrv`` (``host:port[;host:port]``): the master (broker id 0) of every
  broker group the NameServer knows; each one's store URL is what its admin
  endpoint's ``/status`` reports (``store``), asked with the admin token
  (``adminTokenFile``, else ``SPARKMQ_ADMIN_TOKEN``).

Each store is one broker, named by its store's ``brokerName`` (its metadata
configuration; ``reader.broker_name``); two stores with one name are refused.
A read of several stores keys its streaming offsets by broker name,
``{"broker-a": {"topic": {"0": 5}}, "broker-b": {...}}`` (even when the list
holds one store), and ``startingOffsets`` / ``endingOffsets`` may do the same
(:func:`split_offsets`). A named topic must exist in at least one store.

Everything here runs on the driver (the planner or streaming source worker):
:func:`plan_stores` opens each store's snapshot; the per-store
:class:`ReadOptions` it returns pickle to executors with the partitions.
"""
from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from typing import Callable

from ..errors import UserError
from ..log.reader import Snapshot
from .options import ReadOptions, parse_offset_json

log = logging.getLogger("sparkmq.datasource")

#: bound on each call to a broker's admin endpoint while resolving ``namesrv``
ADMIN_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class StoreRead:
    """One store of a read: its broker name and its own options (its URL, its part of
    per-broker offset options)."""

    broker: str
    opts: ReadOptions


def plan_stores(opts: ReadOptions, open_snap: Callable[[ReadOptions], Snapshot],
                broker_of: Callable[[Snapshot], str]) -> list[tuple[StoreRead, Snapshot]]:
    """The stores of a read with a snapshot of each (``open_snap``), sorted by broker.

    UserError when two stores have one broker name, or a named topic is in none.
    """
    if not opts.by_broker:
        snap = open_snap(opts)
        return [(StoreRead(broker_of(snap), opts), snap)]
    urls = opts.urls or namesrv_store_urls(opts.namesrv, opts.admin_token_file)
    seen: dict[str, str] = {}
    out = []
    for url in urls:
        one = replace(opts, url=url, urls=(url,), topics_anywhere=True)
        snap = open_snap(one)
        broker = broker_of(snap)
        if broker in seen:
            raise UserError(f"stores {seen[broker]} and {url} both belong to broker "
                            f"{broker!r} (their brokerName); a read of several stores takes "
                            "one store per broker group (its master's)")
        seen[broker] = url
        out.append((StoreRead(broker, one), snap))
    if opts.topics:
        names = {t for _, snap in out for t in snap.topic_names()}
        missing = [t for t in opts.topics if t not in names]
        if missing:
            raise UserError(f"topics {missing} exist in none of the stores "
                            f"{', '.join(sorted(seen))} ({', '.join(urls)})")
    brokers = sorted(seen)
    starting = split_offsets(opts.starting_offsets, brokers, "startingOffsets")
    ending = split_offsets(opts.ending_offsets, brokers, "endingOffsets")
    out = [(replace(r, opts=replace(r.opts, starting_offsets=starting[r.broker],
                                    ending_offsets=ending[r.broker])), snap)
           for r, snap in out]
    return sorted(out, key=lambda rs: rs[0].broker)


def split_offsets(text: str | None, brokers: list[str], name: str) -> dict[str, str | None]:
    """An offsets option of a read of several stores, per broker.

    ``earliest``/``latest`` and topic JSON (``{"T": {"0": 5}}``) apply to every
    store; JSON keyed by broker names (``{"broker-a": {"T": {"0": 5}}}``) gives each
    named broker its own (others fall back to the option's default).
    """
    if text is None or text.strip().lower() in ("earliest", "latest"):
        return {b: text for b in brokers}
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise UserError(f"option {name} is not valid JSON: {exc}") from None
    nested = isinstance(parsed, dict) and parsed and all(
        isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values())
        for v in parsed.values())
    if not nested:
        parse_offset_json(text, name)            # the topic form: checked here, once
        return {b: text for b in brokers}
    unknown = sorted(set(parsed) - set(brokers))
    if unknown:
        raise UserError(f"option {name} names brokers {unknown}; this read's brokers are "
                        f"{brokers}")
    out = {}
    for b in brokers:
        out[b] = json.dumps(parsed[b]) if b in parsed else None
        if out[b] is not None:
            parse_offset_json(out[b], f"{name} of {b}")
    return out


# -- streaming offsets ---------------------------------------------------------------
def offsets_by_broker(offset: dict | None, brokers: list[str]) -> dict[str, dict]:
    """A streaming offset of a read of several stores, checked against its brokers:
    a broker whose store is gone, or a store added since the checkpoint, is an error
    (its position is unknown, and starting it anywhere could skip or repeat messages)."""
    offset = offset or {}
    if not all(isinstance(v, dict) and all(isinstance(x, dict) for x in v.values())
               for v in offset.values()):
        raise UserError("the checkpoint's offsets are of a read of one store "
                        '({"topic": {"queue": offset}}); this query reads several stores '
                        "(offsets keyed by broker): use a new checkpointLocation")
    gone = sorted(set(offset) - set(brokers))
    added = sorted(set(brokers) - set(offset))
    if gone:
        raise UserError(f"the checkpoint has offsets of brokers {gone} whose stores this "
                        f"query does not read (it reads {brokers}); give their stores "
                        "again, or start a new query (new checkpointLocation)")
    if added:
        raise UserError(f"the stores of brokers {added} were added since the checkpoint "
                        f"(it has {sorted(offset)}); a query keeps its stores: start a new "
                        "query (new checkpointLocation) to read them")
    return offset


def check_one_store_offset(offset: dict | None) -> dict:
    """A streaming offset of a read of one store ({topic: {queue: offset}})."""
    offset = offset or {}
    if any(isinstance(x, dict) for v in offset.values() if isinstance(v, dict)
           for x in v.values()):
        raise UserError(f"the checkpoint's offsets are keyed by brokers {sorted(offset)} "
                        "(a read of several stores); this query reads one store: give the "
                        "same stores again, or use a new checkpointLocation")
    return offset


# -- NameServer ----------------------------------------------------------------------
def namesrv_store_urls(namesrv: str, token_file: str | None = None) -> tuple[str, ...]:
    """The store URL of every broker group's master the NameServer ``namesrv`` knows
    (as ``sparkmq admin group progress --namesrv`` finds the brokers), from the
    ``store`` of each master's admin ``/status``."""
    from ..admin_auth import MISSING_TOKEN_HINT, auth_headers, find_token
    from ..namesrv.client import NameServerClient
    brokers = NameServerClient(namesrv).brokers()
    if brokers is None:
        raise UserError(f"option namesrv: no NameServer of {namesrv} answered")
    masters = sorted((b for b in brokers if b.get("brokerId") == 0), key=lambda b: b["brokerName"])
    if not masters:
        raise UserError(f"option namesrv: the NameServer {namesrv} knows no master broker")
    token = find_token(token_file=token_file)
    urls = []
    for b in masters:
        if not b.get("adminEndpoint"):
            raise UserError(f"option namesrv: broker {b['brokerName']} registered no admin "
                            "endpoint, so its store is unknown; give the stores instead")
        url = f"http://{b['adminEndpoint']}/status"
        req = urllib.request.Request(url, headers=auth_headers(token))
        try:
            with urllib.request.urlopen(req, timeout=ADMIN_TIMEOUT_S) as resp:
                status = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            hint = f"; {MISSING_TOKEN_HINT}" if e.code == 401 else ""
            raise UserError(f"option namesrv: {url} answered {e.code} asking broker "
                            f"{b['brokerName']} for its store{hint}") from None
        except (OSError, ValueError) as e:
            raise UserError(f"option namesrv: cannot ask broker {b['brokerName']} for its "
                            f"store at {url}: {e}") from None
        if not status.get("store"):
            raise UserError(f"option namesrv: broker {b['brokerName']} did not say its store")
        store = str(status["store"])
        if "://" not in store and not os.path.isabs(store):
            log.warning("broker %s reports its store as %r, relative to the broker's working "
                        "directory; it is read relative to this one (give an absolute "
                        "storePathRootDir, or the stores option, if they differ)",
                        b["brokerName"], store)
        urls.append(store)
    return tuple(urls)
